"""Anytime Checkmate: large-neighbourhood search over windows of steps (issue 18, item 3).

From any feasible frontier-form schedule ``(R, S)`` (a heuristic's, re-cut by
:func:`~solvers.checkmate.to_frontier_form`), repeat: choose a window of ``w`` consecutive
steps ``[t0, t0 + w)``, fix every ``R[t, :]`` and ``S[t, :]`` outside it to the incumbent's
values (:meth:`solvers.milp.MilpModel.fix`), and re-solve Checkmate's MILP
(:func:`~solvers.checkmate.add_checkmate_core`, the same rows as the exact solve) with the
incumbent as warm start.  The sub-problem is exact for its neighbourhood: the carry rows at the
window's edges keep ``S[t0 + w]`` reachable and the memory rows of every step stay in the model,
so an accepted schedule fits the budget (re-checked with :func:`schedule_memory`, which shares no
code with the rows).  A schedule is accepted when it is strictly cheaper.

Two kinds of neighbourhood: windows of steps (above) and windows of nodes ``[i0, i0 + w)``
whose ``R``/``S`` columns are freed in every step (re-planning the checkpoints of a run of
layers, backward steps included).  They are visited most-wasteful first (the incumbent's
recomputation cost inside them; those with none are skipped: they cannot improve), stride
``w / 2``; one solved to optimality is skipped until the incumbent changes where it reads it; a
sweep with no improvement doubles ``w``.  A window covering every step
is the full MILP: when it ends ``optimal`` the incumbent is proven optimal.  The returned lower
bound is the small LP relaxation's (:func:`solvers.checkmate.solve_state.small_lp_bound`, at
most a fifth of the time) or the MILP's own when the full window finished, and the trivial
``sum(costs)`` otherwise.

Costs are the problem's cost units; times are wall-clock seconds.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.checkmate.formulation import (
    Formulation,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    normalize,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.solve_state import LpBound, SolveClock, SolveState, small_lp_bound
from solvers.milp import MilpModel

__all__ = ["solve_checkmate_lns", "solve_lns", "windows", "LnsStep"]


@dataclasses.dataclass(frozen=True)
class LnsStep:
    """One sub-solve: window ``[t0, t1)`` of steps or nodes (``kind``), its status, the
    incumbent cost after it and the wall-clock time since the start (seconds)."""

    t0: int
    t1: int
    status: str
    cost: float
    elapsed_s: float
    kind: str = "steps"


def windows(problem: CheckmateProblem, R: np.ndarray, w: int, kinds: tuple[str, ...]
             ) -> list[tuple[str, int, int]]:
    """Neighbourhoods of width ``w``, stride ``w // 2``, most recomputation cost first.

    ``("steps", t0, t1)`` frees ``R``/``S`` rows ``t0..t1-1`` (every node); ``("nodes", i0, i1)``
    frees columns ``i0..i1-1`` (those nodes' computation and retention in every step: re-planning
    the checkpoints of a run of layers, including the backward steps that read them).
    Neighbourhoods without recomputation are left out: the objective is a sum over steps (and
    over nodes), and every step pays at least its frontier node, so such a neighbourhood is
    already at its sub-problem's optimum."""
    n = problem.n
    if w >= n:
        return [("steps", 0, n)]
    stride = max(1, w // 2)
    starts = list(range(0, n - w + 1, stride))
    if starts[-1] != n - w:
        starts.append(n - w)
    Rf = R.astype(float)
    per = {"steps": Rf @ problem.costs - problem.costs,  # per step: recomputation cost
           "nodes": (Rf.sum(0) - 1.0) * problem.costs}  # per node: its recomputation cost
    cands, score = [], []
    for kind in kinds:
        waste = per[kind]
        for st in starts:
            cands.append((kind, st, st + w))
            score.append(float(waste[st:st + w].sum()))
    sc = np.asarray(score)
    tol = 1e-12 * max(1.0, float(problem.costs.sum()))
    return [cands[i] for i in np.argsort(-sc, kind="stable") if sc[i] > tol]


def solve_checkmate_lns(
    problem: CheckmateProblem,
    start: tuple[np.ndarray, np.ndarray],
    *,
    time_limit: float = 60.0,
    window: int = 16,
    window_time: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    formulation: Formulation = Formulation(),  # noqa: B008 (frozen dataclass)
    lp_bound: bool = True,
    neighbourhoods: tuple[str, ...] = ("steps", "nodes"),
    lower_bound: float | None = None,
) -> CheckmateSolution:
    """Improve the feasible frontier-form schedule ``start`` within ``time_limit`` seconds
    (:func:`solve_lns` on a fresh :class:`SolveState`).

    Args:
      problem: the graph on arrays with ``budget`` (bytes) set.
      start: ``(R, S)`` ``bool[n, n]`` frontier-form schedule that fits the budget.
      lower_bound: a bound already proven by the caller (e.g. LP rounding's LP), cost units.
      window, window_time, lp_bound, neighbourhoods: as for :func:`solve_lns`.

    Returns and raises as :func:`solve_lns`.
    """
    known = (LpBound(float(lower_bound)) if lower_bound is not None and math.isfinite(lower_bound)
             else LpBound())
    state = SolveState(problem, SolveClock(time_limit), warm=start, formulation=formulation,
                       mip_gap=mip_gap, lp=known, threads=threads)
    return solve_lns(state, window=window, window_time=window_time, lp_bound=lp_bound,
                     neighbourhoods=neighbourhoods)


def solve_lns(state: SolveState, *, window: int = 16, window_time: float | None = None,
              lp_bound: bool = True, neighbourhoods: tuple[str, ...] = ("steps", "nodes")
              ) -> CheckmateSolution:
    """Improve ``state.warm`` (a frontier-form schedule that fits) by large-neighbourhood search
    within ``state.clock``'s limit (see the module docstring).

    Args:
      state: the solve; ``state.lp.bound`` is a bound already proven (cost units, ``-inf``:
        none), ``state.threads`` HiGHS's threads.
      window: initial window size (steps); doubled after a sweep without improvement.
      window_time: seconds per sub-solve (default: a tenth of the time limit, at least 2 s).
      lp_bound: solve the small LP relaxation first for a lower bound.
      neighbourhoods: ``"steps"`` (windows of consecutive steps) and/or ``"nodes"`` (windows
        of consecutive nodes across all steps); see :func:`windows`.

    Returns:
      :class:`CheckmateSolution` with status ``optimal`` (the full window was solved to
      ``mip_gap``) or ``time_limit``; ``meta["lns_steps"]`` lists every sub-solve
      (:class:`LnsStep` as dicts), ``meta["start_objective"]`` the start's cost.

    Raises:
      SolverError: ``state.warm`` is not a frontier-form schedule within the budget.
    """
    problem, clock, mip_gap, threads = state.problem, state.clock, state.mip_gap, state.threads
    formulation, time_limit = state.formulation, state.clock.limit
    budget = problem.budget
    if budget is None:
        raise SolverError("solve_checkmate_lns needs a budget")
    if state.warm is None:
        raise SolverError("LNS needs a start schedule")
    R, S = normalize(problem, *(np.asarray(a, bool) for a in state.warm))
    if np.triu(R, 1).any() or np.triu(S).any() or not np.diag(R).all():
        raise SolverError("LNS start is not a frontier-form schedule (R, S lower triangular)")
    peak, _ = schedule_memory(problem, R, S)
    if peak > budget:
        raise SolverError(f"LNS start has peak {peak} B > budget {budget} B")
    cost = schedule_cost(problem, R)
    start_cost = cost
    n = problem.n
    lb = max(float(problem.costs.sum()), state.lp.bound)
    lp_s = 0.0
    if lp_bound:
        lp = small_lp_bound(problem, formulation, 0.2 * time_limit, threads)
        if math.isfinite(lp.bound):
            lb = max(lb, lp.bound)
        lp_s = lp.time_s
    build0 = time.perf_counter()
    model = MilpModel("checkmate_lns")
    v = add_checkmate_core(model, problem, budget=budget, formulation=formulation)
    build_s = time.perf_counter() - build0
    per = window_time if window_time is not None else max(2.0, 0.1 * time_limit)
    steps: list[LnsStep] = []
    status = "time_limit"
    w = max(2, min(int(window), n))
    left = clock.left

    # A step window's sub-problem reads the incumbent only on steps [t0 - 1, t1] (carry rows at
    # its edges, the memory rows of its own steps): one solved to optimality is skipped until
    # those steps change.  A node window's reads all of it (every step's memory row); re-solving
    # it after every change elsewhere kept the search from widening its windows (the n = 100
    # published DAG at m = 0.9 did not reach the full MILP in 120 s), so it is skipped until its
    # own columns change: a search choice, not an exactness argument.
    settled: dict[tuple[str, int, int], bytes] = {}
    kinds = tuple(neighbourhoods)
    if not kinds or any(k not in ("steps", "nodes") for k in kinds):
        raise SolverError(f"neighbourhoods must be a non-empty subset of ('steps', 'nodes'), "
                          f"got {neighbourhoods!r}")

    def signature(kind: str, t0: int, t1: int) -> bytes:
        if kind == "nodes":
            return R[:, t0:t1].tobytes() + S[:, t0:t1].tobytes()
        lo, hi = max(0, t0 - 1), min(n, t1 + 1)
        return R[lo:hi].tobytes() + S[lo:hi].tobytes()

    skipped = 0
    while left() > 0.5 and status != "optimal" and cost - lb > mip_gap * cost:
        improved = False
        for kind, t0, t1 in windows(problem, R, w, kinds):
            if left() <= 0.5:
                break
            if settled.get((kind, t0, t1)) == signature(kind, t0, t1):
                skipped += 1
                continue
            model.clear_fixes()
            free = np.zeros((n, n), bool)
            if kind == "steps":
                free[t0:t1] = True
            else:
                free[:, t0:t1] = True
            for blk, M in ((v.R, R), (v.S, S)):
                sel = (blk >= 0) & ~free
                model.fix(blk[sel], M[sel].astype(float))
            full = t1 - t0 >= n
            try:
                sol = model.solve("highs", time_limit=max(0.5, min(per if not full else left(),
                                                                 left())),
                                  mip_gap=mip_gap, threads=threads,
                                  warm_start=checkmate_vector(model, v, problem, R, S))
            except SolverTimeoutError:
                steps.append(LnsStep(t0, t1, "no_solution", cost, clock.elapsed(), kind))
                continue
            if sol.has_solution:
                R2, S2 = decode_schedule(problem, v, sol.x)
                c2 = schedule_cost(problem, R2)
                if c2 < cost * (1 - 1e-9) and schedule_memory(problem, R2, S2)[0] <= budget:
                    R, S, cost, improved = R2, S2, c2, True
            if sol.status == "optimal":  # the incumbent is now this window's optimum
                settled[(kind, t0, t1)] = signature(kind, t0, t1)
            if full and sol.status == "optimal":
                status = "optimal"
                if math.isfinite(sol.bound):
                    lb = max(lb, min(cost, sol.bound * v.cost_unit))
            steps.append(LnsStep(t0, t1, sol.status, cost, clock.elapsed(), kind))
            if full:
                break
        if not improved:
            if w >= n:
                break
            w = min(n, 2 * w)
    model.clear_fixes()
    lb = min(lb, cost)
    if status != "optimal" and rel_gap(cost, lb) <= mip_gap:
        status = "optimal"
    peak, _ = schedule_memory(problem, R, S)
    return CheckmateSolution(
        R, S, status, cost, lb, rel_gap(cost, lb), peak, clock.elapsed(), build_s, -1,
        {"method": "lns", **state.meta, "start_objective": start_cost,
         "lns_steps": [dataclasses.asdict(s) for s in steps],
         "final_window": w, "lp_bound_time_s": lp_s, "windows_skipped": skipped})
