"""What the MILP back ends share: the result type, the model interface they read, the solve
options they take, the gap.

The back ends (:mod:`solvers.milp.backends`) import this module, never
:mod:`solvers.milp.model`: they receive the model object and read it through
:class:`MilpData`, and the options as one :class:`SolveOptions`.  No jax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from remat.core.errors import SolverError

__all__ = ["MilpSolution", "MilpData", "SolveOptions", "relative_gap", "full_warm_start"]

NO_TIME_LIMIT_S = 1e7  # what a time limit of None or inf becomes: a limit is always set


@dataclasses.dataclass(frozen=True, eq=False)
class MilpSolution:
    """Result of :meth:`solvers.milp.MilpModel.solve`.

    Attributes:
      status: ``"optimal"``, ``"time_limit"`` (incumbent returned, not proven optimal),
        ``"feasible"`` (stopped for another reason with an incumbent), ``"infeasible"`` or
        ``"error"``.
      x: ``float64[num_vars]`` primal values (``None`` when there is no solution).
      objective: objective value of ``x`` (``nan`` without a solution).
      bound: best proven lower bound on the objective (minimisation; ``nan`` when unknown).
      gap: relative gap ``(objective - bound) / max(|objective|, 1e-9)`` (0 when optimal).
      solve_time_s: wall time of the solver call, seconds.
      build_time_s: wall time spent assembling the matrix and handing it to the solver, seconds.
      node_count: branch-and-bound nodes explored (0 for LPs; -1 when the back end does not say).
      backend: ``"highs"``, ``"cvxpy"``, ``"cpsat"`` or ``"highs+cpsat"`` (the race).
      message: the back end's own status text.
    """

    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    gap: float
    solve_time_s: float
    build_time_s: float
    node_count: int
    backend: str
    message: str = ""

    @property
    def has_solution(self) -> bool:
        return self.x is not None


class MilpData(Protocol):
    """The part of :class:`solvers.milp.MilpModel` a back end reads: minimise
    ``c @ x + offset`` s.t. ``lo <= A @ x <= hi``, ``lb <= x <= ub``, some ``x`` integer."""

    offset: float

    @property
    def num_vars(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    def matrix(self) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        """``(A, lo, hi)``, ``A`` CSR ``(num_rows, num_vars)``."""

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lb, ub)`` of every column, fixes applied."""

    def integrality(self) -> np.ndarray:
        """``bool[num_vars]``: which columns are integer."""

    def objective_vector(self) -> np.ndarray:
        """``float64[num_vars]``: ``c``."""

    def row_block_name(self, row: int) -> str | None:
        """Name of the row block holding ``row`` (``None``: no block does)."""


@dataclasses.dataclass(frozen=True, eq=False)
class SolveOptions:
    """How to solve a model: the keywords of :meth:`solvers.milp.MilpModel.solve` and
    :func:`solvers.milp.solve`, built once by :func:`solvers.milp.registry.solve` and handed to
    the back end's ``solve(model, opts)``.

    Attributes:
      time_limit: wall-clock limit in seconds, always applied (``None`` or infinite: 1e7 s).
      mip_gap: relative MIP gap at which to stop.
      threads: solver threads (HiGHS ``threads``, CP-SAT's worker count; ``None`` leaves the
        default).  cvxpy and the race ignore it.
      warm_start: a full ``float[num_vars]`` vector (``nan`` entries are left unset, making it
        partial) or ``(indices, values)`` for a partial one.  HiGHS completes partial solutions
        itself; cvxpy ignores warm starts.
      relax: solve the LP relaxation (integrality dropped); ``cpsat`` and ``race`` refuse it.
      log: print the solver log.
      presolve: run HiGHS presolve (HiGHS only).
      options: extras for the back end: HiGHS options (``{"mip_heuristic_effort": 0.3}``),
        keywords of cvxpy's ``Problem.solve``, of
        :func:`~solvers.milp.backends.cpsat.solve_cpsat` or of
        :func:`~solvers.milp.backends.race.solve_race` (``cpsat_workers``).
      on_start: (HiGHS) called with the ``highspy.Highs`` object just before the search; it may
        subscribe callbacks or stop the search (``cancelSolve()``) and may return a function
        that is called when the search ends (to unsubscribe).  The other back ends ignore it.
    """

    time_limit: float | None = 60.0
    mip_gap: float = 1e-4
    threads: int | None = None
    warm_start: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    relax: bool = False
    log: bool = False
    presolve: bool = True
    options: dict[str, Any] | None = None
    on_start: Callable[[Any], Callable[[], None] | None] | None = None

    def __post_init__(self) -> None:
        if self.time_limit is None or not math.isfinite(self.time_limit):
            object.__setattr__(self, "time_limit", NO_TIME_LIMIT_S)

    def integer_keywords(self, backend: str, num_vars: int) -> dict[str, Any]:
        """Keywords of an integer-only back end's own solve function
        (:func:`~solvers.milp.backends.cpsat.solve_cpsat`,
        :func:`~solvers.milp.backends.race.solve_race`): ``time_limit``, ``mip_gap``, the warm
        start as a full vector (:func:`full_warm_start`) and ``log``; the caller passes
        ``options`` after them (a key given twice stays a ``TypeError``).

        Raises:
          SolverError: ``relax`` (``backend`` solves integer programs only).
        """
        if self.relax:
            raise SolverError(f"backend {backend!r} solves integer programs only; the LP "
                              "relaxation needs 'highs' or 'cvxpy'")
        return {"time_limit": self.time_limit, "mip_gap": self.mip_gap,
                "warm_start": full_warm_start(num_vars, self.warm_start), "log": self.log}


def relative_gap(obj: float, bound: float) -> float:
    """``max(0, (obj - bound) / max(|obj|, 1e-9))``; ``nan`` unless both are finite."""
    if not (math.isfinite(obj) and math.isfinite(bound)):
        return math.nan
    return max(0.0, (obj - bound) / max(abs(obj), 1e-9))


def full_warm_start(num_vars: int, warm_start) -> np.ndarray | None:
    """A warm start as ``float64[num_vars]`` (``nan``: unset): ``(indices, values)`` is
    spread out; a vector or ``None`` is returned as is."""
    if not isinstance(warm_start, tuple):
        return warm_start
    w = np.full(num_vars, np.nan)
    w[np.asarray(warm_start[0], np.int64)] = np.asarray(warm_start[1], np.float64)
    return w
