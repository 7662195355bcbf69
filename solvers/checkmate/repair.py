"""Repair of a schedule that overshoots the budget on a few steps: a window MILP around them.

The lazy solve of :func:`solvers.checkmate.solve.solve_checkmate` (``lazy_memory``) solves
relaxations whose schedules may exceed the budget on replay, on the few steps where memory
peaks between the step's start and its frontier.  Such a schedule is usually cheap and fits
everywhere else.  :func:`repair_schedule` keeps every step outside windows of ``+-w`` steps
around the overshooting ones fixed (``R[t, :]``, ``S[t, :]``) and re-solves Checkmate's exact
MILP (the ``U``/``FREE`` memory chain on the free steps) for the cheapest completion; the carry
rows at the windows' edges keep the fixed steps reachable, so a completion is a schedule that
fits every step (re-checked by :func:`~solvers.checkmate.problem.schedule_memory`, which shares
no code with the rows).  When the sub-problem is infeasible (the fixed steps leave no room) the
windows are doubled, up to the whole schedule.

Costs are the problem's cost units, memory bytes, times wall-clock seconds.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.checkmate.formulation import Formulation, add_checkmate_core, decode_schedule
from solvers.checkmate.problem import CheckmateProblem, normalize, schedule_memory
from solvers.milp import MilpModel

__all__ = ["RepairResult", "repair_schedule"]


@dataclasses.dataclass(frozen=True, eq=False)
class RepairResult:
    """The outcome of :func:`repair_schedule`.

    Attributes:
      R, S: ``bool[n, n]`` the repaired frontier-form schedule (fits the budget), or ``None``.
      status: ``"fits"`` (the input already fitted), ``"repaired"``, ``"infeasible"`` (no
        completion even with every step free), ``"time_limit"``, or ``"tolerance"`` (the
        MILP's completion exceeds the budget in bytes on replay, by the solver's tolerance).
      window: the last half-width tried (steps).
      free_steps: how many steps the last sub-problem left free.
      time_s: wall seconds spent.
    """

    R: np.ndarray | None
    S: np.ndarray | None
    status: str
    window: int
    free_steps: int
    time_s: float


def repair_schedule(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray, *,
                    time_limit: float = 5.0, window: int = 2, mip_gap: float = 1e-4,
                    threads: int | None = None,
                    formulation: Formulation = Formulation()  # noqa: B008 (frozen dataclass)
                    ) -> RepairResult:
    """The cheapest schedule that agrees with ``(R, S)`` outside windows around its overshoots.

    Args:
      problem: the graph on arrays with ``budget`` (bytes) set.
      R, S: ``bool[n, n]`` frontier-form schedule (may exceed the budget on some steps).
      time_limit: wall seconds for all sub-solves together.
      window: initial half-width: steps ``t - window .. t + window`` around every overshooting
        step ``t`` are free; doubled while the sub-problem is infeasible.
      mip_gap: relative gap of each sub-solve.
      formulation: the core's switches (its ``memory_chain``/``chain_steps`` are overridden:
        the chain is built on the free steps).

    Returns:
      :class:`RepairResult`; ``R``/``S`` set when ``status`` is ``"fits"`` or ``"repaired"``.

    Raises:
      SolverError: no budget, or ``(R, S)`` is not frontier-form.
    """
    t_start = time.perf_counter()
    budget = problem.budget
    if budget is None:
        raise SolverError("repair_schedule needs a budget")
    R, S = (np.asarray(a, bool) for a in (R, S))
    n = problem.n
    if R.shape != (n, n) or S.shape != (n, n) or np.triu(R, 1).any() or np.triu(S).any():
        raise SolverError(f"repair_schedule needs frontier-form bool[{n}, {n}] R and S")
    R, S = normalize(problem, R, S)
    peak, step_peak = schedule_memory(problem, R, S)
    if peak <= budget:
        return RepairResult(R, S, "fits", 0, 0, time.perf_counter() - t_start)
    over = np.flatnonzero(step_peak > budget)
    w = max(1, int(window))
    while True:
        free = np.zeros(n, bool)
        for t in over:
            free[max(0, t - w):min(n, t + w + 1)] = True
        left = time_limit - (time.perf_counter() - t_start)
        if left <= 0.05:
            return RepairResult(None, None, "time_limit", w, int(free.sum()),
                                time.perf_counter() - t_start)
        # the chain also on the step before each window: its R/S are fixed, but what it
        # carries out (S of the window's first step) is free, and so is its memory
        chained = free | np.r_[free[1:], False]
        form = dataclasses.replace(formulation, memory_chain=True,
                                   chain_steps=tuple(np.flatnonzero(chained).tolist()))
        model = MilpModel("checkmate_repair")
        v = add_checkmate_core(model, problem, budget=budget, formulation=form)
        fixed = ~free
        for blk, M in ((v.R, R), (v.S, S)):
            sel = (blk >= 0) & fixed[:, None]
            model.fix(blk[sel], M[sel].astype(float))
        try:
            sol = model.solve("highs", time_limit=left, mip_gap=mip_gap, threads=threads)
        except SolverTimeoutError:
            return RepairResult(None, None, "time_limit", w, int(free.sum()),
                                time.perf_counter() - t_start)
        if sol.has_solution:
            R2, S2 = decode_schedule(problem, v, sol.x)
            fits = schedule_memory(problem, R2, S2)[0] <= budget
            return RepairResult(R2 if fits else None, S2 if fits else None,
                                "repaired" if fits else "tolerance", w, int(free.sum()),
                                time.perf_counter() - t_start)
        if sol.status != "infeasible" or free.all():
            status = "infeasible" if sol.status == "infeasible" else "time_limit"
            return RepairResult(None, None, status, w, int(free.sum()),
                                time.perf_counter() - t_start)
        w *= 2
