r"""Rotor's dynamic programme over a chain of blocks, one option per block (Rockmate's extension).

Beaumont et al. 2019 ("Optimal checkpointing for heterogeneous chains") solve a chain whose
stages either keep all their activations (``F_all``) or only their output (``F_ck``); Rockmate
(Zhao et al. 2023) replaces ``F_all`` by a choice among each block's options.  Here block
``l`` has forward cost ``cf_l``, output bytes ``wa_l``, forward transient ``tf_l`` and options
``o`` with kept bytes ``kept_{l,o}`` (``a_l`` included), backward cost ``cb_{l,o}`` (its
backward plus its recomputation) and backward transient ``tb_{l,o}``
(:mod:`solvers.hierarchical.options`).  ``Opt(s, t, m)`` is the least cost of running blocks
``s..t`` forward from the stored ``a_{s-1}`` and back to ``delta_{s-1}`` within ``m`` bytes
besides ``a_{s-1}`` and ``delta_t`` (held by the caller)::

    Opt(s, t, m) = min( min_o  cf_s + Opt(s+1, t, m - kept_{s,o}) + cb_{s,o}
                               [m >= kept_{s,o} + max(tf_s, tb_{s,o})],
                        min_{s < s' <= t}  sum_{k=s}^{s'-1} cf_k + Opt(s', t, m - wa_{s'-1})
                                           + Opt(s, s'-1, m - wa_{s'-1})
                               [m >= wa_{s'-1} + max_{s<=k<s'} tf_k] )

with ``Opt(t+1, t, m) = 0``; ``delta_{s'-1}`` is taken as ``wa_{s'-1}`` bytes.  Memory is
counted in ``levels`` units of ``ceil(m_max / levels)`` bytes, sizes rounded up (a plan the
table accepts fits its model); one fill answers every memory up to ``m_max``.  The fill is ``O(n^3 levels)`` for ``n`` blocks, compiled with
numba; the schedule is read back from the choice table as block operations.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import njit

from remat.core.errors import InfeasibleBudgetError

__all__ = ["BlockChainCosts", "BlockSchedule", "BlockTable", "fill_blocks", "schedule", "solve_blocks",
           "F_CK", "F_OPT", "BWD"]

F_CK, F_OPT, BWD = 0, 1, 2
INF = np.inf


@dataclasses.dataclass(frozen=True)
class BlockChainCosts:
    """The DP's input: per block ``l`` and option ``o`` (padded with ``nopt``)."""

    cf: np.ndarray  # float64[n]
    wa: np.ndarray  # int64[n]
    tf: np.ndarray  # int64[n]
    nopt: np.ndarray  # int64[n]
    kept: np.ndarray  # int64[n, O]
    cb: np.ndarray  # float64[n, O]
    tb: np.ndarray  # int64[n, O]


@dataclasses.dataclass(frozen=True)
class BlockSchedule:
    """``ops``: ``(kind, block, option)`` in execution order (``option`` -1 for ``F_CK``);
    ``cost``: the DP's cost; ``memory``: the budget (bytes) the table was filled for."""

    ops: tuple[tuple[int, int, int], ...]
    cost: float
    memory: int


@njit(cache=True)
def _fill(cf, wa, tf, nopt, kept, cb, tb, M):  # pragma: no cover - compiled
    n = cf.shape[0]
    cost = np.full((n, n, M + 1), np.inf)
    choice = np.zeros((n, n, M + 1), dtype=np.int32)
    for d in range(n):
        for s in range(n - d):
            t = s + d
            for m in range(M + 1):
                best = np.inf
                ch = 0
                for o in range(nopt[s]):
                    k = kept[s, o]
                    need = k + max(tf[s], tb[s, o])
                    if m < need:
                        continue
                    if d == 0:
                        c = cf[s] + cb[s, o]
                    else:
                        sub = cost[s + 1, t, m - k]
                        if sub == np.inf:
                            continue
                        c = cf[s] + sub + cb[s, o]
                    if c < best:
                        best = c
                        ch = -(o + 1)
                if d > 0:
                    fsum = 0.0
                    tmax = 0
                    for sp in range(s + 1, t + 1):
                        fsum += cf[sp - 1]
                        if tf[sp - 1] > tmax:
                            tmax = tf[sp - 1]
                        w = wa[sp - 1]
                        if m < w + tmax:
                            continue
                        a = cost[sp, t, m - w]
                        if a == np.inf:
                            continue
                        b = cost[s, sp - 1, m - w]
                        if b == np.inf:
                            continue
                        c = fsum + a + b
                        if c < best:
                            best = c
                            ch = sp
                cost[s, t, m] = best
                choice[s, t, m] = ch
    return cost, choice


