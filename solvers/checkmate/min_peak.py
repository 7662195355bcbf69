"""The smallest budget a frontier-form schedule fits: the peak-minimising Checkmate MILP.

Memory is bytes, times wall-clock seconds.
"""

from __future__ import annotations

import numpy as np

from remat.core.errors import SolverTimeoutError
from solvers.checkmate.formulation import (
    Formulation,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.frontier import best_heuristic
from solvers.checkmate.problem import CheckmateProblem, schedule_memory
from solvers.milp import MilpModel

__all__ = ["min_feasible_budget", "min_peak_schedule"]


def min_feasible_budget(problem: CheckmateProblem, *, time_limit: float = 60.0,
                        formulation: Formulation = Formulation()  # noqa: B008 (frozen)
                        ) -> tuple[int, bool]:
    """The smallest budget (bytes) for which a frontier-form schedule exists.

    Returns ``(bytes, exact)``.  ``exact`` is True when a schedule meeting
    :meth:`CheckmateProblem.frontier_lower_bound` is found (the bound is then attained) or when
    the peak-minimising MILP proves optimality; otherwise ``bytes`` is the best schedule's peak
    found within ``time_limit`` seconds (an upper bound on the true minimum).
    """
    peak, exact, _, _ = min_peak_schedule(problem, time_limit, formulation)
    return peak, exact


def min_peak_schedule(problem: CheckmateProblem, time_limit: float,
                      formulation: Formulation = Formulation()  # noqa: B008 (frozen)
                      ) -> tuple[int, bool, np.ndarray, np.ndarray]:
    """``(peak_bytes, exact, R, S)`` of the lowest-peak schedule found (see
    :func:`min_feasible_budget`; ``R``, ``S``: ``bool[n, n]`` frontier form)."""
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
        R, S = decode_schedule(problem, v, sol.x)
        peak, _ = schedule_memory(problem, R, S)
        if peak < best_peak:
            best_peak, warm = peak, (R, S)
    exact = sol.status == "optimal"
    return int(best_peak), bool(exact), warm[0], warm[1]
