"""Melon: the lifetime-aware pool (validator on hypothesis lifetimes, max-live bound, versus
on-demand), progressive recomputation (legal, under budget, executed with matching gradients),
the micro-batch rule and budget adaptation."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from generated_models import Spec, build
from hypothesis import given, settings
from hypothesis import strategies as st
from mlp_models import mlp_setup, relu_mlp_loss

import policies
import remat
from policies.melon import Melon
from remat.apply import planning_context
from remat.errors import InfeasibleBudgetError
from remat.layout import (
    allocate,
    arena_size,
    first_fit,
    greedy_by_size,
    lifetimes,
    max_live_lower_bound,
    validate,
)
from solvers.melon_pool import COMPARED, lifetime_aware, lifetime_aware_lowest, pool_report

MELON_POOLS = [lifetime_aware, lifetime_aware_lowest]


@st.composite
def general_lifetimes(draw):
    a = draw(st.integers(1, 25))
    start = np.array(draw(st.lists(st.integers(0, 30), min_size=a, max_size=a)))
    span = np.array(draw(st.lists(st.integers(0, 12), min_size=a, max_size=a)))
    sizes = np.array(draw(st.lists(st.integers(0, 64), min_size=a, max_size=a)))
    return np.stack([start, start + span], 1), sizes


@st.composite
def laminar_lifetimes(draw):
    """Nested-or-disjoint lifetimes ("first produce, last release"): a random bracket sequence."""
    ops = draw(st.lists(st.booleans(), min_size=2, max_size=40))
    iv, stack, t = [], [], 0
    for push in ops:
        if push or not stack:
            stack.append(t)
        else:
            iv.append((stack.pop(), t))
        t += 1
    while stack:
        iv.append((stack.pop(), t))
        t += 1
    sizes = draw(st.lists(st.integers(1, 64), min_size=len(iv), max_size=len(iv)))
    return np.array(iv), np.array(sizes)


@settings(max_examples=150, deadline=None)
@given(general_lifetimes())
def test_pools_never_overlap_live_tensors(case):
    iv, s = case
    bound = max_live_lower_bound(iv, s)
    for name, fn in COMPARED.items():
        off, rep = pool_report(iv, s, fn)  # validates
        validate(iv, s, off)
        assert rep.pool_bytes >= bound == rep.lower_bound_bytes, name
        assert rep.fragmentation >= 0.0


@settings(max_examples=150, deadline=None)
@given(laminar_lifetimes())
def test_lifetime_aware_is_optimal_on_laminar_lifetimes(case):
    """The structure Melon exploits: on nested lifetimes longest-first reaches the bound, so it
    is never worse than on-demand (nor than large-first)."""
    iv, s = case
    bound = max_live_lower_bound(iv, s)
    for fn in MELON_POOLS:
        size = arena_size(fn(iv, s), s)
        assert size == bound
        assert size <= arena_size(first_fit(iv, s), s)
        assert size <= arena_size(greedy_by_size(iv, s), s)


def test_lifetime_aware_can_lose_to_on_demand_in_general():
    """The paper's "never worse" is not a theorem: three allocations where on-demand wins."""
    iv, s = np.array([[2, 6], [3, 8], [1, 2]]), np.array([5, 3, 5])
    assert arena_size(first_fit(iv, s), s) == 10 == max_live_lower_bound(iv, s)
    for fn in MELON_POOLS:
        assert arena_size(fn(iv, s), s) == 13


@pytest.mark.parametrize("name", ["mobilenet_v2", "squeezenet"])
def test_lifetime_aware_on_zoo_stage_graphs(name):
    """Measured at batch 2, 32x32, checkpoint-all, stage granularity: the paper's "never worse
    than on-demand" does NOT hold here (mobilenet_v2: bound 7548544, on-demand 7697336,
    lifetime-aware 8197504 B; squeezenet: 1768704 / 1769728 / 1835776 B).  What holds: valid
    layouts, at least the bound, within 10% of on-demand and of the bound."""
    fn, params, batch = remat.zoo.get(name, batch_size=2, image_size=32)
    g = remat.extract(fn, params, batch)
    plan = policies.checkpoint_all_plan(g)
    lt = lifetimes(plan.validate(g))
    bound = max_live_lower_bound(lt.intervals, lt.sizes)
    on_demand = arena_size(first_fit(lt.intervals, lt.sizes), lt.sizes)
    for placement in ("melon", "melon_lowest"):
        p = allocate(g, plan, placement=placement)  # registered names; validated
        assert bound <= p.meta["arena_bytes"] <= 1.1 * min(on_demand, bound)


# --------------------------------------------------------------------------- the policy
@pytest.fixture(scope="module")
def mlp():
    params, batch = mlp_setup(6, 32, 8)
    g = remat.extract(relu_mlp_loss, params, batch)
    ref = jax.value_and_grad(relu_mlp_loss)(params, batch)
    return g, params, batch, ref


