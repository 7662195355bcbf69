"""RecomputeAll, JaxPolicy, SqrtN and the shared plan builders, against hand counts and
independent implementations (checkpoint_all_plan, networkx-free reasoning on small graphs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.bench_graphs import BENCH, needs_bench

import policies
import remat
from policies.base import checkpoint_all_plan
from policies.from_checkpoints import plan_from_checkpoints, plan_from_steps
from policies.jax_policy import JaxPolicy, saveable_nodes
from policies.recompute_all import RecomputeAll
from policies.sqrtn import SqrtN, articulation_points
from remat.core.errors import InfeasibleBudgetError, InvalidPlanError, UnknownNameError


def fwd_idx(g):
    return [v.index for v in g.nodes if not v.is_backward]


def test_plan_from_steps_reproduces_checkpoint_all():
    g = remat.chain_graph(5, sizes=[3, 1, 4, 1, 5])
    p = plan_from_steps(g, [[i] for i in range(g.n)], policy="x")
    ref = checkpoint_all_plan(g)
    assert np.array_equal(p.S, ref.S) and np.array_equal(p.R, ref.R)
    assert remat.simulate(g, p).peak_bytes == g.no_remat_peak()
    with pytest.raises(InvalidPlanError):
        plan_from_steps(g, [[1], [0]], policy="x")  # f1 before f0


@pytest.mark.parametrize("L", [2, 5, 9])
def test_recompute_all_hand_count(L):
    g = remat.chain_graph(L, sizes=1, fwd_costs=1.0, bwd_costs=2.0)
    plan = RecomputeAll().plan(g)
    rep = remat.simulate(g, plan)
    # forward pass (L layers + loss), b_{L-1} rebuilds all of it, b_i (i < L-1) rebuilds f_0..f_i
    evals = 2 * (L + 1) + sum(i + 1 for i in range(L - 1))
    assert int(plan.compute_counts()[fwd_idx(g)].sum()) == evals
    # b_i holds f_{i-1}, f_i, the incoming gradient and its output: 4 values, the chain minimum
    assert rep.peak_bytes == 4
    assert plan.meta["policy"] == "recompute_all" and plan.meta["status"] == "heuristic"
    with pytest.raises(InfeasibleBudgetError) as ei:
        RecomputeAll(budget=3).plan(g)
    assert ei.value.min_feasible_bytes == 4


def test_jax_policy_extremes():
    g = remat.chain_graph(6, sizes=[2, 3, 1, 4, 1, 5])
    every = JaxPolicy(which="everything_saveable").plan(g)
    assert np.all(every.compute_counts() == 1)
    assert remat.simulate(g, every).peak_bytes == g.no_remat_peak()
    nothing = JaxPolicy(which="nothing_saveable").plan(g)
    # jax.checkpoint without a policy: the backward pass reruns the whole forward once
    assert np.all(nothing.compute_counts()[fwd_idx(g)] == 2)
    assert nothing.saved_forward(g) == frozenset()
    with pytest.raises(UnknownNameError):
        JaxPolicy(which="dots").plan(g)


def test_jax_policy_dots_from_primitives():
    g = remat.chain_graph(4)
    prims = [("dot_general", "add"), ("max",), ("conv_general_dilated",), ("dot_general",),
             ("log", "reduce_sum")] + [("transpose",)] * 4
    g = dataclasses.replace(g, meta={**g.meta, "node_primitives": prims,
                                     "node_dot_batch_dims": [False, False, False, True] + [False] * 5})
    assert saveable_nodes(g, "dots_saveable") == {0, 2, 3}
    assert saveable_nodes(g, "dots_with_no_batch_dims_saveable") == {0}
    for which, keep in (("dots_saveable", {0, 2, 3}), ("dots_with_no_batch_dims_saveable", {0})):
        plan = JaxPolicy(which=which).plan(g)
        assert plan.saved_forward(g) == keep  # the rest is recomputed exactly once more
        assert set(np.flatnonzero(plan.compute_counts() == 2)) == set(fwd_idx(g)) - keep


@needs_bench
def test_jax_policy_name_fallback_on_published_vgg16():
    g = remat.load_graph(f"{BENCH}/VGG16_b256_224x224_train.json")
    names = {g.nodes[i].name for i in saveable_nodes(g, "dots_saveable")}
    assert "block1_conv1" in names and "fc1" in names and "predictions" in names
    assert not any("pool" in n or n == "flatten" for n in names)
    nb = {g.nodes[i].name for i in saveable_nodes(g, "dots_with_no_batch_dims_saveable")}
    assert nb == {"fc1", "fc2", "predictions"}


def test_articulation_points_hand():
    assert articulation_points(remat.chain_graph(5)) == [1, 2, 3, 4]
    # a -> b, a -> c, (b, c) -> d, d -> e: only d disconnects the forward graph
    g = remat.make_graph(["a", "b", "c", "d", "e", "ge"],
                         [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (4, 5), (3, 5)],
                         out_bytes=[1] * 6, time_s=[1.0] * 6, is_backward=[False] * 5 + [True])
    assert articulation_points(g) == [3]


def test_sqrtn_segments():
    L = 16
    g = remat.chain_graph(L, sizes=1)
    plan = SqrtN().plan(g)
    rep = remat.simulate(g, plan)
    ckpts = plan.meta["retained"]
    assert len(ckpts) == 3 and plan.meta["segments"] == 4  # round(sqrt(17)) segments
    counts = plan.compute_counts()[fwd_idx(g)]
    assert counts.max() == 2  # Chen et al.: one extra forward at most
    assert all(counts[c] == 1 for c in ckpts)
    assert rep.peak_bytes < g.no_remat_peak()


def test_sqrtn_budget_search_is_cheapest_fitting():
    rng = np.random.default_rng(4)
    L = 12
    g = remat.chain_graph(L, sizes=rng.integers(1, 6, L), fwd_costs=rng.uniform(1, 3, L))
    B = int(0.6 * g.no_remat_peak())
    plan = SqrtN(budget=B).plan(g)
    rep = remat.simulate(g, plan)
    assert rep.peak_bytes <= B
    for k in range(1, L + 1):
        other = remat.simulate(g, SqrtN(segments=k).plan(g))
        if other.peak_bytes <= B:
            assert rep.compute_time_s <= other.compute_time_s + 1e-9
    greedy = SqrtN(mode="greedy", budget=B).plan(g)
    assert remat.simulate(g, greedy).peak_bytes <= B
    with pytest.raises(InfeasibleBudgetError):
        SqrtN(mode="greedy", budget=3).plan(g)


def test_chen_greedy_rule_hand():
    from policies.sqrtn import greedy_checkpoints

    g = remat.chain_graph(6, sizes=[4, 1, 1, 4, 1, 1])
    # running totals: f0 4, f1 5 > 4 -> mark f1, reset; f2 1, f3 5 > 4 -> mark f3, reset;
    # f4 1, f5 2, loss 3
    assert greedy_checkpoints(g, [1, 2, 3, 4, 5], 4) == [1, 3]
    assert greedy_checkpoints(g, [2, 4], 4) == [2, 4]  # f2 at 6 > 4; then f3 4, f4 5 > 4


def test_every_classic_policy_on_chain_and_registry():
    g = remat.chain_graph(8, sizes=[2, 3, 1, 4, 1, 5, 9, 2], fwd_costs=1.5)
    for name, opts in [("recompute_all", {}), ("jax_policy", {"which": "dots_saveable"}),
                       ("sqrtn", {}), ("sqrtn", {"mode": "greedy"}), ("griewank", {}),
                       ("chain_dp", {"budget": "70%"})]:
        pol = policies.get(name, **opts)
        plan = pol.plan(g)
        plan.validate(g)
        for key in ("policy", "budget", "status", "solve_time_s"):
            assert key in plan.meta
        assert plan.meta["policy"] == name
        assert plan.meta["status"] in ("optimal", "heuristic", "feasible")
    assert {"recompute_all", "jax_policy", "sqrtn", "griewank", "chain_dp"} <= set(policies.available())


@needs_bench
def test_classic_policies_on_published_resnet50():
    g = remat.load_graph(f"{BENCH}/ResNet50_b256_224x224_train.json")
    peaks = {}
    for pol in (RecomputeAll(), JaxPolicy(which="nothing_saveable"), SqrtN()):
        plan = pol.plan(g)
        rep = remat.simulate(g, plan)
        peaks[pol.name] = rep.peak_bytes
    # recompute-all is the minimal-memory end: below sqrt(n) and far below checkpoint-all
    assert peaks["recompute_all"] < peaks["sqrtn"] < g.no_remat_peak()
    # plan_from_checkpoints with every forward node retained is checkpoint-all
    every = plan_from_checkpoints(g, fwd_idx(g))
    assert remat.simulate(g, every).peak_bytes == g.no_remat_peak()
