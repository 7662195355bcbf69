"""Op-by-op executor: run a plan's exact schedule stage by stage and measure live bytes.

The executor is an interpreter of the plan's event program (:func:`remat.events.lower`, the one
executable form of the semantics of :mod:`remat.plan` and :mod:`remat.schedule`); it decides
nothing about lifetimes itself.  Node granularity: all of a node's outputs live and die together.

* ``STEP``: a *step-start* sample is taken (exactly the outputs of ``S[t]`` are resident).
* ``PAGE_OUT`` (POET semantics, at the start of the step): the output is copied to the store
  (numpy on the host, or ``.npy`` files with ``paging_store="file"``); its device copy then
  lives and dies by the ordinary events.
* ``COMPUTE k``: the stage runs on its resident inputs and its fresh outputs become resident; a
  sample is taken (outputs exist, inputs still held).
* ``FREE i``: node i's outputs are dropped (a recomputation is preceded by the free of the copy
  it replaces).
* ``PAGE_IN`` (end of the step): when the event allocates, the stored value is copied back to
  the device (it counts from the next step's start); the bytes moved count in ``bytes_paged``
  either way.

Freeing drops the executor's references and calls ``.delete()`` on the device arrays.  Values that
are program outputs (the loss, gradients) are copied to host memory when their node's outputs are
freed (and at the end), so the returned gradients do not count as live device memory after their
node's outputs die, exactly as in the simulator.

Peak bytes are measured two ways: bookkeeping (sum of ``out_bytes`` of resident nodes, the
simulator's quantity) and measured (``sum(a.nbytes for a in jax.live_arrays())`` minus the value
at entry, after the arguments are on the device).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from remat.errors import ExtractionError, InvalidPlanError
from remat.events import COMPUTE, FREE, PAGE_IN, PAGE_OUT, STEP
from remat.extraction import Lit
from remat.graph import Graph
from remat.plan import Plan

__all__ = ["execute", "ExecStats"]


@dataclasses.dataclass(frozen=True)
class ExecStats:
    """What an execution did.

    Attributes:
      peak_bytes: measured peak of device bytes of live arrays above the entry baseline (bytes).
      peak_bytes_bookkeeping: peak of the sum of ``out_bytes`` of resident nodes (bytes).
      bytes_paged: bytes copied out plus bytes copied back in (paging plans), else 0.
      stage_runs: number of node executions (recomputations included).
      wall_s: wall-clock seconds of the whole schedule (compilation of stages included).
      timeline: ``dict`` of equal-length arrays: ``step``, ``node`` (``-1`` for a step-start
        sample), ``live_bytes`` (measured) and ``bookkeeping_bytes``.
    """

    peak_bytes: int
    peak_bytes_bookkeeping: int
    bytes_paged: int
    stage_runs: int
    wall_s: float
    timeline: dict = dataclasses.field(default_factory=dict, repr=False)


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


def execute(
    graph: Graph,
    plan: Plan,
    *args: Any,
    paging_store: Literal["host", "file"] = "host",
    measure: bool = True,
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

    Returns:
      ``(value, grads, stats)``: ``value, grads`` shaped like
      ``jax.value_and_grad(fn, argnums)(*args)``; ``stats`` an :class:`ExecStats`.

    Raises:
      InvalidPlanError: the plan is illegal for the graph.
      ExtractionError: the graph has no program, or ``args`` do not match it.
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
    args_flat = [jnp.asarray(x) if not isinstance(x, jax.Array) else x for x in leaves]

    n = graph.n
    sizes = graph.sizes

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

    live: dict[int, tuple] = {}
    store: dict[int, Any] = {}
    tmpdir = tempfile.mkdtemp(prefix="remat-page-") if paging_store == "file" else None

    def harvest(i: int) -> None:
        if node_has_out[i] and i in live:
            for p, a in enumerate(live[i]):
                if prog.node_outputs[i][p] in out_ids_set:
                    results[(i, p)] = np.array(a, copy=True)

    out_ids_set = {r for r in prog.out_refs if isinstance(r, int)}

    def drop(i: int) -> None:
        harvest(i)
        arrs = live.pop(i, None)
        if arrs is not None:
            _free(arrs)

    steps_l, nodes_l, meas_l, book_l = [], [], [], []
    runs = 0
    paged = 0
    gc_was = gc.isenabled()
    gc.collect()
    gc.disable()
    base = _live_device_bytes() if measure else 0

    def sample(t: int, k: int) -> None:
        book = int(sum(int(sizes[i]) for i in live))
        steps_l.append(t)
        nodes_l.append(k)
        book_l.append(book)
        meas_l.append(_live_device_bytes() - base if measure else book)

    t0 = time.perf_counter()
    try:
        cols = (events.kind, events.step, events.node, events.creates)
        for kind, t, i, allocates in zip(*(c.tolist() for c in cols)):
            if kind == COMPUTE:
                ins = []
                for v in prog.node_inputs[i]:
                    j, q = prog.producer[v]
                    if j not in live:
                        raise InvalidPlanError(
                            f"input {graph.nodes[j].name!r} is not resident", step=t, node=graph.nodes[i].name
                        )
                    ins.append(live[j][q])
                outs = prog.stage_fn(i)(args_flat, ins)
                # never alias an input or argument buffer: the node owns fresh outputs
                owned = {id(a) for a in ins} | {id(a) for a in args_flat}
                outs = tuple(jnp.copy(a) if id(a) in owned else a for a in outs)
                jax.block_until_ready(outs)
                live[i] = outs
                runs += 1
                sample(t, i)
            elif kind == FREE:
                drop(i)
            elif kind == STEP:
                sample(t, -1)
            elif kind == PAGE_OUT:
                if i not in live:
                    raise InvalidPlanError(
                        "page-out of a value that is not resident", step=t, node=graph.nodes[i].name
                    )
                store[i] = _store(live[i], tmpdir, f"s{t}_n{i}")
                paged += int(sizes[i])
            elif kind == PAGE_IN:
                if i not in store:
                    raise InvalidPlanError("page-in of a value never paged out", step=t, node=graph.nodes[i].name)
                if allocates:
                    live[i] = tuple(jax.device_put(d) for d in _load(store[i]))
                paged += int(sizes[i])
            else:  # ALLOC: only illegal plans lowered with strict=False have these
                msg = "value resident without being computed"
                raise InvalidPlanError(msg, step=t, node=graph.nodes[i].name)
        for i in list(live):
            harvest(i)
    finally:
        for i in list(live):
            _free(live.pop(i))
        if gc_was:
            gc.enable()
        if tmpdir is not None:
            import shutil

            shutil.rmtree(tmpdir, ignore_errors=True)
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
        bytes_paged=int(paged),
        stage_runs=runs,
        wall_s=wall,
        timeline={
            "step": np.array(steps_l, dtype=np.int64),
            "node": np.array(nodes_l, dtype=np.int64),
            "live_bytes": meas,
            "bookkeeping_bytes": book,
        },
    )
    return value, grads, stats
