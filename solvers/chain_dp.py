r"""Optimal persistent checkpointing of heterogeneous chains (rotor-style dynamic programme).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous
chains: how to train deep neural networks with limited memory" (2019, rotor) solve chains with
a DP over (segment, memory).  This module re-derives that DP for *remat's* memory model (the
replay in ``remat/core/schedule.py``, equal to the Checkmate MILP's accounting): when a node runs,
memory = every output held + its own output; an output may be freed right after any reader.

Length: a long docstring derives the recursion and its memory terms; the code is the exact DP
only (the vectorised fast DP is :mod:`solvers.chain_dp_fast`).

Problem (:class:`ChainProblem`), all arrays on numpy, no jax:

* a forward chain ``v_0 -> v_1 -> ... -> v_{K-1}`` (``v_0`` reads only the free input
  ``v_{-1}``, size 0); ``s_j`` bytes and ``c_j`` cost each;
* a backward chain ``B_0 -> B_1 -> ... -> B_{M-1}`` (``B_k`` reads ``B_{k-1}``'s output
  ``G_{k-1}``), ``g_k`` bytes and ``bc_k`` cost each, and ``B_k`` also reads the forward values
  ``need_k`` ⊆ ``{hi_k - 1, hi_k}`` with ``hi_k`` and ``lo_k = min need_k`` non-increasing in k
  (the loss is ``B_0``; ``B_k`` for layer ``i`` reads its input and output, as in
  ``remat.chain_graph`` and the published Checkmate graphs).

Sub-problem (one per anchor ``a``, next backward ``k``, flag ``h``, memory ``m``):
``F(a, k, h, m)`` = least compute cost to run ``B_k .. B_{e(a)}`` (every backward node with
``lo >= a``) when ``v_a``, ``G_{k-1}`` and, if ``h``, ``v_{hi_k}`` are resident and at most ``m``
bytes may be resident (those included).  With ``base = s_a + g_{k-1} + h·s_{hi_k}``:

1. every input of ``B_k`` resident: run it (memory ``base + g_k``), then continue with
   ``F(a, k+1, h', m)``, ``h' ∈ {0, keep v_x if B_{k+1} reads it}``;
2. otherwise choose the first checkpoint ``j ∈ (a, hi_k]`` (``< hi_k`` when ``h``): run
   ``v_{a+1} .. v_j`` keeping only the newest (memory ``base + s_{i-1} + s_i``), store ``v_j``;
   if ``j = hi_k`` continue with ``F(a, k, 1, m)``; else solve the right part
   ``F(j, k, h, m - s_a)`` (``v_a`` stays resident), then the left part
   ``F(a, e(j)+1, h', m)`` where ``h'`` keeps ``v_j`` when the next backward node reads it.

3. (anchor drop, ``drop_anchors``) as 2 with ``j < hi_k``, but ``v_a`` is freed as soon as
   ``v_{a+1}`` exists: the right part runs in all of ``m`` (its nearest resident anchor is then
   the parent ``p`` of ``a``), and afterwards ``v_a`` is rebuilt from ``v_p`` (cost
   ``c_{p+1} + .. + c_a``, working memory ``g_{e(j)} + h'·s_j + max(s_{i-1} + s_i)``) before the
   left part.  The state therefore carries ``p``: ``F(p, a, k, h, m)``.  When ``p`` is the
   input, nothing is rebuilt: children of the input finish the *whole* schedule (their value
   includes the top-level continuation), and a dropped anchor's right part hands over to the
   top-level state, which may rebuild ``v_0 .. v_a`` keeping any of them (the non-persistent
   schedules the exhaustive search found).

``F = min`` over those options (``∞`` when a memory term exceeds ``m``); the answer is
``F(·, -1, 0, 0, budget)``.  Memory terms, all in bytes of stage outputs (parameters excluded,
as in the replay): the anchor ``s_a``; the incoming gradient ``g_{k-1}``; a held ``v_{hi_k}``;
the two live values of a forward step; the node's own output.  Why persistent schedules: as in
rotor, a checkpoint that stays resident until every backward node right of it has run turns the
schedule into nested, independent segments (the recursion above); options 1-3 add the
non-persistent moves our model rewards (a layer's backward reads the layer's input *and*
output, so dropping ``v_j`` or ``v_a`` and recomputing it later can pay).  Backward nodes run
exactly once.

Optimality, checked in ``tests/test_chain_dp.py`` against an exhaustive search over *all*
schedules (any node recomputed any number of times) on chains of up to 5 layers: equal on
every (chain, budget) with uniform activation sizes and random costs, and equal to the Checkmate
MILP at 10 budgets.  With unequal sizes, a schedule outside this class was cheaper in 1 of
~3,300 (chain, budget) pairs with L <= 6 (by 0.8 %: a checkpoint dropped below a non-input
anchor whose rebuild keeps values for later layers); ChainDP is optimal over its class.

Complexity (``mode="exact"``): ``O(K·M)`` states (``O(K²·M)`` with anchor dropping) × 2, each
evaluating ``O(K)`` first checkpoints (and every parent ``p``) at once over the ``Lv + 1``
memory levels with numpy: ``O(K²·M·Lv)`` time (``O(K³·M·Lv)`` with dropping, which ``"auto"``
enables up to K = 32), with a Python loop over states.  Memory is counted in units of the
``gcd`` of the sizes (exact) unless the budget needs more than ``max_levels`` units; then sizes
are rounded *up* to ``ceil(budget / max_levels)`` (the plan fits the real budget, the cost may
exceed the optimum; ``exact=False``), and :class:`policies.chain_dp.ChainDP` also tries nearest
rounding with a few levels held back, keeping it when the replayed peak fits.  The smallest
feasible budget comes from the same recursion with ``(min, max)`` in place of ``(min, +)``:
exact, no discretisation.

Fast path (``mode="fast"``, and ``"auto"`` beyond ``AUTO_FAST_ABOVE = 32`` forward values):
options 1-2 only (rotor's persistent class), every first checkpoint tried: compiled level by
level with numba (:mod:`solvers.chain_dp_kernel`, driver :mod:`solvers.chain_dp_compiled`),
or, without numba or with ``max_first``, vectorised per diagonal in :mod:`solvers.chain_dp_fast`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from functools import reduce

import numpy as np

from remat.core.errors import BudgetFormatError, InfeasibleBudgetError, InvalidGraphError

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
    """Result of :func:`solve_chain`.

    Attributes:
      cost: total compute cost of the schedule (forward recomputations included).
      ops: the schedule, ``("f", j)`` runs ``v_j``, ``("b", k)`` runs ``B_k``, in order.
      min_budget: smallest feasible budget in bytes (exact, from the min-max recursion).
      budget: the budget solved for (bytes).
      unit: bytes per memory level used by the DP.
      exact: True when no size was rounded (the cost is the optimum of the persistent class).
      solve_time_s: wall time of the DP.
    """

    cost: float
    ops: tuple[tuple[str, int], ...]
    min_budget: int
    budget: int
    unit: int
    exact: bool
    solve_time_s: float


class _Tables:
    """Shared index helpers for both recursions."""

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


def _check_recursion(K: int) -> None:
    need = 4 * K + 200
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)


class _DP:
    """The recursion of the module docstring, tabulated.

    ``F[q, a + 1, k, h]`` holds the state ``(p, a, k, h)`` where ``q = p + 1`` is the nearest
    *resident* anchor below ``a`` (only with anchor dropping; else ``q = 0``).  In
    ``mode="cost"`` each entry is a ``float64[Lv + 1]`` array over memory levels; in
    ``mode="mem"`` a scalar: the least peak (bytes) of the sub-schedule.  Each state's options
    are evaluated for every parent ``p`` and every first checkpoint ``j`` at once.
    """

    def __init__(self, tb: _Tables, bwd_costs: np.ndarray, drop: bool, mode: str, Lv: int = 0):
        self.tb, self.bc, self.drop, self.mode, self.Lv = tb, bwd_costs, drop, mode, Lv
        K, M = tb.K, tb.M
        P = K + 1 if drop else 1
        shape = (P, K + 1, M + 1, 2) + ((Lv + 1,) if mode == "cost" else ())
        self.F = np.full(shape, INF)
        self.F[:, :, M] = 0.0
        self.m = np.arange(Lv + 1)

    def nparents(self, a: int) -> int:
        """Parents ``p = -1 .. a-1`` of anchor ``a`` (rows ``q = 0 .. a``); 1 row without dropping."""
        return a + 1 if (self.drop and a >= 0) else 1

    def q(self, p: int, a: int) -> int:
        return p + 1 if (self.drop and a >= 0) else 0

    def fill(self) -> None:
        tb, F = self.tb, self.F
        for k in range(tb.M - 1, -1, -1):
            for a in range(tb.K - 1, -2, -1):
                P = self.nparents(a)
                if k > tb.e[a + 1]:
                    F[:P, a + 1, k] = 0.0
                    continue
                for h in (1, 0):
                    vals, _ = self.options(a, k, h)
                    if vals is not None:
                        F[:P, a + 1, k, h] = vals.min(axis=1)
            if self.drop:  # children of the input finish through the top-level state
                for a in range(tb.K):
                    if k > tb.e[a + 1]:
                        F[0, a + 1, k] = self.continuation(a, k)

    def continuation(self, a: int, k: int):
        """Value of the top-level state at ``k`` entered from anchor ``a`` (kept when B_k reads it)."""
        F = self.F
        v = F[0, 0, k, 0]
        if self.tb.keepable(-1, k, a):
            v = np.minimum(v, F[0, 0, k, 1])
        return v

    def options(self, a: int, k: int, h: int, Lv: int | None = None):
        """All options of the states ``(p, a, k, h)`` for every parent p.

        Returns ``(vals, descs)``: ``vals`` is ``[P, n_opt, Lv + 1]`` (cost mode) or
        ``[P, n_opt]`` (mem mode), ``descs`` the option descriptors; ``(None, [])`` if none.
        """
        tb, F, cost = self.tb, self.F, self.mode == "cost"
        if cost:
            Lv = self.Lv if Lv is None else Lv
            F = F[..., : Lv + 1]
            m = self.m[: Lv + 1]
        x = int(tb.hi_eff[k])
        if h and not (x >= 0 and x > a):
            return None, []
        P = self.nparents(a)
        base = int(tb.s_ext[a + 1] + tb.g_ext[k] + (tb.s[x] if h else 0))
        held = {a} | ({x} if h else set())
        blocks: list[np.ndarray] = []  # each [P, n, (Lv+1)] or [P, n]
        descs: list[tuple] = []

        def add(need_mem, c, parts, desc):
            """need_mem, c: broadcastable to [P, n]; parts: arrays [P, n, Lv+1] (cost) or
            [P, n] (mem) combined by + (cost) or max (mem)."""
            need_mem = np.broadcast_to(np.asarray(need_mem, dtype=float), (P, len(desc)))
            if cost:
                v = np.asarray(c, dtype=float)[..., None] + sum(parts)
                blocks.append(np.where(m >= need_mem[..., None], v, INF))
            else:
                blocks.append(reduce(np.maximum, parts, need_mem))
            descs.extend(desc)

        if set(tb.need(k)) <= held:
            mem = base + int(tb.g[k])
            hps = [0] + ([1] if h and tb.keepable(a, k + 1, x) else [])
            for hp in hps:
                add(mem, self.bc[k], [F[:P, a + 1, k + 1, hp][:, None]], [("run", hp)])
            return np.concatenate(blocks, axis=1), descs
        jmax = x - 1 if h else x
        sm = base + tb.sweep_mem(a, jmax)  # sm[i]: peak of the sweep a -> a+1+i, v_a kept
        sa = int(tb.s_ext[a + 1])
        if not h:  # sweep up to v_x and hold it
            add(int(sm[-1]), tb.cumc[x + 1] - tb.cumc[a + 1], [F[:P, a + 1, k, 1][:, None]],
                [("hold", x)])
        js = np.arange(a + 1, min(jmax, x - 1) + 1)
        if len(js) == 0:
            return np.concatenate(blocks, axis=1), descs
        nj = len(js)
        smj = sm[:nj]
        sweep_cost = tb.cumc[js + 1] - tb.cumc[a + 1]
        kk = tb.e[js + 1] + 1
        keep = np.array([tb.keepable(a, int(q), int(j)) for q, j in zip(kk, js)])
        lefts = [F[:P, a + 1, kk, 0], np.where(
            keep[None, :, None] if cost else keep[None, :], F[:P, a + 1, kk, 1], INF)]
        if self.drop and a < 0:
            # with anchor drops, a child of the input finishes the whole schedule: no left part
            lefts = [np.zeros_like(lefts[0]), np.full_like(lefts[1], INF)]
        # keep v_a: the right part runs in m - s_a and its parent anchor is a
        right = F[self.q(a, 0) if a >= 0 else 0, js + 1, k, h]
        if cost:
            sh = np.full((nj, Lv + 1), INF)
            if sa <= Lv:
                sh[:, sa:] = right[:, : Lv + 1 - sa]
            rk = sh[None]
        else:
            rk = (right + sa)[None, :]
        for hp in (0, 1):
            add(smj[None, :], sweep_cost[None, :], [rk, lefts[hp]],
                [("split", int(j), hp, 0) for j in js])
        if self.drop and a >= 0:
            # drop v_a once v_{a+1} exists: the rest of the sweep runs without it, the right part
            # runs in m with parent p, and v_a is rebuilt from v_p afterwards
            w = tb.pair[a + 1 : a + 1 + nj].copy()
            w[0] = tb.s[a + 1] + sa
            sm_drop = base - sa + np.maximum.accumulate(w)
            ps = np.arange(-1, a)
            rs_cost = tb.cumc[a + 1] - tb.cumc[ps + 1]  # [P]
            suffix = np.concatenate([np.maximum.accumulate(tb.pair[: a + 1][::-1])[::-1], [0]])
            rs_mem = np.maximum(tb.s[ps + 1], suffix[np.minimum(ps + 2, a + 1)])  # [P]
            rd = F[:P, js + 1, k, h]
            for hp in (0, 1):
                held_left = tb.g_ext[kk] + (tb.s[js] if hp else 0)  # [nj]
                need_mem = np.maximum(sm_drop[None, :], held_left[None, :] + rs_mem[:, None])
                c = sweep_cost[None, :] + rs_cost[:, None]
                left = lefts[hp].copy()
                # parent = input (row 0): do not rebuild v_a; the right part (a child of the
                # input) hands over to the top-level state, which rebuilds what it wants
                need_mem[0], c[0], left[0] = sm_drop, sweep_cost, (0.0 if hp == 0 else INF)
                add(need_mem, c, [rd, left], [("split", int(j), hp, 1) for j in js])
        return np.concatenate(blocks, axis=1), descs

    def emit(self, p: int, a: int, k: int, h: int, mlev: int, ops: list) -> None:
        """Append the optimal schedule of state (p, a, k, h) to ``ops``: the cheapest at memory
        level ``mlev`` (cost mode) or the one with the smallest peak (mem mode)."""
        tb, cost, merge = self.tb, self.mode == "cost", self.drop
        while k < tb.M:
            if k > tb.e[a + 1]:
                if not (merge and a >= 0 and p == -1):
                    return
                # a child of the input hands over to the top-level state
                c0 = self.F[0, 0, k, 0]
                c1 = self.F[0, 0, k, 1] if tb.keepable(-1, k, a) else c0 + INF
                v0, v1 = (c0[mlev], c1[mlev]) if cost else (c0, c1)
                a, p, h = -1, -1, int(v1 < v0)
                continue
            vals, descs = self.options(a, k, h, Lv=mlev if cost else None)
            row = vals[self.q(p, a)]
            d = descs[int(np.argmin(row[:, mlev] if cost else row))]
            if d[0] == "run":
                ops.append(("b", k))
                k, h = k + 1, d[1]
                continue
            if d[0] == "hold":
                ops.extend(("f", i) for i in range(a + 1, d[1] + 1))
                h = 1
                continue
            _, j, hp, dropped = d
            ops.extend(("f", i) for i in range(a + 1, j + 1))
            if merge and p == -1 and (dropped or a == -1):
                a = j  # the right part is a child of the input: it runs to the end
                continue
            if dropped:
                self.emit(p, j, k, h, mlev, ops)
                ops.extend(("f", i) for i in range(p + 1, a + 1))
            else:
                self.emit(a, j, k, h, mlev - int(tb.s_ext[a + 1]), ops)
            k, h = int(tb.e[j + 1]) + 1, hp


def _use_drop(p: ChainProblem, drop: bool | str) -> bool:
    if drop == "auto":
        return p.K <= 32
    return bool(drop)


def _min_mem_dp(p: ChainProblem, drop: bool) -> _DP:
    _check_recursion(p.K)
    dp = _DP(_Tables(p, p.fwd_sizes, p.bwd_sizes), p.bwd_costs, drop, "mem")
    dp.fill()
    return dp


def min_feasible_budget(p: ChainProblem, *, drop_anchors: bool | str = "auto") -> int:
    """Smallest budget (bytes) for which a schedule of the DP's class exists ((min, max) DP)."""
    return int(_min_mem_dp(p, _use_drop(p, drop_anchors)).F[0, 0, 0, 0])


