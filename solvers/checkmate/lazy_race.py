"""HiGHS's lazy Checkmate solve and CP-SAT on the whole model at once: first proof wins.

The lazy loop (:func:`solvers.checkmate.lazy.solve_lazy`, relaxation rounds and the repair of
overshooting schedules) is a sequence of models, not one, so the race with CP-SAT
(:func:`solvers.milp.backends.cpsat.solve_cpsat`) is run here, one level above the models: the
lazy loop in the calling thread, CP-SAT on the whole integer model (memory in units of the
sizes' gcd) in a second thread.  The first to prove its answer optimal stops the other
(:class:`~solvers.checkmate.lazy.LazyCancel` / ``CpSolver.stop_search``); otherwise, at the
time limit, the cheaper schedule that fits on replay is returned with the larger of the two
bounds (both bound the same problem).  Against the one-model race
(:mod:`solvers.milp.backends.race`) on the zoo: ``experiments/results/lazy_race_zoo.csv``
(``python -m experiments.cpsat_benchmark --solvers race race-full``).
"""

from __future__ import annotations

import dataclasses
import math
import threading

from remat.core.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from solvers.checkmate.formulation import add_checkmate_core, checkmate_vector, decode_schedule
from solvers.checkmate.lazy import LazyCancel, solve_lazy
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.solve_state import SolveClock, SolveState, raise_infeasible
from solvers.milp import MilpModel
from solvers.milp.backends import cpsat

__all__ = ["solve_lazy_race"]


def solve_lazy_race(state: SolveState) -> CheckmateSolution:
    """Race :func:`~solvers.checkmate.lazy.solve_lazy` on ``state`` against CP-SAT (see the
    module docstring).

    ``state.options`` go to HiGHS, but for ``cpsat_workers`` (CP-SAT's workers, default 3) and
    ``log``, which are taken out; ``state.threads`` and ``state.presolve`` are HiGHS's.

    Returns:
      :class:`CheckmateSolution`; ``meta["race"]`` has each side's status, objective, bound
      and which side's schedule was returned (``winner``).

    Raises:
      SolverError: OR-Tools missing (racing HiGHS alone would be a silent downgrade).
      InfeasibleBudgetError: no schedule fits (from either side).
      SolverTimeoutError: neither side found a schedule in time.
    """
    opts = dict(state.options or {})
    cpsat_workers = int(opts.pop("cpsat_workers", 3))
    opts.pop("log", None)
    state = dataclasses.replace(state, options=opts)
    problem, clock, mip_gap, warm = state.problem, state.clock, state.mip_gap, state.warm
    if not cpsat.available():
        raise SolverError("the HiGHS/CP-SAT race needs OR-Tools: pip install -e '.[cpsat]'")
    if int(cpsat_workers) < 1:
        raise SolverError(f"cpsat_workers must be at least 1, got {cpsat_workers!r}")
    cancel = LazyCancel()
    lock = threading.Lock()
    shared: dict = {"highs_done": False, "cp": None}
    out: dict = {}

    def on_cp_start(cp_solver) -> None:
        with lock:
            shared["cp"] = cp_solver
            if shared["highs_done"]:
                cp_solver.stop_search()

    def run_cpsat() -> None:
        try:
            form = dataclasses.replace(state.formulation, integer_memory=True, chain_steps=None)
            model = MilpModel("checkmate_cpsat")
            v = add_checkmate_core(model, problem, budget=problem.budget, formulation=form)
            x0 = None if warm is None else checkmate_vector(model, v, problem, *warm)
            sol = cpsat.solve_cpsat(model, time_limit=clock.left(floor=0.5), mip_gap=mip_gap,
                                    workers=cpsat_workers, warm_start=x0,
                                    on_start=on_cp_start)
            out["cp"] = (sol, v)
            if sol.status in ("optimal", "infeasible"):
                cancel.cancel()
        except Exception as e:  # noqa: BLE001 (handed to the caller's thread)
            out["cp_error"] = e

    thread = threading.Thread(target=run_cpsat, name="checkmate-cpsat", daemon=True)
    thread.start()
    try:
        lazy = solve_lazy(state, cancel=cancel)
    except (SolverTimeoutError, InfeasibleBudgetError) as e:
        lazy, lazy_error = None, e
    else:
        lazy_error = None
    with lock:
        shared["highs_done"] = True
        if lazy is not None and lazy.status == "optimal" and shared["cp"] is not None:
            shared["cp"].stop_search()
    if lazy is None or lazy.status != "optimal":
        thread.join()  # CP-SAT may still prove or improve: it stops at the time limit
    else:
        thread.join(timeout=max(1.0, clock.left()))
    return _combine(problem, lazy, lazy_error, out, mip_gap, state.meta, clock)


