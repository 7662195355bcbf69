"""Random Checkmate problems (:class:`solvers.checkmate.CheckmateProblem`) at a budget relative
to their no-remat peak: a random DAG and a random chain."""

from __future__ import annotations

import math

import numpy as np

import remat
from solvers.checkmate import CheckmateProblem, checkpoint_all_schedule, schedule_memory


def random_problem(n: int, seed: int, m: float) -> CheckmateProblem:
    """A random DAG (every node reads its predecessor and up to two earlier nodes), sizes and
    costs drawn at random, budget ``m`` x the no-remat peak (bytes)."""
    rng = np.random.default_rng(seed)
    edges = [(i - 1, i) for i in range(1, n)]
    for j in range(2, n):
        for i in rng.choice(j - 1, size=min(2, j - 1), replace=False):
            if rng.random() < 0.5:
                edges.append((int(i), j))
    P = CheckmateProblem(n, np.array(edges), rng.uniform(0.5, 2.0, n),
                         rng.integers(1, 9, n) * 1024)
    peak, _ = schedule_memory(P, *checkpoint_all_schedule(P))
    return P.with_budget(int(np.ceil(m * peak)))


def chain_problem(L=40, seed=0, frac=0.3):
    """A random chain of ``L`` nodes (sizes 1..8, costs 0.5..2), budget ``frac`` x the
    no-remat peak (rounded up)."""
    rng = np.random.default_rng(seed)
    g = remat.chain_graph(L, sizes=rng.integers(1, 9, L), fwd_costs=rng.uniform(0.5, 2, L))
    return CheckmateProblem.from_graph(g, math.ceil(frac * g.no_remat_peak()))
