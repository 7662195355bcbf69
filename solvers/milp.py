"""A small sparse MILP model shared by every MILP in the project, with HiGHS, cvxpy and CP-SAT back ends.

Length: the model and its two matrix back ends (HiGHS, cvxpy) in one place; CP-SAT lives in
:mod:`solvers.cpsat`.

The model is built from named variable blocks and vectorised sparse row blocks::

    m = MilpModel()
    x = m.add_vars("x", (3, 4), lb=0, ub=1, integer=True)    # int64[3, 4] column indices
    m.add_rows(sp.coo_matrix(...), lo=-np.inf, hi=1.0)        # rows over all columns so far
    m.add_rows_coo(rows, cols, vals, n_rows, lo, hi)          # the same from COO triplets
    m.add_objective(x.ravel(), costs)
    sol = m.solve(time_limit=60.0, mip_gap=1e-4)

``solve`` never hangs (a time limit is always set).  When the limit hits with an incumbent it
returns it with ``status="time_limit"`` and the gap; when it hits without one it raises
:class:`remat.core.errors.SolverTimeoutError` carrying the proven bound.  Infeasible models return
``status="infeasible"`` (the caller knows what that means for its problem).  No jax here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from remat.core.errors import SolverError, SolverTimeoutError

INF = math.inf
_HIGHS_THREADS: int | None = None  # thread count of HiGHS's process-wide pool, once we set one

__all__ = ["MilpModel", "MilpSolution", "INF"]


@dataclasses.dataclass(frozen=True, eq=False)
class MilpSolution:
    """Result of :meth:`MilpModel.solve`.

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
      backend: ``"highs"`` or ``"cvxpy"``.
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


BACKENDS = ("highs", "cvxpy", "cpsat", "race")  # what MilpModel.solve(backend=...) takes


