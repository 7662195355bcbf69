"""Tests of remat.zoo: every model builds, its loss is a finite float32 scalar, gradients are
finite with the parameters' structure, SGD lowers the loss, and parameter counts match
published figures and independent hand formulas (shapes only, through ``abstract=True``).

Models run at tiny widths/sizes: compiling full-size networks on a 2-core CPU is slow.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
import remat.zoo as zoo
from remat.core.errors import RematError, UnknownNameError
from remat.zoo import ModelOptionError

ALL = ["bert_small", "gpt2_small", "mlp", "mobilenet_v2", "resnet18", "resnet50", "squeezenet",
       "unet", "vgg16"]

TINY = {
    "mlp": dict(depth=3, width=16),
    "vgg16": dict(width=4, fc_width=16),
    "resnet18": dict(width=4),
    "resnet50": dict(width=4, image_size=32, stage_sizes=(1, 1, 1, 1)),
    "mobilenet_v2": dict(width_mult=0.1, image_size=32,
                         inverted_residual_setting=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 1, 2))),
    "squeezenet": dict(width=4, image_size=32),
    "unet": dict(width=4, depth=2, image_size=16),
    "bert_small": dict(hidden=16, num_heads=2, num_layers=2, vocab_size=32, seq_len=8),
    "gpt2_small": dict(hidden=16, num_heads=2, num_layers=2, vocab_size=32, seq_len=8),
}
BN_MODELS = {"resnet18", "resnet50", "mobilenet_v2"}
FAST_COMPILE = {"xla_backend_optimization_level": 0}

_cache: dict[str, tuple] = {}


def compiled(fn, *args):
    """``jax.jit(fn)`` compiled for ``args`` at XLA's lowest backend optimisation level (the
    tests check values, not speed; eager op-by-op execution would compile every op)."""
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST_COMPILE)


def tiny(name: str):
    """(spec, compiled value_and_grad) of the tiny variant, built once per session."""
    if name not in _cache:
        spec = zoo.get_model(name, 2, **TINY[name])
        _cache[name] = (spec, compiled(jax.value_and_grad(spec.loss_fn), spec.variables,
                                       spec.batch))
    return _cache[name]


def n_params(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


# ------------------------------------------------------------------------ registry
def test_available_lists_every_model():
    assert zoo.available() == ALL
    assert remat.zoo is zoo  # the lazy attribute of the package


def test_unknown_name_is_typed_and_lists_models():
    with pytest.raises(UnknownNameError) as info:
        zoo.get("resnet19")
    assert isinstance(info.value, KeyError) and isinstance(info.value, RematError)
    assert "resnet18" in str(info.value) and info.value.available == ALL


def test_get_returns_the_spec_parts_and_names_are_forgiving():
    loss_fn, variables, batch = zoo.get("MLP", batch_size=3, depth=2, width=8)
    spec = zoo.get_model("mlp", 3, depth=2, width=8)
    assert batch["x"].shape == (3, 8) and batch["label"].shape == (3,)
    np.testing.assert_array_equal(
        variables["params"]["block1"]["dense"]["kernel"],
        spec.variables["params"]["block1"]["dense"]["kernel"],
    )
    assert loss_fn.__name__ == "mlp_loss" and set(spec.batch) == set(batch)
    assert zoo.get_model("mobilenet-v2", 1, width_mult=0.1, image_size=32, abstract=True)


# ------------------------------------------------------------------ every model
@pytest.mark.parametrize("name", ALL)
def test_model_loss_and_grads(name):
    spec, vg = tiny(name)
    out = jax.eval_shape(spec.loss_fn, spec.variables, spec.batch)
    assert out.shape == () and out.dtype == jnp.float32
    value, grads = vg(spec.variables, spec.batch)
    assert value.shape == () and value.dtype == jnp.float32 and bool(jnp.isfinite(value))
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(spec.variables)
    for g, p in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(spec.variables)):
        assert g.shape == p.shape and g.dtype == p.dtype
        assert bool(jnp.all(jnp.isfinite(g)))
    # the loss depends on the parameters: some gradient is non-zero
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree_util.tree_leaves(grads["params"]))
    assert set(spec.mutable) == ({"batch_stats"} if name in BN_MODELS else set())
    assert spec.reduction == "mean"


@pytest.mark.parametrize("name", ["mlp", "resnet18"])
def test_one_sgd_step_lowers_the_loss(name):
    spec, vg = tiny(name)
    loss0, grads = vg(spec.variables, spec.batch)
    lr = 0.05
    params = jax.tree_util.tree_map(lambda p, g: np.asarray(p) - lr * np.asarray(g),
                                    spec.variables["params"], grads["params"])
    loss1, _ = vg({**spec.variables, "params": params}, spec.batch)
    assert float(loss1) < float(loss0) - 1e-4


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("name", ["mlp", "unet", "bert_small", "gpt2_small"])
def test_loss_is_the_mean_cross_entropy_of_the_logits(name):
    """Reference: NumPy log-softmax of the module's logits, reduced by hand."""
    spec, _ = tiny(name)
    b = {k: np.asarray(v) for k, v in spec.batch.items()}
    rngs = {"dropout": spec.batch["dropout_rng"]} if "dropout_rng" in b else None
    x = b["x"] if name == "mlp" else b["image"] if name == "unet" else b["tokens"]
    apply = compiled(lambda v, x, r: spec.module.apply(v, x, train=True, rngs=r),
                     spec.variables, x, rngs)
    logits = np.asarray(apply(spec.variables, x, rngs), np.float64)
    labels = b.get("label", b.get("mask", b.get("targets")))
    nll = -np.take_along_axis(_log_softmax(logits), labels[..., None], axis=-1)[..., 0]
    want = (nll * b["weights"]).sum() / b["weights"].sum() if name == "bert_small" else nll.mean()
    spec_loss, _ = tiny(name)[1](spec.variables, spec.batch)
    np.testing.assert_allclose(float(spec_loss), want, rtol=1e-5)


