"""OLLA (solvers/olla.py, policies/olla.py): the order ILP against brute force over every
topological order, the address ILP against brute force over every stacking order, layouts
validated by remat.layout, warm starts never beaten by the result, time limits returning the
incumbent, and the policy's plans running through remat.execute with unchanged gradients."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from helpers.event_oracle import oracle_peak
from helpers.limits import SAFETY_S, spend_highs_time
from helpers.orders import graph_of, random_dag, topological_orders

import policies
import remat
from policies.from_checkpoints import plan_from_steps
from policies.olla import Olla, olla_layout, olla_placement
from remat.core import layout
from remat.core.errors import InfeasibleBudgetError
from remat.core.schedule import replay
from solvers.olla import overlapping_pairs, solve_addresses, solve_order
from solvers.orders import order_peak


def test_order_peak_is_the_replayed_peak():
    """The ILP's memory semantics (eq. 13, one node per step) equal the event program's."""
    rng = np.random.default_rng(3)
    for _ in range(10):
        sizes, edges = random_dag(7, 0.35, rng)
        g = graph_of(sizes, edges)
        for order in itertools.islice(topological_orders(7, edges), 6):
            plan = plan_from_steps(g, [[v] for v in order])
            assert order_peak(sizes, edges, order) == replay(g, plan).peak_bytes


@pytest.mark.parametrize("seed", range(4))
def test_order_ilp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    solved = 0
    for _ in range(12):
        n = int(rng.integers(3, 9))
        sizes, edges = random_dag(n, rng.uniform(0.1, 0.5), rng)
        orders = list(topological_orders(n, edges))
        best = min(order_peak(sizes, edges, o) for o in orders)
        warm = orders[int(rng.integers(len(orders)))]
        sol = solve_order(sizes, edges, warm_order=warm, method="exact", time_limit=SAFETY_S,
                          heuristic_restarts=0)  # the ILP itself, from the given order
        assert sol.status == "optimal" and sol.gap == 0.0
        assert sol.peak_bytes == best == sol.lower_bound
        assert sorted(sol.order.tolist()) == list(range(n))
        assert order_peak(sizes, edges, sol.order) == sol.peak_bytes
        assert sol.warm_peak_bytes == order_peak(sizes, edges, warm) >= sol.peak_bytes
        solved += sol.num_binaries > 0
    assert solved >= 3  # some instances reach HiGHS (not all closed by the bounds alone)


def test_lns_orders_are_valid_and_never_worse():
    """The order LNS, two sub-ILPs each (a work limit, ``max_subproblems``: the same search at
    any speed), on 30-node DAGs: a valid order, never above the start's peak, above the
    bound; on an 8-node DAG the bound is below the brute-force optimum."""
    rng = np.random.default_rng(11)
    for _ in range(2):
        sizes, edges = random_dag(30, 0.08, rng)
        sol = solve_order(sizes, edges, method="lns", release=3, time_limit=SAFETY_S,
                          max_subproblems=2)
        assert sol.status in ("feasible", "optimal")  # a local optimum, not a time-out
        assert "max_subproblems (2)" in sol.message
        assert order_peak(sizes, edges, sol.order) == sol.peak_bytes <= sol.warm_peak_bytes
        assert sol.lower_bound <= sol.peak_bytes
    sizes, edges = random_dag(8, 0.3, rng)
    best = min(order_peak(sizes, edges, o) for o in topological_orders(8, edges))
    sol = solve_order(sizes, edges, method="lns", release=2, time_limit=SAFETY_S,
                      max_subproblems=2)
    assert sol.lower_bound <= best <= sol.peak_bytes
    with pytest.raises(ValueError, match="max_subproblems"):
        solve_order(*random_dag(30, 0.08, rng), method="lns", max_subproblems=0)


def test_order_time_limit_returns_the_incumbent(monkeypatch):
    """The exact order ILP of a 70-node DAG with HiGHS out of time at its first check
    (:func:`helpers.limits.spend_highs_time`, the same at any speed): the incumbent comes back,
    its peak the replayed one and no higher than the start's."""
    rng = np.random.default_rng(5)
    sizes, edges = random_dag(70, 0.06, rng)
    spend_highs_time(monkeypatch)
    sol = solve_order(sizes, edges, method="exact", time_limit=SAFETY_S)
    assert sol.status == "time_limit" and sol.num_binaries > 0  # the ILP was built and stopped
    assert order_peak(sizes, edges, sol.order) == sol.peak_bytes <= sol.warm_peak_bytes
    assert sol.lower_bound < sol.peak_bytes and sol.gap > 0


