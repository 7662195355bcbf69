"""Small Flax / plain-JAX models shared by test_extract.py and test_executor.py.

Each ``make_*`` returns ``(loss_fn, params, batch)`` with ``loss_fn(params, batch)`` a float32
scalar.  Sizes are tiny so the suite stays fast on a 2-core machine.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class MLP(nn.Module):
    """``depth`` Dense layers, ReLU after all but the last."""

    depth: int = 16
    width: int = 8
    out: int = 3

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth - 1):
            x = nn.relu(nn.Dense(self.width)(x))
        return nn.Dense(self.out)(x)


def _xent(logits, labels):
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, logits.shape[-1]), -1))


def _classifier(m, x_shape, batch, seed):
    """A stateless classifier task: random x of ``x_shape``, labels in {0, 1, 2}, mean xent."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=batch), jnp.int32)
    params = m.init(jax.random.PRNGKey(seed), x)

    def loss(p, b):
        return _xent(m.apply(p, b["x"]), b["y"])

    return loss, params, {"x": x, "y": y}


def make_mlp(depth=16, width=8, batch=4, seed=0):
    return _classifier(MLP(depth=depth, width=width), (batch, 5), batch, seed)


class ConvBN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Conv(4, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=False)(x)
        x = nn.relu(x)
        x = nn.Conv(4, (3, 3), strides=(2, 2))(x)
        x = nn.BatchNorm(use_running_average=False)(x)
        x = nn.relu(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(3)(x)


def make_convbn(batch=2, seed=0):
    m = ConvBN()
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(batch, 8, 8, 3)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=batch), jnp.int32)
    variables = m.init(jax.random.PRNGKey(seed), x)

    def loss(v, b):
        logits, _state = m.apply(v, b["x"], mutable=["batch_stats"])
        return _xent(logits, b["y"])

    return loss, variables, {"x": x, "y": y}


class DropNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(8)(x))
        x = nn.Dropout(0.5, deterministic=False)(x)
        return nn.Dense(3)(x)


def make_dropout(batch=4, seed=0):
    m = DropNet()
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(batch, 5)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=batch), jnp.int32)
    params = m.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, x)

    def loss(p, b):
        return _xent(m.apply(p, b["x"], rngs={"dropout": b["rng"]}), b["y"])

    return loss, params, {"x": x, "y": y, "rng": jax.random.PRNGKey(seed + 7)}


class AttnNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8)(x)
        h = h + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(h, h)
        h = nn.LayerNorm()(h)
        return nn.Dense(3)(jnp.mean(h, axis=1))


def make_attention(batch=2, seq=5, seed=0):
    m = AttnNet()
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(batch, seq, 6)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=batch), jnp.int32)
    params = m.init(jax.random.PRNGKey(seed), x)

    def loss(p, b):
        return _xent(m.apply(p, b["x"]), b["y"])

    return loss, params, {"x": x, "y": y}


class Block(nn.Module):
    """Three Dense layers and a skip connection around them."""

    width: int = 8

    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(self.width)(x))
        h = nn.relu(nn.Dense(self.width)(h))
        h = nn.Dense(self.width)(h)
        return nn.relu(x + h)


class ResNet(nn.Module):
    blocks: int = 3

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(8)(x)
        for _ in range(self.blocks):
            x = Block()(x)
        return nn.Dense(3)(x)


def make_resnet(blocks=3, batch=4, seed=0):
    return _classifier(ResNet(blocks=blocks), (batch, 5), batch, seed)


class RematNet(nn.Module):
    """Blocks wrapped in ``nn.remat``: JAX's own recomputation inside the backward pass."""

    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.remat(Block)()(x)
        return nn.Dense(3)(x)


def make_remat(batch=4, seed=0):
    return _classifier(RematNet(), (batch, 8), batch, seed)


def make_plain(seed=0):
    """A plain-JAX function (no modules): two tanh layers, a skip, a squared-error loss."""
    rng = np.random.default_rng(seed)
    params = {
        "w1": jnp.asarray(rng.normal(size=(5, 6)) * 0.5, jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(6, 6)) * 0.5, jnp.float32),
    }
    x = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)

    def loss(p, x):
        h = jnp.tanh(x @ p["w1"])
        z = jnp.tanh(h @ p["w2"]) + h
        return jnp.mean(z * z)

    return loss, params, x


MODELS = {
    "mlp": lambda: make_mlp(depth=6),
    "convbn": make_convbn,
    "dropout": make_dropout,
    "attention": make_attention,
    "resnet": make_resnet,
    "plain": make_plain,
    "remat": make_remat,
}