def test_batchnorm_state_is_updated_by_loss_and_state_fn():
    spec, vg = tiny("resnet18")
    loss, state = compiled(spec.loss_and_state_fn, spec.variables, spec.batch)(
        spec.variables, spec.batch)
    np.testing.assert_allclose(float(loss), float(vg(spec.variables, spec.batch)[0]), rtol=1e-6)
    old = spec.variables["batch_stats"]
    assert set(state) == {"batch_stats"}
    assert jax.tree_util.tree_structure(state["batch_stats"]) == jax.tree_util.tree_structure(old)
    # running mean after one step = 0.9 * 0 + 0.1 * (batch mean of the stem conv's output)
    stem_mean = state["batch_stats"]["stem"]["bn"]["mean"]
    x = spec.batch["image"]
    conv = jax.lax.conv_general_dilated(
        x, spec.variables["params"]["stem"]["conv"]["kernel"], (1, 1), ((1, 1), (1, 1)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(stem_mean, 0.1 * conv.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6)
    merged = spec.merge_state(spec.variables, state)
    assert merged["params"] is spec.variables["params"]
    assert merged["batch_stats"] is state["batch_stats"]


def test_dropout_rng_comes_from_the_batch():
    spec, vg = tiny("gpt2_small")
    assert spec.batch["dropout_rng"].shape == (2,) and spec.batch["dropout_rng"].dtype == jnp.uint32
    l1 = vg(spec.variables, spec.batch)[0]
    assert float(l1) == float(vg(spec.variables, spec.batch)[0])  # pure
    other = {**spec.batch, "dropout_rng": jnp.array([0, 12345], jnp.uint32)}
    assert float(vg(spec.variables, other)[0]) != float(l1)
    nodrop = zoo.get_model("gpt2_small", 2, **{**TINY["gpt2_small"], "dropout": 0.0})
    assert "dropout_rng" not in nodrop.batch


def test_seed_fixes_params_and_batch():
    a = zoo.get_model("mlp", 2, depth=2, width=8, seed=3)
    b = zoo.get_model("mlp", 2, depth=2, width=8, seed=3)
    c = zoo.get_model("mlp", 2, depth=2, width=8, seed=4)
    for x, y in zip(jax.tree_util.tree_leaves(a.variables), jax.tree_util.tree_leaves(b.variables)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.batch["x"], b.batch["x"])
    assert not np.array_equal(a.params["block0"]["dense"]["kernel"],
                              c.params["block0"]["dense"]["kernel"])


def test_numpy_init_has_flax_default_statistics():
    """Kernels ~ LeCun normal (std 1/sqrt(fan_in)), biases 0; same tree as Flax's init."""
    spec = zoo.get_model("mlp", 2, depth=2, width=1024, in_features=256)
    k = np.asarray(spec.params["block1"]["dense"]["kernel"])
    assert abs(k.std() * math.sqrt(1024) - 1.0) < 0.01 and np.abs(k).max() <= 2 / 0.8796 / 32 + 1e-6
    assert not np.any(spec.params["block1"]["dense"]["bias"])
    flax_spec = zoo.get_model("mlp", 2, depth=1, width=256, in_features=16, init="flax")
    ours = zoo.get_model("mlp", 2, depth=1, width=256, in_features=16)
    assert jax.tree_util.tree_structure(flax_spec.variables) == \
        jax.tree_util.tree_structure(ours.variables)
    fk, ok = (np.asarray(s.params["block0"]["dense"]["kernel"]) for s in (flax_spec, ours))
    assert abs(fk.std() / ok.std() - 1) < 0.05  # Flax's lecun_normal vs ours, fan_in 16
    spec = zoo.get_model("resnet18", 1, width=8, abstract=False)
    assert np.all(np.asarray(spec.variables["batch_stats"]["stem"]["bn"]["var"]) == 1)
    assert np.all(np.asarray(spec.params["stem"]["bn"]["scale"]) == 1)


def test_name_stacks_identify_layers():
    """The extractor groups equations by Flax module scope: check the scopes are there."""
    for name, want in [("mlp", {"block0", "block2", "head"}),
                       ("resnet18", {"stem", "stage1_block1", "stage4_block2", "head"})]:
        spec, _ = tiny(name)
        jaxpr = jax.make_jaxpr(spec.loss_fn)(spec.variables, spec.batch)
        stacks = " ".join(str(e.source_info.name_stack) for e in jaxpr.jaxpr.eqns)
        for scope in want:
            assert scope in stacks, (name, scope)


def test_options_are_validated():
    with pytest.raises(ModelOptionError):
        zoo.get_model("vgg16", 1, image_size=40, abstract=True)
    with pytest.raises(ModelOptionError):
        zoo.get_model("unet", 1, image_size=20, abstract=True)
    with pytest.raises(ModelOptionError):
        zoo.get_model("gpt2_small", 1, seq_len=2048, abstract=True)
    with pytest.raises(ModelOptionError):
        zoo.get_model("bert_small", 1, hidden=30, num_heads=4, abstract=True)
    with pytest.raises(ModelOptionError):
        zoo.get_model("squeezenet", 1, image_size=16, abstract=True)
    with pytest.raises(ModelOptionError):
        zoo.get_model("mlp", 0)
    with pytest.raises(TypeError):
        zoo.get_model("mlp", 1, colour="red")


# ------------------------------------------------------- parameter counts (shapes only)
def conv(k, cin, cout, bias=False):
    return k * k * cin * cout + (cout if bias else 0)


def bn(c):
    return 2 * c  # scale + bias (running statistics are not parameters)


def resnet_count(blocks, bottleneck, num_classes, cifar):
    """He et al.'s ResNet, counted by hand."""
    total = conv(3 if cifar else 7, 3, 64) + bn(64)
    cin = 64
    for stage, n in enumerate(blocks):
        w = 64 * 2**stage
        out = 4 * w if bottleneck else w
        for b in range(n):
            stride = 2 if (stage > 0 and b == 0) else 1
            if bottleneck:
                total += conv(1, cin, w) + bn(w) + conv(3, w, w) + bn(w) + conv(1, w, out) + bn(out)
            else:
                total += conv(3, cin, w) + bn(w) + conv(3, w, w) + bn(w)
            if stride != 1 or cin != out:
                total += conv(1, cin, out) + bn(out)
            cin = out
    return total + cin * num_classes + num_classes


def vgg16_count(image_size, num_classes):
    chans = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    total, cin = 0, 3
    for c in chans:
        total += conv(3, cin, c, bias=True)
        cin = c
    flat = 512 * (image_size // 32) ** 2
    return total + (flat * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * num_classes + num_classes)


def unet_count(width=64, depth=4, cin=3, classes=2):
    total, c = 0, cin
    for i in range(depth + 1):  # encoder levels and the bottleneck
        w = width * 2**i
        total += conv(3, c, w, True) + conv(3, w, w, True)
        c = w
    for i in reversed(range(depth)):
        w = width * 2**i
        total += conv(2, c, w, True)  # transposed 2x2
        total += conv(3, 2 * w, w, True) + conv(3, w, w, True)
        c = w
    return total + conv(1, c, classes, True)


def gpt2_count(vocab, ctx=1024, d=768, layers=12):
    per_layer = 2 * bn(d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return vocab * d + ctx * d + layers * per_layer + bn(d)


@pytest.mark.parametrize(
    "name, options, published, formula",
    [
        ("resnet18", dict(image_size=224), 11_689_512, resnet_count([2, 2, 2, 2], False, 1000, False)),
        ("resnet18", {}, 11_173_962, resnet_count([2, 2, 2, 2], False, 10, True)),
        ("resnet50", {}, 25_557_032, resnet_count([3, 4, 6, 3], True, 1000, False)),
        ("vgg16", dict(image_size=224), 138_357_544, vgg16_count(224, 1000)),
        ("vgg16", {}, None, vgg16_count(32, 10)),
        ("mobilenet_v2", {}, 3_504_872, None),
        ("squeezenet", {}, 1_248_424, None),
        ("squeezenet", dict(version="1.1"), 1_235_496, None),
        ("unet", {}, None, unet_count()),
        ("gpt2_small", dict(vocab_size=50257), 124_439_808, gpt2_count(50257)),
        ("gpt2_small", {}, None, gpt2_count(8192)),
        ("mlp", {}, None, 1024 * 1024 * 16 + 1024 * 16 + 1024 * 10 + 10),
    ],
)
def test_parameter_counts_at_default_sizes(name, options, published, formula):
    """Published figures (torchvision / Hugging Face model cards) and hand formulas."""
    spec = zoo.get_model(name, 1, abstract=True, **options)
    assert isinstance(jax.tree_util.tree_leaves(spec.variables)[0], jax.ShapeDtypeStruct)
    count = n_params(spec.variables["params"])
    assert count == spec.param_count()
    if published is not None:
        assert count == published
    if formula is not None:
        assert count == formula


def test_default_sizes_follow_the_papers():
    assert zoo.get_model("resnet18", 1, abstract=True).batch["image"].shape == (1, 32, 32, 3)
    assert zoo.get_model("vgg16", 1, abstract=True).batch["image"].shape == (1, 32, 32, 3)
    for name in ("resnet50", "mobilenet_v2", "squeezenet"):
        assert zoo.get_model(name, 1, abstract=True).batch["image"].shape == (1, 224, 224, 3)
    assert zoo.get_model("unet", 1, abstract=True).batch["image"].shape == (1, 128, 128, 3)
    bert = zoo.get_model("bert_small", 4, abstract=True)
    assert bert.batch["tokens"].shape == (4, 64)
    # BERT-Small (L=4, H=512): with BERT's vocabulary 28.8M + 0.26M pooler = the published 29.1M
    big = zoo.get_model("bert_small", 1, vocab_size=30522, abstract=True).param_count()
    assert abs(big + 512 * 512 + 512 - 29.1e6) < 0.05e6


def test_abstract_models_trace_without_allocating():
    spec = zoo.get_model("resnet50", 2, abstract=True)
    jaxpr = jax.make_jaxpr(spec.loss_fn)(spec.variables, spec.batch)
    out = jaxpr.out_avals[0]
    assert out.shape == () and out.dtype == jnp.float32


def test_ceil_mode_max_pool_matches_pytorch_rule():
    """Output size ceil((n - 3) / 2) + 1 (PyTorch MaxPool2d(3, 2, ceil_mode=True)); values are
    the max over each (clipped) window, computed in NumPy."""
    from remat.zoo.layers import max_pool

    for n in (109, 54, 27, 13, 8, 7):
        out = jax.eval_shape(lambda x: max_pool(x, 3, 2, ceil_mode=True),
                             jax.ShapeDtypeStruct((1, n, n, 1), jnp.float32))
        assert out.shape[1] == -(-(n - 3) // 2) + 1
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 2)).astype(np.float32)
    got = np.asarray(jax.jit(lambda x: max_pool(x, 3, 2, ceil_mode=True))(x))
    want = np.array([[x[0, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(0, 1)) for j in range(4)]
                     for i in range(4)])
    np.testing.assert_array_equal(got[0], want)
