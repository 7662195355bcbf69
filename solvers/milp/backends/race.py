"""The ``"race"`` MILP back end: HiGHS and CP-SAT racing on one
:class:`~solvers.milp.MilpModel` (no jax).

Neither back end dominates on Checkmate's MILP: CP-SAT proves symmetric chains (identical
layers) much sooner, HiGHS proves others where CP-SAT stops at a gap (measured in
``docs/design/decisions/0005-cpsat-and-race.md``).  :func:`solve_race` runs both at once in
two threads (both release the GIL while searching): HiGHS with its default threads (its MIP
search is serial), CP-SAT with ``cpsat_workers``.  The first to end
*optimal* stops the other (``cancelSolve`` / ``stop_search``); otherwise, at the time limit, the
cheaper incumbent is returned with the larger of the two proven bounds (both are bounds on the
same model), and the status is ``optimal`` when that closes the gap to ``mip_gap``.
``MilpSolution.backend`` is ``"highs+cpsat"``; ``message`` names the winner.
"""

from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.milp.backends import cpsat, highs
from solvers.milp.solution import MilpData, MilpSolution, SolveOptions

__all__ = ["solve", "solve_race"]


def solve(model: MilpData, opts: SolveOptions) -> MilpSolution:
    """:func:`solve_race` with the :class:`~solvers.milp.solution.SolveOptions` of
    :meth:`solvers.milp.MilpModel.solve`: ``options`` go to :func:`solve_race` as keywords
    (``cpsat_workers``); ``threads``, ``presolve`` and ``on_start`` are ignored.

    Raises:
      SolverError: ``relax`` (the race solves integer programs only), or as :func:`solve_race`.
      SolverTimeoutError: as :func:`solve_race`.
    """
    kw = opts.integer_keywords("race", model.num_vars)
    return solve_race(model, **kw, **(opts.options or {}))


def solve_race(model: MilpData, *, time_limit: float, mip_gap: float = 1e-4,
               warm_start: np.ndarray | None = None, cpsat_workers: int = 3,
               log: bool = False) -> MilpSolution:
    """Race HiGHS and CP-SAT on ``model`` (integer data, see :mod:`solvers.milp.backends.cpsat`).

    Returns:
      The winner's :class:`~solvers.milp.MilpSolution` (``backend="highs+cpsat"``).

    Raises:
      SolverTimeoutError: neither found a feasible solution in time (with the better bound).
      SolverError: OR-Tools missing, ``cpsat_workers < 1``, or both back ends failed.
    """
    if not cpsat.available():  # racing HiGHS alone would be a silent downgrade
        raise SolverError("the HiGHS/CP-SAT race needs OR-Tools: pip install -e '.[cpsat]'")
    if int(cpsat_workers) < 1:
        raise SolverError(f"cpsat_workers must be at least 1, got {cpsat_workers!r}")

    handles: dict[str, object] = {}
    results: dict[str, object] = {}
    lock = threading.Lock()
    done = threading.Event()

    def stop_others(me: str) -> None:
        with lock:
            for name, h in handles.items():
                if name == me:
                    continue
                try:
                    h.cancelSolve() if name == "highs" else h.stop_search()
                except Exception:  # noqa: BLE001 (a solver that already ended)
                    pass

    def register(name):
        def cb(h):
            with lock:
                handles[name] = h
            if done.is_set():
                stop_others("")  # the other one won before this one started
        return cb

    def run(name, fn):
        try:
            sol = fn(register(name))
        except (SolverError, SolverTimeoutError) as e:
            results[name] = e
            return
        results[name] = sol
        if sol.status in ("optimal", "infeasible"):
            done.set()
            stop_others(name)

    w = None if warm_start is None else np.asarray(warm_start, dtype=np.float64)
    threads = [
        threading.Thread(target=run, args=("highs", lambda cb: highs.solve(
            model, SolveOptions(time_limit=time_limit, mip_gap=mip_gap, warm_start=w, log=log,
                                on_start=cb))), daemon=True),
        threading.Thread(target=run, args=("cpsat", lambda cb: cpsat.solve_cpsat(
            model, time_limit=time_limit, mip_gap=mip_gap, workers=cpsat_workers,
            warm_start=w, log=log, on_start=cb)), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sols = {k: v for k, v in results.items() if not isinstance(v, Exception)}
    errs = {k: v for k, v in results.items() if isinstance(v, Exception)}
    for name in ("highs", "cpsat"):  # a proof ends the race
        s = sols.get(name)
        if s is not None and s.status in ("optimal", "infeasible") and (
                s.status != "optimal" or s.has_solution):
            return dataclasses.replace(s, backend="highs+cpsat", message=f"{name} proved it")
    with_x = [s for s in sols.values() if s.has_solution]
    bounds = [s.bound for s in sols.values() if math.isfinite(s.bound)]
    bounds += [e.bound for e in errs.values()
               if isinstance(e, SolverTimeoutError) and e.bound is not None]
    bound = max(bounds) if bounds else math.nan
    if not with_x:
        if any(isinstance(e, SolverTimeoutError) for e in errs.values()) or sols:
            raise SolverTimeoutError("neither HiGHS nor CP-SAT found a feasible solution in "
                                     f"{time_limit:.1f} s", bound=bound if bounds else None)
        raise SolverError("both back ends failed: " + "; ".join(f"{k}: {v}" for k, v in errs.items()))
    best = min(with_x, key=lambda s: s.objective)
    winner = next(k for k, s in sols.items() if s is best)
    bound = min(max(bound, best.bound) if math.isfinite(bound) else best.bound, best.objective)
    gap = max(0.0, (best.objective - bound) / max(abs(best.objective), 1e-9))
    status = "optimal" if gap <= mip_gap else best.status
    return MilpSolution(status, best.x, best.objective, bound, gap,
                        max(s.solve_time_s for s in sols.values()),
                        max(s.build_time_s for s in sols.values()), best.node_count,
                        "highs+cpsat", f"{winner} incumbent; bound max of "
                        + ", ".join(f"{k} {s.bound:.6g}" for k, s in sols.items()))
