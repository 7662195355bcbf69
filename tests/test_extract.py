"""remat.extract: stage grouping, forward/backward structure, sizes, costs, errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.extract_models import MODELS, make_mlp, make_plain, make_resnet

import remat
from remat.core.errors import ExtractionError, RematWarning
from remat.extraction import group_keys, scope_of
from remat.flops import ELEMENT_WEIGHT


def leaf_bytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def check_structure(g):
    """Forward nodes first, then backward; no forward node reads a backward one; DAG."""
    bw = g.is_backward_array
    first_bwd = int(np.argmax(bw)) if bw.any() else g.n
    assert not bw[:first_bwd].any() and bw[first_bwd:].all()
    for s, d in g.edges:
        assert s < d
        assert not (bw[s] and not bw[d])
    assert len({v.name for v in g.nodes}) == g.n


@pytest.mark.parametrize("name", sorted(MODELS))
def test_extracts_every_model_kind(name):
    loss, params, batch = MODELS[name]()
    g = remat.extract(loss, params, batch, stages="module")
    check_structure(g)
    assert len(g.forward_nodes) >= 1 and len(g.backward_nodes) >= 1
    assert g.param_bytes == leaf_bytes(params)
    assert g.input_bytes == leaf_bytes(batch)
    # FLOPs are positive and time/energy come from the device model
    assert all(v.flops >= 0 for v in g.nodes) and sum(v.flops for v in g.nodes) > 0
    assert sum(v.time_s for v in g.nodes) > 0
    prims = g.meta["node_primitives"]
    assert len(prims) == g.n and any("dot_general" in p or "conv_general_dilated" in p for p in prims)
    assert g.meta["stages"] == "module" and g.meta["argnums"] == 0
    assert g.program.forward_scopes and len(g.program.forward_scopes) == g.n


def test_mlp16_module_gives_16_forward_stages():
    loss, params, batch = make_mlp(depth=16)
    g = remat.extract(loss, params, batch, stages="module")
    fwd = [v.name for v in g.forward_nodes]
    assert fwd[:16] == [f"fwd/MLP/Dense_{i}" for i in range(16)]
    assert fwd[16:] == ["fwd/loss"]
    bwd = [v.name for v in g.backward_nodes]
    assert bwd[0] == "bwd/loss" and set(bwd[1:]) == {f"bwd/MLP/Dense_{i}" for i in range(16)}
    # every backward stage points at the forward stage of its module
    for v in g.backward_nodes:
        assert g.nodes[v.forward_index].name == "fwd/" + v.name[4:]
    assert g.meta["batch_size"] == 4
    # hand count of forward FLOPs: dots + bias adds + relus + the loss head
    B, W, D, C = 4, 8, 5, 3
    dots = 2 * B * (D * W + 14 * W * W + W * C)
    bias = B * (15 * W + C)
    relu = 15 * B * W
    fw = sum(v.flops for v in g.forward_nodes[:16])
    assert fw == dots + bias + relu
    # the chain: stage i feeds stage i+1
    for i in range(16):
        assert (i, i + 1) in g.edges


def test_auto_uses_modules_for_mlp():
    loss, params, batch = make_mlp(depth=16)
    g = remat.extract(loss, params, batch)
    assert len(g.forward_nodes) == 17


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_int_k_gives_at_most_k_forward_stages(k):
    loss, params, batch = make_mlp(depth=16)
    g = remat.extract(loss, params, batch, stages=k)
    check_structure(g)
    assert 1 <= len(g.forward_nodes) <= k
    ref = remat.extract(loss, params, batch, stages="module")
    # merging loses no work: same total FLOPs in each half
    assert math.isclose(sum(v.flops for v in g.forward_nodes), sum(v.flops for v in ref.forward_nodes))
    assert math.isclose(sum(v.flops for v in g.nodes), sum(v.flops for v in ref.nodes))
    if k >= 3:  # cost balance: no group above twice the ideal share of the 16 layers
        body = [v.flops for v in g.forward_nodes if v.name != "fwd/loss"]
        assert max(body) <= 2 * sum(body) / len(body) + 1e-9


def test_int_k_without_modules_balances_equations():
    loss, params, x = make_plain()
    g = remat.extract(loss, params, x, stages=3)
    check_structure(g)
    assert 2 <= len(g.forward_nodes) <= 3


def test_eqn_mode_one_node_per_equation():
    loss, params, x = make_plain()
    closed = jax.make_jaxpr(jax.value_and_grad(loss))(params, x)
    # no call primitives and no dead code in this function: one node per jaxpr equation
    assert not any(e.primitive.name in ("jit", "custom_jvp_call") for e in closed.jaxpr.eqns)
    g = remat.extract(loss, params, x, stages="eqn")
    assert g.n == len(closed.jaxpr.eqns)
    assert [p for (p,) in g.meta["node_primitives"]] == [e.primitive.name for e in closed.jaxpr.eqns]
    # out_bytes of a node = bytes of its result when another node or the output reads it
    readers = {}
    for e in closed.jaxpr.eqns:
        for v in e.invars:
            readers[id(v)] = readers.get(id(v), 0) + 1
    outs = {id(v) for v in closed.jaxpr.outvars}
    for v, e in zip(g.nodes, closed.jaxpr.eqns):
        (o,) = e.outvars
        used = id(o) in readers or id(o) in outs
        assert v.out_bytes == (math.prod(o.aval.shape) * o.aval.dtype.itemsize if used else 0)


def test_skip_connections_visible_in_both_halves():
    loss, params, batch = make_resnet(blocks=3)
    g = remat.extract(loss, params, batch, stages="module")
    check_structure(g)
    fwd = {v.index for v in g.forward_nodes}
    names = [v.name for v in g.nodes]
    # block i's input (end of the previous block) is read by its residual add (last stage of block
    # i), skipping Dense_0 and Dense_1; in the backward pass the gradient at the block output
    # (bwd Dense_2 stage) reaches the add_any summing the input gradient (bwd Dense_0 stage).
    skips_f = [(s, d) for s, d in g.edges if s in fwd and d in fwd and d - s > 1]
    skips_b = [(s, d) for s, d in g.edges if s not in fwd and d not in fwd and d - s > 1]
    assert skips_f, names
    assert skips_b, names
    for s, d in skips_f:
        assert names[d].endswith("Dense_2") and d - s == 3
    for s, d in skips_b:
        assert names[s].endswith("Dense_2") and names[d].endswith("Dense_0") and d - s == 2


def test_group_keys_absorbs_parent_scope_ops():
    keys = ["M", "M/Dense_0", "M/Dense_0", "M", "M/Dense_1", "M", "", "", "M/Dense_2"]
    eff = group_keys(keys)
    assert eff == ["M/Dense_0", "M/Dense_0", "M/Dense_0", "M/Dense_0", "M/Dense_1", "M/Dense_1",
                   "", "", "M/Dense_2"]


def test_scope_of_matches_forward_scopes_on_forward_only_jaxpr():
    loss, params, batch = make_mlp(depth=4)
    g = remat.extract(loss, params, batch, stages="module")
    closed = jax.make_jaxpr(loss)(params, batch)
    keys = {scope_of(e) for e in closed.jaxpr.eqns}
    covered = {k for i in range(g.n) for k in g.program.forward_scopes[i]}
    assert {f"MLP/Dense_{i}" for i in range(4)} <= keys
    assert {f"MLP/Dense_{i}" for i in range(4)} <= covered
    assert covered <= keys | {""}
    assert g.program.forward_scopes[0] == ("MLP/Dense_0",) or "MLP/Dense_0" in g.program.forward_scopes[0]


def test_param_bytes_per_node_and_argnums_tuple():
    loss, params, x = make_plain()
    g = remat.extract(loss, params, x, stages="eqn")
    # each dot reading a weight carries that weight's bytes
    w1 = params["w1"].nbytes
    assert any(v.param_bytes == w1 for v in g.nodes)
    assert g.param_bytes == leaf_bytes(params) and g.input_bytes == x.nbytes
    g2 = remat.extract(loss, params, x, argnums=(0, 1), stages="module")
    assert g2.param_bytes == leaf_bytes(params) + x.nbytes and g2.input_bytes == 0


def test_device_profile_gives_time_and_energy():
    loss, params, batch = make_mlp(depth=3)
    g = remat.extract(loss, params, batch)
    t = np.array([v.time_s for v in g.nodes])
    e = np.array([v.energy_j for v in g.nodes])
    assert (t >= 0).all() and t.sum() > 0 and (e >= 0).all() and e.sum() > 0


def test_control_flow_kept_as_single_equations():
    w = jnp.eye(4) * 0.5

    def loss(w, x):
        def body(c, _):
            return jnp.tanh(c @ w), None

        h, _ = jax.lax.scan(body, x, None, length=3)
        h = jax.lax.cond(jnp.sum(h) > 0, lambda h: h * 2.0, lambda h: h - 1.0, h)
        return jnp.sum(h ** 2)

    x = jnp.ones((2, 4))
    g = remat.extract(loss, w, x, stages="eqn")
    prims = [p for (p,) in g.meta["node_primitives"]]
    assert prims.count("scan") == 2 and "cond" in prims
    scan_fwd = next(v for v, (p,) in zip(g.nodes, g.meta["node_primitives"]) if p == "scan")
    # the jvp body also computes tanh's derivative; at least dot + tanh per iteration, x length
    body = [e for e in jax.make_jaxpr(jax.value_and_grad(loss))(w, x).jaxpr.eqns
            if e.primitive.name == "scan"][0].params["jaxpr"].jaxpr
    per_iter = sum(2 * 2 * 4 * 4 if e.primitive.name == "dot_general" else
                   math.prod(e.outvars[0].aval.shape) * ELEMENT_WEIGHT.get(e.primitive.name, 1.0)
                   for e in body.eqns
                   if e.primitive.name not in ("broadcast_in_dim", "reshape", "transpose"))
    assert scan_fwd.flops == 3 * per_iter


def test_errors_non_scalar_integer_and_a_warning_for_an_unknown_primitive():
    from jax.extend.core import Primitive

    x = jnp.ones((3, 2))
    with pytest.raises(ExtractionError, match=r"\(3, 2\)"):
        remat.extract(lambda p: p * 2.0, x)
    with pytest.raises(ExtractionError, match="int32"):
        remat.extract(lambda p: jnp.sum(p).astype(jnp.int32), x)
    with pytest.raises(ExtractionError):
        remat.extract(lambda p: (jnp.sum(p), jnp.sum(p)), x)

    mystery = Primitive("mystery_square")
    mystery.def_abstract_eval(lambda a: a)
    jax.interpreters.ad.defjvp(mystery, lambda g, a: 2 * a * g)

    def loss(p):
        return jnp.sum(mystery.bind(p))

    with pytest.warns(RematWarning, match="mystery_square"):
        g = remat.extract(loss, x)
    assert g.meta["unknown_primitives"] == ("mystery_square",)
    assert sum(v.flops for v in g.forward_nodes) >= x.size  # the fallback: 1 per element


def test_program_keeps_what_microbatching_needs():
    loss, params, batch = make_mlp(depth=3)
    g = remat.extract(loss, params, batch, stages=2)
    prog = g.program
    assert prog.fn is loss and prog.stages == 2 and prog.argnums == 0
    shapes = jax.tree_util.tree_map(lambda s: s.shape, prog.arg_shapes)
    assert shapes[1]["x"] == (4, 5)
    half = {k: v[:2] for k, v in batch.items()}
    g2 = remat.extract(prog.fn, params, half, stages=prog.stages)
    assert g2.meta["batch_size"] == 2 and g2.n == g.n


def test_auto_on_a_single_module_balances_equations():
    import flax.linen as nn

    class Flat(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.normal(0.5), (5, 5))
            for _ in range(6):
                x = jnp.tanh(x @ w)
            return jnp.mean(x ** 2)

    m = Flat()
    x = jnp.ones((3, 5))
    params = m.init(jax.random.PRNGKey(0), x)
    g = remat.extract(lambda p, x: m.apply(p, x), params, x)
    check_structure(g)
    assert 3 <= len(g.forward_nodes) <= 8
    ref = remat.extract(lambda p, x: m.apply(p, x), params, x, stages="module")
    assert len(ref.forward_nodes) == 1


def test_nn_remat_regions_are_inlined_and_the_plan_decides():
    """``nn.remat`` blocks inside the loss are inlined: the graph is the one of the same network
    without remat (the plan, not the user's checkpoint, decides what is recomputed), the
    backward stages mirror the forward module scopes, and the notes say so."""
    from helpers.extract_models import make_remat

    loss, params, batch = make_remat()
    g = remat.extract(loss, params, batch, stages="module")
    check_structure(g)
    fwd = {v.name[4:] for v in g.forward_nodes}
    bwd = {v.name[4:].split("#")[0] for v in g.backward_nodes}
    assert bwd <= fwd
    assert any("CheckpointBlock_2" in k for k in bwd)
    assert any("inlined" in n for n in g.meta["notes"])
    # the backward recomputes no forward contraction: twice the forward's dots (dx and dW),
    # where JAX's own remat would add a third copy
    prims = g.meta["node_primitives"]
    n_f = sum(p.count("dot_general") for v, p in zip(g.nodes, prims) if not v.is_backward)
    n_b = sum(p.count("dot_general") for v, p in zip(g.nodes, prims) if v.is_backward)
    assert n_b == 2 * n_f - 1  # the first layer's input gradient is dead code


def test_batch_coupling_is_detected_from_the_dataflow():
    """BatchNorm-style statistics over the batch axis couple samples; a batch-mean loss does not
    (so micro-batching is exact only for the latter: remat.core.context.PolicyContext.batch_coupled)."""
    import jax.numpy as jnp

    def bn_loss(w, x):
        h = x @ w
        h = (h - h.mean(0)) / (h.std(0) + 1e-5)
        return jnp.mean(jnp.tanh(h) ** 2)

    def plain_loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
    assert remat.extract(bn_loss, w, x).meta["batch_coupled"] is True
    assert remat.extract(plain_loss, w, x).meta["batch_coupled"] is False
    loss, p, b = remat.zoo.get("resnet18", batch_size=2)
    assert remat.extract(loss, p, b).meta["batch_coupled"] is True  # flax BatchNorm
    loss, p, b = remat.zoo.get("mlp", batch_size=4, depth=3, width=16)
    assert remat.extract(loss, p, b).meta["batch_coupled"] is False
    # a square weight whose first dimension equals the batch size is not a batch of samples
    w16, x16 = jnp.ones((16, 16)), jnp.ones((16, 16))
    assert remat.extract(plain_loss, w16, x16).meta["batch_coupled"] is False
    assert remat.extract(bn_loss, w16, x16).meta["batch_coupled"] is True
    loss, p, b = remat.zoo.get("mlp", batch_size=16, depth=3, width=16)
    assert remat.extract(loss, p, b).meta["batch_coupled"] is False
