"""Scans (issue 12): extraction sees into ``lax.scan`` / ``nn.scan`` / ``nnx.scan``, ScanLayers
plans the per-iteration saved set and the nesting for a budget, the drop-in applies it with
exact gradients, and the plan's predicted saving is what XLA measures.

Models are written for these tests in :mod:`helpers.scan_models`, not taken from the zoo (a
plain-JAX ``lax.scan`` over stacked weights: tanh MLP blocks and an attention-like block; a Flax
linen ``nn.scan`` stack; a Flax nnx ``nnx.scan`` stack), small enough for the suite (width
16-32, 4-6 iterations).

References: ``jax.jit(jax.value_and_grad(loss))`` of the unmodified loss (float32, rtol 1e-5);
FLOPs by hand and by XLA's ``cost_analysis`` of the unrolled program; saved bytes from
``saved_residuals`` of the transformed function; XLA temp bytes from ``memory_analysis()`` in a
subprocess with the ``cse_barrier_expander`` pass disabled (XLA:CPU undoes ``jax.checkpoint``
otherwise).
"""

from __future__ import annotations

import os
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.scan_models import MODELS, linen_scan, nnx_scan, scan_attention, scan_mlp
from helpers.xla_subprocess import run_json

import policies
import remat
from policies.scan_layers import frontier
from remat._jax_compat import JAX_VERSION
from remat.apply import apply_plan
from remat.core.errors import InfeasibleBudgetError, NotApplicableError
from remat.measurement import residual_bytes
from remat.scans import ScanDecision, adjusted_graph, unroll_scans


def close(a, b):
    """Same pytree, every leaf equal to float32 precision (rtol 1e-5)."""
    jax.tree_util.tree_map(
        lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                                                atol=1e-6), a, b)


# ----------------------------------------------------------------------------- models
# (iterations, carry bytes, forward FLOPs of one iteration by hand)
HAND = {
    scan_mlp: (6, 64 * 32 * 4, 2 * 64 * 32 * 32 + 64 * 32),  # dot + tanh
    # two dots, bias adds and tanh of width 64, bias add and residual add of width 32
    nnx_scan: (4, 32 * 32 * 4, 2 * (2 * 32 * 32 * 64) + 2 * 32 * 64 + 2 * 32 * 32),
    scan_attention: (4, 4 * 16 * 16 * 4, None),
    linen_scan: (4, 32 * 32 * 4, None),
}


def _cost_flops(fn, *args) -> float:
    ca = jax.jit(fn).lower(*args).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca["flops"]) + float(ca.get("transcendentals", 0.0))


# ----------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("make", MODELS)
def test_extract_sees_into_the_scan(make):
    loss, params, x = make()
    g = remat.extract(loss, params, x)
    (body,) = g.program.scans
    L, carry, per_iter = HAND[make]
    assert body.length == L and body.num_carry == 1 and body.carry_bytes == carry
    # the carry is an activation, the stacked parameters are not
    nc = body.num_consts
    assert body.input_is_activation[nc] and not body.input_is_activation[nc + 1:].any()
    assert len(body.anchors) >= 1 and body.needs
    # the scan is one forward stage and one backward stage, named as a repetition
    fwd = [v for v in g.nodes if f"[scan x{L}]" in v.name]
    assert [v.is_backward for v in fwd] == [False, True], [v.name for v in g.nodes]
    # FLOPs: per iteration by hand, the stage pair = L x (forward + backward of the body)
    if per_iter is not None:
        assert body.fwd_flops == per_iter
    assert sum(v.flops for v in fwd) == pytest.approx(L * (body.fwd_flops + body.bwd_flops))
    # and the scan's forward (plus the loss: square and mean) is what XLA counts on the
    # unrolled program (LayerNorm's statistics are counted slightly differently: 3%)
    closed = unroll_scans(jax.make_jaxpr(loss)(params, x))
    assert "scan" not in str(closed)

    def unrolled_loss(p, xx):
        return jax.core.eval_jaxpr(closed.jaxpr, closed.consts,
                                   *jax.tree_util.tree_leaves((p, xx)))[0]

    close(unrolled_loss(params, x), loss(params, x))
    xla = _cost_flops(unrolled_loss, params, x)
    assert L * body.fwd_flops + 2 * x.size == pytest.approx(xla, rel=0.03)
    unrolled = remat.extract(loss, params, x, scans="unroll")
    # the unrolled view: one copy of the body per iteration, no scan left to plan
    assert not unrolled.program.scans
    assert len(unrolled.forward_nodes) > len(g.forward_nodes)


