"""Optimal checkpointing of heterogeneous chains (rotor-style dynamic programmes; numpy, no jax).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous
chains: how to train deep neural networks with limited memory" (2019, rotor), re-derived for
remat's memory model (the replay in ``remat/core/schedule.py``).  The policy on top is
:class:`policies.chain_dp.ChainDP`.

Modules, each importing only those listed before it:

* :mod:`~solvers.chain_dp.problem`: the chain (:class:`ChainProblem`, sizes in bytes), the
  result (:class:`ChainSolution`), the index tables every recursion shares (:class:`Tables`),
  sizes quantised to memory levels (:func:`units`), :func:`ops_cost`, argument checks;
* :mod:`~solvers.chain_dp.exact`: the exact recursion with anchor drops (``mode="exact"``, the
  derivation) and the ``(min, max)`` recursion of :func:`min_feasible_budget`;
* :mod:`~solvers.chain_dp.emit`: plan reconstruction shared by the two persistent back ends;
* :mod:`~solvers.chain_dp.numpy_dp`: the persistent recursion vectorised per diagonal
  (``mode="fast"`` with ``max_first`` or without numba);
* :mod:`~solvers.chain_dp.kernel` (numba kernels) and :mod:`~solvers.chain_dp.compiled` (their
  driver): ``mode="fast"`` otherwise; imported on first use only (numba);
* :mod:`~solvers.chain_dp.levels`: the level counts the compiled path fills
  (:func:`level_portfolio`);
* :mod:`~solvers.chain_dp.solve`: :func:`solve_chain`, the one dispatcher.
"""

from solvers.chain_dp.exact import min_feasible_budget
from solvers.chain_dp.levels import (
    COARSE_LEVELS,
    EXACT_ENTRIES,
    EXACT_WORK,
    LEVEL_WORK,
    MAX_LEVELS,
    level_portfolio,
)
from solvers.chain_dp.problem import (
    INF,
    ChainProblem,
    ChainSolution,
    Tables,
    check_count,
    check_recursion,
    ops_cost,
    units,
)
from solvers.chain_dp.solve import AUTO_FAST_ABOVE, compiled_available, solve_chain, use_fast

__all__ = [
    "AUTO_FAST_ABOVE",
    "COARSE_LEVELS",
    "EXACT_ENTRIES",
    "EXACT_WORK",
    "INF",
    "LEVEL_WORK",
    "MAX_LEVELS",
    "ChainProblem",
    "ChainSolution",
    "Tables",
    "check_count",
    "check_recursion",
    "compiled_available",
    "level_portfolio",
    "min_feasible_budget",
    "ops_cost",
    "solve_chain",
    "units",
    "use_fast",
]
