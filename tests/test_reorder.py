"""Planning in another topological order (policies/reorder.py, Checkmate(order="min_peak")):
the mapped plan runs the same computations on the original graph, fits what the relabelled plan
fit, and gives value_and_grad's gradients when executed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.checks import assert_same
from helpers.dropin import run_against_jax
from helpers.generated_models import build, specs
from helpers.graphs import fan_and_skip_graph, fan_graph
from helpers.limits import SAFETY_S
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
import remat
from policies.checkmate import Checkmate
from policies.reorder import check_order, plan_in_program_order, relabel
from remat.core.errors import InvalidGraphError, InvalidPlanError, RematError
from remat.core.schedule import replay


def random_topological_order(g, seed: int) -> np.ndarray:
    """Kahn's algorithm taking a uniformly random ready node each time."""
    rng = np.random.default_rng(seed)
    indeg = np.array([len(p) for p in g.preds])
    ready = [i for i in range(g.n) if indeg[i] == 0]
    order = []
    succs = [[] for _ in range(g.n)]
    for s, d in g.edges:
        succs[s].append(d)
    while ready:
        v = ready.pop(int(rng.integers(len(ready))))
        order.append(v)
        for d in succs[v]:
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    return np.asarray(order)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=specs(frontends=("plain", "linen", "nnx"), max_depth=4), seed=st.integers(0, 99))
def test_a_plan_in_any_order_maps_back_with_the_same_work_memory_and_gradients(spec, seed):
    loss, params, batch = build(spec)
    g = remat.extract(loss, params, batch, stages="eqn")
    order = random_topological_order(g, seed)
    g2 = relabel(g, order)
    assert g2.no_remat_peak() > 0 and g2.n == g.n
    # a recomputing plan of the relabelled graph, tight enough to make it recompute
    b = int(0.8 * g2.no_remat_peak())
    try:
        p2 = policies.get("pebbling").plan(g2, budget=b)
    except RematError:
        p2 = policies.checkpoint_all_plan(g2)
    p = plan_in_program_order(g, p2, order, note="mapped")
    p.validate(g)
    assert p.meta["note"] == "mapped"
    # the same computations, node for node
    np.testing.assert_array_equal(p.compute_counts()[order], p2.compute_counts())
    # never more memory than the relabelled plan
    assert replay(g, p).peak_bytes <= replay(g2, p2).peak_bytes
    value, grads, stats = remat.execute(g, p, params, batch)
    rv, rg = jax.jit(jax.value_and_grad(loss))(params, batch)
    assert_same(value, rv)
    assert_same(grads, rg)
    assert stats.stage_runs == int(p.R.sum())


def test_bad_orders_and_paging_plans_are_refused():
    g = remat.chain_graph(3)
    with pytest.raises(InvalidGraphError, match="permutation"):
        check_order(g, [0, 1, 1, 2, 3, 4, 5])
    with pytest.raises(InvalidGraphError, match="before its input"):
        check_order(g, list(range(g.n))[::-1])
    p2 = policies.checkpoint_all_plan(g)
    with pytest.raises(InvalidPlanError, match="columns"):
        plan_in_program_order(remat.chain_graph(4), p2, list(range(remat.chain_graph(4).n)))
    with pytest.raises(RematError, match="order must be"):
        Checkmate(budget="90%", order="best").plan(g)


def test_min_peak_order_fits_without_recomputation_where_the_program_order_cannot():
    g = fan_graph(6)
    b = 300  # the program order peaks at 601 bytes
    fixed = Checkmate(budget=b, time_limit=SAFETY_S).plan(g)
    moved = Checkmate(budget=b, time_limit=SAFETY_S, order="min_peak").plan(g)
    assert moved.meta["order"] == "min_peak"
    assert moved.meta["order_peak_bytes"] < moved.meta["program_peak_bytes"] == g.no_remat_peak()
    # replayed by the wrapper; the fixed order must recompute big sources, the new one need not
    assert moved.meta["peak_bytes"] <= b
    assert fixed.meta["compute_cost"] > g.costs.sum()
    assert moved.meta["compute_cost"] == pytest.approx(g.costs.sum())
    assert moved.meta["status"] == "optimal"


def test_min_peak_order_on_a_jax_function_gives_its_gradients():
    """Plain JAX written the way the fan above is: every wide projection first, then the
    reductions; the reordered Checkmate plan executes to value_and_grad's gradients."""
    k, width = 4, 64

    def loss(params, x):
        hs = [jnp.tanh(x @ w) for w in params]  # [batch, width] each
        ys = [jnp.sum(h * h, axis=1) for h in hs]
        return sum(jnp.mean(y) for y in ys)

    keys = jax.random.split(jax.random.PRNGKey(0), k + 1)
    params = [jax.random.normal(kk, (8, width)) / 3 for kk in keys[:k]]
    x = jax.random.normal(keys[k], (16, 8))
    g = remat.extract(loss, params, x, stages="eqn")
    b = int(0.9 * g.no_remat_peak())
    plan = Checkmate(budget=b, time_limit=SAFETY_S, order="min_peak").plan(g)
    # the program order holds every projection at once; an interleaved order does not
    assert plan.meta["order"] == "min_peak"
    assert plan.meta["order_peak_bytes"] < plan.meta["program_peak_bytes"] == g.no_remat_peak()
    if plan.meta["order_peak_bytes"] <= b:  # the order alone fits: nothing is recomputed
        assert plan.meta["compute_cost"] == pytest.approx(g.costs.sum())
    value, grads, stats = remat.execute(g, plan, params, x)
    rv, rg = jax.jit(jax.value_and_grad(loss))(params, x)
    assert_same(value, rv)
    assert_same(grads, rg)
    assert stats.peak_bytes_bookkeeping <= b