def test_body_names_come_from_the_modules():
    loss, params, x = linen_scan()
    g = remat.extract(loss, params, x)
    (body,) = g.program.scans
    assert any("layers/Dense_0" in body.anchor_name(j) for j in body.anchors)
    assert any("layers" in v.name and "scan" in v.name for v in g.forward_nodes)


# ----------------------------------------------------------------------------- planning
@pytest.mark.parametrize("make", MODELS)
def test_scan_layers_plans_every_budget_with_exact_gradients(make):
    """ScanLayers from no budget down to its smallest feasible one: every plan fits its
    budget, FLOPs grow as the budget falls, the drop-in gives the unmodified step's value and
    gradients, and what the transformed step saves is what the plan predicts."""
    loss, params, x = make()
    g = remat.extract(loss, params, x)
    plans = frontier(g)
    # jax >= 0.12 differentiates tanh from its output: JAX's own residuals of the tanh MLP are
    # then one value per iteration, and only "keep nothing" is below them
    least = 2 if make is scan_mlp and JAX_VERSION >= (0, 12) else 3
    assert len(plans) >= least, [p.meta["scans"] for _, p in plans]
    # no budget: JAX's own residuals (the fewest FLOPs); then strictly smaller peaks
    assert plans[0][1].meta["scans"] == ()
    peaks = [p.meta["peak_bytes"] for _, p in plans]
    flops = [p.meta["predicted_flops"] for _, p in plans]
    assert all(a > b for a, b in zip(peaks, peaks[1:])), peaks
    assert all(a < b for a, b in zip(flops, flops[1:])), flops
    for budget, p in plans[1:]:
        assert p.meta["peak_bytes"] <= budget and p.meta["status"] == "optimal"
        assert p.meta["peak_bytes"] == adjusted_graph(g, p.meta["scans"]).no_remat_peak()
    ref = jax.jit(jax.value_and_grad(loss))(params, x)
    # the last plan (the least memory) and the middle one
    for p in (plans[-1][1], plans[len(plans) // 2][1]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no RematFidelityWarning
            app = apply_plan(loss, (params, x), None, graph=g, plan=p)
        close(jax.jit(jax.value_and_grad(app.fn))(params, x), ref)
        assert app.residual_bytes == residual_bytes(app.fn, params, x)[0]
        assert abs(app.residual_bytes - app.predicted_residual_bytes) \
            <= 0.1 * app.predicted_residual_bytes, (p.meta["scans"], app.notes)
    # the drop-in, as users call it
    f = remat.value_and_grad(loss, policies.ScanLayers(budget="90%"))
    close(jax.jit(f)(params, x), ref)
    assert f.applied(params, x).plan.meta["scans"]


def test_every_decision_of_a_scan_is_exact_nested_included():
    """Each saved set x each group size (nested scans) of the MLP scan: exact gradients, the
    saved bytes the cost model predicts (to the loop counter), FLOPs as counted."""
    loss, ws, x = scan_mlp(L=4, B=16, W=16)
    g = remat.extract(loss, ws, x)
    (body,) = g.program.scans
    assert body.anchors == (0,) and body.groups() == [1, 2, 4]
    ref = jax.jit(jax.value_and_grad(loss))(ws, x)
    base = policies.checkpoint_all_plan(g).with_meta(trim_segments=False)
    seen = set()
    for saved in [(), (0,)]:
        for group in body.groups():
            d = ScanDecision(body.leaf, frozenset(saved), group)
            app = apply_plan(loss, (ws, x), None, graph=g, plan=base.with_meta(scans=(d,)))
            close(jax.jit(jax.value_and_grad(app.fn))(ws, x), ref)
            c = body.cost(saved, group)
            # nested scans also keep the group index (a 4-byte scalar per group)
            assert 0 <= app.residual_bytes - app.predicted_residual_bytes <= 4 * 4
            seen.add(c["residual_bytes"])
            vg_flops = remat.measurement.step_flops(jax.value_and_grad(app.fn), ws, x)
            # (JAX recomputes a few elementwise ops more than the model: 3%)
            assert vg_flops == pytest.approx(app.predicted_flops, rel=0.03)
    assert len(seen) >= 4
    # kept bytes: flat keeps the carry (+ the dot) per iteration, nested one carry per group
    B, W = 16, 16
    assert body.cost((), 1)["residual_bytes"] == 4 * B * W * 4
    assert body.cost((0,), 1)["residual_bytes"] == 4 * 2 * B * W * 4
    assert body.cost((), 2)["residual_bytes"] == 2 * B * W * 4
    assert body.cost((), 1)["recompute_flops"] == 4 * body.fwd_flops


def test_budget_below_the_smallest_feasible_one_is_refused_with_it():
    loss, ws, x = scan_mlp()
    g = remat.extract(loss, ws, x)
    with pytest.raises(InfeasibleBudgetError) as err:
        policies.ScanLayers(budget=1024).plan(g)
    smallest = err.value.min_feasible_bytes
    assert smallest > 1024 and str(int(smallest)) in str(err.value)
    assert frontier(g)[-1][1].meta["peak_bytes"] == smallest
    p = policies.ScanLayers(budget=int(smallest)).plan(g)
    assert p.meta["peak_bytes"] == smallest
    with pytest.raises(InfeasibleBudgetError):
        policies.ScanLayers(budget=int(smallest) - 1).plan(g)


def test_graphs_without_scans_are_not_applicable():
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    ws = [jnp.eye(8) * 0.5 for _ in range(3)]
    x = jnp.ones((4, 8))
    with pytest.raises(NotApplicableError):
        policies.ScanLayers(budget="50%").plan(remat.extract(loss, ws, x))
    sloss, sws, sx = scan_mlp(L=4, B=8, W=8)
    with pytest.raises(NotApplicableError):
        policies.ScanLayers().plan(remat.extract(sloss, sws, sx, scans="unroll"))


# ----------------------------------------------------------------------------- unrolled view
@pytest.mark.parametrize("make", [scan_mlp, linen_scan])
def test_unrolled_view_lets_every_policy_plan(make):
    loss, params, x = make()
    g = remat.extract(loss, params, x, scans="unroll")
    ref = jax.jit(jax.value_and_grad(loss))(params, x)
    pols = [policies.Checkmate(budget="85%", time_limit=5)]
    if make is scan_mlp:  # the tanh MLP unrolls into a chain (the linen block does not)
        assert g.is_chain()
        pols += [policies.SqrtN(), policies.ChainDP(budget="85%")]
    for pol in pols:
        p = pol.plan(g)
        assert p.R.sum() > g.n  # something is recomputed
        app = apply_plan(loss, (params, x), None, graph=g, plan=p)
        close(jax.jit(jax.value_and_grad(app.fn))(params, x), ref)
        assert app.residual_bytes < residual_bytes(loss, params, x)[0]


# ----------------------------------------------------------------------------- user policies
def test_checkpoint_policy_for_nn_scan_of_nn_remat():
    """``remat.checkpoint_policy`` of a flat ScanLayers plan is a plain JAX policy: a user's
    ``nn.scan(nn.remat(Block, policy=...))`` saves what the plan saves, gradients equal."""
    loss, params, x = linen_scan()
    g = remat.extract(loss, params, x)
    ref = jax.jit(jax.value_and_grad(loss))(params, x)
    checked = 0
    for budget, p in frontier(g)[1:]:
        p = policies.ScanLayers(budget=budget, nested=False).plan(g)
        pol = remat.checkpoint_policy(p, g)
        app = apply_plan(loss, (params, x), None, graph=g, plan=p)
        user_loss, _, _ = linen_scan(policy=pol)
        close(jax.jit(jax.value_and_grad(user_loss))(params, x), ref)
        assert residual_bytes(user_loss, params, x)[0] == app.residual_bytes, p.meta["scans"]
        checked += 1
    assert checked >= 2
    # a plan leaving the scan alone exports "everything saveable"
    p0 = policies.ScanLayers().plan(g)
    assert remat.checkpoint_policy(p0, g) is jax.checkpoint_policies.everything_saveable


def test_checkpoint_policy_for_jax_checkpoint_in_lax_scan():
    loss, p, x = scan_attention()
    g = remat.extract(loss, p, x)
    # the least-memory plan that keeps something (a percentage budget would depend on JAX's
    # own residuals, which differ between versions)
    plan = frontier(g, nested=False)[-2][1]
    (d,) = plan.meta["scans"]
    assert d.saved and d.group == 1
    pol = remat.checkpoint_policy(plan, g)
    D = x.shape[-1]

    def user_loss(p, x):
        def body(h, w):
            s = jnp.einsum("btd,bsd->bts", h @ w["q"], h) / np.sqrt(D)
            a = jax.nn.softmax(s, axis=-1)
            return h + jnp.tanh(jnp.einsum("bts,bsd->btd", a, h) @ w["o"]), None

        h, _ = jax.lax.scan(jax.checkpoint(body, policy=pol), x, p)
        return jnp.mean(h ** 2)

    app = apply_plan(loss, (p, x), None, graph=g, plan=plan)
    close(jax.jit(jax.value_and_grad(user_loss))(p, x), jax.jit(jax.value_and_grad(loss))(p, x))
    assert residual_bytes(user_loss, p, x)[0] == app.residual_bytes
    # a nested plan cannot be a policy: said, and the per-iteration set is exported
    nested = dataclasses_replace_scans(plan, group=2)
    with pytest.warns(UserWarning, match="nests"):
        remat.checkpoint_policy(nested, g)


def dataclasses_replace_scans(plan, group):
    import dataclasses

    return plan.with_meta(scans=tuple(dataclasses.replace(d, group=group)
                                      for d in plan.meta["scans"]))


# ----------------------------------------------------------------------------- XLA memory
_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    sys.path.insert(0, {tests!r})
    import jax
    import remat
    from remat.apply import apply_plan
    from policies.scan_layers import frontier
    from helpers.scan_models import MODELS

    def temp(f, *args):
        c = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
        return int(c.memory_analysis().temp_size_in_bytes)

    def zoo_gpt2():
        return remat.zoo.get("gpt2_small", scan=True, batch_size=2, seq_len=16, hidden=32,
                             num_layers=4, num_heads=2, vocab_size=64, max_len=16, dropout=0.0)

    out = {{}}
    for make in [*MODELS, zoo_gpt2]:
        loss, params, x = make()
        g = remat.extract(loss, params, x)
        base, peak0 = temp(loss, params, x), g.no_remat_peak()
        rows = []
        plans = frontier(g)  # no budget, the most and least memory, one between (the zoo
        # model, slower to compile: no budget and the least memory)
        picks = {{0, len(plans) - 1}}
        if make is not zoo_gpt2:
            picks |= {{1, len(plans) // 2}}
        for i in sorted(picks):
            budget, plan = plans[i]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                app = apply_plan(loss, (params, x), None, graph=g, plan=plan)
            rows.append(dict(scans=str(plan.meta["scans"]), temp=temp(app.fn, params, x),
                             predicted=peak0 - int(plan.meta["peak_bytes"])))
        out[make.__name__] = dict(base=base, rows=rows)
    print(json.dumps(out))
    """
)


def test_predicted_saving_is_what_xla_measures():
    """XLA:CPU temp bytes (``cse_barrier_expander`` off, in a subprocess) of ScanLayers plans
    (no budget, the most and the least memory, one between): the measured saving (the
    unmodified step's temp minus the plan's) against the simulator's (no-remat peak minus the
    plan's peak), within 10%, except the attention-like block, whose plans recomputing the
    scores are off by up to 16% on jax 0.10 and 20% on 0.12 (one iteration's backward working
    set, which the model does not count).  The plan without a budget (JAX's own residuals) is the unmodified step."""
    out = run_json(_SCRIPT.format(tests=os.path.dirname(__file__)))
    assert set(out) == {"scan_mlp", "scan_attention", "linen_scan", "nnx_scan", "zoo_gpt2"}
    for model, r in out.items():
        first, *rest = r["rows"]
        assert first["scans"] == "()" and first["temp"] == r["base"], (model, first)
        assert len(rest) >= 1
        tol = 0.22 if model == "scan_attention" else 0.10
        for row in rest:
            measured = r["base"] - row["temp"]
            assert abs(measured - row["predicted"]) <= tol * row["predicted"], (model, row, r)
        # less memory predicted, less measured (the least-memory plan is the smallest)
        assert min(row["temp"] for row in rest) == rest[-1]["temp"], (model, rest)


# ----------------------------------------------------------------------------- zoo
def test_zoo_scanned_transformer_is_the_unrolled_one():
    """``zoo.get("gpt2_small", scan=True)``: the same model with its blocks' parameters stacked
    under ``layers/block`` (loss equal to the unrolled model's with the same weights), and
    ``remat_policy=`` (the built-in baseline) changes nothing but memory.  (``bert_small``
    shares ``_layers``; the Pareto experiment runs both.)"""
    name, prefix = "gpt2_small", "h"
    cfg = dict(batch_size=2, seq_len=8, hidden=16, num_layers=3, num_heads=2, vocab_size=32,
               max_len=8, dropout=0.0)
    loss_s, vs, batch = remat.zoo.get(name, scan=True, **cfg)
    loss_u, vu, _ = remat.zoo.get(name, **cfg)
    stacked = vs["params"]["layers"]["block"]
    params = {k: v for k, v in vs["params"].items() if k != "layers"}
    for i in range(3):
        params[f"{prefix}{i}"] = jax.tree_util.tree_map(lambda a, i=i: a[i], stacked)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(vu["params"])
    close(jax.jit(loss_u)({"params": params}, batch), jax.jit(loss_s)(vs, batch))
    loss_r, _, _ = remat.zoo.get(name, scan=True,
                                 remat_policy=jax.checkpoint_policies.nothing_saveable, **cfg)
    close(jax.jit(jax.value_and_grad(loss_r))(vs, batch),
          jax.jit(jax.value_and_grad(loss_s))(vs, batch))