def _combine(problem: CheckmateProblem, lazy: CheckmateSolution | None,
             lazy_error: Exception | None, out: dict, mip_gap: float,
             meta: dict, clock: SolveClock) -> CheckmateSolution:
    """The race's answer from the lazy side's solution (or error) and CP-SAT's (or error)."""
    budget = problem.budget
    cp_sol, v = out.get("cp", (None, None))
    race = {"highs_status": None if lazy is None else lazy.status,
            "highs_objective": None if lazy is None else lazy.objective,
            "highs_bound": None if lazy is None else lazy.lower_bound,
            "highs_error": None if lazy_error is None else type(lazy_error).__name__,
            "cpsat_status": None if cp_sol is None else cp_sol.status,
            "cpsat_error": (None if "cp_error" not in out
                            else f"{type(out['cp_error']).__name__}: {out['cp_error']}")}
    if isinstance(lazy_error, InfeasibleBudgetError):
        raise lazy_error
    cp_sched = None
    cp_bound = -math.inf
    if cp_sol is not None:
        if cp_sol.status == "infeasible" and lazy is None:
            # CP-SAT's proof stopped the HiGHS side before its own: name the smallest
            # feasible budget (or SolverError if a schedule fits after all)
            raise_infeasible(problem, clock)
        if math.isfinite(cp_sol.bound):
            cp_bound = cp_sol.bound * v.cost_unit
        if cp_sol.has_solution:
            R, S = decode_schedule(problem, v, cp_sol.x)
            peak, _ = schedule_memory(problem, R, S)
            if peak <= budget:
                cp_sched = (schedule_cost(problem, R), R, S, peak)
        race["cpsat_objective"] = None if cp_sched is None else cp_sched[0]
        race["cpsat_bound"] = cp_bound if math.isfinite(cp_bound) else None
    if lazy is None and cp_sched is None:
        if lazy_error is not None:
            raise lazy_error
        err = out.get("cp_error")
        raise SolverTimeoutError(f"neither HiGHS nor CP-SAT found a schedule in time ({err})",
                                 bound=cp_bound if math.isfinite(cp_bound) else None)
    bound = max(cp_bound, -math.inf if lazy is None else lazy.lower_bound,
                float(problem.costs.sum()))
    if lazy is not None and (cp_sched is None or lazy.objective <= cp_sched[0]):
        R, S, cost, peak, winner = lazy.R, lazy.S, lazy.objective, lazy.peak_bytes, "highs"
        base_meta, solve_s, build_s, nodes = lazy.meta, lazy.solve_time_s, lazy.build_time_s, \
            lazy.node_count
    else:
        cost, R, S, peak = cp_sched
        winner = "cpsat"
        base_meta = {"method": "milp", **meta, "memory_chain": "whole (CP-SAT)",
                     "note": ""}
        solve_s, build_s, nodes = cp_sol.solve_time_s, cp_sol.build_time_s, cp_sol.node_count
    bound = min(bound, cost)
    status = "optimal" if rel_gap(cost, bound) <= mip_gap else "time_limit"
    if cp_sol is not None and cp_sol.status == "optimal" and winner == "cpsat":
        status = "optimal"
    race["winner"] = winner
    if lazy is not None and winner == "cpsat":
        race["highs_lazy_rounds"] = lazy.meta.get("lazy_rounds")
    return CheckmateSolution(R, S, status, cost, bound, rel_gap(cost, bound), peak, solve_s,
                             build_s, nodes, {**base_meta, "backend": "race", "race": race})
