r"""The exact chain recursion with anchor drops (``solve_chain(mode="exact")``) and the
``(min, max)`` recursion behind :func:`min_feasible_budget` (numpy, no jax).

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous
chains: how to train deep neural networks with limited memory" (2019, rotor) solve chains with
a DP over (segment, memory).  This module re-derives that DP for remat's memory model (the
problem and its notation: :mod:`solvers.chain_dp.problem`).

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

Complexity: ``O(K·M)`` states (``O(K²·M)`` with anchor dropping) × 2, each evaluating ``O(K)``
first checkpoints (and every parent ``p``) at once over the ``Lv + 1`` memory levels with
numpy: ``O(K²·M·Lv)`` time (``O(K³·M·Lv)`` with dropping, which ``drop_anchors="auto"``
enables up to K = 32), with a Python loop over states.  Memory is counted in units of the
``gcd`` of the sizes (exact) unless the budget needs more than ``max_levels`` units; then sizes
are rounded *up* to ``ceil(budget / max_levels)`` (:func:`solvers.chain_dp.problem.units`: the
plan fits the real budget, the cost may exceed the optimum; ``exact=False``), and
:class:`policies.chain_dp.ChainDP` also tries nearest rounding with a few levels held back,
keeping it when the replayed peak fits.  The smallest feasible budget comes from the same
recursion with ``(min, max)`` in place of ``(min, +)``: exact, no discretisation.
"""

from __future__ import annotations

import time
from functools import reduce

import numpy as np

from solvers.chain_dp.problem import (
    INF,
    ChainProblem,
    ChainSolution,
    Tables,
    byte_tables,
    check_min_budget,
    level_tables,
    ops_cost,
)


class _DP:
    """The recursion of the module docstring, tabulated.

    ``F[q, a + 1, k, h]`` holds the state ``(p, a, k, h)`` where ``q = p + 1`` is the nearest
    *resident* anchor below ``a`` (only with anchor dropping; else ``q = 0``).  In
    ``mode="cost"`` each entry is a ``float64[Lv + 1]`` array over memory levels; in
    ``mode="mem"`` a scalar: the least peak (bytes) of the sub-schedule.  Each state's options
    are evaluated for every parent ``p`` and every first checkpoint ``j`` at once.
    """

    def __init__(self, tb: Tables, bwd_costs: np.ndarray, drop: bool, mode: str, Lv: int = 0):
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


def use_drop(p: ChainProblem, drop: bool | str) -> bool:
    """Whether the exact recursion allows anchor drops (``"auto"``: chains of at most 32
    forward values, as dropping costs a factor K)."""
    if drop == "auto":
        return p.K <= 32
    return bool(drop)


def min_mem_dp(p: ChainProblem, drop: bool) -> _DP:
    """The filled ``(min, max)`` table of ``p`` (exact sizes, bytes): ``F[0, 0, 0, 0]`` is the
    smallest budget of the DP's class."""
    dp = _DP(byte_tables(p), p.bwd_costs, drop, "mem")
    dp.fill()
    return dp


def min_feasible_budget(p: ChainProblem, *, drop_anchors: bool | str = "auto") -> int:
    """Smallest budget (bytes) for which a schedule of the DP's class exists ((min, max) DP)."""
    return int(min_mem_dp(p, use_drop(p, drop_anchors)).F[0, 0, 0, 0])


def solve_exact(p: ChainProblem, budget: int, *, max_levels: int, table_bytes: int,
                drop_anchors: bool | str, rounding: str, slack_levels: int) -> ChainSolution:
    """:func:`solvers.chain_dp.solve_chain` with ``mode="exact"`` (see :class:`_DP`; bytes,
    seconds): the ``float64`` cost table is capped at ``table_bytes``."""
    t0 = time.perf_counter()
    budget = int(budget)
    drop = use_drop(p, drop_anchors)
    mdp = min_mem_dp(p, drop)
    mn = int(mdp.F[0, 0, 0, 0])
    check_min_budget(budget, mn)
    P = p.K + 1 if drop else 1
    cap = max(8, int(table_bytes // (8 * 2 * P * (p.K + 1) * (p.M + 1))) - 1)
    tb, unit, exact, Lv = level_tables(p, budget, min(max_levels, cap), rounding, slack_levels)
    dp = _DP(tb, p.bwd_costs, drop, "cost", Lv)
    dp.fill()
    ops: list[tuple[str, int]] = []
    if np.isfinite(dp.F[0, 0, 0, 0, Lv]):
        dp.emit(-1, -1, 0, 0, Lv, ops)
        cost = float(dp.F[0, 0, 0, 0, Lv])
    else:  # rounding sizes up left nothing: the smallest-peak schedule fits the real budget
        mdp.emit(-1, -1, 0, 0, 0, ops)
        cost = ops_cost(p, ops)
        exact = False
    return ChainSolution(
        cost=cost, ops=tuple(ops), min_budget=mn, budget=budget, unit=unit,
        exact=exact, solve_time_s=time.perf_counter() - t0,
    )