def brute_force_arena(iv: np.ndarray, s: np.ndarray) -> int:
    """Smallest arena: every layout compacts downwards to the stacking of some order."""
    best = None
    for perm in itertools.permutations(range(len(s))):
        off = {}
        for a in perm:
            off[a] = max([off[b] + s[b] for b in off
                          if iv[a, 0] <= iv[b, 1] and iv[b, 0] <= iv[a, 1]], default=0)
        arena = max(off[k] + s[k] for k in off)
        best = arena if best is None else min(best, arena)
    return best


def test_address_ilp_matches_brute_force():
    rng = np.random.default_rng(1)
    ran = 0
    for _ in range(40):
        A = int(rng.integers(2, 6))
        start = rng.integers(0, 8, A)
        iv = np.stack([start, start + rng.integers(0, 5, A)], axis=1)
        s = rng.integers(1, 10, A)
        best = brute_force_arena(iv, s)
        for warm in (None, layout.first_fit(iv, s)):
            sol = solve_addresses(iv, s, warm_offsets=warm, time_limit=SAFETY_S)
            layout.validate(iv, s, sol.offsets)
            assert sol.arena_bytes == best and sol.status == "optimal"
            assert sol.arena_bytes >= layout.max_live_lower_bound(iv, s)
            assert sol.arena_bytes <= sol.warm_arena_bytes
            ran += sol.solve_time_s > 0
    assert ran > 10


def test_overlapping_pairs_are_exactly_the_time_overlaps():
    iv = np.array([[0, 2], [2, 3], [4, 5], [1, 1], [3, 6]])
    s = np.array([1, 1, 1, 0, 2])
    got = {tuple(sorted(p)) for p in overlapping_pairs(iv, s).tolist()}
    assert got == {(0, 1), (1, 4), (2, 4)}  # allocation 3 has no bytes


def test_address_warm_start_and_time_limit(monkeypatch):
    """60 allocations, HiGHS out of time at its first check (the same at any speed): the
    first-fit and best-fit starts come back valid, between the max-live bound and their own
    arena, with status ``time_limit``; with too many pairs the ILP is skipped."""
    rng = np.random.default_rng(7)
    A = 60
    start = rng.integers(0, 40, A)
    iv = np.stack([start, start + rng.integers(0, 15, A)], axis=1)
    s = rng.integers(1, 50, A) * 8
    bound = layout.max_live_lower_bound(iv, s)
    for place in (layout.first_fit, layout.best_fit):
        warm = place(iv, s)
        with monkeypatch.context() as mp:
            spend_highs_time(mp)
            sol = solve_addresses(iv, s, warm_offsets=warm, lower_bound=bound,
                                  time_limit=SAFETY_S)
        layout.validate(iv, s, sol.offsets)
        assert bound <= sol.lower_bound <= sol.arena_bytes <= layout.arena_size(warm, s)
        assert sol.status == "time_limit" or sol.arena_bytes == sol.lower_bound
    skipped = solve_addresses(iv, s, warm_offsets=warm, max_pairs=1)
    assert skipped.status in ("heuristic", "optimal")
    assert np.array_equal(skipped.offsets, warm) or skipped.status == "optimal"


def diamond_graph():
    """A fork whose order matters: run the shrinking branch 0 -> 2 -> 3 before the big value
    1 that waits for the join (peak 8 instead of the program order's 12)."""
    sizes = np.array([1, 5, 6, 1, 1])
    edges = np.array([(0, 1), (0, 2), (2, 3), (1, 4), (3, 4)])
    return graph_of(sizes, edges, "diamond"), sizes, edges


