"""The lazy Checkmate solve: the MILP with its ``U``/``FREE`` memory chain added step by step
(``solve_checkmate(lazy_memory=True)``), and :class:`LazyCancel`, which stops it from another
thread.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.checkmate.formulation import (
    CheckmateVars,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.repair import repair_schedule
from solvers.checkmate.solve_state import SolveState, raise_infeasible
from solvers.milp import MilpModel

__all__ = ["REPAIR_SHARE", "LazyCancel", "OvershootWatch", "solve_lazy"]

# share of the time limit the lazy solve keeps for repairing a relaxation's schedule that
# overshoots the budget (:func:`solvers.checkmate.repair.repair_schedule`)
REPAIR_SHARE = 0.1


class LazyCancel:
    """Stops :func:`solve_lazy` from another thread (a racing back end that proved first):
    :meth:`cancel` stops the HiGHS search under way and no further round starts."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._h = None

    def attach(self, h) -> None:
        """The HiGHS object of the round about to run (stopped at once if already cancelled)."""
        with self._lock:
            self._h = h
            if self.event.is_set():
                h.cancelSolve()

    def detach(self) -> None:
        with self._lock:
            self._h = None

    def cancel(self) -> None:
        with self._lock:
            self.event.set()
            if self._h is not None:
                self._h.cancelSolve()


class OvershootWatch:
    """Stops a relaxation's search at ``deadline`` (``time.perf_counter()`` seconds) when its
    incumbent overshoots the budget on replay and is cheaper than ``best``: the time left is
    for :func:`~solvers.checkmate.repair.repair_schedule`.  An incumbent that fits, or none,
    lets the search run to the time limit."""

    def __init__(self, problem: CheckmateProblem, v: CheckmateVars, best: float,
                 deadline: float, cancel: LazyCancel | None = None) -> None:
        self.problem, self.v, self.best, self.deadline = problem, v, best, deadline
        self.cancel = cancel
        self.over = False
        self.stopped = False
        self._h = None

    def _stop_if_due(self) -> None:
        if self.over and not self.stopped and time.perf_counter() >= self.deadline:
            self.stopped = True
            self._h.cancelSolve()

    def _on_solution(self, event) -> None:
        x = np.asarray(event.data_out.mip_solution, dtype=np.float64)
        if x.size < self.v.R.max() + 1:
            return
        R, S = decode_schedule(self.problem, self.v, x)
        peak, _ = schedule_memory(self.problem, R, S)
        self.over = bool(peak > self.problem.budget and schedule_cost(self.problem, R) < self.best)
        self._stop_if_due()

    def attach(self, h):
        """``on_start`` hook of :meth:`MilpModel.solve`: subscribe, arm the deadline timer."""
        self._h = h
        if self.cancel is not None:
            self.cancel.attach(h)
        h.cbMipImprovingSolution.subscribe(self._on_solution)
        timer = threading.Timer(max(0.0, self.deadline - time.perf_counter()), self._stop_if_due)
        timer.daemon = True
        timer.start()

        def detach() -> None:
            timer.cancel()
            h.cbMipImprovingSolution.unsubscribe(self._on_solution)
            if self.cancel is not None:
                self.cancel.detach()

        return detach


