"""MILP back ends by name: :data:`BACKENDS`, :func:`solve`, :func:`check_backend` (no jax).

Imports the back ends; imported by :mod:`solvers.milp.model` (``MilpModel.solve``), never the
other way round.
"""

from __future__ import annotations

from collections.abc import Callable

from remat.core.errors import SolverError
from solvers.milp.backends import cpsat, cvxpy_backend, highs, race
from solvers.milp.solution import MilpData, MilpSolution, SolveOptions

__all__ = ["BACKENDS", "solve", "check_backend"]

# name -> solve(model, opts); what MilpModel.solve(backend=...) takes
BACKENDS: dict[str, Callable[[MilpData, SolveOptions], MilpSolution]] = {
    "highs": highs.solve,
    "cvxpy": cvxpy_backend.solve,
    "cpsat": cpsat.solve,
    "race": race.solve,
}
NEEDS_ORTOOLS = ("cpsat", "race")


def _unknown(backend: str) -> SolverError:
    return SolverError(f"unknown MILP backend {backend!r}; use one of {tuple(BACKENDS)}")


def check_backend(backend: str) -> None:
    """Raise :class:`~remat.core.errors.SolverError` unless ``backend`` is one of :data:`BACKENDS`
    and installed (``cpsat``/``race`` need OR-Tools); for policies to check their options
    before any work."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise _unknown(backend)
    if backend in NEEDS_ORTOOLS and not cpsat.available():
        raise SolverError(f"MILP backend {backend!r} needs OR-Tools: pip install -e '.[cpsat]'")


def solve(model: MilpData, backend: str = "highs", **options) -> MilpSolution:
    """Solve ``model`` with the back end called ``backend``; ``options`` are the fields of
    :class:`~solvers.milp.solution.SolveOptions` (its defaults; ``time_limit`` ``None`` or
    infinite means 1e7 s: a limit is always set).

    Raises:
      SolverError: an unknown ``backend``, or the back end's own errors.
      SolverTimeoutError: the limit hit before any feasible solution.
      TypeError: an option :class:`~solvers.milp.solution.SolveOptions` does not have.
    """
    fn = BACKENDS.get(backend) if isinstance(backend, str) else None
    if fn is None:
        raise _unknown(backend)
    return fn(model, SolveOptions(**options))