def _run(g, plan, budget, args, ref):
    plan.validate(g)
    lt = lifetimes(plan.validate(g))
    validate(lt.intervals, lt.sizes, plan.offsets)
    assert arena_size(plan.offsets, lt.sizes) <= budget
    assert plan.meta["peak_bytes"] <= budget
    value, grads, stats = remat.execute(g, plan, *args)
    assert stats.peak_bytes <= budget
    np.testing.assert_allclose(np.asarray(value), np.asarray(ref[0]), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("frac", [1.0, 0.85, 0.72])
def test_melon_plans_execute_under_budget_with_exact_gradients(mlp, frac):
    g, params, batch, ref = mlp
    b = int(frac * g.no_remat_peak())
    plan = policies.get("melon", budget=b).plan(g)
    assert plan.meta["method"] == "recompute" and plan.R.sum() > g.n
    _run(g, plan, b, (params, batch), ref)


def test_melon_on_a_generated_model():
    spec = Spec(widths=(8, 12, 8, 8), acts=("tanh", "relu", "gelu", "sigmoid"),
                kinds=("dense", "dense", "add", "concat"), skips=(-1, -1, 0, 1), loss="xent",
                frontend="plain", batch=16)
    loss, params, batch = build(spec)
    g = remat.extract(loss, params, batch)
    ref = jax.value_and_grad(loss)(params, batch)
    try:
        b = int(0.8 * g.no_remat_peak())
        plan = Melon(budget=b).plan(g)
    except InfeasibleBudgetError as e:
        b = int(e.min_feasible_bytes)
        plan = Melon(budget=b).plan(g)
    _run(g, plan, b, (params, batch), ref)


def test_infeasible_budget_reports_a_minimum_that_works(mlp):
    g, params, batch, ref = mlp
    with pytest.raises(InfeasibleBudgetError) as ei:
        Melon(budget=int(0.4 * g.no_remat_peak())).plan(g)
    mf = int(ei.value.min_feasible_bytes)
    assert mf > 0.4 * g.no_remat_peak()
    _run(g, Melon(budget=mf).plan(g), mf, (params, batch), ref)


def test_no_budget_is_pool_only(mlp):
    g = mlp[0]
    plan = Melon().plan(g)
    assert plan.meta["method"] == "pool_only" and plan.R.sum() == g.n


def test_microbatch_for_unbatched_models_and_recompute_only_with_batchnorm(mlp):
    g, params, batch, ref = mlp
    ctx = planning_context(relu_mlp_loss, (params, batch), g)
    assert not ctx.batch_coupled and ctx.microbatch_counts()
    b = int(0.72 * g.no_remat_peak())
    plan = Melon(budget=b).plan(g, ctx=ctx)
    assert plan.microbatches > 1 and plan.meta["method"] == "microbatch"
    assert plan.R.sum() == plan.R.shape[1]  # no recomputation
    sub = ctx.graph_at(plan.microbatches)
    # the largest micro-batch: one fewer split does not fit without recomputation
    smaller = [k for k in ctx.microbatch_counts() if k < plan.microbatches]
    for k in smaller:
        assert Melon()._pool_only(ctx.graph_at(k)).meta["arena_bytes"] > b
    lt = lifetimes(plan.validate(sub))
    assert arena_size(plan.offsets, lt.sizes) <= b
    bn = dataclasses.replace(ctx, batch_coupled=True)  # what the front end sets for BatchNorm
    plan_bn = Melon(budget=b).plan(g, ctx=bn)
    assert plan_bn.microbatches == 1 and plan_bn.meta["method"] == "recompute"
    assert "BatchNorm" in plan_bn.meta["microbatch_reason"]
    off = Melon(budget=b, microbatch=False).plan(g, ctx=ctx)
    assert off.microbatches == 1 and "disabled" in off.meta["microbatch_reason"]


@pytest.mark.parametrize("progress", [0.25, 0.5, 0.75])
def test_adapt_keeps_survivors_and_costs_less_than_restart(mlp, progress):
    g = mlp[0]
    old = Melon(budget=int(0.95 * g.no_remat_peak())).plan(g)
    nb = int(0.75 * g.no_remat_peak())
    ad = Melon().adapt(old, g, nb, progress)
    A = set(np.flatnonzero(old.S[ad.switch_step]).tolist())
    B = set(np.flatnonzero(ad.plan.S[ad.resume_step]).tolist()) if ad.resume_step < g.n else set()
    assert set(ad.kept) <= A & B and set(ad.kept) | set(ad.dumped) == A
    assert B - set(ad.kept) <= set(ad.recompute)  # B - (A - C)
    assert ad.plan.meta["peak_bytes"] <= nb
    assert ad.recompute_s >= 0 and ad.relayout_s >= 0
    assert ad.recompute_s <= ad.stop_restart_s + 1e-12  # every recomputed node is in the prefix
