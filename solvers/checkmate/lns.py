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

Windows are visited most-wasteful first (the incumbent's recomputation cost inside the window),
with stride ``w / 2``; a sweep with no improvement doubles ``w``.  A window covering every step
is the full MILP: when it ends ``optimal`` the incumbent is proven optimal.  The returned lower
bound is the small LP relaxation's (:func:`solvers.checkmate.milp._lp_bound`, at most a fifth of
the time) or the MILP's own when the full window finished, and the trivial ``sum(costs)``
otherwise.

Costs are the problem's cost units; times are wall-clock seconds.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from remat.errors import SolverError, SolverTimeoutError
from solvers.checkmate.formulation import (
    Formulation,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.milp import _lp_bound
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    normalize,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.milp import MilpModel

__all__ = ["solve_checkmate_lns", "LnsStep"]


@dataclasses.dataclass(frozen=True)
class LnsStep:
    """One sub-solve: window ``[t0, t1)``, its status, the incumbent cost after it and the
    wall-clock time since the start (seconds)."""

    t0: int
    t1: int
    status: str
    cost: float
    elapsed_s: float


def _windows(problem: CheckmateProblem, R: np.ndarray, w: int) -> list[tuple[int, int]]:
    """Windows of ``w`` steps, stride ``w // 2``, most recomputation cost first."""
    n = problem.n
    if w >= n:
        return [(0, n)]
    stride = max(1, w // 2)
    starts = list(range(0, n - w + 1, stride))
    if starts[-1] != n - w:
        starts.append(n - w)
    waste = (R.astype(float) @ problem.costs) - problem.costs  # per step: recomputation cost
    score = [float(waste[s:s + w].sum()) for s in starts]
    order = np.argsort(-np.asarray(score), kind="stable")
    return [(starts[i], starts[i] + w) for i in order]


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
) -> CheckmateSolution:
    """Improve the feasible frontier-form schedule ``start`` within ``time_limit`` seconds.

    Args:
      problem: the graph on arrays with ``budget`` (bytes) set.
      start: ``(R, S)`` ``bool[n, n]`` frontier-form schedule that fits the budget.
      window: initial window size (steps); doubled after a sweep without improvement.
      window_time: seconds per sub-solve (default: a tenth of ``time_limit``, at least 2 s).
      lp_bound: solve the small LP relaxation first for a lower bound.

    Returns:
      :class:`CheckmateSolution` with status ``optimal`` (the full window was solved to
      ``mip_gap``) or ``time_limit``; ``meta["lns_steps"]`` lists every sub-solve
      (:class:`LnsStep` as dicts), ``meta["start_objective"]`` the start's cost.

    Raises:
      SolverError: ``start`` is not a frontier-form schedule within the budget.
    """
    t_start = time.perf_counter()
    budget = problem.budget
    if budget is None:
        raise SolverError("solve_checkmate_lns needs a budget")
    R, S = normalize(problem, *(np.asarray(a, bool) for a in start))
    if np.triu(R, 1).any() or np.triu(S).any() or not np.diag(R).all():
        raise SolverError("LNS start is not a frontier-form schedule (R, S lower triangular)")
    peak, _ = schedule_memory(problem, R, S)
    if peak > budget:
        raise SolverError(f"LNS start has peak {peak} B > budget {budget} B")
    cost = schedule_cost(problem, R)
    start_cost = cost
    n = problem.n
    lb = float(problem.costs.sum())
    lp_s = 0.0
    if lp_bound:
        lp = _lp_bound(problem, formulation, 0.2 * time_limit, threads)
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

    def left() -> float:
        return time_limit - (time.perf_counter() - t_start)

    while left() > 0.5 and status != "optimal" and cost - lb > mip_gap * cost:
        improved = False
        for t0, t1 in _windows(problem, R, w):
            if left() <= 0.5:
                break
            model.clear_fixes()
            outside = np.ones(n, bool)
            outside[t0:t1] = False
            for blk, M in ((v.R, R), (v.S, S)):
                sel = (blk >= 0) & outside[:, None]
                model.fix(blk[sel], M[sel].astype(float))
            full = t1 - t0 >= n
            try:
                sol = model.solve("highs", time_limit=max(0.5, min(per if not full else left(),
                                                                 left())),
                                  mip_gap=mip_gap, threads=threads,
                                  warm_start=checkmate_vector(model, v, problem, R, S))
            except SolverTimeoutError:
                steps.append(LnsStep(t0, t1, "no_solution", cost, time.perf_counter() - t_start))
                continue
            if sol.has_solution:
                R2, S2 = decode_schedule(problem, v, sol.x)
                c2 = schedule_cost(problem, R2)
                if c2 < cost * (1 - 1e-9) and schedule_memory(problem, R2, S2)[0] <= budget:
                    R, S, cost, improved = R2, S2, c2, True
            if full and sol.status == "optimal":
                status = "optimal"
                if math.isfinite(sol.bound):
                    lb = max(lb, min(cost, sol.bound * v.cost_unit))
            steps.append(LnsStep(t0, t1, sol.status, cost, time.perf_counter() - t_start))
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
    elapsed = time.perf_counter() - t_start
    return CheckmateSolution(
        R, S, status, cost, lb, rel_gap(cost, lb), peak, elapsed, build_s, -1,
        {"method": "lns", "start_objective": start_cost,
         "lns_steps": [dataclasses.asdict(s) for s in steps],
         "final_window": w, "lp_bound_time_s": lp_s})
