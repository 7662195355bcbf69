"""Op-by-op executor: run a plan's exact schedule stage by stage and measure live bytes.

The executor is an interpreter of the plan's event program (:func:`remat.core.events.lower`, the one
executable form of the semantics of :mod:`remat.core.plan` and :mod:`remat.core.schedule`); it decides
nothing about lifetimes itself.  Node granularity: all of a node's outputs live and die together.

* ``STEP``: a *step-start* sample is taken (exactly the outputs of ``S[t]`` are resident).
* ``PAGE_OUT`` (POET semantics, at the start of the step): the output is copied to the store
  (numpy on the host, or ``.npy`` files with ``paging_store="file"``); its device copy then
  lives and dies by the ordinary events (a ``FREE`` first waits for its copy to be written).
* ``COMPUTE k``: the stage runs on its resident inputs and its fresh outputs become resident; a
  sample is taken (outputs exist, inputs still held).
* ``FREE i``: node i's outputs are dropped (a recomputation is preceded by the free of the copy
  it replaces).
* ``PAGE_IN`` (end of the step): when the event allocates, the stored value is copied back to
  the device (it counts from the next step's start); the bytes moved count in ``bytes_paged``
  either way.

Paging runs in one of two modes (``paging=``):

* ``"async"`` (default; NNTrainer's proactive swap, POET's overlapped transfers): transfers run on
  two background threads, one writing to the store and one reading back (the two I/O streams
  of :func:`solvers.nntrainer_plan.swap_latency`).  A value the program pages out is written as
  soon as it is computed (write-behind: values never change), so the ``PAGE_OUT`` event only
  waits for that write before the ``FREE`` of the device copy.  A ``PAGE_IN`` event starts the
  read and the transfer to the device, and the main thread waits for it only when a node reads
  the value (or it is freed): a plan whose page-in sits ``k`` steps before the first reader
  (``policies.nntrainer`` with ``lookahead=k``) prefetches ``k`` steps ahead.  The paged-in
  value counts as live device memory from the ``PAGE_IN`` event (its bytes are reserved until
  the transfer has made the device array) until its ``FREE``, so the measured peak does not
  depend on thread timing.  Threads are joined before :func:`execute` returns; an exception in
  a transfer is raised in the main thread as :class:`~remat.core.errors.PagingError` (chained).
* ``"sync"`` (on-demand swap): every transfer runs on the main thread at its event.

Freeing drops the executor's references and calls ``.delete()`` on the device arrays.  Values that
are program outputs (the loss, gradients) are copied to host memory when their node's outputs are
freed (and at the end), so the returned gradients do not count as live device memory after their
node's outputs die, exactly as in the simulator.

Peak bytes are measured two ways: bookkeeping (sum of ``out_bytes`` of resident nodes, the
simulator's quantity) and measured (``sum(a.nbytes for a in jax.live_arrays())`` minus the value
at entry, after the arguments are on the device), plus the reserved bytes of page-ins under way;
a sample and a transfer's creation of its device array exclude each other (one lock).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from remat.core.errors import ExtractionError, InvalidPlanError, PagingError
from remat.core.events import COMPUTE, FREE, PAGE_IN, PAGE_OUT, STEP
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.extraction import Lit

__all__ = ["execute", "ExecStats"]


@dataclasses.dataclass(frozen=True)
class ExecStats:
    """What an execution did.

    Attributes:
      peak_bytes: measured peak of device bytes of live arrays above the entry baseline, plus
        the reserved bytes of page-ins under way (bytes).
      peak_bytes_bookkeeping: peak of the sum of ``out_bytes`` of resident nodes (bytes).
      bytes_paged: bytes copied out plus bytes copied back in (paging plans), else 0.
      stage_runs: number of node executions (recomputations included).
      wall_s: wall-clock seconds of the whole schedule (compilation of stages included).
      timeline: ``dict`` of equal-length arrays: ``step``, ``node`` (``-1`` for a step-start
        sample), ``live_bytes`` (measured) and ``bookkeeping_bytes``.
      paging: ``"async"``, ``"sync"``, or ``"none"`` (the plan moves nothing).
      page_wait_s: seconds the main thread waited for transfers (all of each synchronous one;
        for asynchronous ones only what compute did not hide).
      bytes_paged_out, bytes_paged_in: the two parts of ``bytes_paged`` (bytes).
    """

    peak_bytes: int
    peak_bytes_bookkeeping: int
    bytes_paged: int
    stage_runs: int
    wall_s: float
    timeline: dict = dataclasses.field(default_factory=dict, repr=False)
    paging: str = "none"
    page_wait_s: float = 0.0
    bytes_paged_out: int = 0
    bytes_paged_in: int = 0


def _live_device_bytes() -> int:
    return int(sum(a.nbytes for a in jax.live_arrays()))


def _free(arrs) -> None:
    for a in arrs:
        try:
            a.delete()
        except Exception:  # noqa: BLE001 - already deleted / not deletable
            pass


def _store(arrs, tmpdir: str | None, stem: str) -> list:
    """Copy device arrays to the paging store: host numpy arrays, or ``.npy`` paths in
    ``tmpdir``."""
    host = [np.array(a, copy=True) for a in arrs]
    if tmpdir is None:
        return host
    paths = []
    for q, h in enumerate(host):
        path = os.path.join(tmpdir, f"{stem}_{q}.npy")
        np.save(path, h)
        paths.append(path)
    return paths


def _load(stored: list) -> list:
    """The host arrays of a stored value (loading ``.npy`` files)."""
    return [np.load(x) if isinstance(x, str) else x for x in stored]


class _Transfers:
    """The paging machinery of one :func:`execute` call: the write and read streams (one
    worker thread each, ``async``) or inline calls (``sync``), the byte reservations of
    page-ins under way, and the lock that orders a sample against a transfer making its device
    array.  Every failure surfaces as :class:`PagingError` in the main thread."""

    def __init__(self, mode: str, graph: Graph, tmpdir: str | None):
        self.mode = mode
        self.graph = graph
        self.tmpdir = tmpdir
        self.lock = threading.Lock()
        self.reserved: dict[int, int] = {}  # node -> bytes of a page-in not yet on the device
        self.wait_s = 0.0
        self.futures: list[Future] = []
        self._pools: list[ThreadPoolExecutor] = []
        if mode == "async":
            self._pools = [ThreadPoolExecutor(1, thread_name_prefix=f"remat-page-{k}")
                           for k in ("out", "in")]

    def _submit(self, stream: int, fn, *a) -> Future:
        if self._pools:
            f = self._pools[stream].submit(fn, *a)
        else:  # synchronous: the main thread does the transfer, all of it counts as waiting
            f = Future()
            t0 = time.perf_counter()
            try:
                f.set_result(fn(*a))
            except BaseException as e:  # noqa: BLE001 - handed to the caller via the future
                f.set_exception(e)
            self.wait_s += time.perf_counter() - t0
        self.futures.append(f)
        return f

    def write(self, arrs: tuple, stem: str) -> Future:
        """Copy device arrays to the store (stream 0); the future's result is the stored form."""
        return self._submit(0, _store, arrs, self.tmpdir, stem)

    def read(self, node: int, stored: Future, nbytes: int) -> Future:
        """Read a stored value back to the device (stream 1); its bytes count from now."""
        with self.lock:
            self.reserved[node] = self.reserved.get(node, 0) + nbytes

        def job():
            host = _load(self.wait(stored, "page-out", node, inline=True))
            with self.lock:
                try:
                    arrs = tuple(jax.device_put(h) for h in host)
                    jax.block_until_ready(arrs)
                finally:
                    self.reserved[node] -= nbytes
            return arrs

        return self._submit(1, job)

    def wait(self, f: Future, what: str, node: int, step: int | None = None,
             inline: bool = False) -> Any:
        """The result of a transfer; its waiting time counts in ``wait_s`` (main thread)."""
        t0 = time.perf_counter()
        try:
            return f.result()
        except PagingError:
            raise
        except Exception as e:  # noqa: BLE001 - typed and chained
            raise PagingError(f"{what} failed: {type(e).__name__}: {e}", step=step,
                              node=self.graph.nodes[node].name) from e
        finally:
            if not inline:
                self.wait_s += time.perf_counter() - t0

    def reserved_bytes(self) -> int:
        return int(sum(self.reserved.values()))

    def close(self) -> None:
        """Join the worker threads (queued transfers are cancelled)."""
        for pool in self._pools:
            pool.shutdown(wait=True, cancel_futures=True)

    def first_error(self) -> BaseException | None:
        for f in self.futures:
            if f.done() and not f.cancelled() and f.exception() is not None:
                return f.exception()
        return None