def _units(p: ChainProblem, budget: int, max_levels: int, rounding: str = "up"):
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


def check_count(name: str, value, *, allow_none: bool = False) -> None:
    """Reject a level or choice count that is not a positive integer (``bool`` included).

    Raises:
      BudgetFormatError: naming ``name`` and the value.
    """
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or value < 1:
        raise BudgetFormatError(f"{name} must be a positive integer, got {value!r}")


def _use_fast(p: ChainProblem, mode: str) -> bool:
    if mode not in ("auto", "exact", "fast"):
        raise ValueError(f"mode must be 'auto', 'exact' or 'fast', got {mode!r}")
    return mode == "fast" or (mode == "auto" and p.K > AUTO_FAST_ABOVE)


def compiled_available() -> bool:
    """True when the numba kernels of :mod:`solvers.chain_dp_kernel` import (fast mode without
    ``max_first`` then uses them; else the numpy path of :mod:`solvers.chain_dp_fast`)."""
    try:
        import solvers.chain_dp_compiled  # noqa: F401
    except ImportError:
        return False
    return True


#: ``mode="auto"`` runs the exact recursion (with anchor drops) up to this many forward values
#: and the fast persistent one beyond.
AUTO_FAST_ABOVE = 32


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
        states), ``"fast"`` (the persistent recursion, options 1-2, vectorised per diagonal,
        ``float32`` tables: :class:`solvers.chain_dp_fast._FastDP`) or ``"auto"`` (exact up to
        ``AUTO_FAST_ABOVE`` forward values, fast beyond).
      max_levels: most memory levels the DP tabulates; beyond, sizes are rounded up
        (``exact=False``).  Default: 4096 (exact mode), 256 (fast mode).
      drop_anchors: exact mode only: also let a checkpoint be dropped during the segment to its
        right and rebuilt from the checkpoint below it afterwards (needed for optimality when
        sizes differ); ``"auto"``: on for chains of at most 32 forward values (it costs a
        factor K).
      table_bytes: cap on the DP tables; lowers ``max_levels`` for long chains.  Default: 256 MiB
        (exact mode), 1 GiB (fast mode).
      rounding: ``"up"`` (sizes rounded up: the schedule always fits) or ``"nearest"`` (closer
        to the optimum, but the caller must check the real peak; see :class:`ChainDP`).
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
    if _use_fast(p, mode):
        if max_first is None and compiled_available():
            from solvers.chain_dp_compiled import _solve_compiled

            return _solve_compiled(p, budget, max_levels=256 if max_levels is None else max_levels,
                                   table_bytes=2**30 if table_bytes is None else table_bytes,
                                   rounding=rounding, slack_levels=slack_levels)[0]
        from solvers.chain_dp_fast import _solve_fast  # (it imports this module's tables)

        return _solve_fast(p, budget, max_levels=256 if max_levels is None else max_levels,
                           table_bytes=2**30 if table_bytes is None else table_bytes,
                           rounding=rounding,
                           slack_levels=slack_levels, max_first=max_first)
    return _solve_exact(p, budget, max_levels=4096 if max_levels is None else max_levels,
                        table_bytes=2**28 if table_bytes is None else table_bytes,
                        drop_anchors=drop_anchors, rounding=rounding, slack_levels=slack_levels)


