"""Melon: the lifetime-aware pool (validator on hypothesis lifetimes, max-live bound, versus
on-demand), progressive recomputation (legal, under budget, executed with matching gradients),
the micro-batch rule and budget adaptation."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from helpers.generated_models import Spec, build
from helpers.mlp_models import mlp_setup, relu_mlp_loss
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
import remat
from policies.melon import Melon
from remat.apply import planning_context
from remat.core.errors import InfeasibleBudgetError
from remat.core.events import STEP
from remat.core.layout import (
    allocate,
    arena_size,
    first_fit,
    greedy_by_size,
    lifetimes,
    max_live_lower_bound,
    validate,
)
from solvers.melon_pool import (
    COMPARED,
    compact,
    lifetime_aware,
    lifetime_aware_lowest,
    lifetime_aware_refined,
    melon_pool,
    place_around,
    pool_report,
)

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
    # the max-live bound by hand: the most bytes live at any event (inclusive lifetimes)
    bound = max(sum(int(b) for (lo, hi), b in zip(iv.tolist(), s) if lo <= t <= hi)
                for t in range(int(iv.max()) + 1))
    assert max_live_lower_bound(iv, s) == bound
    for name, fn in COMPARED.items():
        off, rep = pool_report(iv, s, fn)  # validates
        validate(iv, s, off)
        assert rep.pool_bytes >= bound == rep.lower_bound_bytes, name
        assert rep.fragmentation >= 0.0


@settings(max_examples=60, deadline=None)
@given(general_lifetimes())
def test_refined_pool_is_valid_and_never_worse_than_its_seeds(case):
    """The local search (compaction + critical moves) keeps layouts valid and never grows the
    pool: refined <= the paper's greedy; Melon's pool (on-demand as a guard seed) <= both."""
    iv, s = case
    greedy = min(arena_size(fn(iv, s), s) for fn in MELON_POOLS)
    for fn in (lifetime_aware_refined, melon_pool):
        off = fn(iv, s)
        validate(iv, s, off)
        assert max_live_lower_bound(iv, s) <= arena_size(off, s) <= greedy
    assert arena_size(melon_pool(iv, s), s) <= arena_size(first_fit(iv, s), s)
    start = lifetime_aware(iv, s)
    off = compact(iv, s, start)  # gravity: every allocation at or below where it was
    validate(iv, s, off)
    assert (off <= start).all()
    fixed = np.arange(len(s)) % 2 == 0  # the stitched plan's placement around fixed tensors
    around = place_around(iv, s, fixed, start, np.flatnonzero(~fixed)[::-1])
    validate(iv, s, around)
    assert (around[fixed] == start[fixed]).all()


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


@pytest.mark.parametrize("name", ["mobilenet_v2", "squeezenet", "resnet50"])
def test_melon_pool_on_zoo_stage_graphs(name):
    """Batch 2, 32x32, checkpoint-all, stage granularity.  The paper's raw greedy is NOT never
    worse than on-demand here (measured: mobilenet_v2 bound 7548544, on-demand 7697336, greedy
    8197504 B; squeezenet 1768704 / 1769728 / 1835776 B; resnet50 125710632 / 127578368 /
    134013184 B); Melon's refined pool is: at least the max-live bound, at most on-demand, and
    the lifetime-aware search alone (no on-demand seed) is also at most on-demand."""
    fn, params, batch = remat.zoo.get(name, batch_size=2, image_size=32)
    g = remat.extract(fn, params, batch)
    plan = policies.checkpoint_all_plan(g)
    lt = lifetimes(plan.validate(g))
    bound = max_live_lower_bound(lt.intervals, lt.sizes)
    on_demand = arena_size(first_fit(lt.intervals, lt.sizes), lt.sizes)
    greedy = arena_size(lifetime_aware(lt.intervals, lt.sizes), lt.sizes)
    assert greedy > on_demand  # the failure the refinement repairs
    for placement in ("melon", "melon_lowest"):
        p = allocate(g, plan, placement=placement)  # registered names; validated
        assert bound <= p.meta["arena_bytes"] <= 1.1 * bound
    alone = arena_size(lifetime_aware_refined(lt.intervals, lt.sizes), lt.sizes)
    assert bound <= alone <= on_demand
    pool = Melon().plan(g)  # the policy's pool-only plan: melon_pool ("melon_refined")
    assert pool.meta["method"] == "pool_only"
    validate(lt.intervals, lt.sizes, pool.offsets)
    assert bound <= arena_size(pool.offsets, lt.sizes) <= on_demand
    assert pool.meta["greedy_arena_bytes"] == greedy


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


@pytest.mark.parametrize("frac", [0.9, 0.8, 0.72])
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


@pytest.mark.parametrize("progress", [0.25, 0.5, 0.75])
def test_adapt_stitched_plan_executes_with_exact_gradients(mlp, progress):
    """The stitched plan (old steps, recomputation of B - (A - C), new steps) replays legally,
    stays within the old budget before the switch and the new one from it on (replayed live
    bytes and pool tops, re-derived here from the events), and runs in ``remat.execute`` with
    the gradients of ``jax.value_and_grad``."""
    g, params, batch, ref = mlp
    ob = int(1.0 * g.no_remat_peak())
    old = Melon(budget=ob).plan(g)
    nb = int(0.8 * g.no_remat_peak())
    ad = Melon().adapt(old, g, nb, progress)
    st = ad.stitched
    if progress == 0.75:
        assert ad.recompute  # B - (A - C) is not empty there: a recompute row is stitched in
    ev = st.validate(g)  # legal, offsets checked against the events
    lt = lifetimes(ev)
    validate(lt.intervals, lt.sizes, st.offsets)
    assert st.R.shape[0] == ad.switch_step + bool(ad.recompute) + (g.n - ad.resume_step)
    np.testing.assert_array_equal(st.R[:ad.switch_step], old.R[:ad.switch_step])
    np.testing.assert_array_equal(st.R[-(g.n - ad.resume_step):], ad.plan.R[ad.resume_step:])
    e_sw = int(np.flatnonzero(ev.kind == STEP)[ad.switch_step])  # the switch row starts
    work = ev.kind != STEP
    assert ev.live[:e_sw][work[:e_sw]].max() <= ob
    assert ev.live[e_sw:][work[e_sw:]].max() <= nb
    tops = st.offsets + lt.sizes
    assert tops[lt.intervals[:, 0] < e_sw].max() <= ob
    assert tops[lt.intervals[:, 1] >= e_sw].max() <= nb
    value, grads, stats = remat.execute(g, st, params, batch)
    assert stats.peak_bytes <= ob
    np.testing.assert_allclose(np.asarray(value), np.asarray(ref[0]), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
