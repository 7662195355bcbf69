"""The hierarchical policy (issue 35): blocks at the forward graph's articulation points, exact
op-level options per block, rotor's DP across blocks.

Independent references: the cuts of hand-built graphs, each option programme against brute
force over every kept set, the policy's cost against the Checkmate MILP's proven optimum on the
same graph (a lower bound: hierarchical searches a subset of Checkmate's schedules), and the
drop-in's gradients against ``jax.value_and_grad``.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.limits import SAFETY_S, pinned_host_profile
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
import remat
from remat.core.errors import InfeasibleBudgetError, InvalidOptionError, SolverError
from remat.core.schedule import replay
from solvers.hierarchical import block_chain, block_options


def _with_backward(fwd_edges, n_fwd, sizes, costs):
    """A training graph: forward nodes ``0..n_fwd-1`` with ``fwd_edges``, a loss-side backward
    node per forward node in reverse (``g_i`` reads ``g_{i+1}``, ``i`` and the forward nodes
    that read ``i``)."""
    edges = set(fwd_edges)
    succ = {i: [d for s, d in fwd_edges if s == i] for i in range(n_fwd)}
    for k in range(n_fwd):
        i = n_fwd - 1 - k  # backward node n_fwd + k differentiates forward node i
        g = n_fwd + k
        if k:
            edges.add((g - 1, g))
        edges.add((i, g))
        for d in succ[i]:
            edges.add((d, g))
    names = [f"f{i}" for i in range(n_fwd)] + [f"g{n_fwd - 1 - k}" for k in range(n_fwd)]
    return remat.make_graph(names, sorted(edges), out_bytes=list(sizes) + list(sizes[::-1]),
                            time_s=list(costs) + list(costs[::-1]),
                            flops=[1e3 * c for c in list(costs) + list(costs[::-1])],
                            is_backward=[False] * n_fwd + [True] * n_fwd)


def _residual(blocks: int, inner: int = 3, big: dict[int, int] | None = None):
    """A ResNet-like chain: each block ``x -> c_1 .. c_inner -> add(x, c_inner)``; ``big``:
    node -> bytes overriding the pattern."""
    edges, nodes = [], 0
    prev = None
    for _ in range(blocks):
        first = nodes
        for j in range(inner):
            src = prev if j == 0 else first + j - 1
            if src is not None:
                edges.append((src, first + j))
        add = first + inner
        edges.append((first + inner - 1, add))
        if prev is not None:
            edges.append((prev, add))
        prev, nodes = add, add + 1
    sizes = [4 + (i % (inner + 1)) for i in range(nodes)]  # the same in every block
    sizes = [(big or {}).get(i, s) for i, s in enumerate(sizes)]
    return _with_backward(edges, nodes, sizes, [1.0 + (i % 2) for i in range(nodes)]), nodes


def test_cuts_of_a_residual_chain_are_its_block_outputs():
    g, n = _residual(4)
    chain = block_chain(g)
    # the first block has no skip (the batch is a free input): a chain 0 -> 1 -> 2 -> 3, cut
    # after every node; then one cut per residual block
    assert [b.out for b in chain.blocks] == [0, 1, 2, 3, 7, 11, 15]
    # the residual blocks are one distinct block, but for the last: its backward starts the
    # backward pass (no incoming cotangent)
    assert chain.distinct.tolist() == [0, 1, 2, 3, 4, 4, 6]
    # every backward node belongs to exactly one block, in topological order
    bw = np.concatenate([b.bwd for b in chain.blocks[::-1]])
    assert sorted(bw.tolist()) == list(range(n, 2 * n))
    assert all(np.all(np.diff(b.bwd) > 0) for b in chain.blocks)


def test_a_long_skip_makes_one_block():
    # 0 -> 1 -> 2 -> 3 -> 4 and 0 -> 4 (a U-Net-style skip around everything)
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)]
    g = _with_backward(edges, 5, [4] * 5, [1.0] * 5)
    chain = block_chain(g)
    assert [b.out for b in chain.blocks] == [0, 4]


def _brute_force_best(g, blk, cap):
    """Least recompute cost over every kept set within ``cap`` bytes (independent walk)."""
    interior = [int(v) for v in blk.fwd if int(v) != blk.out]
    avail0 = {blk.out} | ({blk.inp} if blk.inp >= 0 else set())
    best = np.inf
    for r in range(len(interior) + 1):
        for keep in itertools.combinations(interior, r):
            if sum(int(g.sizes[v]) for v in keep) > cap:
                continue
            avail = avail0 | set(keep)
            rec, todo = set(), [int(u) for u in blk.reads if int(u) not in avail]
            while todo:
                v = todo.pop()
                if v not in rec:
                    rec.add(v)
                    todo += [p for p in g.preds[v] if p in set(interior) and p not in avail]
            best = min(best, sum(float(g.costs[v]) for v in rec))
    return best


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.lists(st.integers(1, 9), min_size=12, max_size=12),
       st.lists(st.integers(1, 5), min_size=12, max_size=12), st.randoms(use_true_random=False))
def test_each_option_is_the_brute_force_optimum_at_its_kept_bytes(inner, sizes, costs, rnd):
    # one block of `inner` nodes with random extra edges inside
    edges = [(i, i + 1) for i in range(inner + 1)]
    for _ in range(inner):
        a = rnd.randrange(0, inner)
        b = rnd.randrange(a + 1, inner + 1)
        if (a, b) not in edges:
            edges.append((a, b))
    n = inner + 2
    g = _with_backward(sorted(edges), n, sizes[:n], [float(c) for c in costs[:n]])
    chain = block_chain(g)
    for blk in chain.blocks:
        opts = block_options(g, blk, set(chain.pinned.tolist()), caps=6)
        assert opts.status == "optimal"
        for o in opts.options:
            interior_kept = o.kept - int(g.sizes[blk.out])
            assert o.recompute == pytest.approx(_brute_force_best(g, blk, interior_kept))


def _tanh_mlp_loss(ws, x):
    """Layers ``tanh(h @ w)``, mean of squares."""
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.mean(x ** 2)


def _plain_mlp_graph(depth=6, width=32, batch=64):
    ws = [jnp.ones((width, width)) * 0.01 for _ in range(depth)]
    x = jnp.ones((batch, width))
    return remat.extract(_tanh_mlp_loss, ws, x, stages="eqn")


def _residual_only(g) -> np.ndarray:
    """Forward nodes from which the loss (the last forward node) cannot be reached."""
    fwd = np.flatnonzero(~g.is_backward_array)
    reach = {int(fwd[-1])}
    for v in fwd[::-1]:
        if int(v) in reach:
            reach.update(p for p in g.preds[int(v)] if not g.is_backward_array[p])
    return np.asarray([int(v) for v in fwd if int(v) not in reach], dtype=np.int64)


@pytest.mark.parametrize("frac", [0.5, 0.65, 0.8])
def test_plan_fits_replay_and_is_within_the_milp_bound(frac):
    g = _plain_mlp_graph()
    b = int(frac * g.no_remat_peak())
    p = policies.get("hierarchical", budget=b).plan(g)
    assert replay(g, p).peak_bytes <= b == p.meta["budget"]
    cost = float(p.compute_counts() @ g.costs)
    cm = policies.get("checkmate", budget=b, time_limit=SAFETY_S).plan(g)
    # the MILP's schedules run every forward node in the forward pass; the block DP's may leave
    # a residual-only value (``1 - y**2`` of a tanh, read only by the backward) to the
    # backward alone, as ``jax.checkpoint`` does.  Beyond that one run of each, its schedules
    # are among the MILP's: its proven bound, less those runs, is below any plan's cost
    # (whether or not it proves optimality within the time limit, so no speed dependence)
    assert cost >= cm.meta["lower_bound"] * (1 - 1e-6) - float(g.costs[_residual_only(g)].sum())
    assert cost <= 1.6 * cm.meta["objective"]  # and the block DP stays close to its plan


def _tanh_mlp_with_bias_graph(depth=6, width=64, batch=256):
    """Each layer ``tanh(h @ w + b)``: its blocks are the contraction, the bias add, the tanh,
    and ``1 - y**2`` (tanh's residual) with the next contraction."""
    def loss(params, x):
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
        return jnp.mean((h - 1.0) ** 2)

    k = jax.random.PRNGKey(0)
    params = [(jax.random.normal(jax.random.fold_in(k, i), (width, width)) / 8, jnp.zeros(width))
              for i in range(depth)]
    with pinned_host_profile():  # the same costs, so the same instance, on any machine
        return remat.extract(loss, params, jnp.ones((batch, width)), stages="eqn")


_JAX_BEFORE_0_10 = tuple(int(x) for x in jax.__version__.split(".")[:2]) < (0, 10)


@pytest.mark.parametrize("frac", [
    pytest.param(0.5, marks=pytest.mark.xfail(
        _JAX_BEFORE_0_10, strict=True,
        reason="jax 0.8's tanh backward reads both y and 1 - y (92 nodes, not 79): the plan is "
               "2.6% over the MILP's optimum at 45-60% with the pinned costs (not yet explained)")),
    0.7])
def test_on_a_tanh_mlp_the_plan_is_within_2pct_of_the_milp_optimum(frac):
    """The last block of a recomputed segment is re-run without its output (its cotangent is
    given): without that, every such segment replays a contraction and the plan cost 5.5% over
    the MILP's optimum at 50%.  The graph is extracted with the host profile pinned, so the
    instance is the same on any machine."""
    g = _tanh_mlp_with_bias_graph()
    b = int(frac * g.no_remat_peak())
    # block options proven optimal whatever the machine's speed
    p = policies.Hierarchical(budget=b, option_time_limit=SAFETY_S).plan(g)
    assert p.meta["option_status"] == "optimal"
    assert replay(g, p).peak_bytes <= b
    cm = policies.get("checkmate", budget=b, time_limit=SAFETY_S).plan(g)
    assert cm.meta["status"] == "optimal"
    assert float(p.compute_counts() @ g.costs) <= 1.02 * cm.meta["objective"]


def test_no_remat_budget_is_checkpoint_all_and_too_small_names_the_minimum():
    g = _plain_mlp_graph()
    p = policies.get("hierarchical", budget=g.no_remat_peak()).plan(g)
    assert p.compute_counts().max() == 1
    with pytest.raises(InfeasibleBudgetError) as e:
        policies.get("hierarchical", budget=64).plan(g)
    mf = e.value.min_feasible_bytes
    assert 64 < mf < g.no_remat_peak()
    q = policies.get("hierarchical", budget=int(mf)).plan(g)  # the named minimum plans
    assert replay(g, q).peak_bytes <= mf


def test_below_its_modelled_floor_a_compiled_budget_loop_gets_a_plan_that_holds_less():
    """One block's backward needs a large value (its least transient is the floor of every
    schedule).  Below that floor the policy refuses, but for the compiled-budget loop
    (``ctx.compiled_budget``) it returns a plan marked over the modelled budget whose every
    node outside that block runs within the budget; the uncapped floor plan spends the slack
    the large transient leaves and holds more there."""
    from remat.core.context import PolicyContext
    from remat.core.events import COMPUTE, lower

    g, _ = _residual(8, big={9: 400})
    pol = policies.get("hierarchical")
    floor = pol.min_feasible_budget(g)
    chain = block_chain(g)
    blk = next(bk for bk in chain.blocks if 9 in set(int(v) for v in bk.fwd))
    inside = set(int(v) for v in blk.fwd) | set(int(v) for v in blk.bwd)

    def outside_peak(plan):
        ev = lower(g, plan)
        c = (ev.kind == COMPUTE) & ~np.isin(ev.node, list(inside))
        return int(ev.live[c].max())

    least = pol.plan(g, floor)
    b = int(0.55 * floor)
    assert outside_peak(least) > b  # the floor plan holds more than b outside the block
    with pytest.raises(InfeasibleBudgetError):
        pol.plan(g, b)
    p = pol.plan(g, b, ctx=PolicyContext(compiled_budget=True))
    assert p.meta["over_modelled_budget"] == replay(g, p).peak_bytes - b > 0
    assert p.meta["transient_cap"] >= 0
    assert outside_peak(p) <= b
    unmarked = dataclasses.replace(p, meta={k: v for k, v in p.meta.items()
                                            if k != "over_modelled_budget"})
    with pytest.raises(SolverError):  # unmarked, a plan over the budget is a bug
        pol._finish(g, unmarked, b, PolicyContext(compiled_budget=True), 0.0)


@pytest.mark.parametrize("cap", [0, 5, 40, 10**9])
def test_capped_transients_keep_each_blocks_options_apart(cap):
    """Each block's transients are shifted down together until its least is at most ``cap``:
    blocks already within it are untouched, and an option's excess over its block's least
    is kept (the DP still prefers the block's leaner options)."""
    from policies.hierarchical import capped_transients

    g, _ = _residual(6, big={9: 400})
    costs = policies.Hierarchical()._prepare(g)[2]
    c = capped_transients(costs, cap)
    for b in range(len(costs.cf)):
        for t0, t1 in ((costs.tb[b, :costs.nopt[b]], c.tb[b, :c.nopt[b]]),
                       (costs.tk[b, :costs.nopt[b]], c.tk[b, :c.nopt[b]])):
            if t0.min() <= cap:
                np.testing.assert_array_equal(t1, t0)
            else:
                np.testing.assert_array_equal(t1, t0 - (t0.min() - cap))
    np.testing.assert_array_equal(c.tf, np.minimum(costs.tf, cap))
    with pytest.raises(InvalidOptionError):
        capped_transients(costs, -1)


def test_bad_options_are_typed():
    for opt in (dict(levels=0), dict(caps=-1), dict(rounds=True), dict(option_time_limit=0),
                dict(microbatch="yes")):
        with pytest.raises(InvalidOptionError):
            policies.get("hierarchical", **opt)


def test_dropin_plans_at_equation_granularity_with_the_unmodified_gradients():
    def loss(params, x):
        h = x
        for w, b in params:
            h = jax.nn.gelu(h @ w + b) + h  # residual blocks
        return jnp.mean(h ** 2)

    k = jax.random.PRNGKey(0)
    params = [(jax.random.normal(jax.random.fold_in(k, i), (32, 32)) * 0.2, jnp.zeros(32))
              for i in range(6)]
    x = jax.random.normal(k, (64, 32))
    vg = remat.value_and_grad(loss, "hierarchical", budget=remat.modelled("50%"))
    app = vg.applied(params, x)
    assert app.graph.meta.get("stages", "eqn") == "eqn" or app.graph.n > 100
    assert app.plan.meta["blocks"] >= 6 and app.plan.compute_counts().max() > 1
    v, g = jax.jit(vg)(params, x)
    v0, g0 = jax.jit(jax.value_and_grad(loss))(params, x)
    np.testing.assert_allclose(v, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(st.integers(2, 5), st.integers(1, 3), st.floats(0.2, 1.0))
def test_the_block_dp_never_under_counts_the_replayed_peak(blocks, inner, frac):
    """The DP's memory model against the replay of its own schedule (``remat.core.schedule``,
    the graph's memory semantics): a schedule the table accepts within ``m`` bytes replays
    within ``m`` (rounded up to the table's unit) plus the pinned values."""
    from policies.from_checkpoints import plan_from_steps
    from solvers.hierarchical import block_steps, fill_blocks, schedule

    g, _ = _residual(blocks, inner)
    pol = policies.Hierarchical()
    chain, options, costs = pol._prepare(g)
    table = fill_blocks(costs, g.no_remat_peak(), levels=64)
    lo = table.min_memory
    m = int(lo + frac * (g.no_remat_peak() - lo)) if np.isfinite(lo) else None
    if m is None:
        return
    sched = schedule(table, m)
    plan = plan_from_steps(g, block_steps(g, chain, options, sched.ops))
    pinned = int(g.sizes[chain.pinned].sum()) if len(chain.pinned) else 0
    assert replay(g, plan).peak_bytes <= sched.memory + table.unit + pinned
    assert float(plan.compute_counts() @ g.costs) == pytest.approx(sched.cost, rel=1e-9)


_MEASURE = r"""
import json, sys, warnings
sys.path.insert(0, "tests")
import jax, jax.numpy as jnp
import policies, remat
from helpers import outside_models as om


def measure(loss, params, batch, pct):
    # options proven optimal whatever the machine's speed (a block's programme takes ms), and
    # costs from a fixed host profile: the same plans on a loaded machine
    vg = remat.value_and_grad(loss, policies.Hierarchical(option_time_limit=120.0),
                              budget=f"{pct}%")
    with warnings.catch_warnings(), remat.devices.fixed_host(5e10, 3.5e10):
        warnings.simplefilter("ignore")
        app = vg.applied(params, batch)
        temp = jax.jit(vg).lower(params, batch).compile().memory_analysis().temp_size_in_bytes
        v, g = jax.jit(vg)(params, batch)
    v0, g0 = jax.jit(jax.value_and_grad(loss))(params, batch)
    err = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-12))
              for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)))
    # relative to each leaf's largest entry, floored at 1e-3 of the largest of all leaves (a
    # leaf whose exact gradient is zero holds rounding noise)
    top = max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(g0))
    err_floored = max(float(jnp.max(jnp.abs(a - b)) / max(float(jnp.max(jnp.abs(b))), 1e-3 * top))
                      for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)))
    return dict(k=app.plan.microbatches, budget=app.budget_bytes, temp=temp,
                loop_temp=app.compiled_temp_bytes, baseline=app.baseline_temp_bytes,
                semantics=app.budget_semantics, err=err, err_floored=err_floored, pct=pct,
                value_err=abs(float(v) - float(v0)) / abs(float(v0)),
                regions=len(app.plan.meta.get("regions", ())),
                scans=len(app.plan.meta.get("scans", ())),
                recomputes=int(app.plan.compute_counts().max()),
                option_status=app.plan.meta.get("option_status"), notes=list(app.notes),
                over_modelled=app.plan.meta.get("over_modelled_budget"))
"""
_COMPILED = _MEASURE + r"""
print(json.dumps([dict(name=name, **measure(*build(), 50)) for name, build in (
    ("plain_transformer", lambda: om.plain_transformer(layers=4, batch=4, seq=16, width=16,
                                                       vocab=64)),
    ("linen_mlp", lambda: om.linen_mlp(batch=64)),
    ("linen_scan_transformer", om.linen_scan_transformer))]))
"""


@pytest.mark.slow
def test_dropin_at_half_the_compiled_temp_with_per_block_checkpoints():
    """With XLA:CPU keeping ``jax.checkpoint`` (the flag), the drop-in at ``"50%"`` compiles,
    independently of the loop's own figure, to at most the budget with JAX's gradients,
    through the plan's per-block checkpoint regions (and, on a Flax ``nn.scan`` stack, a
    per-iteration decision for the scan)."""
    from helpers.xla_subprocess import run_json

    rows = run_json(_COMPILED)
    for r in rows:
        assert r["semantics"] == "compiled", r
        assert r["regions"] >= 2, r
        assert r["recomputes"] >= 2 or r["scans"], r
        assert r["option_status"] == "optimal", r
        assert r["temp"] <= r["budget"] and r["budget"] <= 0.5 * r["baseline"] + 1, r
        assert r["err"] < 1e-5 and r["value_err"] < 1e-5, r
    # the scanned stack is planned around a per-iteration decision of its scan
    assert [r["scans"] for r in rows if r["name"] == "linen_scan_transformer"] == [1], rows


def test_plans_with_malformed_regions_are_refused_before_any_work():
    """Regions that overlap, leave their parent or save nodes outside themselves are an
    ``InvalidPlanError`` from ``remat.errors`` when the drop-in applies the plan."""
    from remat.apply import apply_plan
    from remat.core.regions import CheckpointRegion

    loss = _tanh_mlp_loss
    ws = [jnp.eye(8) * 0.5 for _ in range(4)]
    x = jnp.ones((4, 8))
    g = remat.extract(loss, ws, x, stages="eqn")
    plan = policies.get("hierarchical", budget=int(0.6 * g.no_remat_peak())).plan(g)
    assert plan.meta["regions"]
    apply_plan(loss, (ws, x), None, graph=g, plan=plan)  # the policy's own regions apply
    nfwd = int((~g.is_backward_array).sum())
    bad = [(CheckpointRegion(0, 4), CheckpointRegion(2, 6)),  # overlap
           (CheckpointRegion(0, nfwd + 1),),  # past the forward nodes
           (CheckpointRegion(0, 3, saves=(5,)),),  # saves a node outside itself
           (CheckpointRegion(0, 6, children=(CheckpointRegion(4, 8),)),)]  # leaves its parent
    for regions in bad:
        with pytest.raises(remat.errors.InvalidPlanError):
            apply_plan(loss, (ws, x), None, graph=g, plan=plan.with_meta(regions=regions))


def test_applied_regions_run_the_plans_flops_on_batch_statistics():
    """BatchNorm's statistics (``mean(z**2)``) and ReLUs make JAX's residuals of the replayed
    program differ from the extracted graph's (``2 * z`` of the square, the ReLU's mask): the
    regions save what those are computed from, so the applied step's jaxpr FLOPs are the
    plan's.  Saving the graph's residual nodes by name instead recomputed every convolution
    (1.26x against the plan's 1.001x)."""
    from remat.measurement import step_flops

    loss, params, batch = remat.zoo.get("resnet18", batch_size=4, image_size=16, width=8,
                                        stage_sizes=(1, 1, 1, 1))
    vg = remat.value_and_grad(loss, policies.Hierarchical(option_time_limit=SAFETY_S),
                              budget=remat.modelled("90%"))
    with warnings.catch_warnings():  # saving operands may exceed the plan's residual bytes
        warnings.simplefilter("ignore")
        app = vg.applied(params, batch)
    base = step_flops(jax.value_and_grad(loss), params, batch)
    plan_x = app.predicted_flops / float(app.graph.flops_array.sum())
    assert step_flops(vg, params, batch) / base <= plan_x + 0.02


def test_a_batch_that_does_not_fit_is_micro_batched_unless_the_samples_interact():
    """Below the whole batch's smallest replayed peak, the DenseNet-style stack (one block: no
    cut) is planned as ``k`` micro-batches on ``ctx.graph_at(k)``, the smallest ``k`` that fits;
    with coupled samples (BatchNorm) or micro-batching off it is refused, naming the whole
    batch's minimum."""
    import dataclasses

    from helpers import outside_models as om

    from remat.apply import planning_context

    with pinned_host_profile():  # the same costs (and options) on any machine
        loss, ws, x = om.densenet(depth=4, width=16, batch=128)
        g = remat.extract(loss, ws, x, stages="eqn")
        ctx = planning_context(loss, (ws, x), g)
        assert not ctx.batch_coupled and ctx.microbatch_counts()
        pol = policies.Hierarchical(option_time_limit=SAFETY_S)
        floor = pol.min_feasible_budget(g)  # the whole batch (no ctx)
        b = int(0.8 * floor)
        p = pol.plan(g, b, ctx=ctx)
        k = p.microbatches
        assert k > 1 and "micro-batches" in p.meta["microbatch_reason"]
        assert replay(ctx.graph_at(k), p).peak_bytes <= b
        for fewer in (j for j in ctx.microbatch_counts() if j < k):
            with pytest.raises(InfeasibleBudgetError):
                pol._solve_batch(ctx.graph_at(fewer), b)
        for refuse, why in ((dataclasses.replace(ctx, batch_coupled=True), "BatchNorm"),
                            (ctx, "disabled")):
            q = pol if why == "BatchNorm" else dataclasses.replace(pol, microbatch=False)
            with pytest.raises(InfeasibleBudgetError, match=why) as e:
                q.plan(g, b, ctx=refuse)
            assert e.value.min_feasible_bytes == floor
        # a budget no micro-batch count meets names the one-sample floor, which plans
        with pytest.raises(InfeasibleBudgetError) as e:
            pol.plan(g, 64, ctx=ctx)
        mf = int(e.value.min_feasible_bytes)
        assert 64 < mf < floor
        q = pol.plan(g, mf, ctx=ctx)
        assert q.microbatches > k and replay(ctx.graph_at(q.microbatches), q).peak_bytes <= mf


_MICROBATCHED = _MEASURE + r"""
print(json.dumps(measure(*om.densenet(depth=4, width=16, batch=32), 40)))
"""


@pytest.mark.slow
def test_dropin_micro_batches_a_stack_whose_whole_batch_does_not_fit():
    """At 40% of the compiled no-remat temp the concatenating stack does not fit as one batch:
    the drop-in runs ``k`` accumulated micro-batches whose step (the ``lax.scan`` over the full
    batch, compiled here independently) is within the budget, with the loop's own figure equal to
    it (it compiled the micro-batch step alone before) and JAX's gradients."""
    from helpers.xla_subprocess import run_json

    r = run_json(_MICROBATCHED)
    assert r["semantics"] == "compiled" and r["k"] > 1, r
    assert any(f"chose {r['k']} accumulated micro-batches" in n for n in r["notes"]), r
    assert r["temp"] <= r["budget"] and r["budget"] <= 0.4 * r["baseline"] + 1, r
    assert r["loop_temp"] == r["temp"], r
    assert r["err"] < 1e-5 and r["value_err"] < 1e-5, r


def test_residuals_are_sized_as_what_a_region_saves():
    """On a BatchNorm ResNet a ReLU's ``bool`` mask kept by a region costs its ``float32``
    operand (JAX re-derives the mask from it): ``region_saved_graph`` sizes every node the loss
    does not depend on so and leaves the loss's ancestors alone."""
    from remat.core.regions import region_saved_graph

    loss, params, batch = remat.zoo.get("resnet18", batch_size=4, image_size=16, width=8,
                                        stage_sizes=(1, 1, 1, 1))
    g = remat.extract(loss, params, batch, stages="eqn")
    r = region_saved_graph(g)
    grown = np.flatnonzero(r.sizes != g.sizes)
    assert len(grown) and (r.sizes >= g.sizes).all()
    nf = int((~g.is_backward_array).sum())
    live = set(g.ancestors_outside([nf - 1], set(), through_backward=False))
    assert not set(grown.tolist()) & live and grown.max() < nf
    assert [v for v in grown if 4 * g.sizes[v] == r.sizes[v]]  # bool -> float32
    p = policies.Hierarchical(budget="70%").plan(g)
    assert p.meta["peak_bytes"] == replay(r, p).peak_bytes  # the plan is held to those sizes
    with pytest.raises(remat.errors.InvalidGraphError):
        region_saved_graph({"nodes": []})


_DEPTHWISE = _MEASURE + r"""
loss, params, batch = remat.zoo.get(
    "mobilenet_v2", batch_size=8, image_size=32, width_mult=0.25,
    inverted_residual_setting=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 160, 2, 2)))
r = measure(loss, params, batch,
            70 if tuple(int(x) for x in jax.__version__.split(".")[:2]) < (0, 10) else 60)
# JAX against itself: the step jitted and run op by op (same floored relative error)
g0 = jax.jit(jax.value_and_grad(loss))(params, batch)[1]
g1 = jax.value_and_grad(loss)(params, batch)[1]
top = max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(g0))
r["noise"] = max(float(jnp.max(jnp.abs(a - b)) / max(float(jnp.max(jnp.abs(b))), 1e-3 * top))
                 for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)))
print(json.dumps(r))
"""


@pytest.mark.slow
def test_dropin_plans_around_the_scratch_of_depthwise_weight_gradients():
    """A short MobileNetV2 (BatchNorm, depthwise convolutions up to 960 channels at 2x2) at
    ``"60%"``: XLA:CPU computes each depthwise weight gradient through a dense
    ``[3, 3, C, C]`` product (:mod:`remat.workspace`), 0.5 of the budget for the widest.  With
    that scratch in the blocks' backward transients the plan holds little while it runs and
    compiles within the budget; without it the smallest plan compiled to 5.14 MiB against a
    4.43 MiB budget (measured once, jax 0.12).  Before jax 0.10 the no-remat step compiles
    smaller and the budget is 70%.  Gradients: relative to each leaf's largest entry floored
    at 1e-3 of the largest of all (a projection's BatchNorm bias feeds the next block's
    BatchNorm, so its exact gradient is zero and its entries are rounding noise), within 1e-5
    or twice what ``jax.value_and_grad`` jitted and run op by op differ by on this model
    (7.5e-5 on jax 0.12, where the plan's is 3.6e-5); a wrong gradient is off by O(1)."""
    from helpers.xla_subprocess import run_json

    r = run_json(_DEPTHWISE)
    assert r["k"] == 1 and r["recomputes"] >= 2, r
    assert r["temp"] <= r["budget"], r
    assert r["budget"] <= r["pct"] / 100 * r["baseline"] + 1, r
    assert r["err_floored"] <= max(1e-5, 2 * r["noise"]), r


def _zoo_resnet_script(name: str, batch: int, pct: int, pct_before_0_10: int) -> str:
    """The measure script for zoo ``name`` at 16 px, width 8 and one block per stage, at
    ``pct`` % of the compiled no-remat temp (``pct_before_0_10`` % before jax 0.10)."""
    return _MEASURE + f"""
old = tuple(int(x) for x in jax.__version__.split(".")[:2]) < (0, 10)
print(json.dumps(measure(*remat.zoo.get({name!r}, batch_size={batch}, image_size=16, width=8,
                                        stage_sizes=(1, 1, 1, 1)),
                         {pct_before_0_10} if old else {pct})))
"""


def _assert_fits_with_jax_gradients(r: dict) -> None:
    assert r["k"] == 1 and r["recomputes"] >= 2, r
    assert r["temp"] <= r["budget"], r
    assert r["budget"] <= r["pct"] / 100 * r["baseline"] + 1, r
    assert r["err"] < 1e-5, r


@pytest.mark.slow
def test_dropin_fits_half_the_compiled_temp_of_a_batchnorm_resnet():
    """Zoo resnet18 (BatchNorm: no micro-batches) at ``"55%"`` compiles within the budget with
    JAX's gradients; its smallest plan compiles to 0.51 of the no-remat temp on jax 0.12 (so
    ``"50%"`` is refused naming it), sizing masks at one byte per element to 0.54.  Before
    jax 0.10, XLA:CPU compiles the no-remat step smaller and the smallest plan to 0.77 of it
    (0.84 before the region sizing): there the budget is 80%."""
    from helpers.xla_subprocess import run_json

    _assert_fits_with_jax_gradients(run_json(_zoo_resnet_script("resnet18", 16, 55, 80)))


@pytest.mark.slow
def test_dropin_fits_a_bottleneck_resnet_below_the_policys_modelled_floor():
    """Zoo resnet50 (bottleneck blocks, BatchNorm) at ``"50%"``: the first bottleneck's
    backward at equation granularity is the model's floor (0.53 of the no-remat temp when
    compiled, so the budget was refused); the compiled-budget loop's plans below that floor
    (``over_modelled_budget`` in their meta) hold less elsewhere and compile within the budget,
    with JAX's gradients.  Before jax 0.10 XLA:CPU compiles the no-remat step smaller and the
    smallest plan to 0.59 of it: there the budget is 65%."""
    from helpers.xla_subprocess import run_json

    r = run_json(_zoo_resnet_script("resnet50", 8, 50, 65))
    _assert_fits_with_jax_gradients(r)
    assert r["over_modelled"] is not None, r  # a plan from below the floor
    # over its internal budget (in the model), the drop-in says so
    assert any("below the policy's modelled floor" in n for n in r["notes"]) == (
        r["over_modelled"] > 0), r


@pytest.fixture(scope="module")
def linen_scan_graph():
    from helpers import outside_models as om

    loss, params, batch = om.linen_scan_transformer()
    return remat.extract(loss, params, batch, stages="eqn", device="rtx-3090")


@pytest.mark.parametrize("frac", [0.5, 0.7, 0.9])
def test_a_scan_is_planned_around_its_cheapest_decision_that_fits(frac, linen_scan_graph):
    """A scanned Flax transformer: the default plan, around a few points of the scan's Pareto
    front and its fewest-FLOPs point within the budget, costs what planning around every point
    of the front costs (a fixed device profile: no timing).  Around evenly spread points only
    it cost 1.01x at 70-90 % here, and on the GPU benchmark's full-size scan at 25-90 % it kept
    the 0.13x plan that ran 4 % slower than ScanLayers' at 0.27x."""
    from policies.hierarchical import Hierarchical

    g = linen_scan_graph
    budget = int(frac * g.no_remat_peak())
    default = Hierarchical(budget=budget).plan(g)
    every = Hierarchical(budget=budget, scan_options=1000).plan(g)  # the whole front
    assert default.meta["compute_cost"] <= every.meta["compute_cost"] * (1 + 1e-9)
