"""The project's sparse MILP model and its back ends (no jax).

* :mod:`solvers.milp.model`: :class:`MilpModel` (variable blocks, sparse row blocks,
  ``solve``).
* :mod:`solvers.milp.solution`: :class:`MilpSolution`, :class:`SolveOptions` and what the back
  ends share.
* :mod:`solvers.milp.backends`: ``highs``, ``cvxpy_backend``, ``cpsat``, ``race``, each with
  ``solve(model, opts: SolveOptions) -> MilpSolution``.
* :mod:`solvers.milp.registry`: :data:`BACKENDS` (name -> solve), :func:`solve`,
  :func:`check_backend`.

Imports go model -> registry -> back ends -> solution, never back.
"""

from solvers.milp.backends.highs import highs_thread_count, set_highs_threads
from solvers.milp.model import INF, MilpModel
from solvers.milp.registry import BACKENDS, check_backend, solve
from solvers.milp.solution import MilpSolution, SolveOptions

__all__ = [
    "INF",
    "MilpModel",
    "MilpSolution",
    "SolveOptions",
    "BACKENDS",
    "check_backend",
    "solve",
    "set_highs_threads",
    "highs_thread_count",
]
