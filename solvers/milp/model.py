"""The sparse MILP model shared by every MILP in the project (no jax).

The model is built from named variable blocks and vectorised sparse row blocks::

    m = MilpModel()
    x = m.add_vars("x", (3, 4), lb=0, ub=1, integer=True)    # int64[3, 4] column indices
    m.add_rows(sp.coo_matrix(...), lo=-np.inf, hi=1.0)        # rows over all columns so far
    m.add_rows_coo(rows, cols, vals, n_rows, lo, hi)          # the same from COO triplets
    m.add_objective(x.ravel(), costs)
    sol = m.solve(time_limit=60.0, mip_gap=1e-4)

``solve`` hands the model to a back end of :mod:`solvers.milp.registry` (HiGHS, cvxpy, CP-SAT
or the race, in :mod:`solvers.milp.backends`) and never hangs (a time limit is always set).
When the limit hits with an incumbent it returns it with ``status="time_limit"`` and the gap;
when it hits without one it raises :class:`remat.core.errors.SolverTimeoutError` carrying the
proven bound.  Infeasible models return ``status="infeasible"`` (the caller knows what that
means for its problem).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from remat.core.errors import SolverError
from solvers.milp.backends.highs import to_highs
from solvers.milp.registry import solve as solve_with_backend
from solvers.milp.solution import MilpSolution

INF = math.inf

__all__ = ["MilpModel", "INF"]


class MilpModel:
    """Minimise ``c @ x + offset`` s.t. ``lo <= A @ x <= hi``, ``lb <= x <= ub``, some ``x`` integer.

    Columns are created in named blocks by :meth:`add_vars`; rows are appended in sparse blocks.
    Nothing is assembled until :meth:`solve` (or :meth:`matrix`).
    """

    def __init__(self, name: str = "milp") -> None:
        self.name = name
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._blocks: dict[str, np.ndarray] = {}
        self._nv = 0
        self._rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self._row_names: list[tuple[str, int, int]] = []
        self._nr = 0
        self._c: dict[int, float] = {}
        self._c_parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.offset = 0.0
        self._fixed: list[tuple[np.ndarray, np.ndarray]] = []

    # ------------------------------------------------------------ columns
    @property
    def num_vars(self) -> int:
        return self._nv

    @property
    def num_rows(self) -> int:
        return self._nr

    def add_vars(
        self,
        name: str,
        shape: int | Sequence[int],
        lb: float | np.ndarray = 0.0,
        ub: float | np.ndarray = INF,
        integer: bool = False,
    ) -> np.ndarray:
        """Add a block of variables and return their column indices with ``shape`` (``int64``).

        ``lb``/``ub`` broadcast to ``shape`` (``±inf`` allowed); ``integer=True`` makes the block
        integer (binary with bounds 0/1).
        """
        if name in self._blocks:
            raise SolverError(f"variable block {name!r} already exists")
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        size = int(np.prod(shape)) if shape else 1
        idx = np.arange(self._nv, self._nv + size, dtype=np.int64).reshape(shape)
        self._lb.append(np.broadcast_to(np.asarray(lb, dtype=np.float64), shape).ravel().copy())
        self._ub.append(np.broadcast_to(np.asarray(ub, dtype=np.float64), shape).ravel().copy())
        self._int.append(np.full(size, bool(integer)))
        self._blocks[name] = idx
        self._nv += size
        return idx

    def block(self, name: str) -> np.ndarray:
        """Column indices of the block called ``name``."""
        return self._blocks[name]

    @property
    def blocks(self) -> dict[str, np.ndarray]:
        return dict(self._blocks)

    def fix(self, idx: np.ndarray, values: float | np.ndarray) -> None:
        """Pin variables ``idx`` to ``values`` (sets both bounds)."""
        idx = np.asarray(idx, dtype=np.int64).ravel()
        vals = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape).ravel()
        self._fixed.append((idx, vals.copy()))

    def clear_fixes(self) -> None:
        """Drop every :meth:`fix` (bounds return to those of :meth:`add_vars`/:meth:`set_bounds`)."""
        self._fixed = []

    def set_bounds(self, idx: np.ndarray, lb: float | np.ndarray | None = None,
                   ub: float | np.ndarray | None = None) -> None:
        """Change bounds of existing variables ``idx``."""
        lb_all, ub_all, _ = self._col_arrays(apply_fixes=False)
        idx = np.asarray(idx, dtype=np.int64).ravel()
        if lb is not None:
            lb_all[idx] = np.broadcast_to(np.asarray(lb, float), idx.shape)
        if ub is not None:
            ub_all[idx] = np.broadcast_to(np.asarray(ub, float), idx.shape)
        self._lb, self._ub = [lb_all], [ub_all]
        self._int = [np.concatenate(self._int)] if self._int else []

    def _col_arrays(self, apply_fixes: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lb = np.concatenate(self._lb) if self._lb else np.zeros(0)
        ub = np.concatenate(self._ub) if self._ub else np.zeros(0)
        integ = np.concatenate(self._int) if self._int else np.zeros(0, bool)
        if apply_fixes:
            lb, ub = lb.copy(), ub.copy()
            for idx, vals in self._fixed:
                lb[idx] = vals
                ub[idx] = vals
        return lb, ub, integ

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lb, ub)`` of every column, fixes applied."""
        lb, ub, _ = self._col_arrays()
        return lb, ub

    def integrality(self) -> np.ndarray:
        """``bool[num_vars]``: which columns are integer."""
        return self._col_arrays(apply_fixes=False)[2]

    # --------------------------------------------------------------- rows
    def add_rows(self, A, lo: float | np.ndarray = -INF, hi: float | np.ndarray = INF,
                 name: str = "") -> np.ndarray:
        """Append rows ``lo <= A @ x <= hi``.

        Args:
          A: a scipy.sparse matrix (or dense array) with ``num_vars`` columns or fewer (missing
            trailing columns are zero).
          lo, hi: scalars or ``float[rows]``.
          name: label used in error messages and :meth:`row_block`.

        Returns:
          ``int64[rows]``: indices of the new rows.
        """
        A = sp.coo_matrix(A)
        return self.add_rows_coo(A.row, A.col, A.data, A.shape[0], lo, hi, name=name)

    def add_rows_coo(self, rows, cols, vals, n_rows: int, lo: float | np.ndarray = -INF,
                     hi: float | np.ndarray = INF, name: str = "") -> np.ndarray:
        """Append ``n_rows`` rows given as COO triplets (row indices local to this block,
        column indices global, duplicates summed)."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        cols = np.asarray(cols, dtype=np.int64).ravel()
        vals = np.broadcast_to(np.asarray(vals, dtype=np.float64), rows.shape).ravel()
        n_rows = int(n_rows)
        if len(rows) and (rows.min() < 0 or rows.max() >= n_rows):
            raise SolverError(f"row block {name!r}: row index out of range")
        if len(cols) and (cols.min() < 0 or cols.max() >= self._nv):
            raise SolverError(f"row block {name!r}: column index out of range")
        self._rows.append((rows + self._nr, cols, vals.copy()))
        self._lo.append(np.broadcast_to(np.asarray(lo, dtype=np.float64), (n_rows,)).copy())
        self._hi.append(np.broadcast_to(np.asarray(hi, dtype=np.float64), (n_rows,)).copy())
        self._row_names.append((name, self._nr, self._nr + n_rows))
        out = np.arange(self._nr, self._nr + n_rows, dtype=np.int64)
        self._nr += n_rows
        return out

    def add_coefficients(self, rows, cols, vals) -> None:
        """Add ``vals`` at ``(rows, cols)`` of rows that already exist (global row indices;
        duplicates summed).  Lets a formulation extend another's rows, e.g. POET adding its
        page-in term to Checkmate's carry rows."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        cols = np.asarray(cols, dtype=np.int64).ravel()
        vals = np.broadcast_to(np.asarray(vals, dtype=np.float64), rows.shape).ravel()
        if len(rows) and (rows.min() < 0 or rows.max() >= self._nr):
            raise SolverError("add_coefficients: row index out of range")
        if len(cols) and (cols.min() < 0 or cols.max() >= self._nv):
            raise SolverError("add_coefficients: column index out of range")
        self._rows.append((rows, cols, vals.copy()))

    def row_block(self, name: str) -> np.ndarray:
        """Indices of every row added under ``name``."""
        parts = [np.arange(a, b) for nm, a, b in self._row_names if nm == name]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def row_block_name(self, row: int) -> str | None:
        """Name of the row block holding row ``row`` (``None``: no block does)."""
        return next((nm for nm, a, b in self._row_names if a <= row < b), None)

    def matrix(self) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        """``(A, lo, hi)`` with ``A`` CSR of shape ``(num_rows, num_vars)``."""
        if self._rows:
            r = np.concatenate([b[0] for b in self._rows])
            c = np.concatenate([b[1] for b in self._rows])
            v = np.concatenate([b[2] for b in self._rows])
        else:
            r = c = np.zeros(0, np.int64)
            v = np.zeros(0)
        A = sp.csr_matrix((v, (r, c)), shape=(self._nr, self._nv))
        A.sum_duplicates()
        A.eliminate_zeros()
        lo = np.concatenate(self._lo) if self._lo else np.zeros(0)
        hi = np.concatenate(self._hi) if self._hi else np.zeros(0)
        return A, lo, hi

    # ----------------------------------------------------------- objective
    def add_objective(self, idx: np.ndarray, coef: float | np.ndarray) -> None:
        """Add ``coef * x[idx]`` to the objective (accumulates)."""
        idx = np.asarray(idx, dtype=np.int64).ravel()
        coef = np.broadcast_to(np.asarray(coef, dtype=np.float64), idx.shape).ravel()
        self._c_parts.append((idx, coef.copy()))

    def objective_vector(self) -> np.ndarray:
        c = np.zeros(self._nv)
        for idx, coef in self._c_parts:
            np.add.at(c, idx, coef)
        return c

    def evaluate(self, x: np.ndarray) -> tuple[float, float]:
        """``(objective, max constraint/bound violation)`` of a full vector ``x``."""
        A, lo, hi = self.matrix()
        lb, ub = self.bounds()
        ax = A @ x
        viol = max(
            float(np.max(np.maximum(lo - ax, 0), initial=0)),
            float(np.max(np.maximum(ax - hi, 0), initial=0)),
            float(np.max(np.maximum(lb - x, 0), initial=0)),
            float(np.max(np.maximum(x - ub, 0), initial=0)),
        )
        return float(self.objective_vector() @ x + self.offset), viol

    # --------------------------------------------------------------- solve
    def solve(self, backend: str = "highs", **options) -> MilpSolution:
        """Solve the model with the back end called ``backend`` (:mod:`solvers.milp.registry`).

        Args:
          backend: ``"highs"`` (highspy, direct; gives bound, gap and node count), ``"cvxpy"``
            (cvxpy's matrix form with its HiGHS solver; no bound or gap comes back),
            ``"cpsat"`` (OR-Tools CP-SAT, integer data only:
            :mod:`solvers.milp.backends.cpsat`; ``threads`` is its worker count, ``options`` go
            to :func:`~solvers.milp.backends.cpsat.solve_cpsat`) or ``"race"`` (both at once,
            first proof wins: :mod:`solvers.milp.backends.race`).
          **options: the fields of :class:`~solvers.milp.solution.SolveOptions`, by keyword,
            with its defaults: ``time_limit`` (60 s; ``None``/inf means 1e7 s), ``mip_gap``
            (1e-4), ``threads``, ``warm_start``, ``relax``, ``log``, ``presolve``, ``options``
            and ``on_start``.

        Raises:
          SolverTimeoutError: the time limit hit before any feasible solution was found.
          SolverError: an unknown ``backend``, or the back end failed.
          TypeError: an option :class:`~solvers.milp.solution.SolveOptions` does not have.
        """
        return solve_with_backend(self, backend, **options)

    def to_highs(self, *, relax: bool = False, log: bool = False):
        """A ``highspy.Highs`` holding this model (integrality dropped with ``relax``); the
        caller may change it (add rows, re-run warm, as the path-cut loop of
        :mod:`solvers.checkmate.path_cuts` does).  Returns ``(highs, is_mip)``."""
        return to_highs(self, relax=relax, log=log)