def check_backend(backend: str) -> None:
    """Raise :class:`~remat.core.errors.SolverError` unless ``backend`` is one of :data:`BACKENDS`
    and installed (``cpsat``/``race`` need OR-Tools); for policies to check their options
    before any work."""
    if backend not in BACKENDS:
        raise SolverError(f"unknown MILP backend {backend!r}; use one of {BACKENDS}")
    if backend in ("cpsat", "race"):
        from solvers.cpsat import available

        if not available():
            raise SolverError(f"MILP backend {backend!r} needs OR-Tools: pip install -e '.[cpsat]'")


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
    def solve(
        self,
        backend: str = "highs",
        time_limit: float = 60.0,
        mip_gap: float = 1e-4,
        threads: int | None = None,
        warm_start: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None,
        relax: bool = False,
        log: bool = False,
        presolve: bool = True,
        options: dict[str, Any] | None = None,
        on_start: Callable[[Any], Callable[[], None] | None] | None = None,
    ) -> MilpSolution:
        """Solve the model.

        Args:
          backend: ``"highs"`` (highspy, direct; gives bound, gap and node count), ``"cvxpy"``
            (cvxpy's matrix form with its HiGHS solver; no bound or gap comes back) or
            ``"cpsat"`` (OR-Tools CP-SAT, integer data only: :mod:`solvers.cpsat`; ``threads``
            is its worker count, ``options`` go to :func:`~solvers.cpsat.solve_cpsat`) or
            ``"race"`` (both at once, first proof wins: :mod:`solvers.portfolio`).
          time_limit: wall-clock limit in seconds (always applied; ``None``/inf means 1e7 s).
          mip_gap: relative MIP gap at which to stop.
          threads: solver threads (HiGHS ``threads``; ``None`` leaves the default).
          warm_start: a full ``float[num_vars]`` vector (``nan`` entries are left unset, making it
            partial) or ``(indices, values)`` for a partial one.  HiGHS completes partial
            solutions itself; cvxpy ignores warm starts.
          relax: solve the LP relaxation (integrality dropped).
          log: print the solver log.
          presolve: run HiGHS presolve.
          options: extra HiGHS options (``{"mip_heuristic_effort": 0.3}``).
          on_start: (HiGHS) called with the ``highspy.Highs`` object just before the search;
            it may subscribe callbacks or stop the search (``cancelSolve()``) and may return a
            function that is called when the search ends (to unsubscribe).

        Raises:
          SolverTimeoutError: the time limit hit before any feasible solution was found.
          SolverError: the back end failed.
        """
        if time_limit is None or not math.isfinite(time_limit):
            time_limit = 1e7
        if backend == "highs":
            return self._solve_highs(time_limit, mip_gap, threads, warm_start, relax, log,
                                     presolve, options or {}, on_start)
        if backend == "cvxpy":
            return self._solve_cvxpy(time_limit, mip_gap, relax, log, options or {})
        if backend in ("cpsat", "race") and not relax:
            from solvers.cpsat import solve_cpsat
            from solvers.portfolio import solve_race

            w = warm_start
            if isinstance(w, tuple):  # (indices, values) -> a full vector, nan = unset
                w = np.full(self._nv, np.nan)
                w[np.asarray(warm_start[0], np.int64)] = np.asarray(warm_start[1], np.float64)
            if backend == "race":
                return solve_race(self, time_limit=time_limit, mip_gap=mip_gap, warm_start=w,
                                  log=log, **(options or {}))
            return solve_cpsat(self, time_limit=time_limit, mip_gap=mip_gap, workers=threads,
                               warm_start=w, log=log, **(options or {}))
        if backend in ("cpsat", "race"):  # relax=True
            raise SolverError(f"backend {backend!r} solves integer programs only; the LP "
                              "relaxation needs 'highs' or 'cvxpy'")
        check_backend(backend)  # raises for an unknown name
        raise SolverError(f"backend {backend!r} cannot solve this model")  # not reached

    def to_highs(self, *, relax: bool = False, log: bool = False):
        """A ``highspy.Highs`` holding this model (integrality dropped with ``relax``); the
        caller may change it (add rows, re-run warm, as the path-cut loop of
        :mod:`solvers.checkmate.path_cuts` does).  Returns ``(highs, is_mip)``."""
        import highspy

        A, lo, hi = self.matrix()
        lb, ub, integ = self._col_arrays()
        c = self.objective_vector()
        inf = highspy.kHighsInf
        h = _new_highs(quiet=not log)
        h.setOptionValue("output_flag", bool(log))
        lp = highspy.HighsLp()
        lp.num_col_ = self._nv
        lp.num_row_ = self._nr
        lp.col_cost_ = c
        lp.offset_ = float(self.offset)
        lp.col_lower_ = np.where(np.isfinite(lb), lb, -inf)
        lp.col_upper_ = np.where(np.isfinite(ub), ub, inf)
        lp.row_lower_ = np.where(np.isfinite(lo), lo, -inf)
        lp.row_upper_ = np.where(np.isfinite(hi), hi, inf)
        Ac = A.tocsc()
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = Ac.indptr.astype(np.int32)
        lp.a_matrix_.index_ = Ac.indices.astype(np.int32)
        lp.a_matrix_.value_ = Ac.data
        lp.a_matrix_.num_col_ = self._nv
        lp.a_matrix_.num_row_ = self._nr
        is_mip = (not relax) and bool(integ.any())
        if is_mip:
            lp.integrality_ = [
                highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                for i in integ
            ]
        st = h.passModel(lp)
        if st == highspy.HighsStatus.kError:
            raise SolverError("HiGHS rejected the model (passModel)")
        return h, is_mip

    def _solve_highs(self, time_limit, mip_gap, threads, warm_start, relax, log, presolve,
                     options, on_start=None) -> MilpSolution:
        import highspy

        t0 = time.perf_counter()
        h, is_mip = self.to_highs(relax=relax, log=log)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        h.setOptionValue("presolve", "on" if presolve else "off")
        set_highs_threads(h, threads)
        for k, v in options.items():
            h.setOptionValue(k, v)
        if warm_start is not None and is_mip:
            if isinstance(warm_start, tuple):
                idx, vals = (np.asarray(warm_start[0], np.int32),
                             np.asarray(warm_start[1], np.float64))
            else:
                w = np.asarray(warm_start, dtype=np.float64)
                keep = np.flatnonzero(np.isfinite(w))
                idx, vals = keep.astype(np.int32), w[keep]
            if len(idx) == self._nv and np.array_equal(idx, np.arange(self._nv)):
                sol = highspy.HighsSolution()
                sol.col_value = list(vals)
                sol.value_valid = True
                h.setSolution(sol)
            else:
                h.setSolution(len(idx), idx, vals)
        build = time.perf_counter() - t0
        t1 = time.perf_counter()
        cleanup = None
        if on_start is not None:  # a racing caller may stop the search: h.cancelSolve()
            h.HandleUserInterrupt = True
            cleanup = on_start(h)
        try:
            h.run()
        finally:
            if on_start is not None:  # highspy keeps interrupt callbacks beyond this object
                h.HandleUserInterrupt = False
            if callable(cleanup):
                cleanup()
        solve_s = time.perf_counter() - t1
        ms = h.getModelStatus()
        info = h.getInfo()
        text = h.modelStatusToString(ms)
        MS = highspy.HighsModelStatus
        has_sol = info.primal_solution_status == highspy.kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value, dtype=np.float64) if has_sol else None
        if is_mip:
            obj = float(info.objective_function_value) if has_sol else math.nan
            bound = float(info.mip_dual_bound)
            nodes = int(info.mip_node_count)
        else:
            obj = float(info.objective_function_value) if has_sol else math.nan
            bound = obj if ms == MS.kOptimal else math.nan
            nodes = 0
        if ms == MS.kOptimal:
            status = "optimal"
            bound = obj if not is_mip else bound
        elif ms in (MS.kInfeasible, MS.kUnboundedOrInfeasible):
            status = "infeasible"
        elif ms in (MS.kTimeLimit, MS.kIterationLimit, MS.kSolutionLimit, MS.kInterrupt,
                    MS.kHighsInterrupt, MS.kObjectiveBound, MS.kObjectiveTarget):
            if not has_sol:
                raise SolverTimeoutError(
                    f"HiGHS stopped ({text}) after {solve_s:.1f} s without a feasible solution",
                    bound=None if not math.isfinite(bound) else bound,
                )
            status = "time_limit" if ms == MS.kTimeLimit else "feasible"
        else:
            status = "feasible" if has_sol else "error"
        gap = _gap(obj, bound) if status != "optimal" else (_gap(obj, bound) if is_mip else 0.0)
        return MilpSolution(status, x, obj, bound, gap, solve_s, build, nodes, "highs", text)

    def _solve_cvxpy(self, time_limit, mip_gap, relax, log, options) -> MilpSolution:
        import cvxpy as cp

        t0 = time.perf_counter()
        A, lo, hi = self.matrix()
        lb, ub, integ = self._col_arrays()
        c = self.objective_vector()
        n = self._nv
        int_idx = np.flatnonzero(integ) if not relax else np.zeros(0, np.int64)
        cont_idx = np.setdiff1d(np.arange(n), int_idx)
        parts, P = [], []
        for ids, is_int in ((int_idx, True), (cont_idx, False)):
            if len(ids):
                parts.append(cp.Variable(len(ids), integer=is_int))
                P.append(sp.csr_matrix((np.ones(len(ids)), (ids, np.arange(len(ids)))),
                                       shape=(n, len(ids))))
        x = sum(Pk @ v for Pk, v in zip(P, parts))
        cons = []
        fin_lb, fin_ub = np.isfinite(lb), np.isfinite(ub)
        if fin_lb.any():
            cons.append(x[np.flatnonzero(fin_lb)] >= lb[fin_lb])
        if fin_ub.any():
            cons.append(x[np.flatnonzero(fin_ub)] <= ub[fin_ub])
        eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
        for mask, kind in ((eq, "eq"), (np.isfinite(lo) & ~eq, "lo"), (np.isfinite(hi) & ~eq, "hi")):
            rows = np.flatnonzero(mask)
            if not len(rows):
                continue
            Ab = A[rows]
            if kind == "eq":
                cons.append(Ab @ x == lo[rows])
            elif kind == "lo":
                cons.append(Ab @ x >= lo[rows])
            else:
                cons.append(Ab @ x <= hi[rows])
        prob = cp.Problem(cp.Minimize(c @ x + self.offset), cons)
        build = time.perf_counter() - t0
        t1 = time.perf_counter()
        kw = {"time_limit": float(time_limit)}
        if len(int_idx):
            kw["mip_rel_gap"] = float(mip_gap)
        kw.update(options)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                prob.solve(solver=cp.HIGHS, verbose=bool(log), **kw)
            except cp.error.SolverError as e:  # pragma: no cover - back end failure
                raise SolverError(f"cvxpy/HiGHS failed: {e}") from e
        solve_s = time.perf_counter() - t1
        st = prob.status
        xv = None
        if all(v.value is not None for v in parts):
            xv = np.zeros(n)
            for Pk, v in zip(P, parts):
                xv += Pk @ np.asarray(v.value, dtype=np.float64)
        if st == cp.OPTIMAL:
            status = "optimal"
        elif st in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            status = "infeasible"
        elif xv is not None:
            status = "time_limit" if solve_s >= 0.95 * time_limit else "feasible"
        elif solve_s >= 0.95 * time_limit or st == cp.USER_LIMIT:
            raise SolverTimeoutError(f"cvxpy/HiGHS stopped ({st}) without a feasible solution")
        else:
            status = "error"
        obj = float(prob.value) if xv is not None else math.nan
        bound = obj if (status == "optimal" and not len(int_idx)) else math.nan
        gap = 0.0 if status == "optimal" else math.nan
        return MilpSolution(status, xv, obj, bound, gap, solve_s, build, -1, "cvxpy", str(st))