class _Pending:
    """A page-in under way: ``live[i]`` until a reader (or the free) waits for it."""

    __slots__ = ("future", "step")

    def __init__(self, future: Future, step: int):
        self.future = future
        self.step = step


def _write_behind(events) -> dict[int, list[int]]:
    """``{compute event index: [page-out event indices]}``: each ``PAGE_OUT`` of node i is
    attached to the latest ``COMPUTE`` of i before it (the copy it stores)."""
    out: dict[int, list[int]] = {}
    last: dict[int, int] = {}
    for e, (kind, i) in enumerate(zip(events.kind.tolist(), events.node.tolist())):
        if kind == COMPUTE:
            last[i] = e
        elif kind == PAGE_OUT and i in last:
            out.setdefault(last[i], []).append(e)
    return out


def execute(
    graph: Graph,
    plan: Plan,
    *args: Any,
    paging_store: Literal["host", "file"] = "host",
    measure: bool = True,
    paging: Literal["async", "sync"] = "async",
):
    """Run ``plan`` on an extracted ``graph`` with concrete ``args``.

    Args:
      graph: a graph from :func:`remat.extract` (it carries the program).
      plan: a plan for ``graph``; validated first.
      *args: the arguments ``fn`` is called with (same pytree structure and shapes as at
        extraction).
      paging_store: where paged-out values go: ``"host"`` (numpy arrays) or ``"file"`` (``.npy``
        files in a temporary directory removed at the end).
      measure: sample ``jax.live_arrays()`` (set False to time the schedule without the sampling
        cost; ``peak_bytes`` then equals the bookkeeping peak).
      paging: ``"async"`` (background write and read threads, write-behind, prefetch at the
        plan's ``PAGE_IN``) or ``"sync"`` (transfers on the main thread at their events); see
        the module docstring.  Memory and results do not depend on it, only timing.

    Returns:
      ``(value, grads, stats)``: ``value, grads`` shaped like
      ``jax.value_and_grad(fn, argnums)(*args)``; ``stats`` an :class:`ExecStats`.

    Raises:
      InvalidPlanError: the plan is illegal for the graph.
      ExtractionError: the graph has no program, or ``args`` do not match it.
      PagingError: a transfer to or from the store failed.
    """
    prog = graph.program
    if prog is None:
        raise ExtractionError(f"graph {graph.name!r} has no program (it was not extracted)")
    events = plan.validate(graph)
    leaves, tree = jax.tree_util.tree_flatten(args)
    if tree != prog.in_tree or len(leaves) != prog.n_args:
        raise ExtractionError(f"arguments do not match the extracted structure {prog.in_tree}")
    if paging_store not in ("host", "file"):
        raise InvalidPlanError(f"paging_store must be 'host' or 'file', got {paging_store!r}")
    if paging not in ("async", "sync"):
        raise InvalidPlanError(f"paging must be 'async' or 'sync', got {paging!r}")
    args_flat = [jnp.asarray(x) if not isinstance(x, jax.Array) else x for x in leaves]

    n = graph.n
    sizes = graph.sizes
    has_paging = bool(((events.kind == PAGE_OUT) | (events.kind == PAGE_IN)).any())
    mode = paging if has_paging else "none"

    # program outputs: which (node, position) hold each flattened output
    out_loc: list[Any] = []
    node_has_out = np.zeros(n, dtype=bool)
    for r, av in zip(prog.out_refs, prog.out_avals):
        if isinstance(r, Lit):
            out_loc.append(("lit", np.full(av.shape, r.val, dtype=av.dtype)))
        elif r < prog.n_args:
            out_loc.append(("arg", r))
        elif r in prog.producer:
            i, p = prog.producer[r]
            out_loc.append(("node", i, p))
            node_has_out[i] = True
        else:  # a constant
            k = prog.const_ids.index(r)
            out_loc.append(("const", k))
    results: dict[tuple[int, int], np.ndarray] = {}
    out_ids_set = {r for r in prog.out_refs if isinstance(r, int)}

    live: dict[int, Any] = {}  # node -> tuple of device arrays, or a _Pending page-in
    store: dict[int, Future] = {}  # node -> the write of its latest page-out
    writes: dict[int, list[Future]] = {}  # node -> writes of its resident copy (wait before free)
    early: dict[int, Future] = {}  # page-out event index -> its write-behind
    behind = _write_behind(events) if mode == "async" else {}
    tmpdir = tempfile.mkdtemp(prefix="remat-page-") if paging_store == "file" and has_paging else None
    io = _Transfers(mode, graph, tmpdir)

    def resident(i: int, t: int) -> tuple:
        v = live[i]
        if isinstance(v, _Pending):
            v = live[i] = io.wait(v.future, "page-in", i, v.step)
        return v

    def harvest(i: int, t: int) -> None:
        if node_has_out[i] and i in live:
            for p, a in enumerate(resident(i, t)):
                if prog.node_outputs[i][p] in out_ids_set:
                    results[(i, p)] = np.array(a, copy=True)

    def drop(i: int, t: int) -> None:
        if i not in live:
            return
        harvest(i, t)
        for f in writes.pop(i, []):  # the store's copy must be complete before the device's dies
            io.wait(f, "page-out", i, t)
        _free(resident(i, t))
        del live[i]

    steps_l, nodes_l, meas_l, book_l = [], [], [], []
    runs = 0
    paged_out = paged_in = 0
    gc_was = gc.isenabled()
    gc.collect()
    gc.disable()
    base = _live_device_bytes() if measure else 0

    def sample(t: int, k: int) -> None:
        book = int(sum(int(sizes[i]) for i in live))
        steps_l.append(t)
        nodes_l.append(k)
        book_l.append(book)
        if measure:
            with io.lock:
                meas_l.append(_live_device_bytes() - base + io.reserved_bytes())
        else:
            meas_l.append(book)

    t0 = time.perf_counter()
    failed = True
    try:
        cols = (events.kind, events.step, events.node, events.creates)
        for e, (kind, t, i, allocates) in enumerate(zip(*(c.tolist() for c in cols))):
            if kind == COMPUTE:
                ins = []
                for v in prog.node_inputs[i]:
                    j, q = prog.producer[v]
                    if j not in live:
                        raise InvalidPlanError(
                            f"input {graph.nodes[j].name!r} is not resident", step=t, node=graph.nodes[i].name
                        )
                    ins.append(resident(j, t)[q])
                outs = prog.stage_fn(i)(args_flat, ins)
                # never alias an input or argument buffer: the node owns fresh outputs
                owned = {id(a) for a in ins} | {id(a) for a in args_flat}
                outs = tuple(jnp.copy(a) if id(a) in owned else a for a in outs)
                jax.block_until_ready(outs)
                live[i] = outs
                runs += 1
                for e_out in behind.get(e, ()):  # write-behind of a later page-out
                    early[e_out] = io.write(outs, f"e{e_out}_n{i}")
                    writes.setdefault(i, []).append(early[e_out])
                sample(t, i)
            elif kind == FREE:
                drop(i, t)
            elif kind == STEP:
                sample(t, -1)
            elif kind == PAGE_OUT:
                if i not in live:
                    raise InvalidPlanError(
                        "page-out of a value that is not resident", step=t, node=graph.nodes[i].name
                    )
                f = early.pop(e, None)
                if f is None:
                    f = io.write(resident(i, t), f"e{e}_n{i}")
                    writes.setdefault(i, []).append(f)
                store[i] = f
                paged_out += int(sizes[i])
            elif kind == PAGE_IN:
                if i not in store:
                    raise InvalidPlanError("page-in of a value never paged out", step=t, node=graph.nodes[i].name)
                if allocates:
                    live[i] = _Pending(io.read(i, store[i], int(sizes[i])), t)
                paged_in += int(sizes[i])
            else:  # ALLOC: only illegal plans lowered with strict=False have these
                msg = "value resident without being computed"
                raise InvalidPlanError(msg, step=t, node=graph.nodes[i].name)
        for i in list(live):
            harvest(i, events.num_steps - 1)
        failed = False
    finally:
        io.close()  # join the transfer threads before anything they hold is deleted
        for i in list(live):
            v = live.pop(i)
            if isinstance(v, _Pending):
                f = v.future
                v = f.result() if f.done() and not f.cancelled() and f.exception() is None else ()
            _free(v)
        if gc_was:
            gc.enable()
        if tmpdir is not None:
            import shutil

            shutil.rmtree(tmpdir, ignore_errors=True)
    if not failed and (err := io.first_error()) is not None:  # a transfer nobody waited for
        raise PagingError(f"a transfer failed: {type(err).__name__}: {err}") from err
    wall = time.perf_counter() - t0

    flat_out = []
    for loc in out_loc:
        if loc[0] == "lit":
            flat_out.append(jnp.asarray(loc[1]))
        elif loc[0] == "arg":
            flat_out.append(args_flat[loc[1]])
        elif loc[0] == "const":
            flat_out.append(jnp.asarray(prog.consts[loc[1]]))
        else:
            _, i, p = loc
            if (i, p) not in results:
                raise InvalidPlanError("a program output was never computed", node=graph.nodes[i].name)
            flat_out.append(jnp.asarray(results[(i, p)]))
    value, grads = jax.tree_util.tree_unflatten(prog.out_tree, flat_out)
    meas = np.array(meas_l, dtype=np.int64)
    book = np.array(book_l, dtype=np.int64)
    stats = ExecStats(
        peak_bytes=int(meas.max(initial=0)),
        peak_bytes_bookkeeping=int(book.max(initial=0)),
        bytes_paged=int(paged_out + paged_in),
        stage_runs=runs,
        wall_s=wall,
        timeline={
            "step": np.array(steps_l, dtype=np.int64),
            "node": np.array(nodes_l, dtype=np.int64),
            "live_bytes": meas,
            "bookkeeping_bytes": book,
        },
        paging=mode,
        page_wait_s=float(io.wait_s),
        bytes_paged_out=int(paged_out),
        bytes_paged_in=int(paged_in),
    )
    return value, grads, stats
