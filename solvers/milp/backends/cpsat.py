"""OR-Tools CP-SAT as a MILP back end of :class:`solvers.milp.MilpModel` (no jax).

CP-SAT solves integer programs with a portfolio of workers (LP-based branching, clause
learning, large-neighbourhood search) that share bounds; on the symmetric chains where HiGHS's
branch-and-bound proves slowly it proves fast (measured in
``docs/design/decisions/0005-cpsat-and-race.md``).

CP-SAT needs integer data.  :func:`solve_cpsat` takes every column as an integer variable (a
continuous column of the model must be *implied* integral by integer data, as Checkmate's
``U``/``FREE`` are when memory is counted in units of the sizes' gcd: build with
``Formulation(integer_memory=True)``) and requires integral row coefficients and bounds (a
row that is not raises :class:`~remat.core.errors.SolverError` naming its block).  The objective may
be fractional: it is scaled to integers with resolution ``max|c| / 2**objective_bits``; the
returned objective is re-evaluated with the exact coefficients and the bound is corrected by
the largest possible rounding error (``½ · scale · Σ_j |ub_j|`` over columns with a cost), so
it stays a valid lower bound.
"""

from __future__ import annotations

import math
import time

import numpy as np

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.milp.solution import MilpData, MilpSolution, SolveOptions

__all__ = ["solve", "solve_cpsat", "available"]

_BIG = 2**52  # CP-SAT domains are int64; keep well inside exact float range


def available() -> bool:
    """Whether ``ortools`` (the ``cpsat`` extra) is importable."""
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def _integral(a: np.ndarray, tol: float = 1e-9) -> bool:
    a = a[np.isfinite(a)]
    return bool(np.all(np.abs(a - np.round(a)) <= tol * np.maximum(1.0, np.abs(a))))


def solve(model: MilpData, opts: SolveOptions) -> MilpSolution:
    """:func:`solve_cpsat` with the :class:`~solvers.milp.solution.SolveOptions` of
    :meth:`solvers.milp.MilpModel.solve`: ``threads`` is the worker count, ``options`` go to
    :func:`solve_cpsat` as keywords, ``presolve`` and ``on_start`` are ignored.

    Raises:
      SolverError: ``relax`` (CP-SAT solves integer programs only), or as :func:`solve_cpsat`.
      SolverTimeoutError: as :func:`solve_cpsat`.
    """
    kw = opts.integer_keywords("cpsat", model.num_vars)
    return solve_cpsat(model, workers=opts.threads, **kw, **(opts.options or {}))


