"""MILP back ends: each module's ``solve(model, opts) -> MilpSolution``, ``opts`` a
:class:`~solvers.milp.solution.SolveOptions`.

``highs`` (highspy), ``cvxpy_backend`` (cvxpy with HiGHS), ``cpsat`` (OR-Tools CP-SAT) and
``race`` (HiGHS and CP-SAT at once).  They import :mod:`solvers.milp.solution` only, never
:mod:`solvers.milp.model`; :mod:`solvers.milp.registry` maps names to them.
"""
