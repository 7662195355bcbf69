"""Solving the Checkmate MILP: :func:`solve_checkmate` picks a strategy and runs it.

Before any strategy: checkpoint-all when it fits, the frontier lower bound, the warm start, the
small LP relaxation (with path cuts) and the answer without a MILP when the LP bound proves the
warm start or no time is left for the MILP's root.  Then one strategy takes the
:class:`~solvers.checkmate.solve_state.SolveState`: the lazy memory chain
(:mod:`~solvers.checkmate.lazy`), as a portfolio of HiGHS seeds
(:mod:`~solvers.checkmate.lazy_portfolio`) or raced against CP-SAT
(:mod:`~solvers.checkmate.lazy_race`), or the whole model (:mod:`~solvers.checkmate.whole`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from solvers.checkmate.formulation import Formulation
from solvers.checkmate.frontier import best_heuristic, check_frontier_schedule
from solvers.checkmate.lazy import solve_lazy
from solvers.checkmate.lazy_portfolio import portfolio_size, solve_lazy_portfolio
from solvers.checkmate.lazy_race import solve_lazy_race
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.solve_state import (
    LpBound,
    Schedule,
    SolveClock,
    SolveState,
    answer_before_solving,
    small_lp_bound,
    small_lp_bound_with_cuts,
)
from solvers.checkmate.whole import solve_whole

__all__ = ["solve_checkmate"]


def solve_checkmate(
    problem: CheckmateProblem,
    *,
    time_limit: float = 60.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    backend: str = "highs",
    warm_start: tuple[np.ndarray, np.ndarray] | str | None = "auto",
    formulation: Formulation = Formulation(),  # noqa: B008 (frozen dataclass)
    presolve: bool = True,
    log: bool = False,
    options: dict | None = None,
    lp_first: bool = True,
    lazy_memory: bool = True,
    path_cuts: bool = True,
    portfolio: int | None = None,
) -> CheckmateSolution:
    """Solve Checkmate's MILP exactly (up to ``mip_gap``) for ``problem.budget`` (bytes).

    With ``lp_first`` the small LP relaxation of
    :func:`~solvers.checkmate.lp_round.solve_checkmate_lp` (no ``U``/``FREE`` chain; at most a
    quarter of ``time_limit``) runs first: if the warm start is already within ``mip_gap`` of
    its bound the warm start is returned as ``optimal`` without building the MILP, and
    otherwise its bound is kept when the MILP's own bound is weaker.  The MILP gets the time
    that is left; when that is under ten times the small LP's time (the full root LP would not
    finish and HiGHS overruns its limit in presolve), the warm start is returned with status
    ``time_limit`` and the LP bound.

    Args:
      time_limit: seconds for everything (LP bound, model build, MILP).
      mip_gap: relative gap at which the solve stops (HiGHS ``mip_rel_gap``).
      threads: HiGHS threads (CP-SAT's workers with ``backend="cpsat"``, default 4).
      backend: ``"highs"``, ``"cvxpy"``, ``"cpsat"`` (OR-Tools CP-SAT,
        :mod:`solvers.milp.backends.cpsat`) or ``"race"`` (HiGHS against CP-SAT).
      warm_start: ``(R, S)`` frontier-form schedule, ``"auto"`` (cheapest fitting schedule from
        :func:`~solvers.checkmate.frontier.heuristic_schedules`) or ``None``.  A warm start
        that is not frontier-form or does not fit is ignored (``meta["warm_start"]`` says so).
      formulation: the MILP's switches (:class:`~solvers.checkmate.formulation.Formulation`).
      presolve, log, options: HiGHS presolve (on), log and extra options.
      lazy_memory: (HiGHS and the race, with the formulation's full memory chain) build the
        ``U``/``FREE`` memory chain only for the steps whose replayed peak a relaxation
        without it overshoots (:func:`~solvers.checkmate.lazy.solve_lazy`).  With
        ``backend="race"`` the lazy HiGHS loop races CP-SAT on the whole model
        (:func:`~solvers.checkmate.lazy_race.solve_lazy_race`).
      path_cuts: (HiGHS and the race, with ``lp_first``) strengthen the small LP with path
        cuts (:func:`~solvers.checkmate.path_cuts.path_cut_loop`, within the LP's quarter of
        the time) and add them to every MILP model solved.
      portfolio: (HiGHS, lazy) run the lazy loop as that many searches at once, HiGHS random
        seeds ``0..portfolio-1``, one thread each, the first proof stopping the others
        (:func:`~solvers.checkmate.lazy_portfolio.solve_lazy_portfolio`).  ``None``: two when
        ``threads`` is ``None`` and the process may use two or more cores, else one.

    Returns:
      :class:`CheckmateSolution` (status ``optimal``, ``time_limit``, or ``feasible`` when a
      tolerance made the MILP's schedule exceed the budget and the warm start was returned).

    Raises:
      InfeasibleBudgetError: no schedule fits (``min_feasible_bytes`` computed with
        :func:`~solvers.checkmate.min_peak.min_feasible_budget`).
      SolverTimeoutError: the time limit hit with no incumbent (impossible with a warm start).
      SolverError: ``portfolio`` is not a positive integer (before any work).
    """
    members = portfolio_size(portfolio, threads)  # bad input fails before any work
    clock = SolveClock(time_limit)
    done = answer_before_solving(problem, clock, warm_start=None)
    if done is not None:
        return done
    warm, warm_name = _initial_schedule(problem, warm_start)
    lp = LpBound()
    if backend in ("cpsat", "race"):  # integer data: memory in units of the sizes' gcd
        formulation = dataclasses.replace(formulation, integer_memory=True)
    meta = {"backend": backend, "warm_start": warm_name}
    if lp_first and path_cuts and backend in ("highs", "race"):
        lp = small_lp_bound_with_cuts(problem, formulation, 0.25 * time_limit, threads, meta)
    elif lp_first and backend in ("highs", "cpsat", "race"):
        lp = small_lp_bound(problem, formulation, 0.25 * time_limit, threads)
    state = SolveState(problem, clock, warm=warm, formulation=formulation, mip_gap=mip_gap,
                       lp=lp, meta=meta, backend=backend, threads=threads, presolve=presolve,
                       options=options, log=log)
    if warm is not None:
        done = _answer_without_milp(state)
        if done is not None:
            return done
    lazy = lazy_memory and formulation.memory_chain and formulation.chain_steps is None
    if lazy and backend == "highs":
        if members > 1:
            return solve_lazy_portfolio(state, range(members))
        return solve_lazy(state)
    if lazy and backend == "race":  # the lazy HiGHS loop against CP-SAT's whole model
        return solve_lazy_race(state)
    return solve_whole(state)


def _initial_schedule(problem: CheckmateProblem, warm_start: Schedule | str | None
                      ) -> tuple[Schedule | None, str | None]:
    """``(schedule, name)`` of the warm start (see :func:`solve_checkmate`)."""
    budget = problem.budget
    if isinstance(warm_start, str) and warm_start == "auto":
        h = best_heuristic(problem, budget)
        if h is not None and h[3] <= budget:
            return (h[1], h[2]), h[0]
        return None, None
    if warm_start is not None:
        warm = check_frontier_schedule(problem, warm_start, budget)
        return warm, ("given" if warm is not None else
                      "given (rejected: not frontier-form or over budget)")
    return None, None


def _answer_without_milp(state: SolveState) -> CheckmateSolution | None:
    """The warm start when the MILP is not needed (the LP bound proves it optimal) or cannot
    help (too little time left for its root LP), else ``None``."""
    problem, warm, lp, clock, mip_gap = (state.problem, state.warm, state.lp, state.clock,
                                         state.mip_gap)
    wobj = schedule_cost(problem, warm[0])
    left = clock.left()
    status = None
    if wobj - lp.bound <= mip_gap * abs(wobj):
        status, method, note = "optimal", "warm start proven by the LP bound", ""
        solve_s, build_s = lp.time_s, clock.elapsed() - lp.time_s
    elif lp.time_s > 0 and left < 10 * lp.time_s:
        # the full MILP's root LP costs several times the small LP; with this little time HiGHS
        # would only overrun its limit in presolve/root LP
        method = "warm start (no time left for the MILP root)"
        note = f"{left:.1f} s left < 10 x LP time {lp.time_s:.1f} s"
        solve_s, build_s = clock.elapsed(), 0.0
    else:
        return None
    peak, _ = schedule_memory(problem, *warm)
    lb = min(max(lp.bound, float(problem.costs.sum())), wobj)
    gap = rel_gap(wobj, lb)
    if status is None:
        status = "optimal" if gap <= mip_gap else "time_limit"
    return CheckmateSolution(
        warm[0], warm[1], status, wobj, lb, gap, peak, solve_s, build_s, 0,
        {"method": method, **state.meta, "warm_start_objective": wobj, "lp_bound": lp.bound,
         "note": note})
