"""The exact Checkmate MILP (Jain et al., "Checkmate", MLSys 2020) and its LP relaxation + rounding.

Everything here works on arrays (:class:`CheckmateProblem`): node costs, output sizes in bytes, a
topologically ordered edge list and a budget in bytes.  Schedules are Checkmate's *frontier
advancing* ``R``/``S`` matrices with ``T = n`` steps: step ``t`` computes node ``t`` for the first
time (``R[t, t] = 1``), may recompute earlier nodes (``R[t, i]``, ``i < t``) and starts with the
outputs ``S[t, i] = 1`` (``i < t``) resident.

Memory model (must equal :mod:`remat.schedule`'s replay, the independent checker): nodes of a step
run in index order; running node ``k`` needs its inputs resident and allocates its output; an
output is freed after the last node of the step that reads it unless it is carried into
``S[t+1]``.  The MILP encodes this with Checkmate's eqs. (2)-(3)::

    U[t, 0]   = M_0 R[t, 0] + sum_i M_i S[t, i]
    U[t, k+1] = U[t, k] + M_{k+1} R[t, k+1] - sum_{(i, k) in E} M_i FREE[t, i, k]
    U[t, k] <= budget
    FREE[t, i, k] <= R[t, k],  <= 1 - S[t+1, i],  <= 1 - R[t, j]  for every user j > k of i

(``FREE`` is continuous: with integer ``R``/``S`` its best value is the 0/1 product of the paper's
hazard linearisation, so relaxing its integrality is exact and removes ``T |E|`` binaries.)
Dependencies ``R[t, j] <= R[t, i] + S[t, i]`` for ``(i, j) in E`` (eq. 1a), carries
``S[t+1, i] <= S[t, i] + R[t, i]`` (eq. 1b), objective ``sum_t sum_i C_i R[t, i]`` (eq. 1).

Formulation work on top of the paper (each optional, see :class:`Formulation`):

* ``FREE`` continuous and only for ``k < t`` (frees after the frontier, the last node of the step,
  never matter) and no self-free term (a computed output nobody reads or carries is wasted work,
  removed by :func:`normalize`; the frontier itself is the last node of its step).
* ``prune``: ``R[t, i] = S[t, i] = 0`` once no descendant of ``i`` has index ``>= t``.
* ``useful`` (off by default: it slowed HiGHS down, 25 s -> 36 s on a 101-node chain): dominance
  rows ``R[t,i] <= S[t+1,i] + sum_{users j<=t} R[t,j]`` and the same for ``S[t,i]``: only
  *normalised* schedules (no wasted recomputation, no dead checkpoint) are kept; one of them is
  always optimal because normalising never raises cost or memory.
* ``frontier_rows``: the memory while the frontier ``t`` runs,
  ``M_t + sum_{p in preds(t)} M_p + sum_{i<t, i not in preds(t)} M_i S[t+1, i] <= budget``,
  written directly on ``S`` (a knapsack row the LP relaxation otherwise only sees through ``U``).
  This is the change that matters: a 101-node chain at 30% goes from a 60 s time-out to an
  optimum in about 25 s, and the root LP bound is within 0.3% of the optimum.
* ``memory_chain=False`` (LP relaxation only): drop ``U``/``FREE`` and keep start-of-step rows
  ``sum_i M_i S[t, i] <= budget``; still a valid lower bound, much smaller.
* a complete warm start computed from a heuristic schedule (``R``, ``S`` fixed, ``FREE`` and
  ``U`` computed directly), handed to HiGHS with ``setSolution``.

Exactness: the MILP's ``U`` equals the replay's live bytes on normalised schedules and
over-estimates them otherwise, so its optimum equals the replay optimum over frontier schedules;
``tests/test_checkmate.py`` checks this against exhaustive enumeration at every budget of several
7-node graphs.  Memory is counted in units of the gcd of the sizes (or ``total/1e6`` bytes when
that would exceed 1e7 units; every returned schedule is then re-checked in bytes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from functools import cached_property

import numpy as np

from remat.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from solvers.milp import INF, MilpModel

__all__ = [
    "CheckmateProblem",
    "CheckmateVars",
    "CheckmateSolution",
    "Formulation",
    "add_checkmate_core",
    "checkmate_vector",
    "solve_checkmate",
    "solve_checkmate_lp",
    "min_feasible_budget",
    "schedule_memory",
    "normalize",
    "min_r_given_s",
    "heuristic_schedules",
    "checkpoint_all_schedule",
    "to_frontier_form",
    "best_heuristic",
]


# ---------------------------------------------------------------------------------- problem
@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateProblem:
    """A rematerialization problem on arrays.

    Attributes:
      n: number of nodes (topologically ordered: every edge goes from a lower to a higher index).
      edges: ``int64[m, 2]`` data edges ``(src, dst)``, ``src < dst``.
      costs: ``float64[n]`` compute cost of one execution (seconds or any unit).
      sizes: ``int64[n]`` output bytes.
      budget: memory budget in bytes (``None``: unlimited).
    """

    n: int
    edges: np.ndarray
    costs: np.ndarray
    sizes: np.ndarray
    budget: int | None = None

    def __post_init__(self) -> None:
        n = int(self.n)
        e = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        costs = np.asarray(self.costs, dtype=np.float64).reshape(-1)
        sizes = np.asarray(self.sizes, dtype=np.int64).reshape(-1)
        if costs.shape != (n,) or sizes.shape != (n,):
            raise SolverError(f"costs {costs.shape} and sizes {sizes.shape} must have shape ({n},)")
        if len(e) and (e.min() < 0 or e.max() >= n or np.any(e[:, 0] >= e[:, 1])):
            raise SolverError("edges must satisfy 0 <= src < dst < n (topological order)")
        if np.any(costs < 0) or np.any(sizes < 0):
            raise SolverError("costs and sizes must be non-negative")
        e = np.unique(e, axis=0) if len(e) else e
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "edges", e)
        object.__setattr__(self, "costs", costs)
        object.__setattr__(self, "sizes", sizes)
        if self.budget is not None:
            object.__setattr__(self, "budget", int(self.budget))

    @classmethod
    def from_graph(cls, graph, budget: int | None = None) -> CheckmateProblem:
        """From a :class:`remat.Graph` (costs = ``time_s``, sizes = ``out_bytes``)."""
        return cls(graph.n, graph.edge_array, graph.costs, graph.sizes, budget)

    def with_budget(self, budget: int | None) -> CheckmateProblem:
        return dataclasses.replace(self, budget=budget)

    @cached_property
    def preds(self) -> list[np.ndarray]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for s, d in self.edges:
            out[int(d)].append(int(s))
        return [np.array(sorted(p), dtype=np.int64) for p in out]

    @cached_property
    def users(self) -> list[np.ndarray]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for s, d in self.edges:
            out[int(s)].append(int(d))
        return [np.array(sorted(p), dtype=np.int64) for p in out]

    @cached_property
    def last_reader(self) -> np.ndarray:
        """``int64[n]``: the last node reading each output (the node itself if none)."""
        last = np.arange(self.n, dtype=np.int64)
        if len(self.edges):
            np.maximum.at(last, self.edges[:, 0], self.edges[:, 1])
        return last

    @cached_property
    def max_descendant(self) -> np.ndarray:
        """``int64[n]``: the largest index reachable from each node (itself included)."""
        md = np.arange(self.n, dtype=np.int64)
        for i in range(self.n - 1, -1, -1):
            u = self.users[i]
            if len(u):
                md[i] = max(md[i], int(md[u].max()))
        return md

    def frontier_lower_bound(self) -> int:
        """``max_t (b_t + sum_{p in preds(t)} b_p)``: bytes live while node t runs, in any
        schedule.  A lower bound on the smallest feasible budget."""
        if self.n == 0:
            return 0
        lb = self.sizes.copy()
        if len(self.edges):
            np.add.at(lb, self.edges[:, 1], self.sizes[self.edges[:, 0]])
        return int(lb.max())


# ------------------------------------------------------------------ schedules on arrays
def checkpoint_all_schedule(problem: CheckmateProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(R, S)`` of running every node once and keeping it until its last reader."""
    n = problem.n
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    S = (i < t) & (t <= problem.last_reader[None, :])
    return np.eye(n, dtype=bool), S


