"""Random DAGs as arrays, every topological order of one (the brute force the order ILPs are
checked against), and the graph of such arrays."""

from __future__ import annotations

import numpy as np

from remat.core.graph import make_graph


def random_dag(n: int, p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    return rng.integers(1, 20, size=n), np.array(edges, dtype=np.int64).reshape(-1, 2)


def topological_orders(n: int, edges: np.ndarray):
    preds = [set() for _ in range(n)]
    for s, d in edges.tolist():
        preds[d].add(s)

    def rec(done: set, order: list):
        if len(order) == n:
            yield list(order)
            return
        for v in range(n):
            if v not in done and preds[v] <= done:
                done.add(v)
                order.append(v)
                yield from rec(done, order)
                done.remove(v)
                order.pop()

    yield from rec(set(), [])


def graph_of(sizes, edges, name="dag"):
    n = len(sizes)
    return make_graph([f"v{i}" for i in range(n)], [tuple(e) for e in edges.tolist()],
                      out_bytes=[int(s) for s in sizes], time_s=[1.0] * n, name=name)
