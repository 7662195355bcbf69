"""Greedy low-peak orders (solvers/order_search.py) and their use as the order ILP's start:
valid topological orders (control edges included) whose reported peak is order_peak's, never
below the brute-force optimum, strictly better than a bad program order, typed errors; and
solve_order keeping the better of the program's order and the greedy one."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.limits import SAFETY_S
from helpers.orders import random_dag, topological_orders

from remat.core.errors import InvalidGraphError, RematError
from solvers.olla import solve_order
from solvers.order_search import greedy_order
from solvers.orders import order_peak


def _is_topological(order: np.ndarray, n: int, edges: np.ndarray) -> bool:
    if sorted(order.tolist()) != list(range(n)):
        return False
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    return bool(len(edges) == 0 or (pos[edges[:, 0]] < pos[edges[:, 1]]).all())


@pytest.mark.parametrize("seed", range(5))
def test_greedy_orders_are_valid_and_never_beat_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        n = int(rng.integers(2, 8))
        sizes, edges = random_dag(n, rng.uniform(0.1, 0.6), rng)
        order, peak = greedy_order(sizes, edges, restarts=8, seed=seed)
        assert _is_topological(order, n, edges)
        assert peak == order_peak(sizes, edges, order)
        best = min(order_peak(sizes, edges, o) for o in topological_orders(n, edges))
        assert peak >= best


def test_control_edges_are_respected():
    rng = np.random.default_rng(7)
    sizes, edges = random_dag(12, 0.2, rng)
    ctrl = np.array([[11, 0], [10, 1]])  # reverse the program's order of two pairs
    if len(edges):
        edges = edges[~np.isin(edges[:, 0], [10, 11]) & ~np.isin(edges[:, 1], [0, 1])]
    order, _ = greedy_order(sizes, edges, restarts=4, control_edges=ctrl)
    assert _is_topological(order, 12, np.concatenate([edges, ctrl]))


def test_greedy_finishes_a_branch_before_starting_the_next():
    """Two independent branches, each a big value read once by a small one; the program's
    order computes both big values first (peak 200 + 1), the optimum one branch at a time."""
    sizes = np.array([100, 100, 1, 1, 1])
    edges = np.array([[0, 2], [1, 3], [2, 4], [3, 4]])
    program = order_peak(sizes, edges, np.arange(5))
    order, peak = greedy_order(sizes, edges, restarts=1)
    best = min(order_peak(sizes, edges, o) for o in topological_orders(5, edges))
    assert program == 201 and peak == best == 102


def test_more_restarts_never_worse_on_a_layered_dag():
    rng = np.random.default_rng(0)
    n, edges = 120, []
    for v in range(1, n):  # each node reads 1-4 of the 20 nodes before it
        k = int(rng.integers(1, 5))
        edges += [(int(u), v) for u in rng.choice(np.arange(max(0, v - 20), v), size=min(k, v),
                                                   replace=False)]
    e = np.array(edges)
    sizes = rng.integers(10, 1000, size=n)
    peaks = [greedy_order(sizes, e, restarts=r, seed=3)[1] for r in (1, 4, 16)]
    assert peaks[0] >= peaks[1] >= peaks[2]


def test_typed_errors():
    with pytest.raises(InvalidGraphError):
        greedy_order(np.array([1, 1]), np.array([[0, 1], [1, 0]]))
    with pytest.raises(InvalidGraphError):
        greedy_order(np.array([1, 1]), np.array([[0, 5]]))
    with pytest.raises(RematError):
        greedy_order(np.array([1, 1]), np.array([[0, 1]]), restarts=0)


def test_solve_order_starts_from_the_better_order():
    """The program's order of the two-branch graph peaks at 201 bytes; with the greedy start
    the order search returns at most the greedy peak and still reports the program's peak as
    ``warm_peak_bytes``; without it the result is never above the program's order."""
    sizes = np.array([100, 100, 1, 1, 1])
    edges = np.array([[0, 2], [1, 3], [2, 4], [3, 4]])
    with_h = solve_order(sizes, edges, time_limit=SAFETY_S, heuristic_restarts=4)
    without = solve_order(sizes, edges, time_limit=SAFETY_S, heuristic_restarts=0)
    assert with_h.warm_peak_bytes == without.warm_peak_bytes == 201
    assert with_h.peak_bytes <= greedy_order(sizes, edges, restarts=4)[1] == 102
    assert without.peak_bytes <= 201
    assert _is_topological(with_h.order, 5, edges)


def test_solve_order_out_of_time_still_returns_the_greedy_order():
    """With no time for the ILP (1 ms: below the ILP's 0.05 s floor at any speed) the result is
    the greedy start, below the program's order."""
    sizes = np.tile([100, 100, 1, 1, 1], 20)
    edges = np.concatenate([np.array([[0, 2], [1, 3], [2, 4], [3, 4]]) + 5 * k for k in range(20)]
                           + [np.array([[5 * k + 4, 5 * k + 5] for k in range(19)])])
    order = np.concatenate([np.array([0, 1, 2, 3, 4]) + 5 * k for k in range(20)])
    sol = solve_order(sizes, edges, time_limit=1e-3, warm_order=order)
    assert sol.warm_peak_bytes == order_peak(sizes, edges, order) == 201
    assert sol.peak_bytes == order_peak(sizes, edges, sol.order) == 102


def _layered(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    edges = []
    for v in range(1, n):
        k = int(rng.integers(1, 5))
        edges += [(int(u), v) for u in rng.choice(np.arange(max(0, v - 20), v), size=min(k, v),
                                                   replace=False)]
    return rng.integers(10, 1000, size=n), np.array(edges)


def test_target_peak_stops_the_search_once_met():
    """A target the greedy start meets ends the search before any ILP; an unreachable one
    (0 bytes) lets it search on (one LNS sub-ILP, a work limit), never above the greedy peak.
    The safety net leaves the greedy start all its 32 restarts, as the reference had."""
    sizes, edges = _layered()
    _, greedy_peak = greedy_order(sizes, edges, restarts=32)
    sol = solve_order(sizes, edges, time_limit=SAFETY_S, target_peak=greedy_peak)
    assert sol.peak_bytes <= greedy_peak and "target" in sol.message
    assert sol.solve_time_s == 0.0  # no ILP was needed
    free = solve_order(sizes, edges, time_limit=SAFETY_S, target_peak=0, method="lns",
                       max_subproblems=1)  # unreachable: searches on
    assert free.peak_bytes <= greedy_peak and free.solve_time_s > 0
    assert "1 sub-ILPs" in free.message


def test_checkmate_reorder_stops_when_the_order_alone_fits(monkeypatch):
    """Checkmate(order="min_peak") at a budget the greedy order meets: no recomputation, and
    the order search ends at its start (no ILP) instead of searching on for its share of the
    time."""
    from helpers.orders import graph_of

    import policies
    import solvers.olla

    sizes, edges = _layered()
    g = graph_of(sizes, edges)
    _, greedy_peak = greedy_order(sizes, edges, restarts=32)
    assert greedy_peak < g.no_remat_peak()
    searches = []

    def solve_order_seen(*args, **kwargs):
        searches.append(solve_order(*args, **kwargs))
        return searches[-1]

    monkeypatch.setattr(solvers.olla, "solve_order", solve_order_seen)
    plan = policies.get("checkmate", budget=greedy_peak, order="min_peak",
                        time_limit=SAFETY_S).plan(g)
    assert len(searches) == 1 and "meets the target peak" in searches[0].message
    assert searches[0].solve_time_s == 0.0  # no ILP ran
    assert int(plan.R.sum()) == g.n  # every node computed once