def schedule_memory(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray) -> tuple[int, np.ndarray]:
    """Peak bytes of a frontier-form schedule under the replay semantics of :mod:`remat.plan`.

    Written independently of the MILP (and of :func:`remat.schedule.replay`, which tests use to
    check it).  Returns ``(peak_bytes, step_peak)`` with ``step_peak`` ``int64[T]``.
    """
    R = np.asarray(R, bool)
    S = np.asarray(S, bool)
    T, n = R.shape
    sizes = problem.sizes
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    idx = np.arange(n)
    step_peak = np.zeros(T, dtype=np.int64)
    for t in range(T):
        start_b = int(sizes[S[t]].sum())
        comp = np.flatnonzero(R[t])
        if not len(comp):
            step_peak[t] = start_b
            continue
        lastuse = np.full(n, -1, dtype=np.int64)
        m = R[t, dst]
        np.maximum.at(lastuse, src[m], dst[m])
        start = np.where(S[t], 0, np.where(R[t], idx, n + 1))
        end = np.maximum(lastuse, np.where(R[t], idx, -1))
        if t + 1 < T:
            end = np.where(S[t + 1], n, end)
        end = np.minimum(end, n)
        ok = start <= end
        diff = np.zeros(n + 2, dtype=np.int64)
        np.add.at(diff, start[ok], sizes[ok])
        np.add.at(diff, end[ok] + 1, -sizes[ok])
        live = np.cumsum(diff)[comp]
        step_peak[t] = max(start_b, int(live.max()))
    return int(step_peak.max(initial=0)), step_peak


