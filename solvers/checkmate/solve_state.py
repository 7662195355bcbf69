"""What every Checkmate strategy takes (:class:`SolveState`) and the helpers they share: the
solve's clock, the small LP relaxation's bound, the answers before any MILP (checkpoint-all,
the frontier lower bound) and the answer to an infeasible MILP.  :class:`SolveClock` keeps the
time (units: :mod:`solvers.checkmate`).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from remat.core.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from solvers.checkmate.formulation import Formulation, add_checkmate_core
from solvers.checkmate.min_peak import min_feasible_budget
from solvers.checkmate.path_cuts import PathCuts, path_cut_loop
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    checkpoint_all_schedule,
    schedule_memory,
)
from solvers.milp import MilpModel

__all__ = [
    "Schedule",
    "SolveClock",
    "LpBound",
    "SolveState",
    "small_lp_bound",
    "small_lp_bound_with_cuts",
    "answer_before_solving",
    "raise_infeasible",
]

#: ``(R, S)``: ``bool[n, n]`` frontier-form schedule.
Schedule = tuple[np.ndarray, np.ndarray]


class SolveClock:
    """Wall-clock accounting of one solve: ``limit`` seconds from construction."""

    def __init__(self, time_limit: float) -> None:
        self.limit = time_limit
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the solve started."""
        return time.perf_counter() - self.start

    def left(self, floor: float = -math.inf) -> float:
        """Seconds left of the limit (negative once overrun), at least ``floor``."""
        return max(floor, self.limit - self.elapsed())


@dataclasses.dataclass(frozen=True)
class LpBound:
    """The small LP relaxation's bound (cost units, ``-inf``: none), its time (seconds) and the
    path cuts its loop added (:mod:`solvers.checkmate.path_cuts`; ``None``: no loop ran)."""

    bound: float = -math.inf
    time_s: float = 0.0
    cuts: PathCuts | None = None

    def add_cuts(self, model: MilpModel, v) -> None:
        """Append the path cuts (if any) to a model built by :func:`add_checkmate_core`."""
        if self.cuts is not None and self.cuts.num_rows:
            self.cuts.add_to(model, v)


@dataclasses.dataclass(frozen=True, eq=False)
class SolveState:
    """One Checkmate solve as every strategy (:mod:`~solvers.checkmate.whole`,
    :mod:`~solvers.checkmate.lazy`, :mod:`~solvers.checkmate.lazy_portfolio`,
    :mod:`~solvers.checkmate.lazy_race`, :mod:`~solvers.checkmate.lns`) takes it.

    Attributes:
      problem: the graph on arrays, ``budget`` (bytes) set.
      clock: the solve's clock; ``clock.limit`` is the time limit (seconds) for everything.
      warm: frontier-form schedule that fits the budget (warm start, incumbent), or ``None``.
      formulation: the MILP's switches (:class:`~solvers.checkmate.formulation.Formulation`).
      mip_gap: relative gap at which a search stops.
      lp: the small LP's bound and path cuts (:func:`small_lp_bound`,
        :func:`small_lp_bound_with_cuts`), or a bound the caller already has.
      meta: the entries every answer's ``meta`` starts from (back end, warm start, path
        cuts); strategies copy it, never change it.
      backend: MILP back end of the whole-model solve (:meth:`solvers.milp.MilpModel.solve`).
      threads, presolve, options, log: HiGHS's threads, presolve, extra options and log.
    """

    problem: CheckmateProblem
    clock: SolveClock
    warm: Schedule | None = None
    formulation: Formulation = Formulation()
    mip_gap: float = 1e-4
    lp: LpBound = LpBound()
    meta: dict = dataclasses.field(default_factory=dict)
    backend: str = "highs"
    threads: int | None = None
    presolve: bool = True
    options: dict | None = None
    log: bool = False


def small_lp_bound(problem: CheckmateProblem, formulation: Formulation, time_limit: float,
                   threads: int | None) -> LpBound:
    """The small LP relaxation (no memory chain, no dominance rows) within ``time_limit`` s."""
    lpm = MilpModel("checkmate_lp_bound")
    lv = add_checkmate_core(lpm, problem, budget=problem.budget, formulation=dataclasses.replace(
        formulation, memory_chain=False, useful=False))
    try:
        lps = lpm.solve("highs", time_limit=time_limit, relax=True, threads=threads)
    except SolverTimeoutError:
        return LpBound()
    bound = lps.objective * lv.cost_unit if lps.status == "optimal" else -math.inf
    return LpBound(bound, lps.solve_time_s + lps.build_time_s)


def small_lp_bound_with_cuts(problem: CheckmateProblem, formulation: Formulation,
                             time_limit: float, threads: int | None, meta: dict) -> LpBound:
    """The small LP relaxation strengthened by path cuts (:func:`path_cut_loop`) within
    ``time_limit`` s; the cuts are kept for the MILP models.  ``meta["path_cuts"]`` records
    the rounds."""
    res = path_cut_loop(problem, formulation, time_limit, threads=threads)
    meta["path_cuts"] = {"rows": res.cuts.num_rows, "rounds": len(res.rounds),
                         "time_s": res.time_s, "first_bound": (res.rounds[0]["bound"]
                                                               if res.rounds else None),
                         "bound": res.bound, "stop": res.stop}
    # time_s is the first LP's alone: the selector reads it as the root LP's cost
    return LpBound(res.bound, res.first_lp_s, res.cuts)


def answer_before_solving(problem: CheckmateProblem, clock: SolveClock, **meta
                          ) -> CheckmateSolution | None:
    """What every Checkmate solve (exact or LP rounding) does first.

    Returns:
      The checkpoint-all schedule (optimal: every node runs once) when it fits
      ``problem.budget`` bytes or there is no budget, ``meta`` added to its ``meta``; else
      ``None``.

    Raises:
      InfeasibleBudgetError: ``problem.budget`` is below the frontier lower bound (with
        :func:`min_feasible_budget`, ``clock.limit`` seconds).
    """
    R0, S0 = checkpoint_all_schedule(problem)
    peak0, _ = schedule_memory(problem, R0, S0)
    budget = problem.budget
    if budget is None or budget >= peak0:
        c = float(problem.costs.sum())
        return CheckmateSolution(R0, S0, "optimal", c, c, 0.0, peak0, clock.elapsed(), 0.0, 0,
                                 {"method": "checkpoint_all", **meta})
    if budget < problem.frontier_lower_bound():
        mf, exact = min_feasible_budget(problem, time_limit=clock.limit)
        raise InfeasibleBudgetError(budget, mf, "below the frontier lower bound" +
                                    ("" if exact else " (min_feasible_bytes is an upper estimate)"))
    return None


def raise_infeasible(problem: CheckmateProblem, clock: SolveClock) -> None:
    """After a MILP (or a relaxation of it) reported ``infeasible``: raise
    :class:`InfeasibleBudgetError` with :func:`min_feasible_budget`, or :class:`SolverError`
    when a schedule within the budget exists after all (numerical trouble)."""
    budget = problem.budget
    mf, exact = min_feasible_budget(problem, time_limit=clock.limit)
    if mf <= budget:
        raise SolverError(f"solver reported infeasible but a schedule with peak {mf} fits")
    raise InfeasibleBudgetError(budget, mf, "" if exact else "min_feasible_bytes is an upper estimate")
