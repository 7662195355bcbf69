r"""Peak shaving: bring a fixed-order schedule under a memory budget by inserting single
recomputations where they lower the peak, the cheapest first among equals.

Schedule form (Checkmate's frontier form): step ``t`` of ``n`` ends with node ``t``'s first
computation and may first recompute earlier nodes; a step runs its nodes in index order.  Each
computation creates a *copy* of its output that lives from its computation to the last read
served by it (a read takes the latest copy computed before it); the bytes at a computation
are those of every copy alive then, the new output included (remat's replay of
:func:`policies.from_checkpoints.plan_from_steps`, checked in the tests).

Start: every node once (no recomputation).  While the peak is over the budget, take the first
computation ``p`` where it occurs and every copy of a value ``u`` that is alive across ``p``
without being read there; the move for ``u`` ends that copy at its last read before ``p`` and
recomputes ``u`` in the step of its first read after ``p`` (its inputs are then read there
too, which can extend their copies).  Moves are tried in the order of an estimate of the peak
they leave (the copy's bytes removed over the gap, the inputs' extensions added), then by
compute cost; the first that lowers the peak, or keeps it and lowers the number of
computations at it, is applied (an exact rebuild decides).  The search stops when the
schedule fits, when no move helps (``"stuck"``: a local optimum of this neighbourhood, not a
bound), or at the time limit.  A fitting schedule is then pruned: recomputations are removed,
the most expensive first, while the peak stays within the budget.

Cascades come from repetition: a recomputation whose inputs' extensions cost memory is itself
a copy that a later move may split again.

Measured on the published random layered DAGs (in a greedy low-peak order from
:func:`solvers.order_search.greedy_order`):
``docs/design/decisions/0009-peak-shaving-and-low-peak-orders.md``.

This module does not import jax.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from remat.core.errors import BudgetFormatError, InvalidGraphError, RematError

__all__ = ["ShaveResult", "shave_peak"]


@dataclasses.dataclass(frozen=True)
class ShaveResult:
    """Outcome of :func:`shave_peak`.

    Attributes:
      steps: ``steps[t]`` the nodes computed in step ``t`` (index order, ends with ``t``).
      peak_bytes: peak of the schedule (replay semantics), bytes.
      cost: total compute of the schedule (sum of ``costs`` over every computation).
      status: ``"fits"`` (peak within the budget), ``"stuck"`` (no move lowers the peak) or
        ``"time_limit"``.
      moves: recomputations inserted (before pruning).
      pruned: recomputations removed again after the schedule fitted.
      seconds: wall time.
    """

    steps: list[list[int]]
    peak_bytes: int
    cost: float
    status: str
    moves: int
    pruned: int
    seconds: float


class _Schedule:
    """Computation steps of each node and the memory profile they give."""

    def __init__(self, sizes: np.ndarray, edges: np.ndarray, n: int):
        self.n, self.s = n, sizes
        e = edges
        self.pred_off = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(e[:, 1], minlength=n), out=self.pred_off[1:])
        self.pred_src = e[np.argsort(e[:, 1], kind="stable"), 0]
        self.indeg = np.diff(self.pred_off)
        self.comp: list[list[int]] = [[t] for t in range(n)]

    def preds(self, v: int) -> np.ndarray:
        return self.pred_src[self.pred_off[v]:self.pred_off[v + 1]]

    def rebuild(self) -> int:
        """Events, copies and the profile of the current schedule; returns the peak."""
        n = self.n
        cnt = np.array([len(c) for c in self.comp], np.int64)
        node = np.repeat(np.arange(n, dtype=np.int64), cnt)
        step = np.fromiter((t for c in self.comp for t in c), np.int64, int(cnt.sum()))
        key = step * n + node  # event order: step, then index
        M = int(key.max()) + 1
        ck = node * M + key  # computations sorted by (node, key): comp lists are sorted
        # reads: each computation of w reads every input of w
        deg = self.indeg[node]
        r_ev = np.repeat(np.arange(len(key)), deg)
        first = np.repeat(self.pred_off[node], deg)
        r_src = self.pred_src[first + np.arange(len(r_ev)) - np.repeat(np.cumsum(deg) - deg, deg)]
        r_key = key[r_ev]
        copy = np.searchsorted(ck, r_src * M + r_key, side="right") - 1
        if len(copy) and ((copy < 0).any() or (node[copy] != r_src).any()):
            raise InvalidGraphError("a node reads an input that is not computed before it")
        end = key.copy()
        np.maximum.at(end, copy, r_key)
        order = np.argsort(key, kind="stable")
        K = key[order]
        st = np.searchsorted(K, key)
        en = np.searchsorted(K, end)
        d = np.zeros(len(K) + 1, np.int64)
        np.add.at(d, st, self.s[node])
        np.add.at(d, en + 1, -self.s[node])
        self.K, self.mem = K, np.cumsum(d)[:-1]
        self.c_node, self.c_key, self.c_end = node, key, end
        self.r_copy, self.r_key = copy, r_key
        self.peak = int(self.mem.max(initial=0))
        return self.peak

    def at_peak(self) -> int:
        return int((self.mem >= self.peak).sum())

    def moves(self) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
        """``(estimated peak, -bytes removed, node, step, also)`` of every move at the first
        peak; ``also``: inputs recomputed in the same step instead of extending their copies
        (the cascade variant, one level deep)."""
        K, mem, n = self.K, self.mem, self.n
        p = int(K[int(np.argmax(mem))])
        live = np.flatnonzero((self.c_key < p) & (self.c_end > p))
        out = []
        for c in live.tolist():
            u = int(self.c_node[c])
            rk = np.sort(self.r_key[self.r_copy == c])
            if len(rk) and (rk == p).any():
                continue
            j = int(np.searchsorted(rk, p, side="right"))
            if j >= len(rk):
                continue
            ts = int(rk[j]) // n
            tau = ts * n + u
            if tau <= p:
                continue
            lb = int(rk[j - 1]) if j > 0 else int(self.c_key[c])
            lo, hi = int(np.searchsorted(K, lb, side="right")), int(np.searchsorted(K, tau))
            m = mem.copy()
            m[lo:hi] -= self.s[u]
            base = int(m.max(initial=0))
            ext = []
            for q in self.preds(u).tolist():  # inputs read at tau: extend their copies
                cq = self._copy_at(q, tau)
                if self.c_end[cq] < tau:
                    m[int(np.searchsorted(K, self.c_end[cq], side="right")):hi] += self.s[q]
                    ext.append(q)
            out.append((int(m.max(initial=0)), -int(self.s[u]), u, ts, ()))
            if ext:
                out.append((base, -int(self.s[u]), u, ts, tuple(ext)))
        out.sort()
        return out

    def _copy_at(self, q: int, key: int) -> int:
        idx = np.flatnonzero((self.c_node == q) & (self.c_key < key))
        return int(idx[np.argmax(self.c_key[idx])])


def shave_peak(
    sizes: Sequence[int],
    costs: Sequence[float],
    edges: np.ndarray,
    budget: int,
    *,
    time_limit: float = 30.0,
    max_moves: int | None = None,
) -> ShaveResult:
    """Insert recomputations into the one-pass schedule of a DAG until it fits ``budget``.

    Args:
      sizes: ``int64[n]`` output bytes per node; nodes are in topological (index) order.
      costs: ``float[n]`` compute per run of each node (any unit; summed into ``cost``).
      edges: ``int[m, 2]`` data edges ``(src, dst)`` with ``src < dst``.
      budget: bytes.
      time_limit: seconds for the search (pruning included).
      max_moves: most recomputations to insert (default ``4 n``).

    Returns:
      A :class:`ShaveResult`; when ``status != "fits"`` its schedule is the lowest-peak one the
      search reached (over the budget).

    Raises:
      InvalidGraphError: an edge is not ``src < dst`` within ``0..n-1``, or lengths differ.
      BudgetFormatError: a negative or fractional budget.
      RematError: ``time_limit <= 0`` or a negative ``max_moves``.
    """
    t0 = time.perf_counter()
    s = np.asarray(sizes, dtype=np.int64)
    c = np.asarray(costs, dtype=np.float64)
    n = len(s)
    if len(c) != n:
        raise InvalidGraphError(f"{len(c)} costs for {n} nodes")
    e = np.unique(np.asarray(edges, dtype=np.int64).reshape(-1, 2), axis=0)
    if len(e) and (e.min() < 0 or e.max() >= n or (e[:, 0] >= e[:, 1]).any()):
        raise InvalidGraphError("edges must be (src, dst) with 0 <= src < dst < n "
                                "(nodes in topological index order)")
    if int(budget) != budget or budget < 0:
        raise BudgetFormatError(f"budget must be a non-negative number of bytes, got {budget!r}")
    if not time_limit > 0 or (max_moves is not None and max_moves < 0):
        raise RematError(f"shave_peak needs time_limit > 0 and max_moves >= 0, got {time_limit}, "
                         f"{max_moves}")
    budget = int(budget)
    max_moves = 4 * n if max_moves is None else int(max_moves)
    if n == 0:
        return ShaveResult([], 0, 0.0, "fits", 0, 0, time.perf_counter() - t0)
    deadline = t0 + time_limit
    best = None
    for cascade in (False, True):  # plain moves first; the cascade variant when time is left
        if best is not None and time.perf_counter() > deadline:
            break
        r = _search(s, c, e, n, budget, cascade, deadline, max_moves)
        if best is None or _better(r, best):
            best = r
    return dataclasses.replace(best, seconds=time.perf_counter() - t0)


def _better(a: ShaveResult, b: ShaveResult) -> bool:
    """Fitting beats not fitting; then the lower cost (fitting) or the lower peak."""
    fa, fb = a.status == "fits", b.status == "fits"
    if fa != fb:
        return fa
    return a.cost < b.cost if fa else a.peak_bytes < b.peak_bytes


def _search(s: np.ndarray, c: np.ndarray, e: np.ndarray, n: int, budget: int, cascade: bool,
            deadline: float, max_moves: int) -> ShaveResult:
    """One peak-shaving run (see the module docstring); ``cascade`` adds the moves that
    recompute the extended inputs too."""
    sch = _Schedule(s, e, n)
    peak = sch.rebuild()
    moves, tabu, status = 0, set(), "fits"
    while peak > budget:
        if moves >= max_moves or time.perf_counter() > deadline:
            status = "time_limit"
            break
        before = sch.at_peak()
        applied = False
        for _, _, u, ts, also in sch.moves():
            if also and not cascade:
                continue
            add = [v for v in (u, *also) if ts not in sch.comp[v]]
            if (u, ts, also) in tabu or u not in add:
                continue
            for v in add:
                bisect.insort(sch.comp[v], ts)
            new = sch.rebuild()
            if new < peak or (new == peak and sch.at_peak() < before):
                peak, applied = new, True
                moves += 1
                break
            for v in add:
                sch.comp[v].remove(ts)
            tabu.add((u, ts, also))
            if time.perf_counter() > deadline:
                break
        if not applied:
            peak = sch.rebuild()
            status = "stuck" if time.perf_counter() <= deadline else "time_limit"
            break
    pruned = 0
    if status == "fits":
        extra = sorted(((float(c[v]), v, t) for v in range(n) for t in sch.comp[v] if t != v),
                       reverse=True)
        for _, v, t in extra:
            if time.perf_counter() > deadline:
                break
            sch.comp[v].remove(t)  # its reads fall back to an earlier copy
            if sch.rebuild() <= budget:
                pruned += 1
            else:
                bisect.insort(sch.comp[v], t)
        peak = sch.rebuild()
    steps: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for t in sch.comp[v]:
            steps[t].append(v)
    cost = float(sum(c[v] * len(sch.comp[v]) for v in range(n)))
    return ShaveResult([sorted(x) for x in steps], int(peak), cost, status, moves, pruned, 0.0)
