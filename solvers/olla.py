"""OLLA (Steiner et al., "Optimizing the Lifetime and Location of Arrays"): the two ILPs.

Length: the node-order ILP and the address ILP share this module's conventions (bytes scaled
to solver units, warm start always kept as the incumbent, one status vocabulary); together
they are the paper's two-phase split (§4.4, eqs. 14 and 15) and are kept side by side.

**Order ILP (eq. 14).**  One node per step, ``T = n'`` steps (``n'`` the nodes left after the
reduction below): the memory at step ``t`` is the project's event semantics (Checkmate's
``U``, :mod:`remat.core.events`): the outputs created earlier that a node at step ``>= t`` reads,
plus the output created at ``t``.  Decision variables (all in ``[0, 1]``):

* ``D[v, t]`` (binary; the compute-time variable): node ``v`` has run at or before step ``t``.
  The paper's creation variable is ``C[v, t] = D[v, t] - D[v, t-1]``.
* ``L[u, t]`` (continuous, only where needed): tensor ``u`` is resident at step ``t``; the
  paper's ``C[u, t] + P[u, t]`` (eq. 13's ``live``).

Rows: ``sum_v D[v, t] = t + 1`` (one node per step, eq. 3), ``D[v, t-1] <= D[v, t]``,
precedence ``D[w, t] <= D[u, t-1]`` for the transitive reduction's edges ``(u, w)`` (eq. 4 in
cumulative form: inputs strictly earlier), and liveness ``L[u, t] >= D[u, t] - D[w, t-1]`` for
each *maximal* reader ``w`` of ``u`` (a reader that no other reader of ``u`` depends on; the
others are dominated), eqs. 2/4.  Memory (eq. 13): ``sum_u S_u L[u, t] <= peak``.  When ``u``
has a single maximal reader ``w`` (or none: ``w = u``), ``D[u, t] - D[w, t-1]`` is exactly its
liveness (it is >= 0 by precedence), so it enters the memory row directly and ``u`` gets no
``L`` column.  Objective: ``min peak``.

Bounding lifetimes (§4.1, eqs. 10-12) with reachability: a node runs in
``[ASAP, ALAP] = [|ancestors|, N - 1 - |descendants|]`` (exact for one node per step, tighter
than the paper's longest-path levels); ``D`` is a constant outside, ``L`` is 0 outside
``MUL(u) = [ASAP(u), max ALAP(readers)]`` and 1 on ``PRES(u) = [ALAP(u), max ASAP(readers)]``.
Exact reduction: a node without inputs and with a single reader (constants, broadcasts) is
merged into its reader and decoded just before it (running it any earlier only lengthens its
lifetime; the step before the reader peaks no higher than the reader's).  Lower bound: the
*forced-live* bound, the max over nodes ``x`` of the bytes resident whenever ``x`` runs in any
order (``x``'s output and every output ``u`` that ``x`` depends on and that has a reader at or
after ``x``); it bounds ``peak`` in the model and is reported with HiGHS's bound.

Scaling.  The exact model is one ILP (HiGHS proves optimality on graphs of a few hundred nodes
at most, see ``experiments/figures/olla_layout.py``).  Larger graphs (equation-level training
graphs, thousands of nodes) use a large-neighbourhood search of exact sub-ILPs: the nodes whose
ASAP/ALAP window covers the current peak step are freed, the others keep their relative order
through size-0 *control edges* (the paper's device of §4.3, which caps ALAP windows), and each
improvement re-centres the search on the new peak.  Deviation from the paper: one node per step
(``T = n``) instead of concurrent steps (the public code's ``T ~ 1.01 x longest path``), so the
ILP's peak is exactly the replayed peak of the decoded plan.

**Address ILP (eq. 15)** with lifetimes fixed: offsets ``A_i in [0, UB - S_i]``, one binary
``z_ij`` per pair of allocations whose lifetimes overlap (pairs that never overlap get none:
§4.2's pruning is exact here because lifetimes are known), eqs. 7a/7b with one binary (the
public code's form for pairs that always overlap)::

    A_i + S_i - A_j <= (1 - z_ij) UB        A_j + S_j - A_i <= z_ij UB        A_i + S_i <= peak

``min peak`` (eq. 8), ``peak >= `` the max-live lower bound, ``UB`` the warm start's arena.
Offsets are decoded by compaction in the solution's address order (each allocation on top of
the overlapping ones below it), which is integral and never above the ILP's own offsets.

Units: sizes, offsets, peaks and bounds in bytes (``int64``); times in seconds.  The MILPs are
built as sparse COO blocks on :class:`solvers.milp.MilpModel` and solved by HiGHS.  No jax.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from remat.core.errors import InvalidOptionError, SolverTimeoutError
from solvers.milp import INF, MilpModel
from solvers.order_search import greedy_order
from solvers.orders import interval_sweep, order_peak, order_profile

__all__ = [
    "OrderSolution",
    "AddressSolution",
    "order_peak",  # defined in solvers.orders
    "solve_order",
    "overlapping_pairs",
    "solve_addresses",
]


# --------------------------------------------------------------------------------- order phase
@dataclasses.dataclass(frozen=True, eq=False)
class OrderSolution:
    """Result of :func:`solve_order`.

    Attributes:
      order: ``int64[n]`` node indices in execution order (a topological order).
      peak_bytes: peak resident bytes of ``order`` (eq. 13, recomputed exactly).
      warm_peak_bytes: peak of the given warm order (the program's order by default), before
        any greedy start replaced it.
      lower_bound: proven lower bound on the peak of any order, bytes.
      status: ``"optimal"`` (proven), ``"time_limit"`` (incumbent at the limit) or
        ``"feasible"`` (a local optimum of the neighbourhood search, or stopped otherwise).
      gap: ``(peak - lower_bound) / peak``.
      solve_time_s, build_time_s: seconds in HiGHS and in building the model.
      num_vars, num_binaries, num_rows: model size (0 when no model was needed).
      message: the solver's status text or why no model was solved.
    """

    order: np.ndarray
    peak_bytes: int
    warm_peak_bytes: int
    lower_bound: int
    status: str
    gap: float
    solve_time_s: float
    build_time_s: float
    num_vars: int = 0
    num_binaries: int = 0
    num_rows: int = 0
    message: str = ""


def _spans(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(k, t)``: every ``t`` in the inclusive range ``[lo[k], hi[k]]``, for every ``k``."""
    lo = np.asarray(lo, dtype=np.int64)
    cnt = np.maximum(np.asarray(hi, dtype=np.int64) - lo + 1, 0)
    k = np.repeat(np.arange(len(lo), dtype=np.int64), cnt)
    first = np.cumsum(cnt) - cnt
    return k, lo[k] + np.arange(int(cnt.sum()), dtype=np.int64) - first[k]


@dataclasses.dataclass(frozen=True, eq=False)
class _Reduced:
    """The order problem after merging input-less single-reader nodes into their reader, nodes
    relabelled ``0..N-1`` in warm order (a topological order of data and control edges)."""

    keep: np.ndarray  # int64[N] original index of each reduced node
    sizes: np.ndarray  # int64[N] output bytes
    extra: np.ndarray  # int64[N] bytes of merged nodes live at the node's own step
    merged: list[list[int]]  # merged[k]: original nodes decoded just before reduced node k
    preds: list[list[int]]  # data predecessors (reduced indices)
    succs: list[list[int]]  # data readers
    cpreds: list[list[int]]  # data and control predecessors
    anc: list[int]  # ancestors (data and control) as Python-int bitsets
    desc: list[int]  # descendants
    a: np.ndarray  # int64[N] ASAP step: |ancestors|
    b: np.ndarray  # int64[N] ALAP step: N - 1 - |descendants|


def _adjacency(n: int, edges: np.ndarray) -> tuple[list[list[int]], list[list[int]]]:
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges.tolist():
        preds[d].append(s)
        succs[s].append(d)
    return preds, succs


def _mergeable(preds: list[list[int]], succs: list[list[int]]) -> np.ndarray:
    """``int64[n]``: the single reader of each input-less single-reader node, else -1."""
    return np.array([s[0] if not p and len(s) == 1 else -1 for p, s in zip(preds, succs)],
                    dtype=np.int64)


def _reduce(sizes: np.ndarray, preds: list[list[int]], succs: list[list[int]], warm: np.ndarray,
            control: np.ndarray | None = None) -> _Reduced:
    n = len(sizes)
    host = _mergeable(preds, succs)
    keep = warm[host[warm] < 0]
    N = len(keep)
    new = np.full(n, -1, dtype=np.int64)
    new[keep] = np.arange(N)
    extra = np.zeros(N, dtype=np.int64)
    merged: list[list[int]] = [[] for _ in range(N)]
    for v in warm[host[warm] >= 0].tolist():
        extra[new[host[v]]] += sizes[v]
        merged[new[host[v]]].append(v)
    rp = [[int(new[p]) for p in preds[v] if new[p] >= 0] for v in keep.tolist()]
    rs = [[int(new[s]) for s in succs[v]] for v in keep.tolist()]
    cp = [list(p) for p in rp]
    rsc = [list(s) for s in rs]
    if control is not None:
        for s, d in new[np.asarray(control, dtype=np.int64).reshape(-1, 2)].tolist():
            if s >= 0 and d >= 0:
                cp[d].append(s)
                rsc[s].append(d)
    anc = [0] * N
    for v in range(N):
        x = 0
        for p in cp[v]:
            x |= anc[p] | (1 << p)
        anc[v] = x
    desc = [0] * N
    for v in range(N - 1, -1, -1):
        x = 0
        for s in rsc[v]:
            x |= desc[s] | (1 << s)
        desc[v] = x
    a = np.array([x.bit_count() for x in anc], dtype=np.int64)
    b = N - 1 - np.array([x.bit_count() for x in desc], dtype=np.int64)
    return _Reduced(keep, sizes[keep], extra, merged, rp, rs, cp, anc, desc, a, b)


def _bits(x: int, N: int) -> np.ndarray:
    """``bool[N]`` of a Python-int bitset."""
    raw = np.frombuffer(x.to_bytes((N + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:N].astype(bool)


def _forced_live(red: _Reduced) -> np.ndarray:
    """``int64[N]``: bytes resident whenever each node runs, in every order the (data and
    control) edges allow: its own output and merged inputs, and every output ``u`` it depends
    on with a reader at or after it (``x`` in ``desc(u)`` and an ancestor-or-self of a reader).
    Its max is a lower bound on the peak (the frontier bound is the special case ``u`` an
    input)."""
    N = len(red.keep)
    out = (red.sizes + red.extra).astype(np.int64)
    for u in range(N):
        if not red.succs[u] or red.sizes[u] == 0:
            continue
        before = 0
        for w in red.succs[u]:
            before |= red.anc[w] | (1 << w)
        m = red.desc[u] & before
        if m:
            out[_bits(m, N)] += red.sizes[u]
    return out


def solve_order(
    sizes: Sequence[int],
    edges: np.ndarray,
    *,
    warm_order: Sequence[int] | None = None,
    time_limit: float = 60.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    method: str = "auto",
    max_binaries: int = 3000,
    release: int = 16,
    reach: int = 32,
    control_edges: np.ndarray | None = None,
    heuristic_restarts: int = 32,
    target_peak: int | None = None,
    max_subproblems: int | None = None,
    log: bool = False,
) -> OrderSolution:
    """Minimise the peak resident bytes over the topological orders of a DAG (eq. 14).

    Args:
      sizes: ``int64[n]`` output bytes per node (one output tensor per node).
      edges: ``int[m, 2]`` data edges ``(src, dst)``.
      warm_order: the program's order (a topological order; default ``0..n-1``): the warm start
        and the incumbent that is returned when nothing better is found.
      time_limit: seconds for building and solving together.
      mip_gap: relative gap at which HiGHS stops.
      threads: HiGHS threads (``None``: its default).
      method: ``"exact"`` (one ILP over every order), ``"lns"`` (repeated ILPs over a
        neighbourhood: ``release`` nodes whose ASAP/ALAP window covers the peak step are free,
        the others keep their relative order through size-0 control edges, §4.3's device; a
        neighbourhood that cannot improve is doubled; the result is a local optimum, status
        ``"feasible"``), or ``"auto"`` (exact when the model has at most ``max_binaries``
        binaries, else LNS).
      max_binaries: see ``method``.
      release: nodes freed in the first LNS neighbourhood.
      reach: steps past the peak (and their own position) they may move in it.
      control_edges: ``int[k, 2]`` extra precedence pairs (no memory), e.g. OLLA's early weight
        update edges; the warm order must respect them.
      heuristic_restarts: randomised greedy list schedules tried first
        (:func:`solvers.order_search.greedy_order`); the lowest-peak one replaces the warm
        order as the incumbent when it peaks lower (``0``: the warm order only).  On the
        published n = 250 random layered DAG the program's order peaks at 146 840 B and the
        greedy at 115 180 B (0.1 s); 60 s of LNS reach 109 810 B from the program's order and
        106 410 B from the greedy one (a local optimum after 39 s; n = 1000: 590 119 B against
        563 329 B).
      target_peak: bytes; stop as soon as the incumbent peaks at or below it (a memory budget:
        a lower peak is of no further use), status ``"feasible"`` unless proven optimal.  The
        exact ILP is not stopped early; the greedy start and the LNS are.
      max_subproblems: LNS only: stop after that many sub-ILPs (a work limit: with a time limit
        that does not bind, the same search at any speed, as tests need); ``None``: until a
        local optimum or the time limit.
      log: print the HiGHS log.

    Returns:
      An :class:`OrderSolution`; its peak is never above the warm start's.  ``lower_bound`` is
      the larger of the forced-live bound (see :func:`_forced_live`) and HiGHS's bound on the
      exact model.
    """
    t0 = time.perf_counter()
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    e = np.unique(np.asarray(edges, dtype=np.int64).reshape(-1, 2), axis=0)
    warm = np.arange(n, dtype=np.int64) if warm_order is None else np.asarray(warm_order, np.int64)
    ctrl = None if control_edges is None else np.asarray(control_edges, np.int64).reshape(-1, 2)
    warm_peak = given_peak = order_peak(sizes, e, warm)
    if ctrl is not None and len(ctrl):
        pos = np.empty(n, dtype=np.int64)
        pos[warm] = np.arange(n)
        if (pos[ctrl[:, 0]] >= pos[ctrl[:, 1]]).any():
            raise ValueError("the warm order does not respect the control edges")
    if heuristic_restarts > 0 and n:
        h_order, h_peak = greedy_order(sizes, e, restarts=heuristic_restarts, control_edges=ctrl,
                                       time_limit=0.1 * time_limit)
        if h_peak < warm_peak:
            warm, warm_peak = h_order, h_peak
    preds, succs = _adjacency(n, e)
    red = _reduce(sizes, preds, succs, warm, ctrl)
    static = int(_forced_live(red).max(initial=0))
    stats = {"solve": 0.0, "nv": 0, "nb": 0, "nr": 0}

    def done(order, peak, lb, status, msg):
        lb = int(min(max(lb, static), peak))
        gap = (peak - lb) / peak if peak > 0 else 0.0
        if status == "optimal" or lb >= peak:
            status, gap, lb = "optimal", 0.0, peak
        solve_s = stats["solve"]
        return OrderSolution(np.asarray(order, np.int64), int(peak), given_peak, lb, status,
                             float(gap), solve_s, time.perf_counter() - t0 - solve_s,
                             stats["nv"], stats["nb"], stats["nr"], msg)

    if warm_peak <= static:
        return done(warm, warm_peak, static, "optimal", "warm start meets the forced-live bound")
    if target_peak is not None and warm_peak <= target_peak:
        return done(warm, warm_peak, static, "feasible",
                    f"the start order meets the target peak ({target_peak} bytes)")
    if int((red.b - red.a).sum()) == 0:
        return done(warm, warm_peak, warm_peak, "optimal", "one topological order")
    if method == "auto":
        method = "exact" if int((red.b - red.a).sum()) <= max_binaries else "lns"
    if method == "exact":
        r = _solve_exact(red, sizes, e, warm, time_limit - (time.perf_counter() - t0), mip_gap,
                         threads, log)
        stats.update(solve=r.solve_s, nv=r.nv, nb=r.nb, nr=r.nr)
        return done(r.order, r.peak, r.bound, r.status, r.message)
    if method != "lns":
        raise InvalidOptionError(f"method must be 'auto', 'exact' or 'lns', got {method!r}")
    if max_subproblems is not None and not (isinstance(max_subproblems, int)
                                            and max_subproblems >= 1):
        raise InvalidOptionError(f"max_subproblems must be a positive int or None, got "
                         f"{max_subproblems!r}")
    return _lns(red, sizes, e, preds, succs, warm, warm_peak, t0, time_limit, mip_gap, threads,
                release, reach, log, ctrl, stats, done, target_peak, max_subproblems)


class _Exact(NamedTuple):
    """One exact ILP's outcome (bytes, seconds, model size)."""

    order: np.ndarray
    peak: int
    bound: int
    status: str
    message: str
    solve_s: float = 0.0
    nv: int = 0
    nb: int = 0
    nr: int = 0


def _bytes_bound(bound: float, unit: float, exact_unit: bool) -> int:
    """A solver's lower bound in units as bytes, rounded so that it stays a lower bound: up to
    the next integer unit when every size is a multiple of ``unit`` (the optimum is then an
    integer number of units), else down."""
    if not math.isfinite(bound):
        return 0
    if exact_unit:
        return int(math.ceil(bound - 1e-6) * unit)
    return int(math.floor(bound * unit * (1 - 1e-9)))


def _solve_exact(red: _Reduced, sizes: np.ndarray, e: np.ndarray, warm: np.ndarray, left: float,
                 mip_gap: float, threads: int | None, log: bool) -> _Exact:
    """Build and solve the order ILP of ``red``; the warm order is the incumbent."""
    peak = order_peak(sizes, e, warm)
    if left <= 0.05:
        return _Exact(warm, peak, 0, "time_limit", "no time left")
    m = _OrderModel(red)
    x0 = m.warm_vector()
    nv, nb, nr = m.model.num_vars, m.num_binaries, m.model.num_rows
    try:
        sol = m.model.solve(time_limit=left, mip_gap=mip_gap, threads=threads, warm_start=x0,
                            log=log)
    except SolverTimeoutError as err:
        return _Exact(warm, peak, 0, "time_limit", str(err), 0.0, nv, nb, nr)
    lb = _bytes_bound(sol.bound, m.unit, m.exact_unit)
    best = warm
    if sol.x is not None:
        order = m.decode(sol.x)
        p = order_peak(sizes, e, order)
        if p < peak:
            best, peak = order, p
    status = sol.status if sol.status in ("optimal", "time_limit") else "feasible"
    return _Exact(best, peak, lb, status, sol.message, sol.solve_time_s, nv, nb, nr)


def _lns(red: _Reduced, sizes: np.ndarray, e: np.ndarray, preds: list[list[int]],
         succs: list[list[int]], warm: np.ndarray, warm_peak: int, t0: float,
         time_limit: float, mip_gap: float, threads: int | None, release: int, reach0: int,
         log: bool,
         ctrl: np.ndarray | None, stats: dict, done: Callable[..., OrderSolution],
         target_peak: int | None = None, max_subproblems: int | None = None) -> OrderSolution:
    """Large-neighbourhood search with exact sub-ILPs (see :func:`solve_order`).

    Neighbourhood of level ``i``: the ``release * 2**i`` nodes closest to a peak step among
    those whose ASAP/ALAP window covers it are free to move up to ``reach * 2**i`` steps past
    the peak step and their own position (control edges to the chain of the other nodes,
    which keep their relative order).  An improvement re-centres on the new peak; a level
    solved without improvement moves to the next; a level not solved in its time share ends
    the search."""
    host = _mergeable(preds, succs)
    a, b = np.empty(len(sizes), np.int64), np.empty(len(sizes), np.int64)
    a[red.keep], b[red.keep] = red.a, red.b
    order, peak = warm, warm_peak
    share = max(3.0, time_limit / 6)
    level, msg, iters, timed_out = 0, "", 0, False
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0.5:
            timed_out, msg = True, "time limit"
            break
        if max_subproblems is not None and iters >= max_subproblems:
            msg = f"max_subproblems ({max_subproblems}) reached"
            break
        k, reach = release << level, reach0 << level
        kept = order[host[order] < 0]  # reduced nodes in the current order
        N = len(kept)
        pos = np.empty(len(sizes), np.int64)
        pos[kept] = np.arange(N)
        prof = order_profile(sizes, e, order)
        at = order[np.flatnonzero(prof == prof.max())]
        steps = np.unique(pos[np.where(host[at] >= 0, host[at], at)])
        free = np.array([v for v in kept.tolist() if b[v] > a[v]
                         and ((a[v] <= steps) & (steps <= b[v])).any()], np.int64)
        if not len(free):
            msg = "no node can move across the peak"
            break
        dist = np.abs(pos[free][:, None] - steps[None, :])
        pick = np.argsort(dist.min(axis=1), kind="stable")[:k]
        chosen, t_near = free[pick], steps[dist[pick].argmin(axis=1)]
        rest = kept[~np.isin(kept, chosen)]
        ridx = np.searchsorted(pos[rest], pos[chosen])  # chain members before each chosen node
        lo_step = np.minimum(pos[chosen], t_near) - reach
        hi_step = np.maximum(pos[chosen], t_near) + reach
        lo = np.searchsorted(pos[rest], lo_step) - 1  # last chain node before lo_step
        hi = np.searchsorted(pos[rest], hi_step, side="right")  # first chain node after
        cc = [np.stack([rest[:-1], rest[1:]], axis=1)]
        ok = (lo >= 0) & (lo < ridx)
        cc.append(np.stack([rest[lo[ok]], chosen[ok]], axis=1))
        ok = (hi < len(rest)) & (hi >= ridx)
        cc.append(np.stack([chosen[ok], rest[np.minimum(hi[ok], len(rest) - 1)]], axis=1))
        if ctrl is not None:
            cc.append(ctrl)
        cc = np.concatenate(cc)
        sub = _reduce(sizes, preds, succs, order, cc)
        r = _solve_exact(sub, sizes, e, order, min(left, share), mip_gap, threads, log)
        iters += 1
        stats.update(solve=stats["solve"] + r.solve_s, nv=max(stats["nv"], r.nv),
                     nb=max(stats["nb"], r.nb), nr=max(stats["nr"], r.nr))
        if r.peak < peak:
            order, peak = r.order, r.peak
            if target_peak is not None and peak <= target_peak:
                msg = f"meets the target peak ({target_peak} bytes)"
                break
            continue
        if r.status != "optimal":
            timed_out = r.status == "time_limit" and share >= left
            msg = f"level {level} ({len(chosen)} nodes, reach {reach}) not solved in {share:.0f} s"
            break
        if len(chosen) == len(free) and reach >= N:
            msg = f"local optimum: all {len(free)} nodes that can cross the peak freed"
            break
        level += 1
    msg = f"LNS, {iters} sub-ILPs; {msg}"
    return done(order, peak, 0, "time_limit" if timed_out else "feasible", msg)


class _OrderModel:
    """Builds the order ILP of the module docstring for a :class:`_Reduced` problem."""

    def __init__(self, red: _Reduced) -> None:
        self.red = red
        N = len(red.keep)
        anc, desc, a, b = red.anc, red.desc, red.a, red.b
        self.a, self.b, self.N = a, b, N
        allsz = np.concatenate([red.sizes, red.extra])
        pos = allsz[allsz > 0]
        g = int(np.gcd.reduce(pos)) if len(pos) else 1
        total = float(red.sizes.sum() + red.extra.sum())
        self.exact_unit = total / g <= 1e7
        self.unit = float(g) if self.exact_unit else total / 1e6
        s = red.sizes / self.unit
        ex = red.extra / self.unit
        m = self.model = MilpModel("olla_order")
        width = b - a  # D columns of v: t in [a_v, b_v - 1]
        self.doff = np.cumsum(width) - width
        D = m.add_vars("D", int(width.sum()), lb=0.0, ub=1.0, integer=True)
        self.num_binaries = len(D)
        # maximal readers: a reader no other reader of u depends on
        sinks: list[list[int]] = []
        for u in range(N):
            ss = red.succs[u]
            if len(ss) <= 1:
                sinks.append(list(ss) or [u])
                continue
            mask = 0
            for w in ss:
                mask |= 1 << w
            sinks.append([w for w in ss if not (desc[w] & mask)])
        # L columns for tensors with several maximal readers: t in MUL \ PRES
        multi = np.array([u for u in range(N) if len(sinks[u]) > 1 and s[u] > 0], np.int64)
        e_hi = np.array([max(b[w] for w in sinks[u]) for u in multi.tolist()], np.int64)
        p_hi = np.array([max(a[w] for w in sinks[u]) for u in multi.tolist()], np.int64)
        lo_m = a[multi] if len(multi) else np.zeros(0, np.int64)
        b_m = b[multi] if len(multi) else np.zeros(0, np.int64)
        pres = np.maximum(p_hi - b_m + 1, 0)  # PRES = [b_u, p_u] (possibly empty)
        lw = e_hi - lo_m + 1 - pres
        loff = np.cumsum(lw) - lw
        Lc = m.add_vars("L", int(lw.sum()), lb=0.0, ub=1.0)
        peak = int(m.add_vars("peak", 1, lb=0.0, ub=INF)[0])
        self.peak = peak
        mem_cols: list[np.ndarray] = []
        mem_rows: list[np.ndarray] = []
        mem_vals: list[np.ndarray] = []
        const = np.zeros(N + 1, dtype=np.float64)  # difference array of constant bytes per step

        def dcol(v: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            ok = (t >= a[v]) & (t < b[v])
            col = np.where(ok, self.doff[v] + t - a[v], -1)
            return col, (t >= b[v]).astype(np.float64)

        def live_terms(u: np.ndarray, w: np.ndarray, sz: np.ndarray) -> None:
            """Memory terms ``sz * (D[u, t] - D[w, t-1])`` over ``t in [a_u, b_w]``."""
            k, t = _spans(a[u], b[u] - 1)
            mem_rows.append(t)
            mem_cols.append(self.doff[u[k]] + t - a[u[k]])
            mem_vals.append(sz[k])
            np.add.at(const, b[u], sz)
            np.add.at(const, b[w] + 1, -sz)
            k, t = _spans(a[w] + 1, b[w])
            mem_rows.append(t)
            mem_cols.append(self.doff[w[k]] + t - 1 - a[w[k]])
            mem_vals.append(-sz[k])

        single = np.array([u for u in range(N) if len(sinks[u]) == 1 and s[u] > 0], np.int64)
        w1 = np.array([sinks[u][0] for u in single.tolist()], np.int64)
        live_terms(single, w1, s[single])
        has_ex = np.flatnonzero(ex > 0)
        live_terms(has_ex, has_ex, ex[has_ex])  # merged inputs live at their reader's step
        if len(multi):
            k, t = _spans(lo_m, e_hi)
            u = multi[k]
            in_pres = (t >= b_m[k]) & (t <= p_hi[k])
            np.add.at(const, t[in_pres], s[u[in_pres]])
            np.add.at(const, t[in_pres] + 1, -s[u[in_pres]])
            var = ~in_pres
            k, t, u = k[var], t[var], u[var]
            lcol = Lc[loff[k] + t - lo_m[k] - np.where(t > p_hi[k], pres[k], 0)]
            mem_rows.append(t)
            mem_cols.append(lcol)
            mem_vals.append(s[u])
            self._liveness_rows(sinks, u, t, lcol, dcol)
        self.L_info = (multi, sinks)
        # memory rows (eq. 13): sum - peak <= -const
        cum = np.cumsum(const)[:N]
        rows = np.concatenate(mem_rows + [np.arange(N)])
        cols = np.concatenate(mem_cols + [np.full(N, peak)])
        vals = np.concatenate(mem_vals + [np.full(N, -1.0)])
        m.add_rows_coo(rows, cols, vals, N, hi=-cum, name="memory")
        # one node per step (eq. 3): sum_{a_v <= t < b_v} D[v, t] = t + 1 - #{v: b_v <= t}
        v, t = _spans(a, b - 1)
        fixed = np.cumsum(np.bincount(b, minlength=N))[:N]
        rhs = np.arange(1, N + 1) - fixed
        m.add_rows_coo(t, self.doff[v] + t - a[v], 1.0, N, lo=rhs, hi=rhs, name="assign")
        # monotone: D[v, t-1] - D[v, t] <= 0
        v, t = _spans(a + 1, b - 1)
        r = np.arange(len(v))
        c = self.doff[v] + t - a[v]
        m.add_rows_coo(np.concatenate([r, r]), np.concatenate([c - 1, c]),
                       np.concatenate([np.ones(len(r)), -np.ones(len(r))]), len(r), hi=0.0,
                       name="monotone")
        # precedence on the transitive reduction: D[w, t] - D[u, t-1] <= 0, t in [a_w, b_u]
        eu, ew = [], []
        for w in range(N):
            ps = set(red.cpreds[w])
            for u in ps:
                if not any(anc[p] >> u & 1 for p in ps if p != u):
                    eu.append(u)
                    ew.append(w)
        eu_a, ew_a = np.array(eu, np.int64), np.array(ew, np.int64)
        k, t = _spans(a[ew_a], b[eu_a])
        r = np.arange(len(k))
        cw = self.doff[ew_a[k]] + t - a[ew_a[k]]
        cu = self.doff[eu_a[k]] + t - 1 - a[eu_a[k]]
        m.add_rows_coo(np.concatenate([r, r]), np.concatenate([cw, cu]),
                       np.concatenate([np.ones(len(r)), -np.ones(len(r))]), len(r), hi=0.0,
                       name="precedence")
        m.add_objective([peak], 1.0)
        m.set_bounds([peak], lb=float(_forced_live(red).max(initial=0)) / self.unit)

    def _liveness_rows(self, sinks, u, t, lcol, dcol) -> None:
        """``D[u, t] - D[w, t-1] - L[u, t] <= 0`` for each maximal reader ``w`` of ``u``."""
        rows, cols, vals, rhs = [], [], [], []
        nrow = 0
        nmax = max(len(sinks[x]) for x in set(u.tolist()))
        for j in range(nmax):
            has = np.array([len(sinks[x]) > j for x in u.tolist()], dtype=bool)
            uu, tt, ll = u[has], t[has], lcol[has]
            w = np.array([sinks[x][j] for x in uu.tolist()], np.int64)
            cu, ku = dcol(uu, tt)
            cw, kw = dcol(w, tt - 1)
            live = kw < 1  # D[w, t-1] = 1 makes the row trivial
            uu, tt, ll, cu, ku, cw, kw = (x[live] for x in (uu, tt, ll, cu, ku, cw, kw))
            r = nrow + np.arange(len(uu))
            nrow += len(uu)
            for col, sign in ((cu, 1.0), (cw, -1.0)):
                ok = col >= 0
                rows.append(r[ok])
                cols.append(col[ok])
                vals.append(np.full(int(ok.sum()), sign))
            rows.append(r)
            cols.append(ll)
            vals.append(-np.ones(len(r)))
            rhs.append(kw - ku)
        if nrow:
            self.model.add_rows_coo(np.concatenate(rows), np.concatenate(cols),
                                    np.concatenate(vals), nrow, hi=np.concatenate(rhs),
                                    name="liveness")

    def warm_vector(self) -> np.ndarray:
        """The warm order (the reduced nodes' own order) as a full solution vector."""
        a = self.a
        x = np.zeros(self.model.num_vars)
        v, t = _spans(a, self.b - 1)
        x[self.doff[v] + t - a[v]] = (t >= v).astype(np.float64)
        L = self.model.block("L")
        if len(L):  # L = the smallest value its liveness rows allow
            A, lo, hi = self.model.matrix()
            rows = self.model.row_block("liveness")
            sub = A[rows]
            act = sub @ x  # excludes L (zero in x)
            need = act - hi[rows]
            lrow = sub[:, L].tocoo()
            val = np.zeros(len(L))
            np.maximum.at(val, lrow.col, need[lrow.row])
            x[L] = np.clip(val, 0.0, 1.0)
        A, lo, hi = self.model.matrix()
        mem = self.model.row_block("memory")
        x[self.peak] = max(float((A[mem] @ x - hi[mem]).max(initial=0.0)),
                           self.model.bounds()[0][self.peak])
        return x

    def decode(self, x: np.ndarray) -> np.ndarray:
        """The original-node order of a solution: reduced nodes by step, merged nodes first."""
        N, a = self.N, self.a
        v, t = _spans(a, self.b - 1)
        notyet = 1.0 - np.round(x[self.doff[v] + t - a[v]])
        step = a + np.bincount(v, weights=notyet, minlength=N)
        out: list[int] = []
        for k in np.argsort(step, kind="stable").tolist():
            out.extend(self.red.merged[k])
            out.append(int(self.red.keep[k]))
        return np.asarray(out, dtype=np.int64)


# ------------------------------------------------------------------------------- address phase
@dataclasses.dataclass(frozen=True, eq=False)
class AddressSolution:
    """Result of :func:`solve_addresses`.

    Attributes:
      offsets: ``int64[A]`` byte offsets (0 for zero-byte allocations).
      arena_bytes: ``max(offsets + sizes)``.
      warm_arena_bytes: the warm start's arena.
      lower_bound: the max-live lower bound (or the solver's better bound), bytes.
      status: ``"optimal"`` (arena == bound or proven), ``"time_limit"``, ``"feasible"``, or
        ``"heuristic"`` (the ILP was not run: over ``max_pairs``; the warm start is returned).
      gap: ``(arena - lower_bound) / arena``.
      num_pairs: overlapping pairs (binaries) of the model.
      solve_time_s, build_time_s: seconds.
      message: solver status text or why the ILP did not run.
    """

    offsets: np.ndarray
    arena_bytes: int
    warm_arena_bytes: int
    lower_bound: int
    status: str
    gap: float
    num_pairs: int
    solve_time_s: float
    build_time_s: float
    message: str = ""


def overlapping_pairs(intervals: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``int64[P, 2]`` pairs ``(i, j)``, ``i`` starting no later, of allocations with positive
    size whose inclusive lifetimes ``[start, end]`` intersect."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    keep = np.flatnonzero(np.asarray(sizes) > 0)
    o = keep[np.lexsort((keep, iv[keep, 0]))]
    start, end = iv[o, 0], iv[o, 1]
    hi = np.searchsorted(start, end, side="right")  # partners: positions k+1 .. hi-1
    k, j = _spans(np.arange(len(o)) + 1, hi - 1)
    return np.stack([o[k], o[j]], axis=1) if len(k) else np.zeros((0, 2), np.int64)


def _compact(pairs: np.ndarray, sizes: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Offsets with each allocation on top of the overlapping ones of smaller ``key``."""
    A = len(sizes)
    lo_first = key[pairs[:, 0]] < key[pairs[:, 1]]
    below = np.where(lo_first, pairs[:, 0], pairs[:, 1])
    above = np.where(lo_first, pairs[:, 1], pairs[:, 0])
    o = np.argsort(above, kind="stable")
    below, above = below[o], above[o]
    ptr = np.searchsorted(above, np.arange(A + 1))
    off = np.zeros(A, dtype=np.int64)
    for a in np.argsort(key, kind="stable").tolist():
        bl = below[ptr[a]:ptr[a + 1]]
        if len(bl):
            off[a] = int((off[bl] + sizes[bl]).max())
    return off


def solve_addresses(
    intervals: np.ndarray,
    sizes: np.ndarray,
    *,
    warm_offsets: np.ndarray | None = None,
    lower_bound: int | None = None,
    time_limit: float = 60.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    max_pairs: int | None = 300_000,
    log: bool = False,
) -> AddressSolution:
    """Minimise the arena over offsets with lifetimes fixed (eq. 15).

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes (e.g. :func:`remat.core.layout.lifetimes`).
      sizes: ``int64[A]`` bytes.
      warm_offsets: a valid layout (e.g. best fit's) to start from and to return when nothing
        better is found; default: every allocation stacked (arena = total bytes).
      lower_bound: the max-live bound (bytes); computed here when omitted.
      time_limit: seconds for building and solving together.
      mip_gap: relative gap at which HiGHS stops.
      threads: HiGHS threads.
      max_pairs: above this many overlapping pairs the ILP is not built (status
        ``"heuristic"``: the warm start with its gap); ``None``: no limit.
      log: print the HiGHS log.

    Returns:
      An :class:`AddressSolution` whose arena is never above the warm start's.
    """
    t0 = time.perf_counter()
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    A = len(s)
    pairs = overlapping_pairs(iv, s)
    if lower_bound is None:
        lower_bound = int(interval_sweep(iv[:, 0], iv[:, 1], s, int(iv[:, 1].max(initial=0)) + 1)
                          .max(initial=0))
    lb = int(lower_bound)
    warm = None if warm_offsets is None else np.asarray(warm_offsets, dtype=np.int64).reshape(-1)
    if warm is not None and len(pairs):
        i, j = pairs[:, 0], pairs[:, 1]
        ok = (warm[i] + s[i] <= warm[j]) | (warm[j] + s[j] <= warm[i])
        if len(warm) != A or (warm < 0).any() or not ok.all():
            warm = None
    if warm is None:
        warm = np.where(s > 0, np.cumsum(s) - s, 0)
    warm_arena = int((warm + s).max(initial=0))

    def done(off, status, msg, lbound=lb, solve_s=0.0):
        arena = int((off + s).max(initial=0))
        lbound = min(max(lbound, lb), arena)
        gap = (arena - lbound) / arena if arena > 0 else 0.0
        if lbound >= arena:
            status, gap = "optimal", 0.0
        return AddressSolution(off, arena, warm_arena, int(lbound), status, float(gap),
                               len(pairs), solve_s, time.perf_counter() - t0 - solve_s, msg)

    if warm_arena <= lb:
        return done(warm, "optimal", "warm start meets the max-live bound")
    if max_pairs is not None and len(pairs) > max_pairs:
        return done(warm, "heuristic", f"{len(pairs)} overlapping pairs > max_pairs={max_pairs}")
    pos = s[s > 0]
    g = int(np.gcd.reduce(np.concatenate([pos, warm[s > 0]]))) if len(pos) else 1
    g = max(g, 1)
    unit = float(g) if warm_arena / g <= 1e7 else warm_arena / 1e6
    sz, ub = s / unit, warm_arena / unit
    m = MilpModel("olla_address")
    Ac = m.add_vars("A", A, lb=0.0, ub=np.maximum(ub - sz, 0.0))
    z = m.add_vars("z", len(pairs), lb=0.0, ub=1.0, integer=True)
    peak = int(m.add_vars("peak", 1, lb=lb / unit, ub=ub)[0])
    i, j = pairs[:, 0], pairs[:, 1]
    P = len(pairs)
    r = np.arange(P)
    # 7a: A_i - A_j + UB z <= UB - S_i ;  7b: A_j - A_i - UB z <= -S_j
    m.add_rows_coo(np.concatenate([r, r, r]), np.concatenate([Ac[i], Ac[j], z]),
                   np.concatenate([np.ones(P), -np.ones(P), np.full(P, ub)]), P,
                   hi=ub - sz[i], name="below")
    m.add_rows_coo(np.concatenate([r, r, r]), np.concatenate([Ac[j], Ac[i], z]),
                   np.concatenate([np.ones(P), -np.ones(P), np.full(P, -ub)]), P,
                   hi=-sz[j], name="above")
    used = np.flatnonzero(s > 0)
    r = np.arange(len(used))
    m.add_rows_coo(np.concatenate([r, r]), np.concatenate([Ac[used], np.full(len(r), peak)]),
                   np.concatenate([np.ones(len(r)), -np.ones(len(r))]), len(r),
                   hi=-sz[used], name="arena")  # eq. 8
    m.add_objective([peak], 1.0)
    x0 = np.zeros(m.num_vars)
    x0[Ac] = warm / unit
    x0[z] = (warm[i] < warm[j]).astype(np.float64)
    x0[peak] = ub
    left = time_limit - (time.perf_counter() - t0)
    if left <= 0.05:
        return done(warm, "time_limit", "no time left after building")
    try:
        sol = m.solve(time_limit=left, mip_gap=mip_gap, threads=threads, warm_start=x0, log=log)
    except SolverTimeoutError as err:
        return done(warm, "time_limit", str(err))
    best = warm
    if sol.x is not None:
        key = sol.x[Ac] + 1e-9 * np.arange(A)  # address order, ties by index
        off = np.where(s > 0, _compact(pairs, s, key), 0)
        if int((off + s).max(initial=0)) < warm_arena:
            best = off
    bound = max(lb, _bytes_bound(sol.bound, unit, unit == g))
    status = sol.status if sol.status in ("optimal", "time_limit") else "feasible"
    return done(best, status, sol.message, bound, sol.solve_time_s)