def solve_lazy(state: SolveState, cancel: LazyCancel | None = None) -> CheckmateSolution:
    """The MILP with its memory chain added lazily, step by step (``lazy_memory``).

    Round ``r`` solves the model whose ``U``/``FREE`` chain covers the steps collected so far
    (none at first: start-of-step and frontier rows only).  Every such model is a relaxation of
    the full one, so its bound is valid; its schedule is replayed (:func:`schedule_memory`,
    bytes), kept as the incumbent when it fits and is cheaper, and otherwise every step whose
    replayed peak exceeds the budget gets its chain in the next round.  The loop ends when a
    relaxation is solved to ``mip_gap`` and its schedule fits (proven optimal), when the
    incumbent is within ``mip_gap`` of the bound, when ``cancel`` is set, or when time runs out
    (the incumbent and the best bound, ``time_limit``).  With every step collected the model is
    the full one, so the loop ends.

    Each round may use all the time left, with one exception: a schedule of a relaxation that
    overshoots the budget and is cheaper than the incumbent is repaired
    (:func:`~solvers.checkmate.repair.repair_schedule`: the exact MILP on windows of steps
    around the overshoots, the other steps fixed), and a relaxation whose incumbent overshoots
    is stopped at ``1 - REPAIR_SHARE`` of the limit (:class:`OvershootWatch`) to leave the
    repair its time.  Full model against lazy chain on 100-layer random-width MLPs:
    ``experiments/results/milp_variants.csv``.

    Returns:
      :class:`CheckmateSolution`; ``meta["lazy_rounds"]`` lists each round, ``chain_steps`` the
      steps that got their chain.

    Raises:
      InfeasibleBudgetError: a relaxation is infeasible (:func:`raise_infeasible`).
      SolverTimeoutError: no schedule within the budget in time (with the best bound).
    """
    problem, clock, formulation, mip_gap, lp = (state.problem, state.clock, state.formulation,
                                                state.mip_gap, state.lp)
    warm = state.warm
    budget = problem.budget
    trivial = float(problem.costs.sum())
    best = None if warm is None else (schedule_cost(problem, warm[0]), warm[0], warm[1])
    bound = max(trivial, lp.bound)
    steps: set[int] = set()
    rounds: list[dict] = []
    build_s = solve_s = 0.0
    nodes = 0
    status = "time_limit"
    while cancel is None or not cancel.event.is_set():
        t_b = time.perf_counter()
        form = dataclasses.replace(formulation, memory_chain=bool(steps),
                                   chain_steps=tuple(sorted(steps)) if steps else None)
        model = MilpModel("checkmate_lazy")
        v = add_checkmate_core(model, problem, budget=budget, formulation=form)
        lp.add_cuts(model, v)
        x0 = None if best is None else checkmate_vector(model, v, problem, best[1], best[2])
        build_s += time.perf_counter() - t_b
        watch = OvershootWatch(problem, v, math.inf if best is None else best[0],
                               clock.start + (1.0 - REPAIR_SHARE) * clock.limit, cancel)
        try:
            sol = model.solve("highs", time_limit=clock.left(floor=0.05 * clock.limit),
                              mip_gap=mip_gap, threads=state.threads, warm_start=x0,
                              log=state.log, presolve=state.presolve, options=state.options,
                              on_start=watch.attach)
        except SolverTimeoutError as e:  # no incumbent of this relaxation in time
            if e.bound is not None and math.isfinite(e.bound):
                bound = max(bound, e.bound * v.cost_unit)
            if best is None:
                raise SolverTimeoutError(str(e), bound=bound) from None
            rounds.append({"chain_steps": len(steps), "status": "timeout_no_incumbent"})
            break
        solve_s += sol.solve_time_s
        build_s += sol.build_time_s
        nodes += max(0, sol.node_count)
        if sol.status == "infeasible":  # a relaxation is infeasible: so is the problem
            raise_infeasible(problem, clock)
        if not sol.has_solution:
            raise SolverError(f"MILP ended with status {sol.message!r} and no solution")
        if math.isfinite(sol.bound):
            bound = max(bound, sol.bound * v.cost_unit)
        R, S = decode_schedule(problem, v, sol.x)
        peak, step_peak = schedule_memory(problem, R, S)
        cost = schedule_cost(problem, R)
        over = np.flatnonzero(step_peak > budget)
        rounds.append({"chain_steps": len(steps), "status": sol.status, "objective": cost,
                       "bound": bound, "fits": bool(peak <= budget),
                       "steps_over": int(len(over)), "time_s": sol.solve_time_s})
        if peak <= budget and (best is None or cost < best[0]):
            best = (cost, R, S)
        elif (peak > budget and (best is None or cost < best[0]) and clock.left() > 0.5
              and (cancel is None or not cancel.event.is_set())):
            fix = repair_schedule(problem, R, S, time_limit=min(
                clock.left(), max(1.0, REPAIR_SHARE * clock.limit)), mip_gap=mip_gap,
                threads=state.threads, formulation=formulation)
            fixed_cost = None if fix.R is None else schedule_cost(problem, fix.R)
            rounds[-1]["repair"] = {"status": fix.status, "objective": fixed_cost,
                                    "free_steps": fix.free_steps, "time_s": fix.time_s}
            if fixed_cost is not None and (best is None or fixed_cost < best[0]):
                best = (fixed_cost, fix.R, fix.S)
        if best is not None and rel_gap(best[0], bound) <= mip_gap:
            status = "optimal"
            break
        if (sol.status != "optimal" and peak <= budget) or clock.left() <= 0.05 * clock.limit:
            break  # out of time, or no better schedule to expect: the incumbent and the bound
        new = set(over.tolist()) - steps
        if not new:  # fits: the relaxation's optimum is feasible, so optimal; else over by a
            # tolerance on a step that has its chain already: keep the incumbent
            status = "optimal" if peak <= budget else "time_limit"
            break
        steps |= new
    if best is None:
        raise SolverTimeoutError("no schedule within the budget found in time", bound=bound)
    cost, R, S = best
    if status == "optimal":
        bound = min(bound, cost)
    peak, _ = schedule_memory(problem, R, S)
    out_meta = {
        "method": "milp",
        **state.meta,
        "memory_chain": "lazy",
        "warm_start_objective": None if warm is None else schedule_cost(problem, warm[0]),
        "lazy_rounds": rounds,
        "chain_steps": sorted(steps),
        "lp_bound": lp.bound,
        "note": "",
    }
    return CheckmateSolution(R, S, status, cost, bound, rel_gap(cost, bound), peak,
                             solve_s, build_s, nodes, out_meta)
