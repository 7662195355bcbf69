"""Sage (MobiSys 2022): graph passes (remat.core.passes), the hybrid policy (policies.sage), its
BatchNorm rule and the dynamic budget trace.  Gradients are checked against
``jax.value_and_grad`` of the original function; memory against the executor's measurement."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.generated_models import Spec, build
from helpers.mlp_models import mlp_setup, relu_mlp_loss

import policies
import remat
from experiments.figures.sage_passes import pass_report
from policies.sage import Sage, budget_at, plans_for_trace, sage_steps
from remat import microbatch
from remat.core import passes
from remat.core.errors import BudgetFormatError, InfeasibleBudgetError, InvalidOptionError
from remat.planning import planning_context


def _close(tree, ref, rtol=1e-5, atol=1e-6):
    for a, b in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _run(g, ctx, plan, args, budget, ref):
    """Execute ``plan`` micro-batch by micro-batch; measured peak under budget, exact grads."""
    gk = g if plan.microbatches == 1 else ctx.graph_at(plan.microbatches)
    v, grads, st = microbatch.execute(gk, plan, *args)
    assert st.peak_bytes <= budget
    np.testing.assert_allclose(float(v), float(ref[0]), rtol=1e-5)
    _close(grads, ref[1])
    return st


# --------------------------------------------------------------------------- graph passes
def test_fusion_rule_groups_elementwise_with_one_contraction_and_isolates_opaque():
    names = ["convert_element_type", "dot_general", "add", "tanh", "dot_general", "mul",
             "sort", "exp", "argmax", "conv_general_dilated", "max"]
    lab = passes.fusion_labels(names).tolist()
    # prologue + dot + epilogue | dot + mul | sort | exp | argmax | conv + max
    assert lab == [0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 5]
    assert passes.op_class("argmax") == "opaque" and passes.op_class("reduce_sum") == "asymmetrical"


@pytest.fixture(scope="module")
def mlp():
    params, batch = mlp_setup(5, 16, 12)
    g = remat.extract(relu_mlp_loss, params, batch)
    ctx = planning_context(relu_mlp_loss, (params, batch), g)
    ref = jax.value_and_grad(relu_mlp_loss)(params, batch)
    return g, ctx, params, batch, ref


def test_fusion_lowers_memory_keeps_flops_and_reduction_trades_flops(mlp):
    eq0 = remat.extract(relu_mlp_loss, mlp[2], mlp[3], stages="eqn")
    assert passes.fuse(eq0).no_remat_peak() <= eq0.no_remat_peak()  # never worse
    loss, params, batch = remat.zoo.get("mlp", batch_size=4, depth=4, width=64)
    eq = remat.extract(loss, params, batch, stages="eqn")
    fu = passes.fuse(eq)
    assert fu.flops_array.sum() == pytest.approx(eq.flops_array.sum())
    assert fu.no_remat_peak() < eq.no_remat_peak()
    red, n = passes.reduce_subgraphs(fu)
    assert n >= 1  # element-wise groups read by several groups (forward and backward)
    assert red.flops_array.sum() > fu.flops_array.sum()
    assert red.no_remat_peak() < fu.no_remat_peak()
    # K_h = 1 allows nothing (fewer than one fused op): no reduction
    assert passes.reduce_subgraphs(fu, k_h=1)[1] == 0
    with pytest.raises(remat.errors.InvalidGraphError, match="k_w"):
        passes.reduce_subgraphs(fu, k_w=0)
    with pytest.raises(remat.errors.NotApplicableError):
        passes.reduce_subgraphs(eq)  # not a fused graph
    r = pass_report(loss, params, batch)
    assert r.fused_peak_bytes == fu.no_remat_peak() and r.unfused_nodes == eq.n
    assert r.reduced_removed == n and r.fused_nodes < eq.n


def test_sage_stages_are_executable_with_exact_gradients(mlp):
    _, _, params, batch, ref = mlp
    g = remat.extract(relu_mlp_loss, params, batch, stages="sage")
    assert any("fused" in v.name for v in g.forward_nodes)
    ctx = planning_context(relu_mlp_loss, (params, batch), g, stages="sage")
    b = int(0.5 * g.no_remat_peak())
    plan = Sage(budget=b).plan(g, ctx=ctx)
    _run(g, ctx, plan, (params, batch), b, ref)


# --------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("order", ["accumulate_first", "checkpoint_first"])
@pytest.mark.parametrize("frac", [0.6, 0.35])
def test_plans_fit_measured_and_give_full_batch_gradients(mlp, order, frac):
    g, ctx, params, batch, ref = mlp
    b = int(frac * g.no_remat_peak())
    plan = Sage(budget=b, order=order).plan(g, ctx=ctx)
    assert plan.meta["peak_bytes"] <= b and plan.meta["order"] == order
    _run(g, ctx, plan, (params, batch), b, ref)


def test_orders_differ_as_described(mlp):
    g, ctx, *_ = mlp
    # half batch fits without recomputation, full batch with checkpointing
    b = max(ctx.graph_at(2).no_remat_peak(), Sage(accumulate=False).min_feasible_budget(g, ctx))
    assert b < g.no_remat_peak()
    acc = Sage(budget=b, mtp=1).plan(g, ctx=ctx)
    assert acc.microbatches == 2 and acc.meta["method"] == "accumulate"
    assert (acc.compute_counts() == 1).all()
    ck = Sage(budget=b, mtp=1, order="checkpoint_first").plan(g, ctx=ctx)
    assert ck.microbatches == 1 and ck.meta["method"] == "checkpoint"
    # with the MTP at the full batch, accumulate-first checkpoints the full batch first too
    full = Sage(budget=b, mtp=12).plan(g, ctx=ctx)
    assert full.microbatches == 1 and full.meta["method"] == "checkpoint"


def test_dgc_evicts_smallest_latency_per_byte():
    # f0..f3, loss, b3..b0, 4 bytes each; at 20 bytes b3 needs one eviction among f0, f1 (its
    # inputs loss, f3, f2 are locked): the one with the smaller time/bytes goes and is the only
    # recomputation
    for costs, evicted in (([1.0, 8.0, 1.0, 1.0], 0), ([8.0, 1.0, 1.0, 1.0], 1)):
        g = remat.chain_graph(4, sizes=[4, 4, 4, 4], fwd_costs=costs)
        steps, ev = sage_steps(g, 20, g.costs)
        assert ev == 1
        assert [u for s in steps for u in s[:-1]] == [evicted]
    assert sage_steps(g, 12, g.costs) is None  # three locked inputs plus an output do not fit


def test_value_and_grad_drop_in_applies_microbatches_and_checkpoints(mlp):
    g, ctx, params, batch, ref = mlp
    b = int(0.3 * g.no_remat_peak())
    vg = remat.value_and_grad(relu_mlp_loss, Sage(budget=b, mtp=1))
    v, grads = jax.jit(vg)(params, batch)
    app = vg.applied(params, batch)
    assert app.plan.microbatches > 1
    np.testing.assert_allclose(float(v), float(ref[0]), rtol=1e-5)
    _close(grads, ref[1])


def test_generated_models(mlp):
    for frontend in ("linen",):  # plain JAX: the mlp fixture
        spec = Spec(widths=(8, 12, 8, 8), acts=("tanh", "relu", "gelu", "sigmoid"),
                    kinds=("dense", "dense", "add", "concat"), skips=(-1, -1, 0, 1), loss="xent",
                    frontend=frontend, batch=10)
        loss, params, batch = build(spec)
        g = remat.extract(loss, params, batch)
        ctx = planning_context(loss, (params, batch), g)
        ref = jax.value_and_grad(loss)(params, batch)
        b = int(0.5 * g.no_remat_peak())
        plan = Sage(budget=b).plan(g, ctx=ctx)
        _run(g, ctx, plan, (params, batch), b, ref)


def test_infeasible_budget_reports_a_minimum_that_works(mlp):
    g, ctx, params, batch, ref = mlp
    with pytest.raises(InfeasibleBudgetError) as ei:
        Sage(budget=64).plan(g, ctx=ctx)
    mf = int(ei.value.min_feasible_bytes)
    plan = Sage(budget=mf).plan(g, ctx=ctx)
    _run(g, ctx, plan, (params, batch), mf, ref)
    assert g.no_remat_peak() / mf > 2
    with pytest.raises(InvalidOptionError):
        Sage(order="sideways")
    assert "sage" in policies.available()


def test_mtp_is_larger_on_a_gpu_than_on_a_phone(mlp):
    g, ctx, *_ = mlp
    phone = Sage(device="pixel-4", launch_s=0.0)
    gpu = Sage(device="rtx-3090")
    curve = gpu.throughput_curve(g, ctx)
    thr = [t for _, _, t in curve]
    assert thr == sorted(thr, reverse=True)  # smaller micro-batches never run faster
    assert gpu.min_throughput_point(g, ctx) >= phone.min_throughput_point(g, ctx)


# --------------------------------------------------------------------------- BatchNorm
def _bn_loss(p, batch):
    """Dense -> BatchNorm (train mode: batch statistics) -> tanh -> Dense, mean squared error."""
    h = batch["x"] @ p["w1"]
    h = (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5) * p["g"]
    h = jnp.tanh(h) @ p["w2"]
    h = jnp.tanh(h) @ p["w3"]
    return jnp.mean((h - batch["y"]) ** 2)


def test_batchnorm_checkpoint_only_is_exact_accumulate_is_ghost_batchnorm():
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    p = {"w1": jax.random.normal(ks[0], (8, 16)), "g": jnp.ones(16),
         "w2": jax.random.normal(ks[1], (16, 16)) / 4, "w3": jax.random.normal(ks[2], (16, 8)) / 4}
    b = {"x": jax.random.normal(ks[3], (12, 8)), "y": jax.random.normal(ks[4], (12, 8))}
    g = remat.extract(_bn_loss, p, b, stages="sage")
    ctx = planning_context(_bn_loss, (p, b), g, stages="sage")
    assert ctx.batch_coupled
    ref = jax.value_and_grad(_bn_loss)(p, b)
    budget = Sage(mtp=1).min_feasible_budget(g, ctx)  # checkpointing only: the full batch
    assert budget < g.no_remat_peak()
    plan = Sage(budget=budget, mtp=1).plan(g, ctx=ctx)
    assert plan.microbatches == 1 and "checkpointing only" in plan.meta["batch_coupled"]
    _run(g, ctx, plan, (p, b), budget, ref)
    acc = Sage(budget=budget, mtp=1, coupled="accumulate").plan(g, ctx=ctx)
    k = acc.microbatches
    assert k > 1 and "ghost batch norm" in acc.meta["batch_coupled"]
    v, grads, _ = microbatch.execute(ctx.graph_at(k), acc, p, b)
    # the documented change of math: the mean of per-micro-batch gradients (own statistics)
    m = 12 // k
    parts = [jax.grad(_bn_loss)(p, jax.tree_util.tree_map(lambda x, j=j: x[j * m:(j + 1) * m], b))
             for j in range(k)]
    _close(grads, jax.tree_util.tree_map(lambda *xs: sum(xs) / k, *parts), rtol=1e-4, atol=1e-5)
    diff = max(float(jnp.max(jnp.abs(a - c))) for a, c in
               zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref[1])))
    assert diff > 1e-3  # and not the full batch's


# --------------------------------------------------------------------------- dynamic budget
def test_budget_trace_replans_at_changes_with_full_batch_gradients(mlp):
    g, ctx, params, _, _ = mlp
    peak = g.no_remat_peak()
    trace = [(0, None), (1, int(0.5 * peak)), (3, int(0.3 * peak)), (4, int(0.6 * peak))]
    assert budget_at(trace, 2) == int(0.5 * peak)
    steps = plans_for_trace(Sage(mtp=1), g, trace, 5, ctx)
    assert [s for s, _, p in steps if p.meta["replanned"]] == [0, 1, 3, 4]
    ks = []
    for s, b, plan in steps:
        _, batch = mlp_setup(5, 16, 12, seed=s + 1)  # a new batch each step
        ref = jax.value_and_grad(relu_mlp_loss)(params, batch)
        _run(g, ctx, plan, (params, batch), peak if b is None else b, ref)
        ks.append(plan.microbatches)
    assert ks[0] == 1 and ks[3] > ks[1]
    with pytest.raises(BudgetFormatError):
        plans_for_trace(Sage(), g, [(3, None), (1, 5)], 4, ctx)


def test_plan_meta_reports_throughput_and_mtp(mlp):
    g, ctx, *_ = mlp
    p = Sage(budget="40%").plan(g, ctx=ctx)
    for key in ("mtp", "microbatch_size", "modelled_step_s", "throughput_samples_per_s",
                "method", "below_mtp"):
        assert key in p.meta
    assert p.meta["throughput_samples_per_s"] > 0
    assert dataclasses.replace(ctx, graph_at=None).microbatch_counts() == []
