"""The exact Checkmate MILP (Jain et al., "Checkmate", MLSys 2020) and its LP relaxation + rounding.

Everything works on arrays (:class:`CheckmateProblem`: node costs, output sizes in bytes, a
topologically ordered edge list and a budget in bytes) and frontier-form ``R``/``S`` schedules.
Units, in every module of the package: times are wall seconds, memory bytes, costs the
problem's cost units.

Modules, each importing only those above it:

* :mod:`~solvers.checkmate.problem`: problem and solution types, checkpoint-all,
  :func:`schedule_memory` (the replay's peak in bytes), :func:`normalize`;
* :mod:`~solvers.checkmate.frontier`: frontier-form conversion, :func:`min_r_given_s`,
  heuristic schedules (warm starts and fallbacks);
* :mod:`~solvers.checkmate.formulation`: the MILP's variables and core rows
  (:func:`add_checkmate_core`) with the :class:`CoreExtension` hook that POET builds on;
* :mod:`~solvers.checkmate.path_cuts`: valid rows the small LP relaxation violates;
* :mod:`~solvers.checkmate.repair`: a window MILP that repairs a schedule overshooting the
  budget on a few steps (:func:`repair_schedule`, used by the lazy solve);
* :mod:`~solvers.checkmate.min_peak`: :func:`min_feasible_budget` (peak-minimising MILP);
* :mod:`~solvers.checkmate.solve_state`: :class:`~solvers.checkmate.solve_state.SolveState`,
  what every strategy below takes, the solve's clock and the small LP's bound;
* the strategies, each ``f(state) -> CheckmateSolution``: :mod:`~solvers.checkmate.whole` (one
  model), :mod:`~solvers.checkmate.lazy` (memory chain added lazily),
  :mod:`~solvers.checkmate.lazy_portfolio` (the lazy loop over HiGHS seeds),
  :mod:`~solvers.checkmate.lazy_race` (the lazy loop against CP-SAT),
  :mod:`~solvers.checkmate.lns` (large-neighbourhood search from a schedule);
* :mod:`~solvers.checkmate.solve`: the exact solve (:func:`solve_checkmate`): the steps before
  any MILP, then one strategy;
* :mod:`~solvers.checkmate.lp_round`: LP relaxation + rounding (:func:`solve_checkmate_lp`).
"""

from solvers.checkmate.formulation import (
    CheckmateVars,
    CoreContext,
    CoreExtension,
    CoreRows,
    Formulation,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.frontier import (
    best_heuristic,
    check_frontier_schedule,
    heuristic_schedules,
    min_r_given_s,
    to_frontier_form,
)
from solvers.checkmate.lp_round import solve_checkmate_lp
from solvers.checkmate.min_peak import min_feasible_budget
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    checkpoint_all_schedule,
    normalize,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.repair import RepairResult, repair_schedule
from solvers.checkmate.solve import solve_checkmate

__all__ = [
    "CheckmateProblem",
    "CheckmateVars",
    "CheckmateSolution",
    "Formulation",
    "CoreRows",
    "CoreContext",
    "CoreExtension",
    "add_checkmate_core",
    "checkmate_vector",
    "decode_schedule",
    "solve_checkmate",
    "solve_checkmate_lp",
    "min_feasible_budget",
    "schedule_memory",
    "schedule_cost",
    "normalize",
    "min_r_given_s",
    "heuristic_schedules",
    "checkpoint_all_schedule",
    "check_frontier_schedule",
    "to_frontier_form",
    "best_heuristic",
    "repair_schedule",
    "RepairResult",
]
