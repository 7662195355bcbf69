r"""Driver of the compiled persistent chain recursion (:mod:`solvers.chain_dp.kernel`, numba):
``mode="fast"`` by default.

:class:`CompiledDP` lays out the tables of the kernels, fills them and turns the cost table
into a schedule (:meth:`CompiledDP.emit`, which re-evaluates a state's options in ``float64``
and takes the first cheapest in the exact recursion's order: run, hold, split by ``j``).
:func:`solve_compiled` is ``solve_chain(mode="fast")`` when numba is importable; it returns the
filled DP with the solution so that a caller whose replayed peak exceeds the budget (sizes
rounded to the nearest level) can emit the plan of a lower level from the same table
(:func:`emit_at`) instead of solving again; :class:`policies.chain_dp.ChainDP` does so with
:func:`min_peak_dp` and :func:`cost_dp`.  Memory: ``4·(Lv + 1)·2·R`` bytes for ``R ≈ K·M/2``
live states (``K = M = 1000``, 256 levels: 1.0 GiB) plus ``2·K²`` bytes for ``Q`` and the
pruning bounds (``float64``, one per 64 states and level: 33 MB at that size).

Importing this module imports numba (:func:`solvers.chain_dp.compiled_available`).
"""

from __future__ import annotations

import mmap
import time

import numpy as np

from remat.core.errors import BudgetFormatError, SolverError
from solvers.chain_dp.emit import ScheduleEmitter
from solvers.chain_dp.kernel import BLK, fill_cost, fill_mem
from solvers.chain_dp.problem import (
    INF,
    ChainProblem,
    ChainSolution,
    Tables,
    byte_tables,
    check_count,
    check_min_budget,
    check_recursion,
    level_tables,
    ops_cost,
)


def _empty_f32(shape: tuple[int, ...]) -> np.ndarray:
    """Uninitialised ``float32`` array, its pages mapped up front (``MAP_POPULATE``) where the
    platform has it (16 MiB and more): a GiB-sized table then skips page faults one by one,
    several times faster to map and fill than ``np.empty`` or ``np.full``."""
    n = int(np.prod(shape)) * 4
    flags = getattr(mmap, "MAP_POPULATE", None)
    if n < 2**24 or flags is None:
        return np.empty(shape, dtype=np.float32)
    buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
    return np.frombuffer(buf, dtype=np.float32).reshape(shape)  # (keeps buf alive)