def _solve_exact(p: ChainProblem, budget: int, *, max_levels: int, table_bytes: int,
                 drop_anchors: bool | str, rounding: str, slack_levels: int) -> ChainSolution:
    """:func:`solve_chain` with ``mode="exact"`` (see :class:`_DP`; bytes, seconds)."""
    t0 = time.perf_counter()
    budget = int(budget)
    drop = _use_drop(p, drop_anchors)
    mdp = _min_mem_dp(p, drop)
    mn = int(mdp.F[0, 0, 0, 0])
    if budget < mn:
        raise InfeasibleBudgetError(budget, mn, "no chain schedule fits (ChainDP)")
    P = p.K + 1 if drop else 1
    cap = max(8, int(table_bytes // (8 * 2 * P * (p.K + 1) * (p.M + 1))) - 1)
    unit, s, g, exact = _units(p, budget, min(max_levels, cap), rounding)
    Lv = max(0, budget // unit - (0 if exact else int(slack_levels)))
    dp = _DP(_Tables(p, s, g), p.bwd_costs, drop, "cost", Lv)
    dp.fill()
    ops: list[tuple[str, int]] = []
    if np.isfinite(dp.F[0, 0, 0, 0, Lv]):
        dp.emit(-1, -1, 0, 0, Lv, ops)
        cost = float(dp.F[0, 0, 0, 0, Lv])
    else:  # rounding sizes up left nothing: the smallest-peak schedule fits the real budget
        mdp.emit(-1, -1, 0, 0, 0, ops)
        cost = _ops_cost(p, ops)
        exact = False
    return ChainSolution(
        cost=cost, ops=tuple(ops), min_budget=mn, budget=budget, unit=unit,
        exact=exact, solve_time_s=time.perf_counter() - t0,
    )


def _ops_cost(p: ChainProblem, ops) -> float:
    """Total compute cost of an op sequence (``("f", j)`` / ``("b", k)``)."""
    kinds = np.array([o[0] == "f" for o in ops], dtype=bool)
    idx = np.array([o[1] for o in ops], dtype=np.int64)
    return float(p.fwd_costs[idx[kinds]].sum() + p.bwd_costs[idx[~kinds]].sum())
