"""How many memory levels the compiled chain DP fills (:func:`level_portfolio`; numpy, no jax).

Each level count is one fill of :func:`solvers.chain_dp.compiled.cost_dp`;
:class:`policies.chain_dp.ChainDP` polishes each plan and keeps the cheapest.  Work is counted in
element-steps of the kernels of :mod:`solvers.chain_dp.kernel`.
"""

from __future__ import annotations

import numpy as np

from remat.core.errors import BudgetFormatError
from solvers.chain_dp.problem import ChainProblem, check_count, units

#: levels of the coarse fill of the compiled fast path (:func:`level_portfolio`)
COARSE_LEVELS = 16
#: most levels of a compiled fill (and the exact fill's limit: below it sizes are never rounded)
MAX_LEVELS = 256
#: element-steps a 256-level compiled fill may take to be tried besides the coarse one: about
#: 0.6 s at 2.2e-10 s each (``experiments/chain_dp_timing.py``), chains up to ~400 layers
LEVEL_WORK = 2.7e9
#: an unrounded compiled fill runs instead of rounding sizes when it takes at most this many
#: element-steps and ``EXACT_ENTRIES`` table entries (levels x states, ~40-120 ns each)
EXACT_WORK = 7.5e8
EXACT_ENTRIES = 1.5e7


def level_portfolio(prob: ChainProblem, budget: int, max_levels: int | None = None) -> list[int]:
    """Level counts the compiled fast path fills, each its own DP (finest first).

    * ``max_levels`` given: that count alone;
    * ``[MAX_LEVELS]`` (256) when 256 levels hold ``budget`` in units of the sizes' gcd (no
      rounding: the persistent optimum);
    * ``[budget // gcd]`` (one level per gcd: the same optimum) when that fill stays within
      ``EXACT_WORK`` element-steps and ``EXACT_ENTRIES`` table entries;
    * else ``[COARSE_LEVELS]`` (16), preceded by 256 when a 256-level fill stays within
      ``LEVEL_WORK`` element-steps (and then first by the largest count above 256 whose fill
      fits ``EXACT_WORK`` and ``EXACT_ENTRIES``, if any).

    The work of one level is ``sum_k (x_k + 1)(x_k + 2) / 2`` element-steps (every state's first
    checkpoints, ``x_k`` the forward value backward node ``k`` reads; ``K^3 / 6`` for
    ``remat.chain_graph``), its table about ``sum_k (x_k + 2)`` entries.  Why a coarse and a fine
    count: once sizes are rounded, polishing decides most of the cost and the coarse table is
    often the better start on long chains, while 256 levels win on shorter chains at tight
    budgets; ``experiments/chain_dp_levels.py`` compares both with the persistent optimum
    computed without rounding.

    Args:
      prob: the chain.
      budget: activation bytes.
      max_levels: a fixed level count, or ``None``.

    Returns:
      The level counts, finest first.

    Raises:
      BudgetFormatError: ``max_levels`` is not a positive integer, or ``budget`` is not a
        non-negative integer.
    """
    check_count("max_levels", max_levels, allow_none=True)
    if isinstance(budget, (bool, np.bool_)) or int(budget) != budget or budget < 0:
        raise BudgetFormatError(f"budget must be non-negative integer bytes, got {budget!r}")
    if max_levels is not None:
        return [int(max_levels)]
    if units(prob, int(budget), MAX_LEVELS)[3]:
        return [MAX_LEVELS]
    x = prob.bwd_hi[prob.bwd_hi >= 0].astype(float)
    work = float(np.sum((x + 1) * (x + 2) / 2))
    unrounded = int(budget) // units(prob, int(budget), 2**62)[0]  # one level per gcd
    states = float(np.sum(x + 2))  # live (anchor, backward node) pairs, about
    if unrounded * work <= EXACT_WORK and unrounded * states <= EXACT_ENTRIES:
        return [unrounded]
    if MAX_LEVELS * work > LEVEL_WORK:
        return [COARSE_LEVELS]
    fine = int(min(EXACT_WORK / max(work, 1.0), EXACT_ENTRIES / max(states, 1.0)))
    return ([fine] if fine > MAX_LEVELS else []) + [MAX_LEVELS, COARSE_LEVELS]
