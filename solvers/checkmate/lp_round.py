"""Checkmate's approximation: LP relaxation, rounding of ``S``, the cheapest ``R`` per rounding."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from remat.core.errors import InfeasibleBudgetError, SolverTimeoutError
from solvers.checkmate.formulation import Formulation, add_checkmate_core
from solvers.checkmate.frontier import best_heuristic, check_frontier_schedule, min_r_given_s
from solvers.checkmate.min_peak import min_feasible_budget, min_peak_schedule
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.solve_state import (
    Schedule,
    SolveClock,
    answer_before_solving,
)
from solvers.milp import MilpModel

__all__ = ["solve_checkmate_lp"]

#: ``(R, S, cost, peak_bytes, lp_budget_factor)`` of a candidate schedule.
Candidate = tuple[np.ndarray, np.ndarray, float, int, float | None]


def solve_checkmate_lp(
    problem: CheckmateProblem,
    *,
    time_limit: float = 60.0,
    thresholds: tuple[float, ...] = tuple(np.round(np.arange(0.05, 1.0, 0.05), 2)),
    n_random: int = 16,
    seed: int = 0,
    budget_factors: tuple[float, ...] = (1.0, 0.9, 0.8),
    formulation: Formulation = Formulation(memory_chain=False),  # noqa: B008 (frozen)
    threads: int | None = None,
    log: bool = False,
    fallback: Schedule | Callable[[], Schedule | None] | None = None,
    heuristic_fallback: bool = True,
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
    for every legal schedule, so its optimum is still a valid lower bound; on chain graphs it
    equals the full LP's bound and solves faster
    (``docs/design/decisions/0001-checkmate-milp-formulation.md``).  Pass ``Formulation()``
    for the full LP.

    Args:
      time_limit: seconds for everything (LPs, roundings, fallbacks).
      heuristic_fallback: when no rounding fits, fall back as above; ``False`` raises
        :class:`~remat.core.errors.SolverTimeoutError` carrying the LP bound instead (for a caller
        that already has the heuristics' schedules, which the fallback would run again).

    Returns a :class:`CheckmateSolution` with status ``feasible`` (``optimal`` when the rounded
    cost meets the LP bound); ``lower_bound`` is the LP relaxation's optimum.
    """
    clock = SolveClock(time_limit)
    done = answer_before_solving(problem, clock)
    if done is not None:
        return done
    rounds = _Rounds(np.random.default_rng(seed))
    for bf in budget_factors:
        left = clock.left()
        if left <= 0.5 or (rounds.lp_times and left < 1.5 * max(rounds.lp_times)):
            break
        if not rounds.solve_and_round(problem, bf, left, formulation, thresholds, n_random,
                                      threads, log):
            break
    best, method = rounds.best, "lp_rounding"
    if best is None and not heuristic_fallback:
        raise SolverTimeoutError(
            f"no LP rounding fits {problem.budget} bytes ({rounds.tried} tried)",
            bound=rounds.lp_bound if math.isfinite(rounds.lp_bound) else None)
    if best is None:
        best, method = _fallback(problem, fallback, clock)
    R, S, cost, peak, bf = best
    gap = rel_gap(cost, rounds.lp_bound)
    status = "optimal" if gap == 0.0 else "feasible"
    return CheckmateSolution(
        R, S, status, cost, rounds.lp_bound, gap, peak, clock.elapsed(), rounds.build_s, 0,
        {"method": method, "lp_solve_time_s": rounds.lp_times, "roundings_tried": rounds.tried,
         "lp_budget_factor": bf},
    )


@dataclasses.dataclass(eq=False)
class _Rounds:
    """State of the rounding search over budget factors."""

    rng: np.random.Generator
    best: Candidate | None = None
    tried: int = 0
    lp_bound: float = math.nan
    lp_times: list[float] = dataclasses.field(default_factory=list)
    build_s: float = 0.0

    def solve_and_round(self, problem: CheckmateProblem, bf: float, left: float,
                        formulation: Formulation, thresholds: tuple[float, ...], n_random: int,
                        threads: int | None, log: bool) -> bool:
        """Solve the LP at ``bf`` x budget within ``left`` seconds and round it; ``False`` when
        the LP timed out (the search stops)."""
        budget = problem.budget
        tb = time.perf_counter()
        model = MilpModel("checkmate_lp")
        v = add_checkmate_core(model, problem, budget=int(budget * bf), formulation=formulation)
        self.build_s += time.perf_counter() - tb
        try:
            sol = model.solve("highs", time_limit=left, relax=True, threads=threads, log=log)
        except SolverTimeoutError:
            return False
        self.lp_times.append(sol.solve_time_s)
        if sol.status != "optimal":
            if bf == 1.0 and sol.status == "infeasible":
                mf, _ = min_feasible_budget(problem, time_limit=max(1.0, left))
                raise InfeasibleBudgetError(budget, mf, "LP relaxation infeasible")
            return True
        if bf == 1.0:
            self.lp_bound = sol.objective * v.cost_unit
        Sf = np.zeros((problem.n, problem.n))
        ms = v.S >= 0
        Sf[ms] = sol.x[v.S[ms]]
        cands = [Sf >= th - 1e-9 for th in thresholds]
        cands += [self.rng.random(Sf.shape) < Sf for _ in range(n_random)]
        for Sc in cands:
            self.tried += 1
            R, S = min_r_given_s(problem, Sc)
            peak, _ = schedule_memory(problem, R, S)
            if peak > budget:
                continue
            cost = schedule_cost(problem, R)
            if self.best is None or cost < self.best[2]:
                self.best = (R, S, cost, peak, bf)
        return True


def _fallback(problem: CheckmateProblem, fallback: Schedule | Callable[[], Schedule | None] | None,
              clock: SolveClock) -> tuple[Candidate, str]:
    """``(candidate, method)`` when no rounding fits: the cheapest fitting of ``fallback`` and the
    best heuristic, else the peak-minimising MILP's schedule (see :func:`solve_checkmate_lp`)."""
    budget = problem.budget
    fits = []
    if callable(fallback):
        fallback = fallback()
    if fallback is not None and (fb := check_frontier_schedule(problem, fallback, budget)) is not None:
        fits.append((fb[0], fb[1], schedule_cost(problem, fb[0]),
                     schedule_memory(problem, *fb)[0], None, "fallback"))
    h = best_heuristic(problem, budget)
    if h is not None and h[3] <= budget:
        fits.append((h[1], h[2], h[4], h[3], None, "heuristic"))
    if not fits:
        mf, exact, Rm, Sm = min_peak_schedule(problem, clock.left(floor=1.0))
        if mf > budget and exact:
            raise InfeasibleBudgetError(budget, mf, "the peak-minimising MILP proved it")
        if mf > budget:  # nothing fits, but nothing proves that no schedule does
            raise SolverTimeoutError(
                f"LP rounding found no schedule within {budget} bytes; the smallest peak "
                f"found is {mf} bytes (not proven minimal, so infeasibility is not claimed)"
            )
        fits.append((Rm, Sm, schedule_cost(problem, Rm), mf, None, "min-peak MILP"))
    fits.sort(key=lambda f: f[2])
    return fits[0][:5], f"{fits[0][5]} (no rounding fitted)"