def solve_cpsat(model: MilpData, *, time_limit: float, mip_gap: float = 1e-4,
                workers: int | None = None, warm_start: np.ndarray | None = None,
                objective_bits: int = 30, linearization_level: int = 2,
                log: bool = False, on_start=None) -> MilpSolution:
    """Solve ``model`` with CP-SAT (see the module docstring for the integer-data contract).

    Args:
      model: the model; its fixes (:meth:`solvers.milp.MilpModel.fix`) are applied as bounds.
      time_limit: wall-clock seconds for the search.
      mip_gap: relative gap at which CP-SAT stops (``relative_gap_limit``).
      workers: parallel workers (``None``: 4; on 2 cores 4 proved faster than 2 or 8).
      warm_start: ``float[num_vars]`` hint (``nan`` entries left free).
      objective_bits: resolution of the scaled objective (``max|c| / 2**bits``).
      linearization_level: CP-SAT's LP relaxation strength (2: cuts at every node).
      log: print CP-SAT's search log.
      on_start: called with the ``CpSolver`` before the search (a racing caller may stop it
        with ``stop_search()``).

    Returns:
      :class:`~solvers.milp.MilpSolution` with ``backend="cpsat"``; ``node_count`` is CP-SAT's
      branch count.

    Raises:
      SolverError: ``ortools`` missing, non-integral data, or an invalid model.
      SolverTimeoutError: the limit hit before any feasible solution.
    """
    if workers is not None and int(workers) < 1:
        raise SolverError(f"CP-SAT needs at least one worker, got {workers!r}")
    if not 1 <= int(objective_bits) <= 52:
        raise SolverError(f"objective_bits must be in 1..52, got {objective_bits!r}")
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise SolverError("backend 'cpsat' needs OR-Tools: pip install -e '.[cpsat]'") from None
    t0 = time.perf_counter()
    A, lo, hi = model.matrix()
    lb, ub = model.bounds()
    c = model.objective_vector()
    if not (_integral(A.data) and _integral(lo) and _integral(hi)):
        bad = np.flatnonzero(~np.isclose(A.data, np.round(A.data), rtol=0, atol=1e-9))
        row = int(np.searchsorted(A.indptr, bad[0], side="right") - 1) if len(bad) else -1
        name = model.row_block_name(row)
        name = "?" if name is None else name
        raise SolverError(f"CP-SAT needs integer data; row {row} (block {name!r}) is not "
                          "integral (build Checkmate with Formulation(integer_memory=True))")
    lbi = np.where(np.isfinite(lb), np.ceil(lb - 1e-9), -_BIG).astype(np.int64)
    ubi = np.where(np.isfinite(ub), np.floor(ub + 1e-9), _BIG).astype(np.int64)
    m = cp_model.CpModel()
    xs = [m.new_int_var(int(a), int(b), "") for a, b in zip(lbi, ubi)]
    A = A.tocsr()
    for r in range(A.shape[0]):
        s, e = A.indptr[r], A.indptr[r + 1]
        if s == e:
            continue
        expr = cp_model.LinearExpr.weighted_sum([xs[j] for j in A.indices[s:e]],
                                                [int(round(v)) for v in A.data[s:e]])
        lo_r = int(round(lo[r])) if math.isfinite(lo[r]) else None
        hi_r = int(round(hi[r])) if math.isfinite(hi[r]) else None
        if lo_r is not None and hi_r is not None and lo_r == hi_r:
            m.add(expr == lo_r)
        else:
            if lo_r is not None:
                m.add(expr >= lo_r)
            if hi_r is not None:
                m.add(expr <= hi_r)
    nz = np.flatnonzero(c)
    cmax = float(np.abs(c[nz]).max()) if len(nz) else 1.0
    scale = 1.0 if _integral(c) and cmax < 2**objective_bits else cmax / 2**objective_bits
    ci = np.round(c[nz] / scale).astype(np.int64)
    m.minimize(cp_model.LinearExpr.weighted_sum([xs[j] for j in nz], [int(v) for v in ci]))
    if warm_start is not None:
        w = np.asarray(warm_start, dtype=np.float64)
        for j in np.flatnonzero(np.isfinite(w)):
            m.add_hint(xs[j], int(round(w[j])))
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = float(max(0.1, time_limit))
    p.num_workers = int(workers or 4)
    p.relative_gap_limit = float(mip_gap)
    p.linearization_level = int(linearization_level)
    p.log_search_progress = bool(log)
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    if on_start is not None:
        on_start(solver)
    st = solver.solve(m)
    solve_s = time.perf_counter() - t1
    name = solver.status_name(st)
    if st == cp_model.MODEL_INVALID:
        raise SolverError(f"CP-SAT rejected the model: {m.validate()}")
    if st == cp_model.INFEASIBLE:
        return MilpSolution("infeasible", None, math.nan, math.nan, math.nan, solve_s, build,
                            int(solver.num_branches), "cpsat", name)
    err = 0.0 if scale == 1.0 else 0.5 * scale * float(np.abs(np.where(
        np.isfinite(ub[nz]), np.maximum(np.abs(ub[nz]), np.abs(lb[nz])), 0.0)).sum())
    bound = float(solver.best_objective_bound) * scale - err + model.offset
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeoutError(f"CP-SAT stopped ({name}) after {solve_s:.1f} s without a "
                                 "feasible solution", bound=bound if math.isfinite(bound) else None)
    x = np.array([solver.value(v) for v in xs], dtype=np.float64)
    obj = float(c @ x + model.offset)
    bound = min(bound, obj)
    gap = max(0.0, (obj - bound) / max(abs(obj), 1e-9))
    status = ("optimal" if st == cp_model.OPTIMAL and gap <= max(mip_gap, 1e-6)
              else "time_limit")
    return MilpSolution(status, x, obj, bound, gap, solve_s, build, int(solver.num_branches),
                        "cpsat", name)
