"""What the MILP back ends share: the result type, the model interface they read, the gap.

The back ends (:mod:`solvers.milp.backends`) import this module, never
:mod:`solvers.milp.model`: they receive the model object and read it through
:class:`MilpData`.  No jax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np
import scipy.sparse as sp

__all__ = ["MilpSolution", "MilpData", "relative_gap", "full_warm_start"]


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