def test_no_milp_incumbent_in_the_new_order_returns_the_pebbling_plan(monkeypatch):
    import policies.checkmate as pc
    from remat.core.errors import SolverTimeoutError

    g = fan_and_skip_graph()
    b = 130
    ok = Checkmate(budget=b, time_limit=SAFETY_S, order="min_peak").plan(g)
    assert ok.meta["order"] == "min_peak" and ok.meta["order_peak_bytes"] > b
    assert g.costs.sum() < ok.meta["compute_cost"] and ok.meta["peak_bytes"] <= b

    def no_incumbent(*a, **k):
        raise SolverTimeoutError("no incumbent (test)", bound=float(g.costs.sum()))

    monkeypatch.setattr(pc, "solve_checkmate", no_incumbent)
    monkeypatch.setattr(pc, "solve_checkmate_lns", no_incumbent)
    monkeypatch.setattr(pc, "_dag_heuristic_plans", lambda graph, budget: iter(()))
    monkeypatch.setattr(pc.CheckmateMILP, "_warm_start",
                        lambda self, graph, problem, ctx=None: ("auto", "auto", {}))
    p = Checkmate(budget=b, time_limit=SAFETY_S, order="min_peak").plan(g)
    assert p.meta["status"] == "time_limit" and p.meta["best_of"] == "pebbling"
    assert p.meta["peak_bytes"] <= b  # replayed by the wrapper on the original graph
    assert p.meta["lower_bound"] == pytest.approx(g.costs.sum())
    assert p.meta["compute_cost"] > g.costs.sum() and p.meta["gap"] > 0
    with pytest.raises(SolverTimeoutError):  # nothing fits: the solver's error, not a plan
        Checkmate(budget=110, time_limit=SAFETY_S, order="min_peak").plan(g)


def test_order_search_is_extended_only_while_it_improves_and_needs_recomputation(monkeypatch):
    """The order phase gets more time (half shares, at most 60 % of the limit) while its order
    still peaks over the budget, its search ended at the time limit and the last extension
    lowered the peak; the reported program peak stays the program order's.  (Under the safety
    net the 60 % cap is far away: with 8 s, a first search slower than 3.8 s on a loaded
    machine left no room for the extension this test expects.)"""
    import dataclasses as dc

    import solvers.olla as olla

    real = olla.solve_order
    calls = []

    def fake(sizes, edges, *, warm_order=None, time_limit=60.0, **kw):
        calls.append((time_limit, warm_order is not None))
        sol = real(sizes, edges, warm_order=warm_order, time_limit=time_limit, **kw)
        return dc.replace(sol, status="time_limit")  # pretend it was still improving

    monkeypatch.setattr(olla, "solve_order", fake)
    g = fan_and_skip_graph()  # every order peaks at 180 B without recomputation
    p = Checkmate(budget=130, time_limit=SAFETY_S, order="min_peak").plan(g)
    assert p.meta["peak_bytes"] <= 130 and p.meta["order_peak_bytes"] > 130
    first = calls[0][0]
    # one extension, warm-started from the first order; it did not lower the peak (a tiny
    # graph's search is exact at once), so the search stops there
    assert not calls[0][1] and len(calls) == 2
    assert calls[1][1] and calls[1][0] == pytest.approx(first / 2)
    assert p.meta["program_peak_bytes"] == g.no_remat_peak()
    calls.clear()
    p = Checkmate(budget=300, time_limit=SAFETY_S, order="min_peak").plan(fan_graph(6))  # fits
    assert len(calls) == 1 and p.meta["compute_cost"] == pytest.approx(fan_graph(6).costs.sum())


@pytest.mark.parametrize("budget", ["90%", "75%"])
def test_drop_in_realises_a_reordered_plan_or_says_it_does_not(budget):
    """remat.value_and_grad with Checkmate(order="min_peak") on plain JAX: value_and_grad's
    gradients; the saved residual bytes equal the plan's, or a RematFidelityWarning says by how
    much they differ (XLA under jit does not follow the plan's order)."""

    def loss(params, x):
        hs = [jnp.tanh(x @ w) for w in params]  # every projection first, then the reductions
        return sum(jnp.mean(jnp.sum(h * h, axis=1)) for h in hs)

    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    params = [jax.random.normal(kk, (8, 64)) / 3 for kk in keys[:4]]
    x = jax.random.normal(keys[4], (16, 8))
    vg = remat.value_and_grad(loss, Checkmate(budget=budget, time_limit=SAFETY_S, order="min_peak"),
                              stages="eqn")
    ap, fid = run_against_jax(vg, loss, params, x)
    assert ap.plan.meta["order"] == "min_peak"
    if ap.residual_bytes == ap.predicted_residual_bytes:
        assert not ap.warnings
    else:  # not realised exactly: said, with the numbers
        assert fid and ap.warnings and str(ap.residual_bytes) in str(fid[0].message)
