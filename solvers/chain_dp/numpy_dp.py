r"""The persistent chain recursion vectorised per diagonal (numpy, no jax): ``mode="fast"``
with ``max_first``, or when numba is missing.

Options 1-2 of :mod:`solvers.chain_dp.exact` (rotor's persistent class, Beaumont et al. 2019),
tabulated by :class:`NumpyDP` without a Python loop over states: a state's right parts and left
parts lie on strictly shorter diagonals ``d = hi_eff(k) - a``, so each diagonal is one numpy
batch ``[first checkpoints, states, levels]`` (``float32``).  The left part and the sweep cost
depend on ``(a, j)`` only and are cached once per pair, already shifted by ``s_a`` into the right
part's memory frame; the sweep's working memory is a precomputed ``K × K`` running max.  Same
``O(K²·M·Lv)``-element work as the exact recursion without drops (about ``K³·Lv/3`` elements for
``remat.chain_graph``) but no Python per state; equal to the exact mode without drops when no
size is rounded (``tests/test_chain_dp.py``).  ``max_first = C`` tries only the ``C/2`` nearest
and ``C/2`` geometrically spaced first checkpoints per state: ``O(K²·C·Lv)``, an explicit
approximation (``exact=False``); the minimum budget is then recomputed with every choice before
a budget is declared infeasible.

Levels: 256 by default (:func:`solvers.chain_dp.solve_chain`): with hundreds of held values a
coarser unit wastes memory, every size becoming at least one level
(``experiments/chain_dp_timing.py``); levels should exceed the number of values the budget
holds.  The tables take ``4·(Lv + 1)·~1.5·K·M`` bytes, capped by ``table_bytes`` (1 GiB by
default, which limits K = 1000 chains to ~176 levels).
"""

from __future__ import annotations

import time

import numpy as np

from solvers.chain_dp.emit import ScheduleEmitter
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


def solve_numpy(p: ChainProblem, budget: int, *, max_levels: int, table_bytes: int,
                rounding: str, slack_levels: int, max_first: int | None) -> ChainSolution:
    """:func:`solvers.chain_dp.solve_chain` with ``mode="fast"`` on numpy (see :class:`NumpyDP`;
    bytes, seconds): used with ``max_first`` or without numba."""
    t0 = time.perf_counter()
    budget = int(budget)
    tb = byte_tables(p)
    mdp = NumpyDP(tb, p.bwd_costs, "mem", max_first=max_first)
    mdp.fill()
    mn = int(mdp.value(-1, 0, 0))
    if budget < mn and max_first is not None:  # the restriction may have cut the minimum
        mdp = NumpyDP(tb, p.bwd_costs, "mem")
        mdp.fill()
        mn = int(mdp.value(-1, 0, 0))
    check_min_budget(budget, mn)
    # the float32 table: one row per live (anchor, backward) pair, 2 flags, Lv + 1 levels
    cap = max(8, int(table_bytes // (4 * (2 * mdp.n_rows + len(mdp.SW)))) - 1)
    tb, unit, exact, Lv = level_tables(p, budget, min(max_levels, cap), rounding, slack_levels)
    dp = NumpyDP(tb, p.bwd_costs, "cost", Lv, max_first=max_first)
    dp.fill()
    ops: list[tuple[str, int]] = []
    if np.isfinite(dp.value(-1, 0, 0, Lv)):
        dp.emit(-1, 0, 0, Lv, ops)
    else:  # rounding sizes up left nothing: the smallest-peak schedule fits the real budget
        mdp.emit(-1, 0, 0, 0, ops)
        exact = False
    cut = max_first is not None and p.K - 1 > max_first
    return ChainSolution(
        cost=ops_cost(p, ops), ops=tuple(ops), min_budget=mn, budget=budget, unit=unit,
        exact=bool(exact and not cut), solve_time_s=time.perf_counter() - t0,
    )


class NumpyDP(ScheduleEmitter):
    """The persistent recursion (options 1-2 of :mod:`solvers.chain_dp.exact`), one numpy batch
    per diagonal.

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

    def __init__(self, tb: Tables, bwd_costs: np.ndarray, mode: str, Lv: int = 0,
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
        """Vectorised ``Tables.keepable(a, k, j)``."""
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

    label = "ChainDP fast path"

    def split_entries(self, a, k, h, js, kk, mlev, sa, cost):
        lrow = self.sid[a + 1, kk]
        col = mlev if cost else 0
        rcol = mlev - sa if cost else 0
        r = self.T[self.sid[js + 1, k], h, max(rcol, 0)].astype(float)
        if rcol < 0:
            r[:] = INF
        l0 = self.T[lrow, 0, col].astype(float)
        l1 = np.where(self._keep(np.full(len(js), a), kk, js), self.T[lrow, 1, col], INF)
        return r, l0, l1
