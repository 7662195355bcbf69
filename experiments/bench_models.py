"""The five models of the GPU benchmark (``experiments/gpu_benchmark.py``), at two sizes.

``build(name, size) -> BenchModel`` with ``loss(params, batch) -> float32[]`` and, where the
model allows it, ``builtin_loss(policy)``: the same loss with every block under
``jax.checkpoint(block, policy=policy)`` (JAX's built-in policies applied per block, the way
users write them by hand), same parameters.

=============  ===========================================================  =================
name           full size (``size="full"``)                                   per-block hook
=============  ===========================================================  =================
``gpt2_small`` zoo ``gpt2_small``, batch 16, sequence 512 (vocab 8192,       zoo ``remat_policy``
               dropout 0.1, the zoo's defaults)                               (``nn.remat`` per block)
``resnet50``   zoo ``resnet50``, batch 64, 224 px, BatchNorm                 none: the zoo has no hook
``transformer`` plain JAX, 12 pre-LN blocks, d=1024, 16 heads, MLP 4096      ``jax.checkpoint`` per block
               (GELU), batch 16, sequence 512, mean-square loss
``mlp``        plain JAX, 32 x (Dense 4096 + tanh), batch 8192, mean-square   ``jax.checkpoint`` per layer
``flax_scan``  Flax linen ``nn.scan`` over 12 pre-LN blocks, d=1024, 16       ``nn.scan(nn.remat(Block,
               heads, MLP 4096 (GELU), batch 16, sequence 512                 policy=...))``
=============  ===========================================================  =================

``size="tiny"``: 2 blocks (``mlp``: 4 layers), width 64, batch 4, sequence 16 (``mlp``: batch
32; ``resnet50``: 32 px, width 8, one bottleneck per stage), for the CPU test suite.
Parameters of the plain-JAX and Flax-scan models come from ``jax.random`` on the default device;
the zoo models use the zoo's numpy initialisation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

MODELS = ("gpt2_small", "resnet50", "transformer", "mlp", "flax_scan")
SIZES = ("full", "tiny")

__all__ = ["MODELS", "SIZES", "BenchModel", "build", "model_flops"]


@dataclasses.dataclass
class BenchModel:
    """One benchmark model.

    Attributes:
      name, size, description: what it is.
      loss: ``loss(params, batch) -> float32[]``.
      params, batch: device arrays.
      builtin_loss: ``policy -> loss`` with every block under ``jax.checkpoint(policy=policy)``
        (same parameter tree as ``loss``), or ``None`` when the model has no per-block hook.
      builtin_note: why ``builtin_loss`` is ``None``.
      scanned: the layers are one ``nn.scan`` (the ``scan_layers`` policy applies).
      flops: analytic FLOPs of one ``value_and_grad`` step without recomputation
        (3x the forward matmul/conv FLOPs; :func:`model_flops`).
    """

    name: str
    size: str
    description: str
    loss: Callable
    params: Any
    batch: Any
    builtin_loss: Callable[[Any], Callable] | None = None
    builtin_note: str = ""
    scanned: bool = False
    flops: float | None = None


# --------------------------------------------------------------------------- sizes
_CONFIG: dict[str, dict[str, dict[str, Any]]] = {
    "gpt2_small": {
        "full": dict(batch_size=16, seq_len=512),
        "tiny": dict(batch_size=4, seq_len=16, hidden=64, num_layers=2, num_heads=2,
                     vocab_size=64, max_len=16),
    },
    "resnet50": {
        "full": dict(batch_size=64, image_size=224),
        "tiny": dict(batch_size=4, image_size=32, width=8, stage_sizes=(1, 1, 1, 1)),
    },
    "transformer": {
        "full": dict(layers=12, d=1024, heads=16, mlp=4096, batch=16, seq=512),
        "tiny": dict(layers=2, d=64, heads=4, mlp=256, batch=4, seq=16),
    },
    "mlp": {
        "full": dict(layers=32, width=4096, batch=8192),
        "tiny": dict(layers=4, width=64, batch=32),
    },
    "flax_scan": {
        "full": dict(layers=12, d=1024, heads=16, mlp=4096, batch=16, seq=512),
        "tiny": dict(layers=2, d=64, heads=4, mlp=256, batch=4, seq=16),
    },
}


def config(name: str, size: str) -> dict[str, Any]:
    """The builder options of ``name`` at ``size``."""
    if name not in _CONFIG:
        raise KeyError(f"unknown benchmark model {name!r}; known: {', '.join(MODELS)}")
    if size not in SIZES:
        raise KeyError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    return dict(_CONFIG[name][size])


def model_flops(name: str, size: str) -> float:
    """Analytic FLOPs of one training step without recomputation: 3 x forward (2 per
    multiply-add of the matmuls/convolutions and attention products; elementwise work left
    out).  ResNet-50 at 224 px: 4.1 GMAC per image forward."""
    c = config(name, size)
    if name == "mlp":
        return 3 * 2.0 * c["batch"] * c["width"] ** 2 * c["layers"]
    if name in ("transformer", "flax_scan"):
        tok, d, t = c["batch"] * c["seq"], c["d"], c["seq"]
        per_layer = 2.0 * tok * (4 * d * d + 2 * d * c["mlp"]) + 2 * 2.0 * tok * t * d
        return 3 * per_layer * c["layers"]
    if name == "gpt2_small":
        b, t = c["batch_size"], c["seq_len"]
        d, n = c.get("hidden", 768), c.get("num_layers", 12)
        v = c.get("vocab_size", 8192)
        tok = b * t
        per_layer = 2.0 * tok * 12 * d * d + 2 * 2.0 * tok * t * d
        return 3 * (per_layer * n + 2.0 * tok * d * v)
    if name == "resnet50":
        px = c.get("image_size", 224)
        if "width" in c:  # tiny: no analytic count
            return float("nan")
        return 3 * 2.0 * 4.1e9 * c["batch_size"] * (px / 224) ** 2
    raise KeyError(name)


def build(name: str, size: str = "full", seed: int = 0) -> BenchModel:
    """Build benchmark model ``name`` at ``size`` (``"full"`` or ``"tiny"``)."""
    c = config(name, size)
    m = {"gpt2_small": _gpt2, "resnet50": _resnet50, "transformer": _transformer,
         "mlp": _mlp, "flax_scan": _flax_scan}[name](c, seed)
    m.size = size
    m.flops = model_flops(name, size)
    return m


# --------------------------------------------------------------------------- zoo models
def _gpt2(c, seed) -> BenchModel:
    import remat.zoo

    spec = remat.zoo.get_model("gpt2_small", seed=seed, **c)

    def builtin_loss(policy):
        # the zoo's own hook: every block under nn.remat(TransformerBlock, policy=policy);
        # abstract=True builds only the module and loss (same parameter tree)
        return remat.zoo.get_model("gpt2_small", seed=seed, abstract=True, remat_policy=policy,
                                   **c).loss_fn

    return BenchModel("gpt2_small", "", f"zoo gpt2_small {c}", spec.loss_fn, spec.variables,
                      spec.batch, builtin_loss=builtin_loss)


def _resnet50(c, seed) -> BenchModel:
    import remat.zoo

    spec = remat.zoo.get_model("resnet50", seed=seed, **c)
    return BenchModel("resnet50", "", f"zoo resnet50 {c}", spec.loss_fn, spec.variables,
                      spec.batch, builtin_loss=None,
                      builtin_note="remat.zoo.resnet exposes no per-block remat hook")


# --------------------------------------------------------------------------- plain JAX
def _layer_norm(x, scale, bias, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * scale + bias


def _attention(h, wqkv, bqkv, wo, bo, heads):
    b, t, d = h.shape
    hd = d // heads
    qkv = (h @ wqkv + bqkv).reshape(b, t, 3, heads, hd)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    p = jax.nn.softmax(s, axis=-1)
    y = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d)
    return y @ wo + bo


def _transformer(c, seed) -> BenchModel:
    L, d, heads, mlp, B, T = c["layers"], c["d"], c["heads"], c["mlp"], c["batch"], c["seq"]
    key = jax.random.PRNGKey(seed)
    keys = jax.random.split(key, L + 2)

    def layer(k):
        k1, k2, k3, k4 = jax.random.split(k, 4)
        n = lambda kk, shape: 0.02 * jax.random.normal(kk, shape, jnp.float32)  # noqa: E731
        return {
            "ln1_s": jnp.ones((d,)), "ln1_b": jnp.zeros((d,)),
            "wqkv": n(k1, (d, 3 * d)), "bqkv": jnp.zeros((3 * d,)),
            "wo": n(k2, (d, d)), "bo": jnp.zeros((d,)),
            "ln2_s": jnp.ones((d,)), "ln2_b": jnp.zeros((d,)),
            "w1": n(k3, (d, mlp)), "b1": jnp.zeros((mlp,)),
            "w2": n(k4, (mlp, d)), "b2": jnp.zeros((d,)),
        }

    params = {"layers": [layer(k) for k in keys[:L]],
              "lnf_s": jnp.ones((d,)), "lnf_b": jnp.zeros((d,))}
    kx, ky = jax.random.split(keys[L])
    batch = {"x": jax.random.normal(kx, (B, T, d), jnp.float32),
             "y": jax.random.normal(ky, (B, T, d), jnp.float32)}

    def block(p, x):
        x = x + _attention(_layer_norm(x, p["ln1_s"], p["ln1_b"]), p["wqkv"], p["bqkv"],
                           p["wo"], p["bo"], heads)
        h = jax.nn.gelu(_layer_norm(x, p["ln2_s"], p["ln2_b"]) @ p["w1"] + p["b1"])
        return x + h @ p["w2"] + p["b2"]

    def make(block_remat=None):
        blk = block if block_remat is None else jax.checkpoint(block, policy=block_remat)

        def loss(params, batch):
            x = batch["x"]
            for p in params["layers"]:
                x = blk(p, x)
            x = _layer_norm(x, params["lnf_s"], params["lnf_b"])
            return jnp.mean(jnp.square(x - batch["y"]))

        return loss

    return BenchModel("transformer", "", f"plain-JAX transformer {c}", make(), params, batch,
                      builtin_loss=make)


def _mlp(c, seed) -> BenchModel:
    L, w, B = c["layers"], c["width"], c["batch"]
    keys = jax.random.split(jax.random.PRNGKey(seed), L + 1)
    params = [{"w": jax.random.normal(k, (w, w), jnp.float32) / math.sqrt(w),
               "b": jnp.zeros((w,))} for k in keys[:L]]
    kx, ky = jax.random.split(keys[L])
    batch = {"x": jax.random.normal(kx, (B, w), jnp.float32),
             "y": jax.random.normal(ky, (B, w), jnp.float32)}

    def block(p, h):
        return jnp.tanh(h @ p["w"] + p["b"])

    def make(block_remat=None):
        blk = block if block_remat is None else jax.checkpoint(block, policy=block_remat)

        def loss(params, batch):
            h = batch["x"]
            for p in params:
                h = blk(p, h)
            return jnp.mean(jnp.square(h - batch["y"]))

        return loss

    return BenchModel("mlp", "", f"plain-JAX tanh MLP {c}", make(), params, batch,
                      builtin_loss=make)


# --------------------------------------------------------------------------- Flax nn.scan
def _flax_scan(c, seed) -> BenchModel:
    import flax.linen as nn

    L, d, heads, mlp, B, T = c["layers"], c["d"], c["heads"], c["mlp"], c["batch"], c["seq"]

    class Block(nn.Module):
        """Pre-LN transformer block in ``nn.scan``'s ``(carry, x) -> (carry, None)`` form."""

        heads: int
        mlp: int

        @nn.compact
        def __call__(self, x, _):
            b, t, dd = x.shape
            hd = dd // self.heads
            h = nn.LayerNorm(name="ln1")(x)
            qkv = nn.Dense(3 * dd, name="qkv")(h).reshape(b, t, 3, self.heads, hd)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
            y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(b, t, dd)
            x = x + nn.Dense(dd, name="out")(y)
            h = nn.gelu(nn.Dense(self.mlp, name="fc1")(nn.LayerNorm(name="ln2")(x)))
            return x + nn.Dense(dd, name="fc2")(h), None

    class ScanTransformer(nn.Module):
        layers: int
        heads: int
        mlp: int
        remat_policy: Any = None

        @nn.compact
        def __call__(self, x):
            cls = Block if self.remat_policy is None else nn.remat(
                Block, policy=self.remat_policy, prevent_cse=False)
            stack = nn.scan(cls, variable_axes={"params": 0}, split_rngs={"params": True},
                            length=self.layers)
            x, _ = stack(self.heads, self.mlp, name="layers")(x, None)
            return nn.LayerNorm(name="ln_f")(x)

    key = jax.random.PRNGKey(seed)
    kp, kx, ky = jax.random.split(key, 3)
    batch = {"x": jax.random.normal(kx, (B, T, d), jnp.float32),
             "y": jax.random.normal(ky, (B, T, d), jnp.float32)}
    module = ScanTransformer(L, heads, mlp)
    params = jax.jit(module.init)(kp, batch["x"][:1])

    def make(block_remat=None):
        mod = ScanTransformer(L, heads, mlp, remat_policy=block_remat)

        def loss(params, batch):
            return jnp.mean(jnp.square(mod.apply(params, batch["x"]) - batch["y"]))

        return loss

    return BenchModel("flax_scan", "", f"Flax nn.scan transformer {c}", make(), params, batch,
                      builtin_loss=make, scanned=True)
