"""Array-level solvers (MILP/LP/DP). Never imports jax."""