def _units(x: np.ndarray, unit: int) -> np.ndarray:
    return -(-np.asarray(x, dtype=np.int64) // unit)


@dataclasses.dataclass(frozen=True, eq=False)
class BlockTable:
    """The filled DP: ``cost[s, t, m]`` / ``choice[s, t, m]`` for memories ``m * unit`` bytes."""

    cost: np.ndarray
    choice: np.ndarray
    unit: int
    kept: np.ndarray  # int64[n, O] kept bytes in units
    wa: np.ndarray  # int64[n] output bytes in units

    @property
    def min_memory(self) -> float:
        """The least memory (bytes) with a schedule, ``inf`` if none up to the table's top."""
        finite = np.flatnonzero(np.isfinite(self.cost[0, -1]))
        return float(finite[0] * self.unit) if len(finite) else math.inf


def fill_blocks(costs: BlockChainCosts, memory: int, *, levels: int = 256) -> BlockTable:
    """Fill the DP for every memory up to ``max(memory, a surely feasible memory)`` bytes in
    ``levels`` steps (fewer for long chains: the table holds ``n^2 levels`` entries)."""
    n = len(costs.cf)
    levels = int(max(8, min(levels, 2.5e7 // max(n * n, 1))))
    top = max(int(memory), _min_memory(costs), 1)
    unit = max(1, math.ceil(top / levels))
    kept = _units(costs.kept, unit)
    wa = _units(costs.wa, unit)
    cost, choice = _fill(np.asarray(costs.cf, np.float64), wa, _units(costs.tf, unit),
                         np.asarray(costs.nopt, np.int64), kept,
                         np.asarray(costs.cb, np.float64), _units(costs.tb, unit), levels)
    return BlockTable(cost, choice, unit, kept, wa)


def schedule(table: BlockTable, memory: int) -> BlockSchedule:
    """The cheapest schedule within ``memory`` bytes, read back from ``table``.

    Raises:
      InfeasibleBudgetError: no schedule fits (``min_feasible_bytes``: :attr:`BlockTable.min_memory`).
    """
    cost, choice, kept, wa = table.cost, table.choice, table.kept, table.wa
    n = cost.shape[0]
    M = min(int(memory) // table.unit, cost.shape[2] - 1)
    if M < 0 or not np.isfinite(cost[0, n - 1, M]):
        raise InfeasibleBudgetError(memory, table.min_memory, "the block DP's memory model")
    ops: list[tuple[int, int, int]] = []
    stack: list[tuple] = [(0, n - 1, M)]
    # iterative read-back of the recursion: an entry (s, t, m) or a pending backward op
    while stack:
        item = stack.pop()
        if len(item) == 4:  # (BWD, s, o, None)
            ops.append((BWD, item[1], item[2]))
            continue
        s, t, m = item
        if s > t:
            continue
        ch = int(choice[s, t, m])
        if ch < 0:
            o = -ch - 1
            ops.append((F_OPT, s, o))
            stack.append((BWD, s, o, None))
            stack.append((s + 1, t, m - int(kept[s, o])))
        else:
            sp = ch
            for k in range(s, sp):
                ops.append((F_CK, k, -1))
            w = int(wa[sp - 1])
            stack.append((s, sp - 1, m - w))
            stack.append((sp, t, m - w))
    return BlockSchedule(tuple(ops), float(cost[0, n - 1, M]), int(M * table.unit))


def solve_blocks(costs: BlockChainCosts, memory: int, *, levels: int = 256) -> BlockSchedule:
    """The cheapest schedule of the chain within ``memory`` bytes (one fill and its read-back).

    Raises:
      InfeasibleBudgetError: no schedule fits (``min_feasible_bytes``: the least memory with one).
    """
    return schedule(fill_blocks(costs, memory, levels=levels), memory)


def _min_memory(costs: BlockChainCosts) -> int:
    """A memory at which the DP surely has a schedule: every block kept with its smallest
    option plus the largest transient."""
    n = len(costs.cf)
    small = [int(costs.kept[b, :costs.nopt[b]].min()) for b in range(n)]
    tb = [int(costs.tb[b, :costs.nopt[b]].max()) for b in range(n)]
    return int(sum(small) + max(max(costs.tf), max(tb)))
