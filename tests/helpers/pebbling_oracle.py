"""Tiny random DAGs and an exhaustive reference for the smallest peak of any schedule, written
from the memory rules alone (the pebbling tests' oracle)."""

from __future__ import annotations

import heapq
import math

import numpy as np

import remat


def random_dag(seed: int, n: int):
    """``n`` nodes, each reading one or two earlier nodes, sizes 1..5, costs 0.5..2."""
    rng = np.random.default_rng(seed)
    edges = [(i, j) for j in range(1, n) for i in rng.choice(j, size=min(j, int(rng.integers(1, 3))),
                                                           replace=False)]
    sizes = rng.integers(1, 6, n).tolist()
    costs = rng.uniform(0.5, 2.0, n).tolist()
    return remat.make_graph([f"v{i}" for i in range(n)], edges, out_bytes=sizes, time_s=costs)


def exact_min_peak(g) -> int:
    """Smallest peak of *any* schedule (any order, any recomputation) that runs every node,
    by a bottleneck Dijkstra over (live set, nodes run so far); written from the memory rules
    alone: running x needs its inputs live and costs the live bytes plus x's output; dropping a
    value is free."""
    n = g.n
    size = [int(s) for s in g.sizes]
    pmask = [sum(1 << p for p in g.preds[v]) for v in range(n)]
    full = (1 << n) - 1

    def bytes_of(mask):
        return sum(size[i] for i in range(n) if mask >> i & 1)

    best = {(0, 0): 0}
    heap = [(0, 0, 0)]
    while heap:
        peak, live, done = heapq.heappop(heap)
        if done == full:
            return peak
        if best.get((live, done), math.inf) < peak:
            continue
        moves = []
        for x in range(n):
            if not live >> x & 1 and live & pmask[x] == pmask[x]:
                moves.append((max(peak, bytes_of(live | 1 << x)), live | 1 << x, done | 1 << x))
        for i in range(n):
            if live >> i & 1:
                moves.append((peak, live & ~(1 << i), done))
        for p, lv, dn in moves:
            if p < best.get((lv, dn), math.inf):
                best[(lv, dn)] = p
                heapq.heappush(heap, (p, lv, dn))
    raise AssertionError("unreachable")
