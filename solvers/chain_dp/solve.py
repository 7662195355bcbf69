"""The one dispatcher of the chain DPs, :func:`solve_chain` (numpy, no jax).

``mode="auto"`` runs the exact recursion with anchor drops (:mod:`solvers.chain_dp.exact`) up to
``AUTO_FAST_ABOVE = 32`` forward values and the persistent one beyond (options 1-2 of that
recursion, rotor's class, Beaumont et al. 2019): compiled level by level with numba
(:mod:`solvers.chain_dp.kernel`, driver :mod:`solvers.chain_dp.compiled`), or, without numba or
with ``max_first``, vectorised per diagonal (:mod:`solvers.chain_dp.numpy_dp`).  The strategy
modules never import this one.
"""

from __future__ import annotations

from remat.core.errors import InvalidOptionError
from solvers.chain_dp.exact import solve_exact
from solvers.chain_dp.numpy_dp import solve_numpy
from solvers.chain_dp.problem import ChainProblem, ChainSolution

#: ``mode="auto"`` runs the exact recursion (with anchor drops) up to this many forward values
#: and the fast persistent one beyond.
AUTO_FAST_ABOVE = 32


def use_fast(p: ChainProblem, mode: str) -> bool:
    """Whether :func:`solve_chain` runs the persistent (fast) recursion for ``mode``.

    Raises:
      InvalidOptionError: ``mode`` is not ``"auto"``, ``"exact"`` or ``"fast"``.
    """
    if mode not in ("auto", "exact", "fast"):
        raise InvalidOptionError(f"mode must be 'auto', 'exact' or 'fast', got {mode!r}")
    return mode == "fast" or (mode == "auto" and p.K > AUTO_FAST_ABOVE)


def compiled_available() -> bool:
    """True when the numba kernels of :mod:`solvers.chain_dp.kernel` import (fast mode without
    ``max_first`` then uses them; else the numpy path of :mod:`solvers.chain_dp.numpy_dp`)."""
    try:
        import solvers.chain_dp.compiled  # noqa: F401  (numba is imported lazily)
    except ImportError:
        return False
    return True


def solve_chain(
    p: ChainProblem,
    budget: int,
    *,
    mode: str = "auto",
    max_levels: int | None = None,
    drop_anchors: bool | str = "auto",
    table_bytes: int | None = None,
    rounding: str = "up",
    slack_levels: int = 0,
    max_first: int | None = None,
) -> ChainSolution:
    """Cheapest schedule of chain ``p`` whose peak memory is at most ``budget`` bytes.

    Args:
      p: the chain.
      budget: bytes available for activations (stage outputs).
      mode: ``"exact"`` (the recursion with anchor drops, cubic in K with a Python loop over
        states: :mod:`solvers.chain_dp.exact`), ``"fast"`` (the persistent recursion, options 1-2, vectorised per diagonal,
        ``float32`` tables: :mod:`solvers.chain_dp.compiled`, or :mod:`solvers.chain_dp.numpy_dp`
        with ``max_first`` or without numba) or ``"auto"`` (exact up to ``AUTO_FAST_ABOVE``
        forward values, fast beyond).
      max_levels: most memory levels the DP tabulates; beyond, sizes are rounded up
        (``exact=False``).  Default: 4096 (exact mode), 256 (fast mode).
      drop_anchors: exact mode only: also let a checkpoint be dropped during the segment to its
        right and rebuilt from the checkpoint below it afterwards (needed for optimality when
        sizes differ); ``"auto"``: on for chains of at most 32 forward values (it costs a
        factor K).
      table_bytes: cap on the DP tables; lowers ``max_levels`` for long chains.  Default: 256 MiB
        (exact mode), 1 GiB (fast mode).
      rounding: ``"up"`` (sizes rounded up: the schedule always fits) or ``"nearest"`` (closer
        to the optimum, but the caller must check the real peak; see :class:`policies.chain_dp.ChainDP`).
      slack_levels: memory levels kept in reserve (with ``rounding="nearest"``).
      max_first: fast mode only: try at most this many first checkpoints per state (the
        nearest ``max_first / 2`` and ``max_first / 2`` geometrically spaced ones): an explicit
        approximation (``exact=False`` when it cut a choice), ``O(K²·M·max_first)`` instead of
        ``O(K³·M)``.  ``None``: all.

    Returns:
      A :class:`ChainSolution` (cost, op sequence, minimum budget of the DP's class).

    Raises:
      InfeasibleBudgetError: no schedule fits; ``min_feasible_bytes`` is the DP's exact minimum.
    """
    if use_fast(p, mode):
        if max_first is None and compiled_available():
            from solvers.chain_dp.compiled import solve_compiled  # (imports numba)

            return solve_compiled(p, budget, max_levels=256 if max_levels is None else max_levels,
                                  table_bytes=2**30 if table_bytes is None else table_bytes,
                                  rounding=rounding, slack_levels=slack_levels)[0]
        return solve_numpy(p, budget, max_levels=256 if max_levels is None else max_levels,
                           table_bytes=2**30 if table_bytes is None else table_bytes,
                           rounding=rounding,
                           slack_levels=slack_levels, max_first=max_first)
    return solve_exact(p, budget, max_levels=4096 if max_levels is None else max_levels,
                       table_bytes=2**28 if table_bytes is None else table_bytes,
                       drop_anchors=drop_anchors, rounding=rounding, slack_levels=slack_levels)
