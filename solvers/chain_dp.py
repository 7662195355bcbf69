r"""Optimal persistent checkpointing of heterogeneous chains (rotor-style dynamic programme).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous
chains: how to train deep neural networks with limited memory" (2019, rotor) solve chains with
a DP over (segment, memory).  This module re-derives that DP for *remat's* memory model (the
replay in ``remat/schedule.py``, equal to the Checkmate MILP's accounting): when a node runs,
memory = every output held + its own output; an output may be freed right after any reader.

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
options 1-2 only (rotor's persistent class), tabulated by :class:`_FastDP` without a Python loop
over states: a state's right parts and left parts lie on strictly shorter diagonals
``d = hi_eff(k) - a``, so each diagonal is one numpy batch ``[first checkpoints, states,
levels]`` (``float32``).  The left part and the sweep cost depend on ``(a, j)`` only and are
cached once per pair, already shifted by ``s_a`` into the right part's memory frame; the sweep's
working memory is a precomputed ``K × K`` running max.  Same ``O(K²·M·Lv)``-element work as
the exact recursion without drops (about ``K³·Lv/3`` elements for ``remat.chain_graph``, a few
ns each) but no Python per state: K = 200 in 1.4 s CPU at 253 levels, where the exact mode
took 43 s at 397 levels; equal to the exact mode without
drops when no size is rounded (``tests/test_chain_dp.py``).  ``max_first = C`` tries only the
``C/2`` nearest and ``C/2`` geometrically spaced first checkpoints per state: ``O(K²·C·Lv)``,
an explicit approximation (``exact=False``); the minimum budget is then recomputed with every
choice before a budget is declared infeasible.  Default 256 levels: with hundreds of held values
a coarser unit wastes memory (every size becomes at least one level), e.g. on a 500-layer
random chain at half the no-remat peak, 64 levels used 29 % of the budget (recompute overhead
1.277) against 80 % with 256 levels (1.142); ``experiments/chain_dp_timing.py``.  Levels
should exceed the number of values the budget holds; the tables take
``4·(Lv + 1)·~1.5·K·M`` bytes (capped by ``table_bytes``, 1 GiB by default, which limits
K = 1000 chains to ~176 levels).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from functools import reduce

import numpy as np

from remat.errors import InfeasibleBudgetError, InvalidGraphError, SolverError

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


def _use_fast(p: ChainProblem, mode: str) -> bool:
    if mode not in ("auto", "exact", "fast"):
        raise ValueError(f"mode must be 'auto', 'exact' or 'fast', got {mode!r}")
    return mode == "fast" or (mode == "auto" and p.K > AUTO_FAST_ABOVE)


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
        ``float32`` tables: :class:`_FastDP`) or ``"auto"`` (exact up to
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
        return _solve_fast(p, budget, max_levels=256 if max_levels is None else max_levels,
                           table_bytes=2**30 if table_bytes is None else table_bytes,
                           rounding=rounding,
                           slack_levels=slack_levels, max_first=max_first)
    max_levels = 4096 if max_levels is None else max_levels
    table_bytes = 2**28 if table_bytes is None else table_bytes
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
    kinds = np.array([o[0] == "f" for o in ops], dtype=bool)
    idx = np.array([o[1] for o in ops], dtype=np.int64)
    return float(p.fwd_costs[idx[kinds]].sum() + p.bwd_costs[idx[~kinds]].sum())


def _solve_fast(p: ChainProblem, budget: int, *, max_levels: int, table_bytes: int,
                rounding: str, slack_levels: int, max_first: int | None) -> ChainSolution:
    """:func:`solve_chain` with ``mode="fast"`` (see :class:`_FastDP`)."""
    t0 = time.perf_counter()
    budget = int(budget)
    _check_recursion(p.K)
    tb = _Tables(p, p.fwd_sizes, p.bwd_sizes)
    mdp = _FastDP(tb, p.bwd_costs, "mem", max_first=max_first)
    mdp.fill()
    mn = int(mdp.value(-1, 0, 0))
    if budget < mn and max_first is not None:  # the restriction may have cut the minimum
        mdp = _FastDP(tb, p.bwd_costs, "mem")
        mdp.fill()
        mn = int(mdp.value(-1, 0, 0))
    if budget < mn:
        raise InfeasibleBudgetError(budget, mn, "no chain schedule fits (ChainDP)")
    # the float32 table: one row per live (anchor, backward) pair, 2 flags, Lv + 1 levels
    cap = max(8, int(table_bytes // (4 * (2 * mdp.n_rows + len(mdp.SW)))) - 1)
    unit, s, g, exact = _units(p, budget, min(max_levels, cap), rounding)
    Lv = max(0, budget // unit - (0 if exact else int(slack_levels)))
    dp = _FastDP(_Tables(p, s, g), p.bwd_costs, "cost", Lv, max_first=max_first)
    dp.fill()
    ops: list[tuple[str, int]] = []
    if np.isfinite(dp.value(-1, 0, 0, Lv)):
        dp.emit(-1, 0, 0, Lv, ops)
    else:  # rounding sizes up left nothing: the smallest-peak schedule fits the real budget
        mdp.emit(-1, 0, 0, 0, ops)
        exact = False
    cut = max_first is not None and p.K - 1 > max_first
    return ChainSolution(
        cost=_ops_cost(p, ops), ops=tuple(ops), min_budget=mn, budget=budget, unit=unit,
        exact=bool(exact and not cut), solve_time_s=time.perf_counter() - t0,
    )


# ----------------------------------------------------------------------------------------------
# Fast path: the persistent recursion (options 1 and 2, no anchor drops), vectorised over
# batches of states.
# ----------------------------------------------------------------------------------------------


def _count_le(rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``out[s, i] = #{t: rows[s, t] <= q[s, i]}`` for rows sorted ascending: ``int[S, n]``."""
    S, n = rows.shape
    off = (np.arange(S) * (int(max(rows.max(initial=0), q.max(initial=0))) + 2))[:, None]
    keys = (rows + off).ravel()
    qq = np.clip(q, -1, None) + off
    return np.searchsorted(keys, qq.ravel(), side="right").reshape(q.shape) - np.arange(S)[:, None] * n