class CompiledDP(ScheduleEmitter):
    """Tables of the compiled kernels (:mod:`solvers.chain_dp.kernel`) for one size
    quantisation (``tb``, :class:`~solvers.chain_dp.problem.Tables`)."""

    def __init__(self, tb: Tables, bwd_costs: np.ndarray):
        self.tb, self.bc = tb, np.ascontiguousarray(bwd_costs, dtype=np.float64)
        K, M, e = tb.K, tb.M, tb.e
        # live anchors of backward node k: a = -1 .. amax[k] (e is non-increasing in a)
        live = e[None, :] >= np.arange(M)[:, None]  # [M, K + 1]
        n = live.sum(axis=1)
        if np.any(live != (np.arange(K + 1)[None, :] < n[:, None])):
            raise SolverError("ChainDP: live states do not form anchor prefixes (bug)")
        x = tb.hi_eff
        bad = (x >= 0) & (n[np.arange(M)] < np.maximum(x, 0) + 1)
        if np.any(bad):  # right parts (j, k), j < x, must be live
            raise SolverError("ChainDP: right parts outside the live states (bug)")
        self.roff = np.concatenate([[1], 1 + np.cumsum(n)]).astype(np.int64)  # [M + 1]
        self.n_rows = int(self.roff[-1])
        # j whose left part starts at backward node e(j) + 1 (CSR over k = 0 .. M)
        kk = tb.e[1:] + 1  # [K], for j = 0 .. K-1
        order = np.argsort(kk, kind="stable")
        self.jlist = np.arange(K, dtype=np.int64)[order]
        self.jstart = np.searchsorted(kk[order], np.arange(M + 2)).astype(np.int64)
        nq = np.maximum(K - np.arange(K + 1), 1)
        self.qoff = np.concatenate([[0], np.cumsum(nq)[:-1]]).astype(np.int64)
        self.nq = int(nq.sum())
        # SW[qoff[a + 1] + t - 1]: working memory of the sweep v_a -> v_{a+t} without v_a
        sw = np.zeros((K + 1, max(K, 1)), dtype=np.int64)
        sw[:, 0] = tb.s_ext[np.minimum(np.arange(K + 1) + 1, K)]
        for t in range(2, K + 1):
            sw[:, t - 1] = np.maximum(sw[:, t - 2], tb.pair[np.minimum(np.arange(-1, K) + t, K - 1)])
        self.SW = np.ascontiguousarray(sw[np.arange(max(K, 1))[None, :] < nq[:, None]])
        self.cs = np.concatenate([[0], np.cumsum(tb.s)]).astype(np.int64)
        self.pad = int(2 * tb.g.max(initial=0) + tb.s.max(initial=0))
        # cost of sweep a -> j (added to Q)
        self.Lv = -1
        self.T = None

    def row(self, a: int, k: int) -> int:
        tb = self.tb
        if k >= tb.M or k > tb.e[a + 1]:
            return 0
        return int(self.roff[k] + a + 1)

    def _args(self):
        tb = self
        t = self.tb
        return (t.K, t.M, t.s, t.g, t.s_ext, t.g_ext), (t.hi, t.lo, t.hi_eff, t.e, tb.roff,
                                                          tb.jstart, tb.jlist, tb.qoff, tb.SW)

    def fill_mem(self) -> None:
        (K, M, s, g, s_ext, g_ext), rest = self._args()
        T = np.full((2, self.n_rows), INF)
        T[:, 0] = 0.0
        Q = np.zeros(self.nq)
        fill_mem(K, M, s, g, s_ext, g_ext, *rest, T, Q)
        self.T, self.mode = T, "mem"

    def cost_inputs(self, Lv: int) -> tuple:
        """Arguments of :func:`solvers.chain_dp.kernel.fill_cost` for ``Lv`` levels (all but
        ``stats``), with fresh tables: ``T`` (``float32[Lv + 1, 2, n_rows]``, index 20), ``Q``
        (21), then the pruning tables ``boff, TB, QB0, QB, P, eps``."""
        t = self.tb
        T = _empty_f32((Lv + 1, 2, self.n_rows))
        T[...] = np.float32(INF)
        T[:, :, 0] = 0.0
        # Q entries whose left part is finished keep the sweep cost alone
        a = np.repeat(np.arange(-1, t.K), np.maximum(t.K - np.arange(t.K + 1), 1))
        tt = np.arange(self.nq) - self.qoff[a + 1] + 1
        j = np.minimum(a + tt, t.K - 1)
        Q = (t.cumc[j + 1] - t.cumc[a + 1]).astype(np.float32)
        # pruning tables (see solvers.chain_dp.kernel.fill_cost): block minima of T + P per
        # backward node's rows and of Q - P per anchor; QB0: the Q entries no level rewrites
        nseg = np.diff(self.roff)
        boff = np.concatenate([[0], np.cumsum(-(-nseg // BLK))]).astype(np.int64)  # [M + 1]
        TB = np.empty((Lv + 1, 2, max(int(boff[-1]), 1)))
        TB[...] = INF
        nbj = t.K // BLK + 2
        cb = np.concatenate([[0.0], np.cumsum(self.bc)])
        P = -cb[t.e + 1] + 2.0 * t.cumc  # P[j + 1], j = -1 .. K - 1 (cost units)
        eps = 1e-12 * (2 * np.abs(P).max() + t.cumc[-1] * (t.K + 1) + cb[-1] + 1.0)
        QB0 = np.full((t.K + 1) * nbj, INF)
        static = (t.e[j + 1] + 1 > np.minimum(t.e[a + 1], t.M - 1)) & (a + tt <= t.K - 1)
        np.minimum.at(QB0, ((a + 1) * nbj + (j + 1) // BLK)[static],
                      Q[static].astype(float) - P[j + 1][static])
        return (t.K, t.M, Lv, t.s, t.g, t.s_ext, t.g_ext, t.cumc, self.bc, t.hi, t.lo, t.hi_eff,
                t.e, self.roff, self.jstart, self.jlist, self.qoff, self.SW, self.cs, self.pad,
                T, Q, boff, TB, QB0, QB0.copy(), P, float(eps))

    def fill_cost(self, Lv: int) -> None:
        """Fill the cost table for ``Lv`` levels (``stats``: sums, bounds, pruned states)."""
        args = self.cost_inputs(Lv)
        self.stats = np.zeros((1, 4), dtype=np.int64)
        fill_cost(*args, self.stats)
        T = args[20]
        self.T, self.Lv, self.mode = T, Lv, "cost"

    def value(self, a: int, k: int, h: int, mlev: int = 0) -> float:
        r = self.row(a, k)
        if self.mode == "mem":
            return float(self.T[h, r])
        return INF if mlev < 0 else float(self.T[mlev, h, r])

    label = "ChainDP compiled path"

    def split_entries(self, a, k, h, js, kk, mlev, sa, cost):
        tb = self.tb
        kk = np.asarray(kk, dtype=np.int64)
        lrow = np.where((kk < tb.M) & (kk <= tb.e[a + 1]),
                        self.roff[np.minimum(kk, tb.M)] + a + 1, 0)  # row(a, k) for each k
        rrow = self.roff[k] + js + 1
        if cost:
            r = (self.T[mlev - sa, h, rrow].astype(float) if mlev >= sa
                 else np.full(len(js), INF))
            l0 = self.T[mlev, 0, lrow].astype(float)
            l1 = self.T[mlev, 1, lrow].astype(float)
        else:
            r, l0, l1 = self.T[h, rrow], self.T[0, lrow], self.T[1, lrow]
        keep = (kk < tb.M) & (kk <= tb.e[a + 1]) & (tb.hi_eff[np.minimum(kk, tb.M - 1)] == js)
        return r, l0, np.where(keep, l1, INF)


def emit_at(p: ChainProblem, dp: CompiledDP, mlev: int) -> tuple[float, tuple] | None:
    """Schedule of the filled cost table at memory level ``mlev`` (``None`` if none fits)."""
    if mlev < 0 or not np.isfinite(dp.value(-1, 0, 0, mlev)):
        return None
    ops: list[tuple[str, int]] = []
    dp.emit(-1, 0, 0, mlev, ops)
    return ops_cost(p, ops), tuple(ops)


def min_peak_dp(p: ChainProblem) -> CompiledDP:
    """The filled ``(min, max)`` table of ``p`` (exact sizes): ``value(-1, 0, 0)`` is the
    smallest budget of the persistent class (bytes), ``emit(-1, 0, 0, 0, ops)`` its schedule."""
    mdp = CompiledDP(byte_tables(p), p.bwd_costs)
    mdp.fill_mem()
    return mdp


def cost_dp(p: ChainProblem, budget: int, *, max_levels: int, table_bytes: int, rounding: str,
            slack_levels: int) -> tuple[CompiledDP, int, bool]:
    """The filled cost table for ``budget`` bytes with at most ``max_levels`` levels (fewer when
    the ``float32`` table would exceed ``table_bytes``): ``(dp, unit, exact)``, ``dp.Lv`` the top
    level (``budget // unit`` less ``slack_levels`` when sizes were rounded).

    Raises:
      BudgetFormatError: ``max_levels`` is not a positive integer or ``budget`` is negative.
    """
    check_count("max_levels", max_levels)
    if int(budget) < 0:
        raise BudgetFormatError(f"budget must be non-negative bytes, got {budget!r}")
    check_recursion(p.K)
    tb, unit, exact, Lv = level_tables(p, int(budget), max_levels, rounding, slack_levels)
    n_rows = 1 + int(np.clip(np.minimum(tb.e, tb.M - 1) + 1, 0, None).sum())  # CompiledDP's
    cap = max(8, int(table_bytes // (4 * 2 * n_rows)) - 1)
    if cap < max_levels:
        tb, unit, exact, Lv = level_tables(p, int(budget), cap, rounding, slack_levels)
    dp = CompiledDP(tb, p.bwd_costs)
    if dp.n_rows != n_rows:
        raise SolverError("ChainDP: table row count mismatch (bug)")
    dp.fill_cost(Lv)
    return dp, unit, bool(exact)


def solve_compiled(p: ChainProblem, budget: int, *, max_levels: int, table_bytes: int,
                   rounding: str, slack_levels: int) -> tuple[ChainSolution, CompiledDP]:
    """:func:`solvers.chain_dp.solve_chain` with ``mode="fast"`` on the compiled kernels (bytes,
    seconds); also returns the filled cost table."""
    t0 = time.perf_counter()
    budget = int(budget)
    mdp = min_peak_dp(p)
    mn = int(mdp.value(-1, 0, 0))
    check_min_budget(budget, mn)
    dp, unit, exact = cost_dp(p, budget, max_levels=max_levels, table_bytes=table_bytes,
                              rounding=rounding, slack_levels=slack_levels)
    got = emit_at(p, dp, dp.Lv)
    if got is None:  # rounding sizes up left nothing: the smallest-peak schedule fits
        ops: list[tuple[str, int]] = []
        mdp.emit(-1, 0, 0, 0, ops)
        got, exact = (ops_cost(p, ops), tuple(ops)), False
    sol = ChainSolution(cost=got[0], ops=got[1], min_budget=mn, budget=budget, unit=unit,
                        exact=bool(exact), solve_time_s=time.perf_counter() - t0)
    return sol, dp
