"""Primitive census: every primitive that the zoo and the generated models put into their training
jaxprs on the installed JAX has a real FLOP rule in :mod:`remat.flops`; an unknown primitive is
costed by the fallback rule, warned about once and recorded, and planning still runs.

On a new JAX release :func:`test_every_model_primitive_has_a_rule` names the primitives to add.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import extract_models, generated_models, mlp_models, outside_models
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

import remat
from remat import zoo
from remat.core.errors import RematWarning, UnsupportedPrimitiveError
from remat.flops import (
    eqn_flops,
    fallback_bytes,
    has_rule,
    jaxpr_flops,
    primitive_names,
    unknown_primitives,
)

ZOO_TINY = {
    "mlp": dict(depth=2, width=8),
    "vgg16": dict(width=2, fc_width=8),
    "resnet18": dict(width=2),
    "resnet50": dict(width=2, image_size=32, stage_sizes=(1, 1, 1, 1)),
    "mobilenet_v2": dict(width_mult=0.1, image_size=32,
                         inverted_residual_setting=((1, 16, 1, 1), (6, 24, 2, 2))),
    "squeezenet": dict(width=2, image_size=32),
    "unet": dict(width=2, depth=2, image_size=16),
    "bert_small": dict(hidden=8, num_heads=2, num_layers=2, vocab_size=16, seq_len=4),
    "gpt2_small": dict(hidden=8, num_heads=2, num_layers=2, vocab_size=16, seq_len=4),
}
"""Zoo options of the census: tiny, every layer type kept (dropout, BatchNorm, GELU)."""


def _zoo(name, **extra):
    def make():
        spec = zoo.get_model(name, 2, abstract=True, **{**ZOO_TINY[name], **extra})
        return spec.loss_fn, spec.variables, spec.batch

    return make


def _generated(frontend, loss="xent", scan=2):
    spec = generated_models.Spec(
        widths=(4, 4, 4, 4), acts=("tanh", "relu", "gelu", "sigmoid"),
        kinds=("dense", "dense", "add", "concat"), skips=(-1, -1, 0, 1), loss=loss,
        frontend=frontend, scan=scan, batch=4)
    return lambda: generated_models.build(spec)


def _mlp(act):
    def make():
        params, batch = mlp_models.mlp_setup(2, 4, 2)
        return mlp_models.make_mlp_loss(act), params, batch

    return make


MODELS = {
    **{f"zoo/{n}": _zoo(n) for n in ZOO_TINY},
    "zoo/bert_small[scan]": _zoo("bert_small", scan=True),
    "zoo/gpt2_small[scan]": _zoo("gpt2_small", scan=True),
    **{f"generated/{fe}": _generated(fe) for fe in generated_models.FRONTENDS},
    "generated/plain[mse]": _generated("plain", "mse", 0),
    "generated/plain[sumsq]": _generated("plain", "sumsq", 3),
    **{f"extract_models/{n}": m for n, m in extract_models.MODELS.items()},
    "mlp_models/relu": _mlp(jax.nn.relu),
    "mlp_models/tanh": _mlp(jnp.tanh),
    "custom_vjp": outside_models.custom_vjp_mlp,
    "plain_transformer": outside_models.plain_transformer,
    "linen_scan_transformer": outside_models.linen_scan_transformer,
    "linen_mlp": outside_models.linen_mlp,
    "nnx_mlp": outside_models.nnx_mlp,
}
"""name -> ``() -> (loss, params, batch)``: the models whose training jaxprs the census reads."""


def training_jaxpr(make):
    """``make_jaxpr(value_and_grad(loss))`` of a census model, its arguments built abstractly
    (``jax.eval_shape``: no initialiser is compiled)."""
    box = {}

    def args():
        box["loss"], params, batch = make()
        return params, batch

    params, batch = jax.eval_shape(args)
    return jax.make_jaxpr(jax.value_and_grad(box["loss"]))(params, batch)


def test_every_model_primitive_has_a_rule():
    """Every primitive of every census model's training jaxpr (sub-jaxprs included) has a rule of
    its own; the failure lists the ones that fall back, with the models that use them."""
    missing: dict[str, list[str]] = {}
    seen: set[str] = set()
    for name, make in MODELS.items():
        closed = training_jaxpr(make)
        seen |= primitive_names(closed)
        for prim in unknown_primitives(closed):
            missing.setdefault(prim, []).append(name)
    assert {"dot_general", "tanh", "scan", "conv_general_dilated"} <= seen
    assert not missing, (
        f"jax {jax.__version__}: primitives without a FLOP rule in remat.flops (costed by the "
        "fallback): " + "; ".join(f"{p} (in {', '.join(m)})" for p, m in sorted(missing.items())))


# ------------------------------------------------------------------ primitives without a rule
def _probe(name, impl, abstract):
    """A test-only primitive (public ``jax.extend`` API) lowered through ``impl``."""
    p = Primitive(name)
    p.def_impl(impl)
    p.def_abstract_eval(abstract)
    mlir.register_lowering(p, mlir.lower_fun(impl, multiple_results=False))
    return p


cube_p = _probe("remat_test_cube", lambda x: x * x * x, lambda x: x)
ad.defjvp(cube_p, lambda g, x: g * 3.0 * x * x)
rowsum_p = _probe("remat_test_rowsum", lambda x: jnp.sum(x, axis=-1),
                  lambda x: x.update(shape=x.shape[:-1]))
PROBES = ("remat_test_cube", "remat_test_rowsum")


def _probe_model():
    """A 16-layer tanh MLP whose layers end in the unknown elementwise ``cube`` (differentiated
    through its JVP rule), plus the unknown ``rowsum`` of a wide tiled copy (memory-bound) on a
    ``stop_gradient`` side path."""
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.normal(size=(8, 8)) * 0.3, jnp.float32) for _ in range(16)]
    x = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)

    def loss(p, x):
        h = x
        for w in p:
            h = cube_p.bind(jnp.tanh(h @ w))
        side = rowsum_p.bind(jnp.tile(jax.lax.stop_gradient(h), (1, 128)))
        return jnp.mean(h ** 2) + 1e-3 * jnp.mean(side)

    return loss, params, x


def _eqn(closed, name):
    return next(e for e in closed.jaxpr.eqns if e.primitive.name == name)


def test_unknown_primitive_gets_the_fallback_cost():
    loss, params, x = _probe_model()
    closed = jax.make_jaxpr(jax.value_and_grad(loss))(params, x)
    assert unknown_primitives(closed) == PROBES
    assert not has_rule("remat_test_cube") and has_rule("tanh") and has_rule("one_minus_square")
    cube, rowsum = _eqn(closed, "remat_test_cube"), _eqn(closed, "remat_test_rowsum")
    assert eqn_flops(cube) == 4 * 8 and fallback_bytes(cube) == 0.0  # elementwise
    assert eqn_flops(rowsum) == 4 and fallback_bytes(rowsum) == 4 * (4 * 1024 + 4)  # in + out


def test_unknown_call_like_primitive_costs_its_body_and_unknown_shape_raises():
    body = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b))(jnp.ones((3, 4)), jnp.ones((4, 5)))
    call = SimpleNamespace(primitive=SimpleNamespace(name="remat_test_call"),
                           params={"jaxpr": body}, invars=[], outvars=[])
    assert eqn_flops(call) == jaxpr_flops(body) == 2 * 3 * 4 * 5 + 3 * 5
    token = SimpleNamespace(primitive=SimpleNamespace(name="remat_test_token"), params={},
                            invars=[], outvars=[SimpleNamespace(aval=object())],
                            source_info=SimpleNamespace(name_stack=""))
    with pytest.raises(UnsupportedPrimitiveError, match="remat_test_token"):
        eqn_flops(token)


def test_extract_warns_once_and_records_unknown_primitives():
    loss, params, x = _probe_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = remat.extract(loss, params, x, device="pixel-4")
    ours = [w for w in caught if issubclass(w.category, RematWarning)]
    assert len(ours) == 1 and all(p in str(ours[0].message) for p in PROBES)
    assert tuple(g.meta["unknown_primitives"]) == PROBES
    assert any("fallback" in n for n in g.meta["notes"])
    # the rowsum's bytes reach the time model: its node costs more than its boundary bytes say
    t_boundary, _ = remat.devices.get("pixel-4").node_costs(g)
    t = np.array([v.time_s for v in g.nodes])
    assert np.all(t >= t_boundary) and np.any(t > t_boundary)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)
        assert remat.extract(*extract_models.make_plain(), device="pixel-4").meta["unknown_primitives"] == ()


@pytest.mark.parametrize("policy", ["checkmate", "sqrtn"])
def test_plan_runs_through_unknown_primitives(policy):
    loss, params, x = _probe_model()
    want = jax.jit(jax.value_and_grad(loss))(params, x)
    # the graph's modelled budget: the unknown primitives are the graph's matter, and the
    # compiled-budget loop's compiles took 28 of this test's 29 s
    with pytest.warns(RematWarning, match="remat_test_cube"):
        got = jax.jit(remat.value_and_grad(loss, policy, budget=remat.modelled("60%")))(params, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