class _FastDP:
    """The persistent recursion (options 1-2 of the module docstring), one numpy batch per
    diagonal.

    State ``(a, k, h)`` with ``x = hi_eff[k]`` lies on diagonal ``d = max(x - a, 0)``.  Its
    right parts ``F(j, k, h)`` (``j > a``) and left parts ``F(a, e(j) + 1, ·)`` (``x' <= j < x``)
    lie on smaller diagonals; only the "run" option reads a state of the same diagonal,
    ``(a, k + 1)``, so a diagonal is split into ranks (larger ``k`` first among states with the
    same anchor).  Every batch evaluates all its states × first checkpoints ``j`` × memory levels
    at once.  Tables: ``T[row, h, 1 + m]`` (``float32``; column 0 is ``+inf`` so that shifting
    by ``s_a`` reads ``+inf`` below level 0), one row per live ``(a, k)`` (``k <= e(a)``), row 0
    = finished (cost 0).  ``Q[a + 1, j - a - 1, m]`` caches ``sweep cost(a, j) + min_h' F(a,
    e(j) + 1, h', m)`` (the left part does not depend on ``k`` or ``h``).

    In ``mode="mem"`` the entries are the least peak (bytes) instead (the ``(min, max)``
    recursion); no memory axis.

    Time: ``Σ_states (d - 1)·(Lv + 1)`` element operations (``min(d - 1, max_first)`` with a
    cut), about ``K³·Lv / 3`` for ``remat.chain_graph`` (both ``h``); memory ``O(K·M·Lv)``
    (4 bytes per entry; ``K = 500``, 256 levels: 0.26 GB for ``T`` and ``Q`` together).
    """

    def __init__(self, tb: _Tables, bwd_costs: np.ndarray, mode: str, Lv: int = 0,
                 max_first: int | None = None):
        self.tb, self.bc, self.mode, self.Lv = tb, np.asarray(bwd_costs, float), mode, Lv
        self.max_first = max_first
        K, M = tb.K, tb.M
        cost = mode == "cost"
        # live states: k <= e(a), k < M
        ek = np.minimum(tb.e, M - 1)  # [K + 1]
        cnt = np.maximum(ek + 1, 0)
        A = np.repeat(np.arange(K + 1), cnt)  # a + 1
        kk = np.concatenate([np.arange(c) for c in cnt]) if len(A) else np.zeros(0, np.int64)
        self.sid = np.zeros((K + 1, M + 1), dtype=np.int64)  # 0 = finished
        # rows numbered backward-node-major: the right parts (a + t, k) of a state are adjacent
        byk = np.lexsort((A, kk))
        self.sid[A[byk], kk[byk]] = np.arange(1, len(A) + 1)
        self.n_rows = len(A) + 1
        W = Lv + 1 if cost else 1
        self.dt = np.float32 if cost else np.float64
        self.T = np.full((self.n_rows, 2, W), INF, dtype=self.dt)
        if cost:
            self.T[0] = 0.0
        else:
            self.T[0, :, 0] = 0.0
        # per-(anchor, first checkpoint) tables, packed: entry qoff[a + 1] + t - 1 for
        # j = a + t, t = 1 .. K - 1 - a
        KQ = max(K, 1)
        nq = np.maximum(K - np.arange(K + 1), 1)
        self.qoff = np.concatenate([[0], np.cumsum(nq)[:-1]])
        self.Q = np.full((int(nq.sum()), W), INF, dtype=self.dt) if cost else None
        self.Qm = np.full(int(nq.sum()), INF) if not cost else None
        # SW[qoff[a + 1] + t - 1]: working memory of the sweep v_a -> v_{a+t} without v_a
        # (max(s_{a+1}, s_{i-1} + s_i for a+1 < i <= a+t)), in memory units
        sw = np.zeros((K + 1, KQ), dtype=np.int64)
        sw[:, 0] = tb.s_ext[np.minimum(np.arange(K + 1) + 1, K)]
        for t in range(2, K + 1):
            sw[:, t - 1] = np.maximum(sw[:, t - 2], tb.pair[np.minimum(np.arange(-1, K) + t, K - 1)])
        self.SW = sw[np.arange(KQ)[None, :] < nq[:, None]]
        self._offs: dict[int, np.ndarray] = {}
        # store-all bound: state (a, k, h) fits every value v_{a+1} .. v_x at once in
        # base + cs[x + 1] - cs[a + 1] + pad levels (pad: two gradients and a sweep step)
        self.cs = np.concatenate([[0], np.cumsum(tb.s)])
        self.pad = int(2 * tb.g.max(initial=0) + tb.s.max(initial=0))
        x = tb.hi_eff[kk]
        d = np.maximum(x - (A - 1), 0)
        # rank among states with the same anchor and diagonal, larger k first
        order = np.lexsort((-kk, d, A))
        Ao, do = A[order], d[order]
        newgrp = np.ones(len(order), dtype=bool)
        newgrp[1:] = (Ao[1:] != Ao[:-1]) | (do[1:] != do[:-1])
        start = np.maximum.accumulate(np.where(newgrp, np.arange(len(order)), 0))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order)) - start
        self.A, self.kk, self.x, self.d, self.rank = A, kk, x, d, rank
        # per-(a, j) tables for splits: j = a + t, t = 1 .. K - 1 - a
        self.m = np.arange(Lv + 1)

    # -- helpers ---------------------------------------------------------------------------
    def _keep(self, a, k, j):
        """Vectorised ``_Tables.keepable(a, k, j)``."""
        tb = self.tb
        kc = np.minimum(k, tb.M - 1)
        return (k < tb.M) & (k <= tb.e[a + 1]) & (j > a) & (tb.hi_eff[kc] == j)

    def _cont(self, a, k, xkeep):
        """``min_h' F(a, k, h')`` with ``h' = 1`` allowed when ``v_xkeep`` may be carried:
        ``[S, W]`` (cost) or ``[S]`` (mem)."""
        rows = self.sid[a + 1, k]
        v0 = self.T[rows, 0]
        keep = self._keep(a, k, xkeep)
        if keep.any():
            v1 = self.T[rows, 1]
            v0 = np.where(keep[:, None], np.minimum(v0, v1), v0)
        return v0 if self.mode == "cost" else v0[:, 0]

    def _offsets(self, d: int) -> np.ndarray:
        """First-checkpoint offsets ``t = j - a`` tried on diagonal ``d``: all of ``1 .. d-1``,
        or with ``max_first = C`` and ``d - 1 > C``: ``1 .. C/2`` and ``C/2`` geometrically
        spaced offsets up to ``d - 1`` (an approximation)."""
        if d in self._offs:
            return self._offs[d]
        C = self.max_first
        if C is None or d - 1 <= C:
            out = np.arange(1, d)
        else:
            h = max(C // 2, 1)
            geo = np.unique(np.rint(np.geomspace(h + 1, d - 1, C - h)).astype(np.int64))
            out = np.concatenate([np.arange(1, h + 1), geo[geo > h]])
        self._offs[d] = out
        return out

    def _fill_q(self, a, t):
        """``Q[a + 1, t - 1]`` for anchors ``a`` and offsets ``t`` (``j = a + t``)."""
        tb = self.tb
        j = a + t
        kk = tb.e[j + 1] + 1
        left = self._cont(a, kk, j)
        if self.mode == "cost":
            # stored in the right part's frame m' = m - s_a (levels above Lv: +inf)
            c = (tb.cumc[j + 1] - tb.cumc[a + 1]).astype(self.dt)
            sa = tb.s_ext[a + 1]
            col = self.m[None, :] + sa[:, None]
            v = np.take_along_axis(left, np.minimum(col, self.Lv), axis=1) + c[:, None]
            v[col > self.Lv] = INF
            self.Q[self.qoff[a + 1] + t - 1] = v
        else:
            self.Qm[self.qoff[a + 1] + t - 1] = left

    def fill(self) -> None:
        tb = self.tb
        K = tb.K
        keys = self.d * (K + 2) + self.rank
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        bounds = np.flatnonzero(np.diff(ks)) + 1
        groups = np.split(order, bounds)
        dmax_done = 0
        for grp in groups:
            d = int(self.d[grp[0]])
            while dmax_done < d - 1:  # every state of diagonals <= dmax_done + 1 is final
                dmax_done += 1
                a = np.arange(-1, K - dmax_done)
                if len(a):
                    self._fill_q(a, np.full(len(a), dmax_done))
            a, k, x = self.A[grp] - 1, self.kk[grp], self.x[grp]
            rows = self.sid[a + 1, k]
            for h in (1, 0):
                self._batch(a, k, x, d, h, rows)
        # (Q of the largest diagonal is never needed)

    def _batch(self, a, k, x, d, h, rows) -> None:
        tb, cost, T = self.tb, self.mode == "cost", self.T
        if h:
            ok = (x >= 0) & (x > a)
            if not ok.any():
                return
            a, k, x, rows = a[ok], k[ok], x[ok], rows[ok]
        S = len(a)
        sa = tb.s_ext[a + 1]
        base = sa + tb.g_ext[k] + (tb.s[np.maximum(x, 0)] if h else 0)
        lo, hi = tb.lo[k], tb.hi[k]
        def held(v):
            return (v == a) | ((v == x) if h else False)

        run_ok = (hi < 0) | (held(lo) & held(hi))
        if cost:
            best = np.full((S, self.Lv + 1), INF, dtype=self.dt)
        else:
            best = np.full(S, INF)
        m = self.m
        if run_ok.any():
            i = np.flatnonzero(run_ok)
            kn = k[i] + 1
            xk = x[i] if h else np.full(len(i), -2)
            cont = self._cont(a[i], kn, xk)
            need = base[i] + tb.g[k[i]]
            if cost:
                v = cont + self.bc[k[i]].astype(self.dt)[:, None]
                v[m[None, :] < need[:, None]] = INF
                best[i] = np.minimum(best[i], v)
            else:
                best[i] = np.minimum(best[i], np.maximum(cont, need))
        if d >= 1 and not run_ok.all():
            if not h:  # hold: sweep to v_x and keep it
                c = tb.cumc[x + 1] - tb.cumc[a + 1]
                hold = T[rows, 1]
                need = base + self.SW[self.qoff[a + 1] + d - 1]
                need = np.where(run_ok, INF, need)
                if cost:
                    v = hold + c.astype(self.dt)[:, None]
                    v[m[None, :] < need[:, None]] = INF
                    best = np.minimum(best, v)
                else:
                    best = np.minimum(best, np.maximum(hold[:, 0], need))
            if d >= 2:
                tt = self._offsets(d)  # first checkpoints j = a + tt
                rr = self.sid.ravel()[(a[None, :] + tt[:, None] + 1) * (tb.M + 1) + k[None, :]]
                qi = self.qoff[a + 1][None, :] + (tt - 1)[:, None]  # [nj, S]
                # the sweep a -> j fits iff m' = m - s_a >= base - s_a + SW(a, j)
                thr = self.SW[qi] + (base - sa)[None, :]
                if cost:
                    # layout [nj, S, U] (min over axis 0 is the fast one); frame m' = m - s_a.
                    # Levels >= U: every state of the batch can store all its values there, so
                    # F is constant (the cost of running every node once) from U - 1 on
                    U = int(min(self.Lv + 1, (base + self.cs[x + 1] - self.cs[a + 1]).max()
                                + self.pad + 1))
                    if U == T.shape[2]:
                        v = np.take(T.reshape(-1, U), rr * 2 + h, axis=0)
                        v += np.take(self.Q, qi, axis=0)
                    else:  # (np.take would copy the whole strided view)
                        v = T.reshape(-1, T.shape[2])[rr * 2 + h, :U]
                        v += self.Q[qi, :U]
                    # thresholds are a few values' sizes: mask only the first columns
                    tmax = int(min(thr.max(initial=0), U))
                    if tmax > 0:
                        v[:, :, :tmax][thr[:, :, None] > m[None, None, :tmax]] = INF
                    got = v.min(axis=0)  # [S, U] in frame m'
                    col = m[None, :] - sa[:, None]
                    got = np.take_along_axis(got, np.clip(col, 0, U - 1), axis=1)
                    got[(col < 0) | run_ok[:, None]] = INF
                    best = np.minimum(best, got)
                else:
                    r = T[rr, h, 0]
                    q = self.Qm[qi]
                    v = np.maximum(np.maximum(r, q - sa[None, :]), thr).min(axis=0) + sa
                    best = np.minimum(best, np.where(run_ok, INF, v))
        if cost:
            T[rows, h] = best
        else:
            T[rows, h, 0] = best

    def value(self, a: int, k: int, h: int, mlev: int = 0) -> float:
        row = self.sid[a + 1, k]
        return float(self.T[row, h, mlev] if self.mode == "cost" else self.T[row, h, 0])

    def emit(self, a: int, k: int, h: int, mlev: int, ops: list) -> None:
        """Append the schedule of state ``(a, k, h)`` at memory level ``mlev`` (cost mode) or
        of least peak (mem mode) to ``ops``; re-evaluates the state's options in float64."""
        tb, cost = self.tb, self.mode == "cost"

        def val(a_, k_, h_, lev):
            if cost and lev < 0:
                return INF
            return self.value(a_, k_, h_, lev)

        while k < tb.M and k <= tb.e[a + 1]:
            x = int(tb.hi_eff[k])
            base = int(tb.s_ext[a + 1] + tb.g_ext[k] + (tb.s[x] if h else 0))
            held = {a} | ({x} if h else set())
            sa = int(tb.s_ext[a + 1])
            cands = []  # (value, kind, data)
            if set(tb.need(k)) <= held:
                need = base + int(tb.g[k])
                for hp in [0] + ([1] if h and tb.keepable(a, k + 1, x) else []):
                    c = val(a, k + 1, hp, mlev)
                    v = (self.bc[k] + c if need <= mlev else INF) if cost else max(need, c)
                    cands.append((v, "run", hp))
            else:
                sw = base + tb.sweep_mem(a, x)
                if not h:
                    c = val(a, k, 1, mlev)
                    v = ((tb.cumc[x + 1] - tb.cumc[a + 1] + c) if sw[-1] <= mlev else INF) \
                        if cost else max(int(sw[-1]), c)
                    cands.append((v, "hold", x))
                if x - a >= 2:  # every first checkpoint j (a superset of max_first's)
                    js = np.arange(a + 1, x)
                    kk = tb.e[js + 1] + 1
                    lrow = self.sid[a + 1, kk]
                    col = mlev if cost else 0
                    rcol = mlev - sa if cost else 0
                    r = self.T[self.sid[js + 1, k], h, max(rcol, 0)].astype(float)
                    if rcol < 0:
                        r[:] = INF
                    l0 = self.T[lrow, 0, col].astype(float)
                    l1 = np.where(self._keep(np.full(len(js), a), kk, js),
                                  self.T[lrow, 1, col], INF)
                    lft = np.minimum(l0, l1)
                    swj = sw[: len(js)]
                    if cost:
                        v = np.where(swj <= mlev, tb.cumc[js + 1] - tb.cumc[a + 1] + r + lft, INF)
                    else:
                        v = np.maximum(np.maximum(swj, r + sa), lft)
                    i = int(np.argmin(v))
                    cands.append((float(v[i]), "split", (int(js[i]), int(l1[i] < l0[i]))))
            v, kind, dat = min(cands, key=lambda c: c[0])
            if not np.isfinite(v):
                raise SolverError("ChainDP fast path: no schedule at this memory level (bug)")
            if kind == "run":
                ops.append(("b", k))
                k, h = k + 1, dat
            elif kind == "hold":
                ops.extend(("f", i) for i in range(a + 1, x + 1))
                h = 1
            else:
                j, hp = dat
                ops.extend(("f", i) for i in range(a + 1, j + 1))
                self.emit(j, k, h, mlev - sa if cost else 0, ops)
                k, h = int(tb.e[j + 1]) + 1, hp
