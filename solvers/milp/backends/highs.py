"""HiGHS (highspy, direct) as a MILP back end: bound, gap and node count come back (no jax).

HiGHS keeps one thread pool per process: :func:`set_highs_threads` and
:func:`highs_thread_count` switch it without making a running solve fail.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time

import numpy as np

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.milp.solution import MilpData, MilpSolution, SolveOptions, relative_gap

__all__ = ["solve", "to_highs", "set_highs_threads", "highs_thread_count"]

_HIGHS_THREADS: int | None = None  # thread count of HiGHS's process-wide pool, once we set one


def solve(model: MilpData, opts: SolveOptions) -> MilpSolution:
    """Solve ``model`` with HiGHS (:class:`~solvers.milp.solution.SolveOptions` as
    :meth:`solvers.milp.MilpModel.solve` takes them; ``options`` HiGHS options).

    Raises:
      SolverTimeoutError: stopped (time or work limit, interrupt) without a feasible solution.
      SolverError: HiGHS rejected the model.
    """
    import highspy

    warm_start, on_start = opts.warm_start, opts.on_start
    nv = model.num_vars
    t0 = time.perf_counter()
    h, is_mip = to_highs(model, relax=opts.relax, log=opts.log)
    h.setOptionValue("time_limit", float(opts.time_limit))
    h.setOptionValue("mip_rel_gap", float(opts.mip_gap))
    h.setOptionValue("presolve", "on" if opts.presolve else "off")
    set_highs_threads(h, opts.threads)
    for k, v in (opts.options or {}).items():
        h.setOptionValue(k, v)
    if warm_start is not None and is_mip:
        if isinstance(warm_start, tuple):
            idx, vals = (np.asarray(warm_start[0], np.int32),
                         np.asarray(warm_start[1], np.float64))
        else:
            w = np.asarray(warm_start, dtype=np.float64)
            keep = np.flatnonzero(np.isfinite(w))
            idx, vals = keep.astype(np.int32), w[keep]
        if len(idx) == nv and np.array_equal(idx, np.arange(nv)):
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
    gap = 0.0 if status == "optimal" and not is_mip else relative_gap(obj, bound)
    return MilpSolution(status, x, obj, bound, gap, solve_s, build, nodes, "highs", text)


def to_highs(model: MilpData, *, relax: bool = False, log: bool = False):
    """A ``highspy.Highs`` holding ``model`` (integrality dropped with ``relax``).

    Returns:
      ``(highs, is_mip)``.
    """
    import highspy

    A, lo, hi = model.matrix()
    lb, ub = model.bounds()
    integ = model.integrality()
    c = model.objective_vector()
    nv, nr = model.num_vars, model.num_rows
    inf = highspy.kHighsInf
    h = _new_highs(quiet=not log)
    h.setOptionValue("output_flag", bool(log))
    lp = highspy.HighsLp()
    lp.num_col_ = nv
    lp.num_row_ = nr
    lp.col_cost_ = c
    lp.offset_ = float(model.offset)
    lp.col_lower_ = np.where(np.isfinite(lb), lb, -inf)
    lp.col_upper_ = np.where(np.isfinite(ub), ub, inf)
    lp.row_lower_ = np.where(np.isfinite(lo), lo, -inf)
    lp.row_upper_ = np.where(np.isfinite(hi), hi, inf)
    Ac = A.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = Ac.indptr.astype(np.int32)
    lp.a_matrix_.index_ = Ac.indices.astype(np.int32)
    lp.a_matrix_.value_ = Ac.data
    lp.a_matrix_.num_col_ = nv
    lp.a_matrix_.num_row_ = nr
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
