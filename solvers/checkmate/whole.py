"""The whole Checkmate MILP solved as one model (every step's ``U``/``FREE`` memory chain built,
or none when the formulation drops it), on any back end of :meth:`solvers.milp.MilpModel.solve`.
"""

from __future__ import annotations

import dataclasses
import math
import time

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.checkmate.formulation import (
    CheckmateVars,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.problem import CheckmateSolution, rel_gap, schedule_cost, schedule_memory
from solvers.checkmate.solve_state import SolveState, raise_infeasible
from solvers.milp import MilpModel, MilpSolution

__all__ = ["solve_whole"]


def solve_whole(state: SolveState) -> CheckmateSolution:
    """Build the MILP (with the LP's path cuts), warm-start it and solve it on
    ``state.backend`` within the time left (at least 5 % of the limit).

    Returns:
      :class:`CheckmateSolution`: status ``optimal``, ``time_limit`` (also ``optimal`` when the
      LP bound closes the gap the MILP left), or ``feasible`` when a tolerance made the MILP's
      schedule exceed the budget and the warm start was returned.

    Raises:
      InfeasibleBudgetError: the MILP is infeasible (:func:`raise_infeasible`).
      SolverTimeoutError: no incumbent in time (the bound in cost units).
      SolverError: the MILP ended without a solution for another reason.
    """
    problem, clock, warm = state.problem, state.clock, state.warm
    t_b = time.perf_counter()
    model = MilpModel("checkmate")
    v = add_checkmate_core(model, problem, budget=problem.budget, formulation=state.formulation)
    state.lp.add_cuts(model, v)
    x0 = checkmate_vector(model, v, problem, *warm) if warm is not None else None
    build = time.perf_counter() - t_b
    try:
        sol = model.solve(state.backend, time_limit=clock.left(floor=0.05 * clock.limit),
                          mip_gap=state.mip_gap, threads=state.threads, warm_start=x0,
                          log=state.log, presolve=state.presolve, options=state.options)
    except SolverTimeoutError as e:
        b = None if e.bound is None else e.bound * v.cost_unit
        raise SolverTimeoutError(str(e), bound=b) from None
    return _milp_answer(state, model, v, sol, build)


def _milp_answer(state: SolveState, model: MilpModel, v: CheckmateVars, sol: MilpSolution,
                 build: float) -> CheckmateSolution:
    """The :class:`CheckmateSolution` of a finished MILP solve (raises when it has none);
    ``build``: the model's build time (seconds)."""
    problem, warm, lp, mip_gap = state.problem, state.warm, state.lp, state.mip_gap
    budget = problem.budget
    if sol.status == "infeasible":
        raise_infeasible(problem, state.clock)
    if not sol.has_solution:
        raise SolverError(f"MILP ended with status {sol.message!r} and no solution")
    R, S = decode_schedule(problem, v, sol.x)
    peak, _ = schedule_memory(problem, R, S)
    note = ""
    if peak > budget:  # an integrality/feasibility tolerance let a few bytes through
        if warm is None:
            raise SolverError(f"MILP solution has peak {peak} > budget {budget} (tolerance problem)")
        note = f"MILP solution exceeded the budget by {peak - budget} bytes; warm start returned"
        R, S = warm
        peak, _ = schedule_memory(problem, R, S)
        sol = dataclasses.replace(sol, status="feasible")
    obj = schedule_cost(problem, R)
    # every node runs at least once: sum(costs) is always a valid bound
    trivial = float(problem.costs.sum())
    lb = max(sol.bound * v.cost_unit, trivial) if math.isfinite(sol.bound) else trivial
    lb = max(lb, lp.bound)
    if sol.status == "optimal":
        lb = min(obj, lb) if math.isfinite(lb) else obj
    status = sol.status if sol.status in ("optimal", "feasible") else "time_limit"
    if status == "time_limit" and rel_gap(obj, lb) <= mip_gap:
        status = "optimal"  # the LP bound closed the gap the MILP left open
    meta = {
        "method": "milp",
        **state.meta,
        "warm_start_objective": None if warm is None else schedule_cost(problem, warm[0]),
        "num_vars": model.num_vars,
        "num_int_vars": int(model.integrality().sum()),
        "num_rows": model.num_rows,
        "solver_message": sol.message,
        "milp_objective": sol.objective * v.cost_unit,
        "lp_bound": lp.bound,
        "note": note,
    }
    return CheckmateSolution(R, S, status, obj, lb, rel_gap(obj, lb), peak,
                             sol.solve_time_s, build + sol.build_time_s, sol.node_count, meta)