def test_policy_reorders_and_places():
    g, sizes, edges = diamond_graph()
    best = min(order_peak(sizes, edges, o) for o in topological_orders(g.n, edges))
    assert best < g.no_remat_peak()
    plan = Olla(time_limit=SAFETY_S).plan(g)
    events = plan.validate(g)
    assert plan.meta["status"] == "optimal" and plan.meta["policy"] == "olla"
    assert plan.meta["order_peak_bytes"] == best == replay(g, plan).peak_bytes
    assert plan.meta["program_peak_bytes"] == g.no_remat_peak()
    assert (plan.R.sum(axis=0) == 1).all()  # no recomputation
    lt = layout.lifetimes(events)
    layout.validate(lt.intervals, lt.sizes, plan.offsets)
    bound = layout.max_live_lower_bound(lt.intervals, lt.sizes)
    top = max(o + s for o, s in zip(plan.offsets.tolist(), lt.sizes.tolist()))  # by hand
    assert bound == best and plan.meta["arena_bytes"] == top
    assert plan.meta["arena_bytes"] >= bound
    rep = remat.simulate(g, plan)
    assert rep.arena_bytes == plan.meta["arena_bytes"]
    assert policies.get("olla", addresses=False).plan(g).offsets is None


def test_policy_budget():
    g, sizes, edges = diamond_graph()
    best = min(order_peak(sizes, edges, o) for o in topological_orders(g.n, edges))
    assert Olla(budget=best, addresses=False).plan(g).meta["peak_bytes"] == best
    with pytest.raises(InfeasibleBudgetError) as err:
        Olla(budget=best - 1).plan(g)
    assert err.value.min_feasible_bytes == best and "proven" in str(err.value)


def test_other_policies_pass_through_olla():
    g = remat.core.graph.chain_graph(6, sizes=[4, 8, 4, 8, 4, 8])
    cm = policies.Checkmate(budget="60%", time_limit=SAFETY_S)
    base = cm.plan(g)
    out = Olla(base=cm, time_limit=SAFETY_S).plan(g)
    assert out.meta["base_policy"] == "checkmate" and out.meta["order_status"] == "skipped"
    assert np.array_equal(out.R, base.R) and np.array_equal(out.S, base.S)
    events = out.validate(g)
    lt = layout.lifetimes(events)
    assert out.meta["arena_bytes"] >= layout.max_live_lower_bound(lt.intervals, lt.sizes)
    # a plan that recomputes nothing is reordered, then placed; never worse than the plan
    ca = policies.checkpoint_all_plan(g)
    again = olla_layout(g, ca, time_limit=SAFETY_S)
    assert again.meta["order_status"] != "skipped"
    assert replay(g, again).peak_bytes <= replay(g, ca).peak_bytes
    pl = olla_placement(SAFETY_S)
    placed = layout.allocate(g, base, placement=pl)
    assert placed.meta["layout"] == "olla" and pl.last is not None
    assert placed.meta["arena_bytes"] == pl.last.arena_bytes


def test_gradients_unchanged_through_execute():
    """Reordering changes memory, not math: remat.execute of OLLA's plan (eqn-level graph)
    gives jax.value_and_grad's value and gradients, and its peak is the simulated one."""
    loss, params, batch = remat.zoo.get("mlp", batch_size=2, depth=2, width=16, in_features=8)
    g = remat.extract(loss, params, batch, stages="eqn")
    plan = Olla(time_limit=SAFETY_S).plan(g)
    assert (np.nonzero(plan.R)[1] != np.arange(g.n)).any()  # the order did change
    assert plan.meta["peak_bytes"] < g.no_remat_peak()
    value, grads, stats = remat.execute(g, plan, params, batch)
    rv, rg = jax.value_and_grad(loss)(params, batch)
    np.testing.assert_allclose(np.asarray(value), np.asarray(rv), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(rg)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert stats.peak_bytes_bookkeeping == oracle_peak(g, plan)
