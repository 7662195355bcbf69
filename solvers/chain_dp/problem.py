r"""The chain problem, its solution, and what every chain recursion shares (numpy, no jax).

Problem (:class:`ChainProblem`), as in Beaumont et al. 2019 ("Optimal checkpointing for
heterogeneous chains", rotor) but with *remat's* memory model (the replay in
``remat/core/schedule.py``, equal to the Checkmate MILP's accounting): when a node runs, memory
= every output held + its own output; an output may be freed right after any reader.

* a forward chain ``v_0 -> v_1 -> ... -> v_{K-1}`` (``v_0`` reads only the free input
  ``v_{-1}``, size 0); ``s_j`` bytes and ``c_j`` cost each;
* a backward chain ``B_0 -> B_1 -> ... -> B_{M-1}`` (``B_k`` reads ``B_{k-1}``'s output
  ``G_{k-1}``), ``g_k`` bytes and ``bc_k`` cost each, and ``B_k`` also reads the forward values
  ``need_k`` ⊆ ``{hi_k - 1, hi_k}`` with ``hi_k`` and ``lo_k = min need_k`` non-increasing in k
  (the loss is ``B_0``; ``B_k`` for layer ``i`` reads its input and output, as in
  ``remat.chain_graph`` and the published Checkmate graphs).

Shared by the recursions of :mod:`solvers.chain_dp.exact`, :mod:`solvers.chain_dp.numpy_dp` and
:mod:`solvers.chain_dp.compiled`: the index tables (:class:`Tables`), the quantisation of sizes
to memory levels (:func:`units`), the tables each recursion starts from (:func:`byte_tables`,
:func:`level_tables`), the cost of an op sequence (:func:`ops_cost`) and argument checks
(:func:`check_min_budget` among them).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from functools import reduce

import numpy as np

from remat.core.errors import InfeasibleBudgetError, InvalidGraphError, InvalidOptionError

INF = np.inf


@dataclasses.dataclass(frozen=True)
class ChainProblem:
    """A heterogeneous chain (see the module docstring).

    Attributes:
      fwd_sizes: ``int64[K]`` bytes of ``v_j``.
      fwd_costs: ``float64[K]`` compute cost of ``v_j``.
      bwd_sizes: ``int64[M]`` bytes of ``G_k``.
      bwd_costs: ``float64[M]`` compute cost of ``B_k``.
      bwd_hi: ``int64[M]`` highest forward index ``B_k`` reads, ``-1`` if none.
      bwd_lo: ``int64[M]`` lowest forward index ``B_k`` reads (``hi - 1`` or ``hi``), ``-1`` if none.
    """

    fwd_sizes: np.ndarray
    fwd_costs: np.ndarray
    bwd_sizes: np.ndarray
    bwd_costs: np.ndarray
    bwd_hi: np.ndarray
    bwd_lo: np.ndarray

    def __post_init__(self) -> None:
        for f, dt in (("fwd_sizes", np.int64), ("fwd_costs", np.float64), ("bwd_sizes", np.int64),
                      ("bwd_costs", np.float64), ("bwd_hi", np.int64), ("bwd_lo", np.int64)):
            object.__setattr__(self, f, np.asarray(getattr(self, f), dtype=dt).reshape(-1))
        K, M = len(self.fwd_sizes), len(self.bwd_sizes)
        if len(self.fwd_costs) != K or not (len(self.bwd_costs) == len(self.bwd_hi) == len(self.bwd_lo) == M):
            raise InvalidGraphError("chain arrays have inconsistent lengths")
        if K == 0 or M == 0:
            raise InvalidGraphError("a chain needs at least one forward and one backward node")
        hi, lo = self.bwd_hi, self.bwd_lo
        if np.any((hi < 0) != (lo < 0)) or np.any(hi >= K) or np.any((hi - lo)[hi >= 0] > 1) or np.any(hi < lo):
            raise InvalidGraphError("backward node must read forward values {hi-1, hi} or {hi}")
        h, l_ = hi[hi >= 0], lo[hi >= 0]
        if np.any(np.diff(h) > 0) or np.any(np.diff(l_) > 0):
            raise InvalidGraphError("backward nodes must read forward values right to left")

    @property
    def K(self) -> int:
        return len(self.fwd_sizes)

    @property
    def M(self) -> int:
        return len(self.bwd_sizes)

    def reads(self, k: int) -> tuple[int, ...]:
        """Forward indices ``B_k`` reads."""
        hi, lo = int(self.bwd_hi[k]), int(self.bwd_lo[k])
        return () if hi < 0 else tuple(sorted({lo, hi}))


@dataclasses.dataclass(frozen=True)
class ChainSolution:
    """Result of :func:`solvers.chain_dp.solve_chain`.

    Attributes:
      cost: total compute cost of the schedule (forward recomputations included).
      ops: the schedule, ``("f", j)`` runs ``v_j``, ``("b", k)`` runs ``B_k``, in order.
      min_budget: smallest feasible budget in bytes (exact, from the min-max recursion).
      budget: the budget solved for (bytes).
      unit: bytes per memory level used by the DP.
      exact: True when no size was rounded (the cost is the optimum of the DP's class).
      solve_time_s: wall time of the DP.
    """

    cost: float
    ops: tuple[tuple[str, int], ...]
    min_budget: int
    budget: int
    unit: int
    exact: bool
    solve_time_s: float


class Tables:
    """Index helpers of one size quantisation, shared by every recursion.

    ``s``, ``g``: ``int64[K]`` / ``int64[M]`` forward / backward sizes, in bytes or memory
    levels (:func:`units`).  Attributes: ``s_ext[a + 1]`` (size of ``v_a``, 0 for the input),
    ``g_ext[k]`` (size of ``G_{k-1}``), ``cumc[j + 1]`` (cost of ``v_0 .. v_j``), ``hi``/``lo``
    (reads), ``eff_lo``/``hi_eff`` (reads with empty ones inherited), ``e[a + 1]`` (last
    backward node whose reads are all ``>= a``) and ``pair[i] = s_{i-1} + s_i``.
    """

    def __init__(self, p: ChainProblem, s: np.ndarray, g: np.ndarray):
        K, M = p.K, p.M
        self.K, self.M = K, M
        self.s_ext = np.concatenate([[0], s]).astype(np.int64)  # s_ext[a + 1] = size of v_a
        self.g_ext = np.concatenate([[0], g]).astype(np.int64)  # g_ext[k] = size of G_{k-1}
        self.g = np.asarray(g, dtype=np.int64)
        self.s = np.asarray(s, dtype=np.int64)
        self.cumc = np.concatenate([[0.0], np.cumsum(p.fwd_costs)])
        self.hi, self.lo = p.bwd_hi, p.bwd_lo
        # effective lo (empty reads inherit the previous one; leading empties: +inf = K)
        eff = np.empty(M, dtype=np.int64)
        prev = K
        for k in range(M):
            if self.hi[k] >= 0:
                prev = int(self.lo[k])
            eff[k] = prev
        self.eff_lo = eff
        # effective hi: a node reading nothing passes v_x on to the next node that reads (h flag)
        hie = np.array(self.hi, dtype=np.int64)
        nxt = -1
        for k in range(M - 1, -1, -1):
            if self.hi[k] >= 0:
                nxt = int(self.hi[k])
            hie[k] = nxt
        self.hi_eff = hie
        # e[a + 1] = last k with eff_lo >= a  (eff_lo non-increasing)
        self.e = np.array([int(np.sum(eff >= a)) - 1 for a in range(-1, K)], dtype=np.int64)
        # pair[i] = s_{i-1} + s_i  (working memory of computing v_i from v_{i-1})
        self.pair = s + np.concatenate([[0], s[:-1]])

    def need(self, k: int) -> tuple[int, ...]:
        hi, lo = int(self.hi[k]), int(self.lo[k])
        return () if hi < 0 else tuple(sorted({lo, hi}))

    def keepable(self, a: int, k: int, x: int) -> bool:
        """Can ``v_x`` be carried into state ``(a, k, h=1)``?"""
        return k < self.M and k <= self.e[a + 1] and x > a and int(self.hi_eff[k]) == x

    def sweep_mem(self, a: int, jmax: int) -> np.ndarray:
        """``int64[jmax - a]``: max working bytes of running ``v_{a+1} .. v_j`` for each j."""
        w = self.pair[a + 1 : jmax + 1].copy()
        w[0] = self.s[a + 1]  # v_a is the anchor, counted in base
        return np.maximum.accumulate(w)


def check_recursion(K: int) -> None:
    """Raise Python's recursion limit for plan reconstruction on ``K`` forward values (the
    emitters recurse once per nested segment)."""
    need = 4 * K + 200
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)


def units(p: ChainProblem, budget: int, max_levels: int, rounding: str = "up"):
    """Memory levels for ``budget`` bytes: ``(unit, s, g, exact)``.

    ``unit`` (bytes per level) is the gcd of the nonzero sizes, or ``ceil(budget / max_levels)``
    when the budget would need more than ``max_levels`` levels; ``s``/``g`` (``int64[K]`` /
    ``int64[M]``) are the sizes in levels, rounded ``"up"`` (a plan always fits the real budget)
    or to the ``"nearest"`` level (at least 1 for a nonzero size); ``exact``: no size was
    rounded.
    """
    sizes = np.concatenate([p.fwd_sizes, p.bwd_sizes])
    nz = [int(v) for v in sizes if v > 0]
    unit = reduce(math.gcd, nz) if nz else 1
    exact = True
    if budget // unit > max_levels:
        unit = int(math.ceil(budget / max_levels))
        exact = bool(np.all(sizes % unit == 0))
    if rounding == "nearest":
        def q(x):
            return np.where(x > 0, np.maximum(1, np.rint(x / unit)), 0).astype(np.int64)
    else:
        def q(x):
            return -(-x // unit)
    return unit, q(p.fwd_sizes), q(p.bwd_sizes), exact


def byte_tables(p: ChainProblem) -> Tables:
    """The tables of ``p`` at its exact sizes (bytes), for the ``(min, max)`` recursions, with
    the recursion limit raised for plan reconstruction (:func:`check_recursion`)."""
    check_recursion(p.K)
    return Tables(p, p.fwd_sizes, p.bwd_sizes)


def level_tables(p: ChainProblem, budget: int, max_levels: int, rounding: str,
                 slack_levels: int) -> tuple[Tables, int, bool, int]:
    """The tables of ``p`` at its sizes in memory levels for ``budget`` bytes (:func:`units`,
    at most ``max_levels`` levels): ``(tables, unit, exact, Lv)``, ``Lv`` the top level a cost
    table fills (``budget // unit``, less ``slack_levels`` when a size was rounded)."""
    unit, s, g, exact = units(p, budget, max_levels, rounding)
    Lv = max(0, budget // unit - (0 if exact else int(slack_levels)))
    return Tables(p, s, g), unit, exact, Lv


def check_min_budget(budget: int, min_budget: int) -> None:
    """Raise :class:`~remat.core.errors.InfeasibleBudgetError` when ``budget`` is below
    ``min_budget`` (bytes), the smallest budget of the recursion's class."""
    if budget < min_budget:
        raise InfeasibleBudgetError(budget, min_budget, "no chain schedule fits (ChainDP)")


def ops_cost(p: ChainProblem, ops) -> float:
    """Total compute cost of an op sequence (``("f", j)`` / ``("b", k)``)."""
    kinds = np.array([o[0] == "f" for o in ops], dtype=bool)
    idx = np.array([o[1] for o in ops], dtype=np.int64)
    return float(p.fwd_costs[idx[kinds]].sum() + p.bwd_costs[idx[~kinds]].sum())


def check_count(name: str, value, *, allow_none: bool = False) -> None:
    """Reject a level or choice count that is not a positive integer (``bool`` included).

    Raises:
      InvalidOptionError: naming ``name`` and the value.
    """
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or value < 1:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
