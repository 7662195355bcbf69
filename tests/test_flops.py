"""FLOP model: hand counts, XLA's HloCostAnalysis as the independent reference, zoo models."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat
from remat.flops import conv_flops, dot_flops, eqn_flops, jaxpr_flops


def xla_flops(f, *args) -> float:
    ca = jax.jit(f).lower(*args).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca["flops"])


def eqns_of(f, *args):
    return jax.make_jaxpr(f)(*args).jaxpr.eqns


def test_dot_general_hand_count():
    a, b = jnp.ones((3, 5, 7)), jnp.ones((3, 7, 11))
    (e,) = [e for e in eqns_of(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), a, b)
            if e.primitive.name == "dot_general"]
    assert eqn_flops(e) == 2 * 3 * 5 * 7 * 11
    assert dot_flops((4, 6), (6, 9), (((1,), (0,)), ((), ()))) == 2 * 4 * 6 * 9


CONV_CASES = [
    # (lhs NHWC, rhs HWIO, strides, padding, lhs_dil, rhs_dil, groups)
    ((2, 9, 9, 4), (3, 3, 4, 6), (1, 1), "SAME", (1, 1), (1, 1), 1),
    ((2, 9, 9, 4), (3, 3, 4, 6), (2, 2), "SAME", (1, 1), (1, 1), 1),
    ((1, 8, 7, 4), (3, 2, 4, 4), (1, 2), ((2, 1), (0, 3)), (1, 1), (2, 1), 1),
    ((2, 6, 6, 8), (3, 3, 2, 8), (1, 1), "VALID", (1, 1), (1, 1), 4),
    ((2, 6, 6, 8), (3, 3, 1, 8), (1, 1), "SAME", (1, 1), (1, 1), 8),  # depthwise
    ((1, 5, 5, 3), (3, 3, 3, 2), (1, 1), ((1, 1), (1, 1)), (2, 2), (1, 1), 1),  # transposed
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_and_backward_match_xla(case):
    """Every conv of value_and_grad (forward, input-grad and weight-grad convs, which use lhs/rhs
    dilation and batch/feature groups) counts exactly 2 * MACs.

    References: XLA's cost analysis of each conv, and (independently) the fact that every product
    ``x[..] * w[..]`` of the forward conv occurs exactly once in each of the two gradient convs, so
    all three must equal the forward conv's XLA count.  (XLA:CPU rewrites batch-grouped convs
    before counting, so for those only the second reference applies.)"""
    ls, rs, strides, pad, ldil, rdil, groups = case

    def conv(x, w):
        return lax.conv_general_dilated(x, w, strides, pad, lhs_dilation=ldil, rhs_dilation=rdil,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=groups)

    x, w = jnp.ones(ls), jnp.ones(rs)
    fwd_ref = xla_flops(conv, x, w)
    closed = jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1)))(x, w)
    convs = [e for e in closed.jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
    assert len(convs) == 3
    for e in convs:
        assert eqn_flops(e) == fwd_ref
        if e.params["batch_group_count"] == 1:
            a = jnp.ones(e.invars[0].aval.shape)
            b = jnp.ones(e.invars[1].aval.shape)
            ref = xla_flops(lambda a, b, e=e: lax.conv_general_dilated_p.bind(a, b, **e.params), a, b)
            assert eqn_flops(e) == ref
        if pad == "VALID" and ldil == (1, 1) and e is convs[0]:
            out = math.prod(e.outvars[0].aval.shape)
            assert conv_flops(ls, rs, e.outvars[0].aval.shape, e.params) == 2 * out * 9 * rs[2]


def test_elementwise_reduction_movement_rules():
    x = jnp.ones((4, 6))
    table = {e.primitive.name: eqn_flops(e) for e in eqns_of(
        lambda x: jnp.sum(jnp.tanh(x) * 2.0, axis=1).reshape(2, 2).T, x)}
    assert table["tanh"] == 24 and table["mul"] == 24
    assert table["reduce_sum"] == 24  # input size
    assert table["reshape"] == 0 and table["transpose"] == 0


def test_scan_cond_while_rules():
    w = jnp.ones((8, 8))

    def body(c, _):
        return jnp.tanh(c @ w), None

    body_flops = 2 * 8 * 8 * 8 + 64
    f_scan = lambda c: lax.scan(body, c, None, length=5)[0]  # noqa: E731
    (e,) = [e for e in eqns_of(f_scan, w) if e.primitive.name == "scan"]
    assert eqn_flops(e) == 5 * body_flops

    f_cond = lambda p, c: lax.cond(p, lambda c: c @ w, lambda c: c + 1.0, c)  # noqa: E731
    (e,) = [e for e in eqns_of(f_cond, True, w) if e.primitive.name == "cond"]
    assert eqn_flops(e) == 2 * 8 ** 3  # the larger branch

    f_while = lambda c: lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] @ w), (0, c))[1]  # noqa: E731
    (e,) = [e for e in eqns_of(f_while, w) if e.primitive.name == "while"]
    assert eqn_flops(e) == 1 + 1 + 2 * 8 ** 3  # cond (lt) + body (add, dot), one iteration


def test_jaxpr_flops_recurses_into_calls():
    w = jnp.ones((8, 8))
    f = jax.jit(lambda x: jax.nn.relu(x @ w))
    assert jaxpr_flops(jax.make_jaxpr(f)(w)) == 2 * 8 ** 3 + 64


ZOO_SMALL = {
    "mlp": dict(depth=3, width=128),
    "vgg16": dict(),
    "resnet18": dict(width=16),
    "mobilenet_v2": dict(image_size=32),
    "gpt2_small": dict(seq_len=16, hidden=128, num_layers=1, num_heads=2, vocab_size=512),
}


@pytest.mark.parametrize("name", sorted(ZOO_SMALL))
def test_forward_flops_match_xla_on_zoo(name):
    """(All nine zoo models at their default sizes: experiments/results/extract_timing.json.)"""
    zoo = pytest.importorskip("remat.zoo")
    loss_fn, params, batch = zoo.get(name, batch_size=2, **ZOO_SMALL[name])
    g = remat.extract(loss_fn, params, batch)
    fwd = sum(v.flops for v in g.forward_nodes)
    ref = xla_flops(loss_fn, params, batch)
    assert abs(fwd / ref - 1) < 0.02, (fwd, ref)
    # backward is roughly twice the forward for these models (sanity, not a reference)
    bwd = sum(v.flops for v in g.backward_nodes)
    assert 1.0 < bwd / fwd < 3.5


def test_unknown_primitive_gets_the_fallback_rule_and_raises_only_without_shapes():
    """One FLOP per output element; an output without a static shape raises, with location."""
    from types import SimpleNamespace

    from jax.extend.core import Primitive

    from remat.core.errors import UnsupportedPrimitiveError

    p = Primitive("mystery_op")
    p.def_abstract_eval(lambda x: x)
    closed = jax.make_jaxpr(lambda x: p.bind(x))(np.ones(3, np.float32))
    e = closed.jaxpr.eqns[0]
    assert eqn_flops(e) == 3.0
    shapeless = SimpleNamespace(primitive=e.primitive, params=e.params, invars=e.invars,
                                outvars=[SimpleNamespace(aval=object())],
                                source_info=e.source_info)
    with pytest.raises(UnsupportedPrimitiveError) as ei:
        eqn_flops(shapeless)
    assert ei.value.primitive == "mystery_op"
    assert "test_flops.py" in str(ei.value)