def set_highs_threads(h, threads: int | None) -> None:
    """Set ``threads`` on a ``highspy.Highs`` (``None``: the count the process pool runs).

    HiGHS keeps one global thread pool per process; a different thread count than the pool was
    started with makes ``run()`` fail, so the pool is restarted when the count changes."""
    import highspy

    global _HIGHS_THREADS
    if threads is not None:
        if _HIGHS_THREADS != int(threads):
            highspy.Highs.resetGlobalScheduler(True)
        _HIGHS_THREADS = int(threads)
        h.setOptionValue("threads", int(threads))
    elif _HIGHS_THREADS is not None:
        h.setOptionValue("threads", _HIGHS_THREADS)


@contextlib.contextmanager
def highs_thread_count(threads: int):
    """Within the block, HiGHS runs with ``threads`` threads; the pool is switched here, in
    the calling thread, so that solves started in worker threads inside the block (a
    portfolio, :mod:`solvers.checkmate.lazy_portfolio`) find it set and never restart it
    while another one runs.  The previous count is restored on exit (the pool is restarted
    then, once, if it differs)."""
    import highspy

    global _HIGHS_THREADS
    before = _HIGHS_THREADS
    if before != int(threads):
        highspy.Highs.resetGlobalScheduler(True)
        _HIGHS_THREADS = int(threads)
    try:
        yield
    finally:
        if before != _HIGHS_THREADS:
            highspy.Highs.resetGlobalScheduler(True)
            _HIGHS_THREADS = before


def _gap(obj: float, bound: float) -> float:
    if not (math.isfinite(obj) and math.isfinite(bound)):
        return math.nan
    return max(0.0, (obj - bound) / max(abs(obj), 1e-9))


_BANNER_LOCK = threading.Lock()
_BANNER_SHOWN = False


def _new_highs(quiet: bool = True):
    """A new ``highspy.Highs``.  highspy 1.16 prints its version banner to the C-level stdout
    on the first construction in a process, whatever ``output_flag`` is set to afterwards
    (``remat compare`` printed it above its table); with ``quiet`` that one construction runs
    with file descriptor 1 pointed at ``/dev/null``."""
    import highspy

    global _BANNER_SHOWN
    with _BANNER_LOCK:
        if _BANNER_SHOWN or not quiet:
            _BANNER_SHOWN = True
            return highspy.Highs()
        _BANNER_SHOWN = True
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                return highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
