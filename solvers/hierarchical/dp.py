r"""Rotor's dynamic programme over a chain of blocks, one option per block (Rockmate's extension).

Beaumont et al. 2019 ("Optimal checkpointing for heterogeneous chains") solve a chain whose
stages either keep all their activations (``F_all``) or only their output (``F_ck``); Rockmate
(Zhao et al. 2023) replaces ``F_all`` by a choice among each block's options.  Here block
``l`` has forward cost ``cf_l``, output bytes ``a_l`` (``wa``; its cotangent ``delta_l`` is
taken as ``a_l`` bytes), forward transient ``tf_l`` (peak of its forward beyond its input,
keeping only ``a_l``) and options ``o`` (:mod:`solvers.hierarchical.options`) with kept bytes
``K_{l,o}`` (``a_l`` included), forward transient ``tk_{l,o}`` (keeping ``K_{l,o}``), backward
cost ``cb_{l,o}`` (its backward plus its recomputation) and backward transient ``tb_{l,o}``
(beyond what it holds: recomputed values, ``delta_l`` in, ``delta_{l-1}`` out); the backward
holds ``Kb_{l,o}`` of the kept bytes (``a_l`` only if it reads it) and ``a_{l-1}`` only if it
reads it (``i_{l,o} = 1``).

``Opt(s, t, m)`` is the least cost of running blocks ``s..t`` forward from the stored
``a_{s-1}`` and back from ``delta_t`` to ``delta_{s-1}`` with at most ``m`` bytes held at any
time, ``a_{s-1}`` and ``delta_t`` included (``a_{-1}``, the batch, counts 0)::

    Opt(s, t, m) = min( min_o  cf_s + cb_{s,o} + Opt(s+1, t, m - i_{s,o} a_{s-1} - K_{s,o} + a_s)
                               [m >= a_{s-1} + delta_t + tk_{s,o},
                                m >= i_{s,o} a_{s-1} + Kb_{s,o} + tb_{s,o}],
                        min_{s < s' <= t}  sum_{k=s}^{s'-1} cf_k + Opt(s', t, m - a_{s-1})
                                           + Opt(s, s'-1, m)
                               [m >= a_{s-1} + delta_t + max_{s<=k<s'} ([k>s] a_{k-1} + tf_k)] )

with ``Opt(t+1, t, m) = 0``, ``cf_s`` in the first line the cost of the nodes a run keeping
``K_{s,o}`` computes (``cr_{s,o}``; residual-only values it does not keep are left to the
backward), ``cf_k`` in the second those of a run keeping only ``a_k`` (``cc_k``), and
``cf_s`` replaced by the option's tail cost ``ct_{s,o}`` when ``s = t < n - 1`` (the last block of a recomputed segment: its output's cotangent is given, so
its re-run computes only what the backward keeps, :class:`~solvers.hierarchical.BlockOption`'s
``tail``; every ``Opt(s, t)`` with ``t < n - 1`` is a re-run): the first runs block ``s``
keeping ``K_{s,o}`` (and its input if its backward reads it), the
second runs blocks ``s..s'-1`` keeping only ``a_{s'-1}`` and runs them again for their
backward (recursive checkpointing).  Memory is counted in ``levels`` units of
``ceil(m_max / levels)`` bytes, sizes rounded up (a plan the table accepts fits its model); one
fill answers every memory up to ``m_max``.  The fill is ``O(n^3 levels)`` for ``n`` blocks,
compiled with numba; the schedule is read back from the choice table as block operations.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import njit

from remat.core.errors import InfeasibleBudgetError

__all__ = ["BlockChainCosts", "BlockSchedule", "BlockTable", "fill_blocks", "schedule", "solve_blocks",
           "F_CK", "F_OPT", "BWD", "F_TAIL"]

F_CK, F_OPT, BWD, F_TAIL = 0, 1, 2, 3
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
    tk: np.ndarray  # int64[n, O]
    kb: np.ndarray  # int64[n, O]
    kin: np.ndarray  # bool[n, O]
    tc: np.ndarray | None = None  # float64[n, O] tail costs (``cf`` when None)
    cr: np.ndarray | None = None  # float64[n, O] run costs keeping the option (``cf`` when None)
    cc: np.ndarray | None = None  # float64[n] run costs keeping only a_l (``cf`` when None)


@dataclasses.dataclass(frozen=True)
class BlockSchedule:
    """``ops``: ``(kind, block, option)`` in execution order (``option`` -1 for ``F_CK``;
    ``F_TAIL``: block run with the option for its backward, only the option's ``tail``);
    ``cost``: the DP's cost; ``memory``: the budget (bytes) the table was filled for;
    ``tree``: the recursion as nested items, ``(F_OPT, b, o)`` (block ``b`` run with option
    ``o``) or ``(F_CK, s, s', subtree)`` (blocks ``s..s'-1`` run keeping only ``a_{s'-1}``,
    then again as ``subtree`` for their backward), in forward order."""

    ops: tuple[tuple[int, int, int], ...]
    cost: float
    memory: int
    tree: tuple = ()


@njit(cache=True)
def _fill(cf, wa, tf, nopt, kept, cb, tb, tk, kb, kin, tc, cr, cc, M):  # pragma: no cover - compiled
    n = cf.shape[0]
    cost = np.full((n, n, M + 1), np.inf)
    choice = np.zeros((n, n, M + 1), dtype=np.int32)
    for d in range(n):
        for s in range(n - d):
            t = s + d
            ain = wa[s - 1] if s > 0 else 0
            dt = wa[t]
            for m in range(M + 1):
                best = np.inf
                ch = 0
                for o in range(nopt[s]):
                    k = kept[s, o]
                    hold = ain if kin[s, o] else 0
                    if m < ain + dt + tk[s, o] or m < hold + kb[s, o] + tb[s, o]:
                        continue
                    if d == 0:
                        c = (cr[s, o] if s == n - 1 else tc[s, o]) + cb[s, o]
                    else:
                        sub = cost[s + 1, t, m - hold - k + wa[s]]
                        if sub == np.inf:
                            continue
                        c = cr[s, o] + sub + cb[s, o]
                    if c < best:
                        best = c
                        ch = -(o + 1)
                if d > 0 and m >= ain:
                    fsum = 0.0
                    tmax = 0
                    for sp in range(s + 1, t + 1):
                        k = sp - 1
                        fsum += cc[k]
                        need = tf[k] + (wa[k - 1] if k > s else 0)
                        if need > tmax:
                            tmax = need
                        if m < ain + dt + tmax:
                            break
                        a = cost[sp, t, m - ain]
                        if a == np.inf:
                            continue
                        b = cost[s, sp - 1, m]
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
    kin: np.ndarray  # bool[n, O] the option's backward reads the block input

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
    cf = np.asarray(costs.cf, np.float64)
    per_option = np.broadcast_to(cf[:, None], costs.cb.shape)
    tc = per_option if costs.tc is None else costs.tc
    cr = per_option if costs.cr is None else costs.cr
    cc = cf if costs.cc is None else costs.cc
    cost, choice = _fill(np.asarray(costs.cf, np.float64), wa, _units(costs.tf, unit),
                         np.asarray(costs.nopt, np.int64), kept,
                         np.asarray(costs.cb, np.float64), _units(costs.tb, unit),
                         _units(costs.tk, unit), _units(costs.kb, unit),
                         np.asarray(costs.kin, np.bool_),
                         np.ascontiguousarray(tc, dtype=np.float64),
                         np.ascontiguousarray(cr, dtype=np.float64),
                         np.ascontiguousarray(cc, dtype=np.float64), levels)
    return BlockTable(cost, choice, unit, kept, wa, np.asarray(costs.kin, np.bool_))


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
        ain = int(wa[s - 1]) if s > 0 else 0
        if ch < 0:
            o = -ch - 1
            ops.append((F_TAIL if s == t < n - 1 else F_OPT, s, o))
            stack.append((BWD, s, o, None))
            hold = ain if table.kin[s, o] else 0
            stack.append((s + 1, t, m - hold - int(kept[s, o]) + int(wa[s])))
        else:
            sp = ch
            for k in range(s, sp):
                ops.append((F_CK, k, -1))
            stack.append((s, sp - 1, m))
            stack.append((sp, t, m - ain))
    return BlockSchedule(tuple(ops), float(cost[0, n - 1, M]), int(M * table.unit),
                         _tree(choice, kept, wa, table.kin, 0, n - 1, M))


def _tree(choice, kept, wa, kin, s: int, t: int, m: int) -> tuple:
    """The read-back of ``Opt(s, t, m)`` as nested items (see :class:`BlockSchedule`)."""
    items: list[tuple] = []
    while s <= t:
        ch = int(choice[s, t, m])
        ain = int(wa[s - 1]) if s > 0 else 0
        if ch < 0:
            o = -ch - 1
            items.append((F_OPT, s, o))
            m = m - (ain if kin[s, o] else 0) - int(kept[s, o]) + int(wa[s])
            s += 1
        else:
            items.append((F_CK, s, ch, _tree(choice, kept, wa, kin, s, ch - 1, m)))
            s, m = ch, m - ain
    return tuple(items)


def solve_blocks(costs: BlockChainCosts, memory: int, *, levels: int = 256) -> BlockSchedule:
    """The cheapest schedule of the chain within ``memory`` bytes (one fill and its read-back).

    Raises:
      InfeasibleBudgetError: no schedule fits (``min_feasible_bytes``: the least memory with one).
    """
    return schedule(fill_blocks(costs, memory, levels=levels), memory)


def _min_memory(costs: BlockChainCosts) -> int:
    """A memory at which the DP surely has a schedule: every block kept with its largest
    option plus the largest transient and two boundary values."""
    n = len(costs.cf)
    big = [int(costs.kept[b, :costs.nopt[b]].max()) for b in range(n)]
    tr = [max(int(costs.tb[b, :costs.nopt[b]].max()), int(costs.tk[b, :costs.nopt[b]].max()))
          for b in range(n)]
    return int(sum(big) + max(max(costs.tf), max(tr)) + 2 * int(np.max(costs.wa)))