def normalize(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop wasted work from a legal frontier-form schedule without raising cost or memory.

    Removes recomputations whose output is neither read in their step nor carried, checkpoints
    ``S[t, i]`` neither read in step t nor carried on, and recomputations of values already
    resident.  Vectorised over steps, one pass over nodes in reverse order.
    """
    R = np.asarray(R, bool).copy()
    S = np.asarray(S, bool).copy()
    T, n = R.shape
    tt = np.arange(T)
    for i in range(n - 1, -1, -1):
        u = problem.users[i]
        used = R[:, u].any(axis=1) if len(u) else np.zeros(T, bool)
        # S kept iff S[t..t'] all set and used at t' (backward recurrence, done with "next" scans)
        s = S[:, i]
        big = T + 1
        next_zero = np.where(~s, tt, big)
        next_zero = np.minimum.accumulate(next_zero[::-1])[::-1]
        next_used = np.where(s & used, tt, big)
        next_used = np.minimum.accumulate(next_used[::-1])[::-1]
        s_keep = s & (next_used < next_zero)
        s_next = np.r_[s_keep[1:], False]
        need = used | s_next | (tt == i)
        R[:, i] = R[:, i] & need & ~s_keep
        S[:, i] = s_keep
    return R, S


def min_r_given_s(problem: CheckmateProblem, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest ``R`` for a given checkpoint matrix ``S`` (Checkmate's ``solve_r_opt``), then
    :func:`normalize`.  ``S`` is first cut to its strict lower triangle."""
    n = problem.n
    S = np.tril(np.asarray(S, bool), -1)
    R = np.zeros((n, n), bool)
    tt = np.arange(n)
    s_next = np.vstack([S[1:], np.zeros((1, n), bool)])
    for i in range(n - 1, -1, -1):
        u = problem.users[i]
        used = R[:, u].any(axis=1) if len(u) else np.zeros(n, bool)
        R[:, i] = (tt == i) | ((tt > i) & ~S[:, i] & (used | s_next[:, i]))
    return normalize(problem, R, S)


def to_frontier_form(problem: CheckmateProblem, R: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Re-cut any schedule's compute sequence into ``n`` frontier steps.

    The events of ``R`` (steps in order, nodes in index order within a step) are split after the
    first computation of each node; step ``s`` of the result holds the events after node
    ``s - 1``'s first computation up to node ``s``'s.  ``S`` is then the minimal (liveness)
    retention.  Returns ``None`` when first computations are not in index order or a new step
    would run a node twice or out of index order.  Memory is not checked here.
    """
    R = np.asarray(R, bool)
    n = problem.n
    ev_t, ev_i = np.nonzero(R)  # row-major: steps in order, index order inside a step
    seen = np.zeros(n, bool)
    Rf = np.zeros((n, n), bool)
    s = 0
    last = -1
    for i in ev_i.tolist():
        if s >= n:
            return None  # events after the last first computation
        if Rf[s, i] or i <= last:
            return None
        Rf[s, i] = True
        last = i
        if not seen[i]:
            if i != s:
                return None
            seen[i] = True
            s += 1
            last = -1
    if s != n:
        return None
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    reads = np.zeros((n, n), bool)
    if len(src):
        np.logical_or.at(reads.T, src, Rf[:, dst].T)  # reads[t, i]: a node run in t reads i
    need = reads & ~Rf
    Sf = np.zeros((n, n), bool)
    carry = np.zeros(n, bool)
    for t in range(n - 1, -1, -1):
        carry = need[t] | (carry & ~Rf[t]) if t + 1 < n else need[t]
        Sf[t] = carry
    if np.triu(Sf).any():
        return None
    return Rf, Sf


def _frontier_steps(problem: CheckmateProblem, rule) -> tuple[np.ndarray, np.ndarray]:
    """Build a schedule step by step: R[t] = the least recomputation that makes the frontier t
    runnable from S[t]; S[t+1] = ``rule(t, resident_end, R[t])``."""
    n = problem.n
    preds = problem.preds
    R = np.zeros((n, n), bool)
    S = np.zeros((n, n), bool)
    for t in range(n):
        st = S[t]
        need = [t]
        R[t, t] = True
        while need:
            k = need.pop()
            for p in preds[k]:
                if not st[p] and not R[t, p]:
                    R[t, p] = True
                    need.append(int(p))
        if t + 1 < n:
            S[t + 1] = rule(t, st | R[t], R[t])
    return R, S


def heuristic_schedules(problem: CheckmateProblem, max_candidates: int = 24):
    """Yield ``(name, R, S)`` frontier schedules: checkpoint-all and "keep every c-th node" rules
    (outputs of kept nodes carried until their last reader, the rest recomputed from the nearest
    kept ancestors; recomputed values optionally kept until their last reader), so that one of
    them fits most budgets.  A cheap warm start, not an optimiser."""
    n = problem.n
    lr = problem.last_reader
    idx = np.arange(n)
    pred_next = [np.zeros(n, bool) for _ in range(n)]
    for t in range(n - 1):
        pred_next[t][problem.preds[t + 1]] = True
    R, S = checkpoint_all_schedule(problem)
    yield "checkpoint_all", R, S
    cs = sorted({max(1, int(round(x))) for x in np.geomspace(1, max(n, 2), max_candidates)})
    for carry_recomputed in (True, False):
        for c in cs:
            keep = (idx % c) == 0

            def rule(t, resident, Rt, keep=keep, cr=carry_recomputed):
                alive = resident & (lr > t) & (idx <= t)
                want = keep | pred_next[t]
                if cr:
                    want = want | (Rt & (idx < t))
                return alive & want

            R, S = _frontier_steps(problem, rule)
            R, S = normalize(problem, R, S)
            yield f"keep_every_{c}{'_carry' if carry_recomputed else ''}", R, S


def best_heuristic(problem: CheckmateProblem, budget: int | None):
    """The cheapest heuristic schedule that fits ``budget`` (or the lowest-memory one when none
    fits, or ``budget`` is None): ``(name, R, S, peak_bytes, cost)``."""
    best = None
    lowest = None
    for name, R, S in heuristic_schedules(problem):
        peak, _ = schedule_memory(problem, R, S)
        cost = float(problem.costs @ R.sum(axis=0))
        cand = (name, R, S, peak, cost)
        if lowest is None or (peak, cost) < (lowest[3], lowest[4]):
            lowest = cand
        if budget is not None and peak <= budget and (best is None or cost < best[4]):
            best = cand
    return best if best is not None else lowest


# --------------------------------------------------------------------------- formulation
@dataclasses.dataclass(frozen=True)
class Formulation:
    """Switches for the formulation work (all on by default; see the module docstring)."""

    prune: bool = True
    useful: bool = False
    frontier_rows: bool = True
    memory_chain: bool = True


@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateVars:
    """Column indices of the Checkmate blocks in a :class:`MilpModel` (``-1`` where absent).

    Attributes:
      R, S, U: ``int64[T, n]``.
      F: ``int64[T, m]`` FREE variable of edge ``e`` in step ``t``.
      mem_unit: bytes per memory unit used in the rows.
      cost_unit: cost per objective unit.
      peak: column of the peak-memory variable when the model minimises peak memory, else -1.
    """

    R: np.ndarray
    S: np.ndarray
    U: np.ndarray
    F: np.ndarray
    mem_unit: float
    cost_unit: float
    peak: int = -1


def _units(problem: CheckmateProblem, budget: int | None) -> tuple[float, float]:
    pos = problem.sizes[problem.sizes > 0]
    g = int(np.gcd.reduce(pos)) if len(pos) else 1
    mem_unit = float(g)
    top = max(float(budget or 0), float(problem.sizes.sum()))
    if top / mem_unit > 1e7:  # keep coefficients sane (HiGHS tolerances are absolute)
        mem_unit = top / 1e6
    c = problem.costs[problem.costs > 0]
    cost_unit = 1.0
    if len(c):
        q = c / c.min()
        if np.allclose(q, np.round(q), rtol=0, atol=1e-9) and q.max() < 1e6:
            cost_unit = float(c.min())  # integer multiples: scale by the gcd-like unit
            ci = np.round(c / cost_unit).astype(np.int64)
            cost_unit *= float(np.gcd.reduce(ci))
        else:
            cost_unit = float(np.median(c))
    return mem_unit, cost_unit


def add_checkmate_core(
    model: MilpModel,
    problem: CheckmateProblem,
    *,
    budget: int | None = None,
    formulation: Formulation = Formulation(),
    minimize_peak: bool = False,
    objective: bool = True,
) -> CheckmateVars:
    """Add Checkmate's frontier-advancing variables, rows and objective to ``model``.

    Args:
      model: the model to extend (other blocks, e.g. POET's paging variables, may be added
        before or after).
      problem: the graph on arrays.
      budget: bytes (defaults to ``problem.budget``; ``None`` with ``minimize_peak``).
      formulation: optional strengthenings.
      minimize_peak: add a continuous peak variable ``P >= U[t, k]`` and minimise it (used to
        find the smallest feasible budget); the compute objective is then not added.
      objective: add ``sum C_i R[t, i]`` (in ``cost_unit`` units) to the objective.

    Returns:
      :class:`CheckmateVars` with the column indices.
    """
    n = problem.n
    budget = problem.budget if budget is None else budget
    mem_unit, cost_unit = _units(problem, budget)
    M = problem.sizes / mem_unit
    if budget is None and not minimize_peak:
        B = INF
    elif budget is None:
        B = float(problem.sizes.sum()) / mem_unit
    else:
        # integer units (gcd scaling): floor is exact; otherwise the exact ratio, and the caller
        # re-checks every schedule in bytes (tolerances are ~1e-6 units, far below one byte)
        B = math.floor(budget / mem_unit + 1e-9) if mem_unit == int(mem_unit) else budget / mem_unit
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    m = len(src)
    md = problem.max_descendant

    # ---- variables
    tR, iR = np.tril_indices(n)
    ubR = np.ones(len(tR))
    lbR = (tR == iR).astype(float)
    tS, iS = np.tril_indices(n, -1)
    ubS = np.ones(len(tS))
    if formulation.prune:
        ubR[(md[iR] < tR)] = 0.0
        ubS[(md[iS] < tS)] = 0.0
    R = np.full((n, n), -1, np.int64)
    S = np.full((n, n), -1, np.int64)
    U = np.full((n, n), -1, np.int64)
    R[tR, iR] = model.add_vars("R", len(tR), lbR, ubR, integer=True)
    S[tS, iS] = model.add_vars("S", len(tS), 0.0, ubS, integer=True)
    chain = formulation.memory_chain or minimize_peak
    te = ee = np.zeros(0, np.int64)
    if chain:
        U[tR, iR] = model.add_vars("U", len(tR), 0.0, INF if minimize_peak else B)
        # FREE[t, e] for e = (i, k) with k < t
        if m:
            te, ee = np.nonzero(np.arange(n)[:, None] > dst[None, :])
    F = np.full((n, m), -1, np.int64)
    F[te, ee] = model.add_vars("FREE", len(te), 0.0, 1.0)
    peak = -1
    if minimize_peak:
        peak = int(model.add_vars("PEAK", 1, 0.0, B)[0])

    # ---- dependencies (1a): R[t, j] - R[t, i] - S[t, i] <= 0 for (i, j) in E, j <= t
    td, ed = np.nonzero(np.arange(n)[:, None] >= dst[None, :]) if m else (np.zeros(0, int),) * 2
    k = len(td)
    rows = np.repeat(np.arange(k), 3)
    cols = np.stack([R[td, dst[ed]], R[td, src[ed]], S[td, src[ed]]], 1).ravel()
    vals = np.tile([1.0, -1.0, -1.0], k)
    model.add_rows_coo(rows, cols, vals, k, -INF, 0.0, name="dep")

    # ---- carries (1b): S[t+1, i] - S[t, i] - R[t, i] <= 0 for i <= t < n-1
    tc, ic = np.tril_indices(n - 1) if n > 1 else (np.zeros(0, int),) * 2
    k = len(tc)
    r3 = np.stack([np.arange(k)] * 3, 1)
    c3 = np.stack([S[tc + 1, ic], S[tc, ic], R[tc, ic]], 1)
    v3 = np.tile([1.0, -1.0, -1.0], (k, 1))
    keep = c3 >= 0
    model.add_rows_coo(r3[keep], c3[keep], v3[keep], k, -INF, 0.0, name="carry")

    # ---- memory chain (eqs. 2-3)
    nu = len(tR)
    if chain:
        urow = np.full((n, n), -1, np.int64)
        nu = len(tR)
        urow[tR, iR] = np.arange(nu)
        rr = [np.arange(nu), np.arange(nu)]
        cc = [U[tR, iR], R[tR, iR]]
        vv = [np.ones(nu), -M[iR]]
        prev = iR > 0
        rr.append(np.flatnonzero(prev))
        cc.append(U[tR[prev], iR[prev] - 1])
        vv.append(-np.ones(prev.sum()))
        rr.append(urow[tS, 0])  # S terms in row (t, 0)
        cc.append(S[tS, iS])
        vv.append(-M[iS])
        if len(te):  # FREE[t, (i, k)] frees M_i before node k+1, i.e. in row (t, k+1)
            rr.append(urow[te, dst[ee] + 1])
            cc.append(F[te, ee])
            vv.append(M[src[ee]])
        model.add_rows_coo(np.concatenate(rr), np.concatenate(cc), np.concatenate(vv), nu, 0.0, 0.0,
                           name="mem")
        if minimize_peak:
            model.add_rows_coo(np.r_[np.arange(nu), np.arange(nu)],
                               np.r_[U[tR, iR], np.full(nu, peak)],
                               np.r_[np.ones(nu), -np.ones(nu)], nu, -INF, 0.0, name="peak")
    else:  # relaxation only: memory at each step start, sum_i M_i S[t, i] <= B (valid, weaker)
        model.add_rows_coo(tS, S[tS, iS], M[iS], n, -INF, B, name="start")

    # ---- FREE upper bounds (two of the paper's hazard conditions + one per later user)
    if len(te):
        kf = len(te)
        model.add_rows_coo(np.r_[np.arange(kf), np.arange(kf)], np.r_[F[te, ee], R[te, dst[ee]]],
                           np.r_[np.ones(kf), -np.ones(kf)], kf, -INF, 0.0, name="free_r")
        has_next = te + 1 < n
        t2, e2 = te[has_next], ee[has_next]
        k2 = len(t2)
        model.add_rows_coo(np.r_[np.arange(k2), np.arange(k2)],
                           np.r_[F[t2, e2], S[t2 + 1, src[e2]]],
                           np.ones(2 * k2), k2, -INF, 1.0, name="free_s")
        # pairs (edge e = (i, k), later user j of i, j > k)
        pe, pj = [], []
        for e in range(m):
            i, kk = int(src[e]), int(dst[e])
            later = problem.users[i][problem.users[i] > kk]
            pe.extend([e] * len(later))
            pj.extend(later.tolist())
        if pe:
            pe, pj = np.array(pe), np.array(pj)
            tl, pl = np.nonzero(np.arange(n)[:, None] >= pj[None, :])
            kl = len(tl)
            model.add_rows_coo(np.r_[np.arange(kl), np.arange(kl)],
                               np.r_[F[tl, pe[pl]], R[tl, pj[pl]]],
                               np.ones(2 * kl), kl, -INF, 1.0, name="free_later")

    # ---- dominance rows: only normalised schedules
    if formulation.useful and n > 1:
        for which, block in (("useful_r", R), ("useful_s", S)):
            tu, iu = np.tril_indices(n, -1)
            k = len(tu)
            rr = [np.arange(k)]
            cc = [block[tu, iu]]
            vv = [np.ones(k)]
            nxt = tu + 1 < n
            rr.append(np.flatnonzero(nxt))
            cc.append(S[tu[nxt] + 1, iu[nxt]])
            vv.append(-np.ones(nxt.sum()))
            # users j of i with j <= t
            if m:
                # for each edge (i, j): rows (t, i) with t >= j
                tj, ej = np.nonzero(np.arange(n)[:, None] >= dst[None, :])
                rowid = np.full((n, n), -1, np.int64)
                rowid[tu, iu] = np.arange(k)
                rr.append(rowid[tj, src[ej]])
                cc.append(R[tj, dst[ej]])
                vv.append(-np.ones(len(tj)))
            model.add_rows_coo(np.concatenate(rr), np.concatenate(cc), np.concatenate(vv), k,
                               -INF, 0.0, name=which)

    # ---- frontier rows: memory while node t runs, directly on S[t+1]
    if formulation.frontier_rows and n > 1:
        pm = [np.zeros(n, bool) for _ in range(n)]
        base = M.copy()
        for t in range(n):
            pm[t][problem.preds[t]] = True
            base[t] += M[problem.preds[t]].sum()
        tf, i_f = np.tril_indices(n - 1, -1)  # i < t, t <= n-2
        isp = np.array([pm[t][i] for t, i in zip(tf, i_f)], bool) if len(tf) else np.zeros(0, bool)
        sel = ~isp & (M[i_f] > 0)
        tf, i_f = tf[sel], i_f[sel]
        rows_t = np.arange(n - 1)
        cols = [S[tf + 1, i_f]]
        vals = [M[i_f]]
        rws = [tf]
        if minimize_peak:
            rws.append(rows_t)
            cols.append(np.full(n - 1, peak))
            vals.append(-np.ones(n - 1))
            hi = -base[:n - 1]
        else:
            hi = B - base[:n - 1]
        model.add_rows_coo(np.concatenate(rws), np.concatenate(cols), np.concatenate(vals), n - 1,
                           -INF, hi, name="frontier")

    # ---- objective
    if minimize_peak:
        model.add_objective(np.array([peak]), 1.0)
    elif objective:
        model.add_objective(R[tR, iR], problem.costs[iR] / cost_unit)
    return CheckmateVars(R, S, U, F, mem_unit, cost_unit, peak)


def checkmate_vector(model: MilpModel, v: CheckmateVars, problem: CheckmateProblem,
                     R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """A complete MILP vector (``nan`` for columns of other blocks) from a schedule: ``R``, ``S``
    as given, ``FREE`` and ``U`` computed directly.  ``R``/``S`` should be normalised."""
    n = problem.n
    R = np.asarray(R, bool)
    S = np.asarray(S, bool)
    x = np.full(model.num_vars, np.nan)
    m = v.R >= 0
    x[v.R[m]] = R[m]
    m = v.S >= 0
    x[v.S[m]] = S[m]
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    M = problem.sizes / v.mem_unit
    Snext = np.vstack([S[1:], np.zeros((1, n), bool)])
    # last computed user of each value in each step
    lastuse = np.full((n, n), -1, np.int64)
    for e in range(len(src)):
        col = np.where(R[:, dst[e]], dst[e], -1)
        lastuse[:, src[e]] = np.maximum(lastuse[:, src[e]], col)
    Fv = np.zeros((n, len(src)))
    if len(src):
        Fv = (R[:, dst] & ~Snext[:, src] & (lastuse[:, src] <= dst[None, :])).astype(float)
        mf = v.F >= 0
        x[v.F[mf]] = Fv[mf]
    freed = np.zeros((n, n))  # freed[t, k]: units freed after node k
    if len(src):
        np.add.at(freed.T, dst, (Fv * M[src][None, :]).T)
    Uv = (S * M).sum(1)[:, None] + np.cumsum(R * M, axis=1) - np.cumsum(freed, axis=1) + freed
    mu = v.U >= 0
    x[v.U[mu]] = Uv[mu]
    if v.peak >= 0:
        x[v.peak] = float(Uv[mu].max()) if mu.any() else 0.0
    return x


# ----------------------------------------------------------------------------- solutions
@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateSolution:
    """A solved schedule.

    Attributes:
      R, S: ``bool[n, n]`` frontier-form schedule (normalised).
      status: ``optimal``, ``time_limit``, ``feasible`` (LP rounding / heuristic).
      objective: total compute cost of ``R`` (``costs @ R.sum(0)``), in the problem's cost units.
      lower_bound: proven lower bound on the optimal cost (MILP dual bound or LP relaxation).
      gap: ``(objective - lower_bound) / objective``.
      peak_bytes: peak memory of the schedule (replay semantics).
      solve_time_s, build_time_s: seconds.
      node_count: branch-and-bound nodes (-1 unknown).
      meta: extra facts (warm-start cost, method, LP details, ...).
    """

    R: np.ndarray
    S: np.ndarray
    status: str
    objective: float
    lower_bound: float
    gap: float
    peak_bytes: int
    solve_time_s: float
    build_time_s: float
    node_count: int = -1
    meta: dict = dataclasses.field(default_factory=dict)


def _gap(obj: float, lb: float) -> float:
    if not (math.isfinite(obj) and math.isfinite(lb)):
        return math.nan
    return max(0.0, (obj - lb) / max(abs(obj), 1e-12))


def _extract(problem: CheckmateProblem, v: CheckmateVars, x: np.ndarray):
    n = problem.n
    R = np.zeros((n, n), bool)
    S = np.zeros((n, n), bool)
    m = v.R >= 0
    R[m] = x[v.R[m]] > 0.5
    m = v.S >= 0
    S[m] = x[v.S[m]] > 0.5
    return normalize(problem, R, S)


def _check_warm(problem, warm, budget):
    R, S = (np.asarray(a, bool) for a in warm)
    n = problem.n
    if R.shape != (n, n) or S.shape != (n, n):
        return None
    if np.triu(R, 1).any() or np.triu(S).any() or not np.diag(R).all():
        return None
    R, S = normalize(problem, R, S)
    peak, _ = schedule_memory(problem, R, S)
    if budget is not None and peak > budget:
        return None
    return R, S


def solve_checkmate(
    problem: CheckmateProblem,
    *,
    time_limit: float = 60.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    backend: str = "highs",
    warm_start: tuple[np.ndarray, np.ndarray] | str | None = "auto",
    formulation: Formulation = Formulation(),
    presolve: bool = True,
    log: bool = False,
    options: dict | None = None,
    lp_first: bool = True,
) -> CheckmateSolution:
    """Solve Checkmate's MILP exactly (up to ``mip_gap``) for ``problem.budget``.

    With ``lp_first`` the small LP relaxation of :func:`solve_checkmate_lp` (no ``U``/``FREE``
    chain; at most a quarter of ``time_limit``) runs first: if the warm start is already within
    ``mip_gap`` of its bound the warm start is returned as ``optimal`` without building the MILP,
    and otherwise its bound is kept when the MILP's own bound is weaker (large graphs whose root
    LP does not finish in time).  The MILP gets the time that is left; when that is under ten
    times the small LP's time (the full root LP would not finish and HiGHS overruns its limit in
    presolve), the warm start is returned with status ``time_limit`` and the LP bound.

    Args:
      warm_start: ``(R, S)`` frontier-form schedule, ``"auto"`` (cheapest fitting schedule from
        :func:`heuristic_schedules`) or ``None``.  A warm start that is not frontier-form or does
        not fit is ignored (``meta["warm_start"]`` says so).
      threads: HiGHS threads.  HiGHS 1.15's MIP search is serial ("1 max worker"): on a
        101-node chain at 30%, 1 thread 19.1 s, 2 threads 19.6 s.
      presolve: HiGHS presolve (default on).  Off was faster on 101-node chains (30%: 11.9 s vs
        19.1 s; 50%: 10.4 s vs 16.1 s) but a 51-node chain at 30% went from optimal in 23.8 s to
        a 60 s time-out (gap 1.2%), so it stays on.
      time_limit: seconds for everything (LP bound, model build, MILP).
      mip_gap: relative gap at which the solve stops (HiGHS ``mip_rel_gap``).

    Returns:
      :class:`CheckmateSolution` (status ``optimal``, ``time_limit``, or ``feasible`` when a
      tolerance made the MILP's schedule exceed the budget and the warm start was returned).

    Raises:
      InfeasibleBudgetError: no schedule fits (``min_feasible_bytes`` computed with
        :func:`min_feasible_budget`).
      SolverTimeoutError: the time limit hit with no incumbent (impossible with a warm start).
    """
    t_start = time.perf_counter()
    budget = problem.budget
    R0, S0 = checkpoint_all_schedule(problem)
    peak0, _ = schedule_memory(problem, R0, S0)
    if budget is None or budget >= peak0:
        c = float(problem.costs.sum())
        return CheckmateSolution(R0, S0, "optimal", c, c, 0.0, peak0,
                                 time.perf_counter() - t_start, 0.0, 0,
                                 {"method": "checkpoint_all", "warm_start": None})
    if budget < problem.frontier_lower_bound():
        mf, exact = min_feasible_budget(problem, time_limit=time_limit)
        raise InfeasibleBudgetError(budget, mf, "below the frontier lower bound" +
                                    ("" if exact else " (min_feasible_bytes is an upper estimate)"))
    warm = None
    warm_name = None
    if isinstance(warm_start, str) and warm_start == "auto":
        h = best_heuristic(problem, budget)
        if h is not None and h[3] <= budget:
            warm, warm_name = (h[1], h[2]), h[0]
    elif warm_start is not None:
        warm = _check_warm(problem, warm_start, budget)
        warm_name = "given" if warm is not None else "given (rejected: not frontier-form or over budget)"
    lp_lb = -math.inf
    lp_time = 0.0
    if lp_first and backend == "highs":
        lpm = MilpModel("checkmate_lp_bound")
        lv = add_checkmate_core(lpm, problem, budget=budget, formulation=dataclasses.replace(
            formulation, memory_chain=False, useful=False))
        try:
            lps = lpm.solve("highs", time_limit=0.25 * time_limit, relax=True,
                            threads=threads)
            lp_time = lps.solve_time_s + lps.build_time_s
            if lps.status == "optimal":
                lp_lb = lps.objective * lv.cost_unit
        except SolverTimeoutError:
            pass
        if warm is not None:
            wobj = float(problem.costs @ warm[0].sum(axis=0))
            if wobj - lp_lb <= mip_gap * abs(wobj):
                peak, _ = schedule_memory(problem, *warm)
                lb = min(max(lp_lb, float(problem.costs.sum())), wobj)
                return CheckmateSolution(
                    warm[0], warm[1], "optimal", wobj, lb, _gap(wobj, lb), peak, lp_time,
                    time.perf_counter() - t_start - lp_time, 0,
                    {"method": "warm start proven by the LP bound", "backend": backend,
                     "warm_start": warm_name, "warm_start_objective": wobj, "lp_bound": lp_lb,
                     "note": ""})
    left = time_limit - (time.perf_counter() - t_start)
    if warm is not None and lp_time > 0 and left < 10 * lp_time:
        # the full MILP's root LP costs several times the small LP (n = 401 chain: 11 s vs
        # minutes); with this little time HiGHS would only overrun its limit in presolve/root LP.
        # (RENS around this small LP was tried: its 0/1 values contradict the exact memory model,
        # the fixed sub-MIP was infeasible on a 201-node chain.)
        wobj = float(problem.costs @ warm[0].sum(axis=0))
        best = (warm[0], warm[1], wobj)
        method = "warm start (no time left for the MILP root)"
        peak, _ = schedule_memory(problem, best[0], best[1])
        lb = min(max(lp_lb, float(problem.costs.sum())), best[2])
        st = "optimal" if _gap(best[2], lb) <= mip_gap else "time_limit"
        return CheckmateSolution(
            best[0], best[1], st, best[2], lb, _gap(best[2], lb), peak,
            time.perf_counter() - t_start, 0.0, 0,
            {"method": method, "backend": backend,
             "warm_start": warm_name, "warm_start_objective": wobj, "lp_bound": lp_lb,
             "note": f"{left:.1f} s left < 10 x LP time {lp_time:.1f} s"})
    t_b = time.perf_counter()
    model = MilpModel("checkmate")
    v = add_checkmate_core(model, problem, budget=budget, formulation=formulation)
    x0 = checkmate_vector(model, v, problem, *warm) if warm is not None else None
    build = time.perf_counter() - t_b
    left = max(0.05 * time_limit, time_limit - (time.perf_counter() - t_start))
    try:
        sol = model.solve(backend, time_limit=left, mip_gap=mip_gap, threads=threads,
                          warm_start=x0, log=log, presolve=presolve, options=options)
    except SolverTimeoutError as e:
        b = None if e.bound is None else e.bound * v.cost_unit
        raise SolverTimeoutError(str(e), bound=b) from None
    if sol.status == "infeasible":
        mf, exact = min_feasible_budget(problem, time_limit=time_limit)
        if mf <= budget:  # the MILP said infeasible but a schedule fits: numerical trouble
            raise SolverError(f"solver reported infeasible but a schedule with peak {mf} fits")
        raise InfeasibleBudgetError(budget, mf, "" if exact else "min_feasible_bytes is an upper estimate")
    if not sol.has_solution:
        raise SolverError(f"MILP ended with status {sol.message!r} and no solution")
    R, S = _extract(problem, v, sol.x)
    peak, _ = schedule_memory(problem, R, S)
    note = ""
    if peak > budget:  # an integrality/feasibility tolerance let a few bytes through
        if warm is None:
            raise SolverError(f"MILP solution has peak {peak} > budget {budget} (tolerance problem)")
        note = f"MILP solution exceeded the budget by {peak - budget} bytes; warm start returned"
        R, S = warm
        peak, _ = schedule_memory(problem, R, S)
        sol = dataclasses.replace(sol, status="feasible")
    obj = float(problem.costs @ R.sum(axis=0))
    # every node runs at least once: sum(costs) is always a valid bound
    trivial = float(problem.costs.sum())
    lb = max(sol.bound * v.cost_unit, trivial) if math.isfinite(sol.bound) else trivial
    lb = max(lb, lp_lb)
    if sol.status == "optimal":
        lb = min(obj, lb) if math.isfinite(lb) else obj
    status = sol.status if sol.status in ("optimal", "feasible") else "time_limit"
    if status == "time_limit" and _gap(obj, lb) <= mip_gap:
        status = "optimal"  # the LP bound closed the gap the MILP left open
    meta = {
        "method": "milp",
        "backend": backend,
        "warm_start": warm_name,
        "warm_start_objective": None if warm is None else float(problem.costs @ warm[0].sum(0)),
        "num_vars": model.num_vars,
        "num_int_vars": int(model.integrality().sum()),
        "num_rows": model.num_rows,
        "solver_message": sol.message,
        "milp_objective": sol.objective * v.cost_unit,
        "lp_bound": lp_lb,
        "note": note,
    }
    return CheckmateSolution(R, S, status, obj, lb, _gap(obj, lb), peak,
                             sol.solve_time_s, build + sol.build_time_s, sol.node_count, meta)


def min_feasible_budget(problem: CheckmateProblem, *, time_limit: float = 60.0,
                        formulation: Formulation = Formulation()) -> tuple[int, bool]:
    """The smallest budget (bytes) for which a frontier-form schedule exists.

    Returns ``(bytes, exact)``.  ``exact`` is True when a schedule meeting
    :meth:`CheckmateProblem.frontier_lower_bound` is found (the bound is then attained) or when
    the peak-minimising MILP proves optimality; otherwise ``bytes`` is the best schedule's peak
    found within ``time_limit`` (an upper bound on the true minimum).
    """
    peak, exact, _, _ = _min_peak_schedule(problem, time_limit, formulation)
    return peak, exact


def _min_peak_schedule(problem: CheckmateProblem, time_limit: float,
                       formulation: Formulation = Formulation()):
    """``(peak_bytes, exact, R, S)`` of the lowest-peak schedule found (see
    :func:`min_feasible_budget`)."""
    lb = problem.frontier_lower_bound()
    h = best_heuristic(problem, None)
    best_peak, warm = h[3], (h[1], h[2])
    if best_peak <= lb:
        return int(best_peak), True, h[1], h[2]
    model = MilpModel("checkmate_min_peak")
    v = add_checkmate_core(model, problem, budget=best_peak, formulation=formulation,
                           minimize_peak=True)
    x0 = checkmate_vector(model, v, problem, *warm)
    try:
        sol = model.solve("highs", time_limit=time_limit, mip_gap=0.0, warm_start=x0)
    except SolverTimeoutError:
        return int(best_peak), False, warm[0], warm[1]
    if sol.has_solution:
        R, S = _extract(problem, v, sol.x)
        peak, _ = schedule_memory(problem, R, S)
        if peak < best_peak:
            best_peak, warm = peak, (R, S)
    exact = sol.status == "optimal"
    return int(best_peak), bool(exact), warm[0], warm[1]


# ---------------------------------------------------------------------- LP + rounding
def solve_checkmate_lp(
    problem: CheckmateProblem,
    *,
    time_limit: float = 60.0,
    thresholds: tuple[float, ...] = tuple(np.round(np.arange(0.05, 1.0, 0.05), 2)),
    n_random: int = 16,
    seed: int = 0,
    budget_factors: tuple[float, ...] = (1.0, 0.9, 0.8),
    formulation: Formulation = Formulation(memory_chain=False),
    threads: int | None = None,
    log: bool = False,
    fallback=None,
) -> CheckmateSolution:
    """Checkmate's approximation: LP relaxation, then rounding of ``S``, then the optimal ``R``
    for each rounded ``S`` (:func:`min_r_given_s`); the cheapest schedule that fits wins.

    Rounding: a deterministic threshold sweep (``S >= theta``) and ``n_random`` randomized
    roundings (``S ~ Bernoulli(S_lp)``, seeded).  The LP is solved at ``budget`` (giving the
    reported lower bound) and, if no rounding fits, at ``budget_factors`` x budget (Checkmate
    solves at 0.9x); every factor is tried while time remains and the cheapest fitting rounding
    over all of them is kept.  When no rounding fits, the cheapest of ``fallback`` (a frontier
    schedule ``(R, S)``, e.g. another policy's, or a callable returning one or None, called only
    then) and :func:`best_heuristic` that fits is returned, else the
    schedule of the peak-minimising MILP (``meta["method"]`` says which).

    The default LP drops the ``U``/``FREE`` memory chain and keeps dependencies, carries, the
    frontier rows and start-of-step rows ``sum_i M_i S[t, i] <= budget``: every one of them holds
    for every legal schedule, so its optimum is still a valid lower bound, and on chain graphs it
    equals the full LP's bound (n = 101: 220.48 both; n = 201: 454.60 both) while solving 5-7x
    faster (n = 201: 1.8 s vs 13 s).  Pass ``Formulation()`` for the full LP.

    Returns a :class:`CheckmateSolution` with status ``feasible`` (``optimal`` when the rounded
    cost meets the LP bound); ``lower_bound`` is the LP relaxation's optimum.
    """
    t0 = time.perf_counter()
    budget = problem.budget
    R0, S0 = checkpoint_all_schedule(problem)
    peak0, _ = schedule_memory(problem, R0, S0)
    if budget is None or budget >= peak0:
        c = float(problem.costs.sum())
        return CheckmateSolution(R0, S0, "optimal", c, c, 0.0, peak0, time.perf_counter() - t0,
                                 0.0, 0, {"method": "checkpoint_all"})
    if budget < problem.frontier_lower_bound():
        mf, exact = min_feasible_budget(problem, time_limit=time_limit)
        raise InfeasibleBudgetError(budget, mf, "below the frontier lower bound")
    rng = np.random.default_rng(seed)
    best = None
    tried = 0
    lp_bound = math.nan
    lp_times = []
    build_s = 0.0
    for bf in budget_factors:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0.5 or (lp_times and left < 1.5 * max(lp_times)):
            break
        tb = time.perf_counter()
        model = MilpModel("checkmate_lp")
        v = add_checkmate_core(model, problem, budget=int(budget * bf), formulation=formulation)
        build_s += time.perf_counter() - tb
        try:
            sol = model.solve("highs", time_limit=left, relax=True, threads=threads, log=log)
        except SolverTimeoutError:
            break
        lp_times.append(sol.solve_time_s)
        if sol.status != "optimal":
            if bf == 1.0 and sol.status == "infeasible":
                mf, _ = min_feasible_budget(problem, time_limit=max(1.0, left))
                raise InfeasibleBudgetError(budget, mf, "LP relaxation infeasible")
            continue
        if bf == 1.0:
            lp_bound = sol.objective * v.cost_unit
        Sf = np.zeros((problem.n, problem.n))
        ms = v.S >= 0
        Sf[ms] = sol.x[v.S[ms]]
        cands = [Sf >= th - 1e-9 for th in thresholds]
        cands += [rng.random(Sf.shape) < Sf for _ in range(n_random)]
        for Sc in cands:
            tried += 1
            R, S = min_r_given_s(problem, Sc)
            peak, _ = schedule_memory(problem, R, S)
            if peak > budget:
                continue
            cost = float(problem.costs @ R.sum(axis=0))
            if best is None or cost < best[2]:
                best = (R, S, cost, peak, bf)
    method = "lp_rounding"
    if best is None:
        fits = []
        if callable(fallback):
            fallback = fallback()
        if fallback is not None and (fb := _check_warm(problem, fallback, budget)) is not None:
            fits.append((fb[0], fb[1], float(problem.costs @ fb[0].sum(0)),
                         schedule_memory(problem, *fb)[0], None, "fallback"))
        h = best_heuristic(problem, budget)
        if h is not None and h[3] <= budget:
            fits.append((h[1], h[2], h[4], h[3], None, "heuristic"))
        if not fits:
            left = max(1.0, time_limit - (time.perf_counter() - t0))
            mf, exact, Rm, Sm = _min_peak_schedule(problem, left)
            if mf > budget and exact:
                raise InfeasibleBudgetError(budget, mf, "the peak-minimising MILP proved it")
            if mf > budget:  # nothing fits, but nothing proves that no schedule does
                raise SolverTimeoutError(
                    f"LP rounding found no schedule within {budget} bytes; the smallest peak "
                    f"found is {mf} bytes (not proven minimal, so infeasibility is not claimed)"
                )
            fits.append((Rm, Sm, float(problem.costs @ Rm.sum(0)), mf, None, "min-peak MILP"))
        fits.sort(key=lambda f: f[2])
        best = fits[0][:5]
        method = f"{fits[0][5]} (no rounding fitted)"
    R, S, cost, peak, bf = best
    gap = _gap(cost, lp_bound)
    status = "optimal" if gap == 0.0 else "feasible"
    return CheckmateSolution(
        R, S, status, cost, lp_bound, gap, peak, time.perf_counter() - t0, build_s, 0,
        {"method": method, "lp_solve_time_s": lp_times, "roundings_tried": tried,
         "lp_budget_factor": bf},
    )
