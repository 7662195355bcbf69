"""cvxpy's matrix form with its HiGHS solver as a MILP back end (no jax).

No bound or gap comes back (``bound`` is the objective only for a solved LP); warm starts,
``threads``, ``presolve`` and ``on_start`` are ignored.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import scipy.sparse as sp

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.milp.solution import MilpData, MilpSolution, SolveOptions

__all__ = ["solve"]


def solve(model: MilpData, opts: SolveOptions) -> MilpSolution:
    """Solve ``model`` through cvxpy (:class:`~solvers.milp.solution.SolveOptions` as
    :meth:`solvers.milp.MilpModel.solve` takes them; ``options`` extra keywords of
    ``Problem.solve``).

    Raises:
      SolverTimeoutError: stopped at the limit without a feasible solution.
      SolverError: cvxpy's HiGHS interface failed.
    """
    import cvxpy as cp

    time_limit = opts.time_limit
    t0 = time.perf_counter()
    A, lo, hi = model.matrix()
    lb, ub = model.bounds()
    integ = model.integrality()
    c = model.objective_vector()
    n = model.num_vars
    int_idx = np.flatnonzero(integ) if not opts.relax else np.zeros(0, np.int64)
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
    prob = cp.Problem(cp.Minimize(c @ x + model.offset), cons)
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    kw = {"time_limit": float(time_limit)}
    if len(int_idx):
        kw["mip_rel_gap"] = float(opts.mip_gap)
    kw.update(opts.options or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prob.solve(solver=cp.HIGHS, verbose=bool(opts.log), **kw)
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
