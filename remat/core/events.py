"""The event program: a plan's execution lowered to one ordered list of memory events.

This module is the single executable form of the memory semantics documented in
:mod:`remat.core.plan` and :mod:`remat.core.schedule`.  :func:`remat.core.schedule.replay` is a fold over its
events, :meth:`remat.Plan.validate` and :func:`remat.simulate` go through it, the executor
(:func:`remat.execute`) interprets it, and :mod:`remat.core.layout` reads allocation lifetimes off it.
Nothing else decides when a value dies.  It imports numpy only, so solvers can call
:func:`lower_arrays` on raw arrays without a :class:`~remat.Graph`.

Events of step ``t``, in this order (nodes of one kind in index order):

1. ``ALLOC`` (illegal plans under ``strict=False`` only): a value of ``S[t]`` that nothing made
   resident appears, so that the live set entering step ``t`` is exactly ``S[t]``.
2. ``STEP``: step ``t`` starts; ``live`` is the step-start bytes ``S[t] @ sizes``.
3. ``PAGE_OUT`` of each ``page_out[t, i]`` (copies to secondary storage, device bytes unchanged).
4. ``FREE`` of every resident value that no node of step ``t`` reads or recomputes and that
   ``S[t+1]`` does not keep.
5. For each node ``k`` of ``R[t]`` in index order: ``FREE k`` if ``k`` is still resident (a
   recomputation replaces the old copy), then ``COMPUTE k`` (allocates ``sizes[k]``; ``live`` is
   Checkmate's ``U[t, k]``: inputs, output and everything held), then ``FREE`` of every value
   whose last reader in this step is ``k`` (or ``k`` itself when nothing reads it) unless
   ``S[t+1]`` keeps it.
6. ``PAGE_IN`` of each ``page_in[t, i]``: it allocates when ``S[t+1, i]`` keeps the value and it
   is not already resident (otherwise it is a transfer without a device allocation).

A value resident at a step start stays until its last reader *or its recomputation*, whichever
is later (the replay's interval rule).  The last step frees everything.  Bytes are ``int64``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from remat.core.errors import InvalidGraphError, InvalidPlanError

__all__ = [
    "COMPUTE",
    "FREE",
    "STEP",
    "PAGE_OUT",
    "PAGE_IN",
    "ALLOC",
    "KIND_NAMES",
    "Events",
    "lower",
    "lower_arrays",
]

COMPUTE, FREE, STEP, PAGE_OUT, PAGE_IN, ALLOC = range(6)
KIND_NAMES = ("compute", "free", "step", "page_out", "page_in", "alloc")


@dataclasses.dataclass(frozen=True, eq=False)
class Events:
    """A plan's execution as parallel arrays, one entry per event, in execution order.

    Attributes:
      kind: ``int8[E]`` event kind (``COMPUTE``, ``FREE``, ``STEP``, ``PAGE_OUT``, ``PAGE_IN``,
        ``ALLOC``; names in ``KIND_NAMES``).
      step: ``int64[E]`` step (row of ``R``/``S``) the event belongs to.
      node: ``int64[E]`` node whose output the event concerns; ``-1`` for ``STEP``.
      bytes: ``int64[E]`` bytes of that output (allocated, freed or transferred); 0 for ``STEP``.
      live: ``int64[E]`` device bytes resident after the event.  For ``COMPUTE`` that is the bytes
        live while the node runs (its inputs and output included); for ``STEP`` the step-start
        bytes.
      creates: ``bool[E]``: the event allocates (``COMPUTE``, ``ALLOC``, and a ``PAGE_IN`` that
        brings a value back to the device).
      num_steps: ``T``, the number of steps.
      n: number of nodes.
    """

    kind: np.ndarray
    step: np.ndarray
    node: np.ndarray
    bytes: np.ndarray
    live: np.ndarray
    creates: np.ndarray
    num_steps: int
    n: int

    def __len__(self) -> int:
        return int(len(self.kind))

    @property
    def peak_bytes(self) -> int:
        """Peak device bytes (max of ``live``; 0 for an empty program)."""
        return int(self.live.max(initial=0))

    @cached_property
    def alloc(self) -> np.ndarray:
        """``int64[E]``: allocation id created (``creates``) or released (``FREE``) by each event,
        ``-1`` otherwise.  Ids count allocations in the order they are made,
        ``0 .. num_allocs - 1``; a value computed k times has k ids."""
        return _alloc_ids(self.kind, self.node, self.creates)

    @property
    def num_allocs(self) -> int:
        """Number of allocations (ids ``0 .. num_allocs - 1``)."""
        return int(self.creates.sum())

    @property
    def step_start_bytes(self) -> np.ndarray:
        """``int64[T]`` bytes resident entering each step."""
        return self.live[self.kind == STEP]

    @property
    def step_peak_bytes(self) -> np.ndarray:
        """``int64[T]`` peak bytes of each step: the max of its step-start bytes and the bytes
        live while each of its nodes runs (Checkmate's per-step memory); ``max`` is
        :attr:`peak_bytes`."""
        peak = np.zeros(self.num_steps, dtype=np.int64)
        at = (self.kind == STEP) | (self.kind == COMPUTE)
        np.maximum.at(peak, self.step[at], self.live[at])
        return peak

    def describe(self, names: Sequence[Any] | None = None) -> list[str]:
        """One readable line per event (for debugging and docs), e.g.
        ``"t=0 compute x +8 B -> live 8 B (alloc 0)"``."""
        lines = []
        for k, t, i, b, lv, a in zip(
            self.kind.tolist(), self.step.tolist(), self.node.tolist(), self.bytes.tolist(),
            self.live.tolist(), self.alloc.tolist(),
        ):
            who = "" if i < 0 else f" {names[i] if names is not None else i}"
            sign = "-" if k == FREE else "+" if a >= 0 else ""
            what = "" if k == STEP else f" {sign}{b} B"
            tag = f" (alloc {a})" if a >= 0 else ""
            lines.append(f"t={t} {KIND_NAMES[k]}{who}{what} -> live {lv} B{tag}")
        return lines


def lower(graph: Any, plan: Any, *, strict: bool = True) -> Events:
    """Lower ``plan`` on ``graph`` to its event program.

    Args:
      graph: a :class:`remat.Graph` (its ``sizes``, ``edge_array`` and node names are used).
      plan: a :class:`remat.Plan`.
      strict: raise :class:`InvalidPlanError` naming the step and node of the first illegal
        action (missing input, carrying a value that is not resident, paging rules); with
        ``strict=False`` an illegal plan is lowered as if legal (missing inputs are not read,
        values claimed resident appear as ``ALLOC`` events).
    """
    if plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    return lower_arrays(
        graph.sizes,
        graph.edge_array,
        plan.R,
        plan.S,
        page_in=plan.page_in,
        page_out=plan.page_out,
        S_aux=plan.S_aux,
        strict=strict,
        names=_NodeNames(graph.nodes),
    )


class _NodeNames:
    """Lazy ``names[i] -> graph.nodes[i].name`` (only looked up to word an error)."""

    def __init__(self, nodes: Sequence[Any]):
        self._nodes = nodes

    def __getitem__(self, i: int) -> str:
        return self._nodes[i].name


def lower_arrays(
    sizes: np.ndarray,
    edges: np.ndarray,
    R: np.ndarray,
    S: np.ndarray,
    *,
    page_in: np.ndarray | None = None,
    page_out: np.ndarray | None = None,
    S_aux: np.ndarray | None = None,
    strict: bool = True,
    names: Sequence[Any] | Callable[[int], Any] | None = None,
) -> Events:
    """Lower raw schedule arrays to an :class:`Events` program (no Graph needed).

    Args:
      sizes: ``int64[n]`` output bytes per node.
      edges: ``int[m, 2]`` data edges ``(src, dst)`` with ``src < dst`` (topological order).
      R, S: ``bool[T, n]`` compute and retain matrices (see :mod:`remat.core.plan`).
      page_in, page_out, S_aux: optional ``bool[T, n]`` POET paging matrices; without ``S_aux``
        storage holds every value paged out in an earlier step.
      strict: raise :class:`InvalidPlanError` on an illegal schedule (see :func:`lower`).
      names: node names for error messages (a sequence or a function of the index); node
        indices when omitted.

    Returns:
      The :class:`Events` program.
    """
    R = np.asarray(R, dtype=bool)
    S = np.asarray(S, dtype=bool)
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    _check_arrays(sizes, e, R, S)
    T, n = R.shape
    src, dst = e[:, 0], e[:, 1]
    p_in = None if page_in is None else np.asarray(page_in, dtype=bool)
    p_out = None if page_out is None else np.asarray(page_out, dtype=bool)
    if strict:
        name = _namer(names)
        if T and S[0].any():
            i = int(np.flatnonzero(S[0])[0])
            msg = "an output is resident before anything ran"
            raise InvalidPlanError(msg, step=0, node=name(i))
        if p_in is not None or p_out is not None or S_aux is not None:
            zeros = np.zeros((T, n), dtype=bool)
            p_in_, p_out_ = (zeros if p is None else p for p in (p_in, p_out))
            aux = _storage(p_out_) if S_aux is None else np.asarray(S_aux, dtype=bool)
            _check_paging(name, S, aux, p_in_, p_out_)

    alive = S | R
    ending = alive.copy()  # alive in step t and not kept into t+1: the copy ends in step t
    ending[:-1] &= ~S[1:]
    # values of S[t] that nothing made resident: S[0], or S[t+1] not live in step t nor paged in
    phantom = S.copy()
    phantom[1:] &= ~alive[:-1]
    if p_in is not None:
        phantom[1:] &= ~p_in[:-1]
    computes = _nz(R)
    if strict:
        _check_inputs_and_carries(name, R, S, phantom, src, dst, computes)

    W = 3 * n + 5  # sub-slots of one step; key = (t * W + slot) * n' + node
    nn = max(n, 1)
    parts: list[tuple[np.ndarray, ...]] = []  # (key, kind, step, node, delta, creates)

    def add(kind: int, t: np.ndarray, i: np.ndarray, slot: Any, delta: Any, creates: Any) -> None:
        m = len(t)
        key = (t * W + slot) * nn + i
        node = i if kind != STEP else np.full(m, -1, dtype=np.int64)
        parts.append((key, np.full(m, kind, np.int8), t, node,
                      np.broadcast_to(delta, m), np.broadcast_to(creates, m)))

    tt, ii = _nz(phantom)
    add(ALLOC, tt, ii, 0, sizes[ii], True)
    add(STEP, np.arange(T, dtype=np.int64), np.zeros(T, dtype=np.int64), 1, 0, False)
    if p_out is not None:
        tt, ii = _nz(p_out)
        add(PAGE_OUT, tt, ii, 2, 0, False)
    tt, ii = _nz(S & R)  # a recomputation replaces the resident copy
    add(FREE, tt, ii, 4 + 3 * ii, -sizes[ii], False)
    tt, ii = computes
    add(COMPUTE, tt, ii, 5 + 3 * ii, sizes[ii], True)
    tt, ii = _nz(ending)
    end = np.maximum(np.where(R[tt, ii], ii, -1), _last_reader(R, tt, ii, src, dst, n))
    add(FREE, tt, ii, np.where(end < 0, 3, 6 + 3 * end), -sizes[ii], False)
    if p_in is not None:  # a page-in allocates when kept into step t+1 and not resident
        tt, ii = _nz(p_in)
        allocates = (tt + 1 < T) & S[np.minimum(tt + 1, T - 1), ii] & ~alive[tt, ii]
        add(PAGE_IN, tt, ii, 3 * n + 4, np.where(allocates, sizes[ii], 0), allocates)

    key, kind, step, node, delta, creates = (np.concatenate(c) for c in zip(*parts))
    order = np.argsort(key, kind="stable")
    kind, step, node, creates = kind[order], step[order], node[order], creates[order]
    live = np.cumsum(delta[order])
    nbytes = np.zeros(len(node), np.int64)
    if n:
        nbytes = np.where(node >= 0, sizes[np.maximum(node, 0)], 0)
    return Events(
        kind=kind, step=step, node=node, bytes=nbytes, live=live, creates=creates, num_steps=T, n=n
    )


def _check_arrays(sizes: np.ndarray, e: np.ndarray, R: np.ndarray, S: np.ndarray) -> None:
    """Typed errors for arrays that do not describe a schedule of one graph."""
    if R.ndim != 2 or R.shape != S.shape:
        raise InvalidPlanError(f"R {R.shape} and S {S.shape} must be 2-D of one shape")
    n = len(sizes)
    if R.shape[1] != n:
        raise InvalidPlanError(f"schedule has {R.shape[1]} columns, the graph {n} nodes")
    if (sizes < 0).any():
        raise InvalidGraphError("negative output size", node=int(np.flatnonzero(sizes < 0)[0]))
    if len(e) and (e.min() < 0 or e.max() >= n):
        raise InvalidGraphError(f"edge endpoint outside 0..{n - 1}")


def _nz(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-major ``(t, i)`` int64 indices of a ``bool[T, n]`` mask (``flatnonzero`` is several
    times faster than 2-D ``nonzero``)."""
    flat = np.flatnonzero(mask) if mask.any() else np.zeros(0, dtype=np.int64)
    t, i = np.divmod(flat, max(mask.shape[1], 1))
    return t, i


def _last_reader(
    R: np.ndarray, tt: np.ndarray, ii: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int
) -> np.ndarray:
    """``int64[len(tt)]``: for each pair ``(t, i)``, the largest node ``u`` of step ``t``
    (``R[t, u]``) that reads ``i``, or -1.  Work is proportional to the pairs' out-degrees."""
    out = np.full(len(tt), -1, dtype=np.int64)
    if len(src) and len(tt):
        pair, eid = _edges_of(src, n, ii)
        u = dst[eid]
        np.maximum.at(out, pair, np.where(R[tt[pair], u], u, -1))
    return out


def _edges_of(end: np.ndarray, n: int, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every edge whose ``end`` (its ``src`` or ``dst`` column) is in ``nodes``, via a CSR:
    ``(k, eid)`` with ``nodes[k]`` the matching node and ``eid`` the edge id, grouped by ``k``
    and in edge order within a group."""
    eids = np.argsort(end, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(end, minlength=n), out=indptr[1:])
    deg = indptr[nodes + 1] - indptr[nodes]
    k = np.repeat(np.arange(len(nodes), dtype=np.int64), deg)
    first = np.zeros(len(nodes), dtype=np.int64)
    np.cumsum(deg[:-1], out=first[1:])
    return k, eids[indptr[nodes][k] + np.arange(len(k)) - first[k]]


def _alloc_ids(kind: np.ndarray, node: np.ndarray, creates: np.ndarray) -> np.ndarray:
    """Allocation ids: creating events numbered in order; each ``FREE`` gets the id of the most
    recent creating event of the same node (every free follows its allocation)."""
    E = len(kind)
    alloc = np.full(E, -1, dtype=np.int64)
    alloc[creates] = np.arange(int(creates.sum()), dtype=np.int64)
    frees = kind == FREE
    if not frees.any():
        return alloc
    # group events by node (stable: execution order within a node), forward-fill the position of
    # the last creating event; a FREE's own creator precedes it inside its group
    by_node = np.argsort(node, kind="stable")
    pos = np.where(creates[by_node], np.arange(E), -1)
    last = np.maximum.accumulate(pos)
    f = frees[by_node]
    src_pos = last[f]
    if (src_pos < 0).any():  # unreachable by construction
        raise AssertionError("free without an allocation")
    alloc[by_node[f]] = alloc[by_node[src_pos]]
    return alloc


def _namer(names: Sequence[Any] | Callable[[int], Any] | None) -> Callable[[int], Any]:
    if names is None:
        return int
    if callable(names) and not hasattr(names, "__getitem__"):
        return names
    return names.__getitem__


def _storage(page_out: np.ndarray) -> np.ndarray:
    """Default ``S_aux``: storage holds everything paged out in an earlier step."""
    aux = np.zeros_like(page_out)
    if len(page_out) > 1:
        aux[1:] = np.logical_or.accumulate(page_out, axis=0)[:-1]
    return aux


def _check_paging(name: Callable[[int], Any], S, S_aux, page_in, page_out) -> None:
    """Raise :class:`InvalidPlanError` unless the paging matrices obey POET's rules:
    ``page_out <= S``, ``page_in <= S_aux``, ``S_aux[0] = 0``,
    ``S_aux[t+1] <= S_aux[t] + page_out[t]`` (all ``bool[T, n]``)."""

    def fail(mask, msg, shift=0):
        t, i = (int(v[0]) for v in np.nonzero(mask))
        raise InvalidPlanError(msg, step=t + shift, node=name(i))

    if (page_out & ~S).any():
        fail(page_out & ~S, "page-out of a value not resident at the step start")
    if (page_in & ~S_aux).any():
        fail(page_in & ~S_aux, "page-in of a value not in secondary storage")
    if len(S_aux) and S_aux[0].any():
        fail(S_aux[:1], "a value is in secondary storage before anything ran")
    grow = S_aux[1:] & ~(S_aux[:-1] | page_out[:-1])
    if grow.any():
        fail(grow, "value in secondary storage without a page-out", shift=1)


def _check_inputs_and_carries(name, R, S, phantom, src, dst, computes) -> None:
    """Raise for the first illegal step, in the order a step-by-step run meets them: in step
    ``t``, a computed node whose input is neither resident nor computed earlier in the step
    (first edge in ``edges`` order), then a value carried into step ``t+1`` that is not resident
    (nor paged in) at the end of step ``t``."""
    T = len(R)
    t_miss = t_carry = T
    tc, kc = computes
    if len(src) and len(tc):
        # an input of a computed node (t, k) is fine when resident or computed in the step
        # (src < dst, so computed means computed earlier)
        ok_node = S | R
        k, eid = _edges_of(dst, R.shape[1], kc)
        bad = ~ok_node[tc[k], src[eid]]
        if bad.any():
            tb, eb = tc[k][bad], eid[bad]
            t_miss = int(tb.min())
            e0 = int(eb[tb == t_miss].min())
    if len(phantom) > 1 and phantom[1:].any():
        t1, i1 = (int(v[0]) for v in np.nonzero(phantom[1:]))
        t_carry = t1  # found while finishing step t1, reported at step t1 + 1
    if t_miss < T and t_miss <= t_carry:
        raise InvalidPlanError(
            f"input {name(int(src[e0]))!r} is not resident", step=t_miss, node=name(int(dst[e0]))
        )
    if t_carry < T:
        msg = "output carried into the next step without being resident"
        raise InvalidPlanError(msg, step=t_carry + 1, node=name(i1))

