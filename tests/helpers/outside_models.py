"""Models written outside the zoo, the way users write them, for the tests that run on both ends of
the supported JAX range (the primitive census, the drop-in on any model).

Each builder returns ``(loss, params, batch)`` with ``loss(params, batch)`` a float32 scalar;
sizes are tiny so a plan and a compiled step take well under a second.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def custom_vjp_mlp():
    """A plain-JAX MLP whose activation has a hand-written VJP (a clipped softplus)."""

    @jax.custom_vjp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    def fwd(x):
        return softplus(x), x

    def bwd(x, g):
        return (jnp.clip(g * jax.nn.sigmoid(x), -1.0, 1.0),)

    softplus.defvjp(fwd, bwd)
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.normal(size=(4, 4)), jnp.float32) for _ in range(2)]
    x = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)

    def loss(p, x):
        for w in p:
            x = softplus(x @ w)
        return jnp.mean(x ** 2)

    return loss, params, x


def plain_transformer(layers: int = 1, *, batch: int = 2, seq: int = 4, width: int = 8,
                      vocab: int = 16):
    """Pre-LN blocks in plain JAX: layernorm, causal softmax attention, exact and tanh GELU,
    token embedding lookup and cross-entropy (tokens (batch, seq), width, vocabulary)."""
    rng = np.random.default_rng(0)
    T, D, V = seq, width, vocab
    shapes = {"qkv": (D, 3 * D), "out": (D, D), "fc1": (D, 2 * D), "fc2": (2 * D, D),
              "g": (D,), "b": (D,)}

    def draw(s):
        return jnp.asarray(rng.normal(size=s) * 0.3, jnp.float32)

    p = {"emb": draw((V, D)),
         "blocks": [{k: draw(s) for k, s in shapes.items()} for _ in range(layers)]}
    tokens = jnp.asarray(rng.integers(0, V, size=(batch, T)), jnp.int32)

    def layernorm(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]

    def loss(p, tokens):
        x = p["emb"][tokens]
        for blk in p["blocks"]:
            q, k, v = jnp.split(layernorm(x, blk) @ blk["qkv"], 3, axis=-1)
            s = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(D)
            s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e9)
            x = x + jax.nn.softmax(s, axis=-1) @ v @ blk["out"]
            h = layernorm(x, blk) @ blk["fc1"]
            gelu = jax.nn.gelu(h, approximate=True) + jax.nn.gelu(h, approximate=False)
            x = x + gelu @ blk["fc2"]
        logp = jax.nn.log_softmax(x @ p["emb"].T)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], axis=-1))

    return loss, p, tokens


def plain_tanh_mlp(depth: int = 8, width: int = 16, batch: int = 8):
    """A plain-JAX tanh MLP (list of (w, b)), mean squared error."""
    ks = jax.random.split(jax.random.PRNGKey(1), depth + 2)
    params = [(jax.random.normal(ks[i], (width, width)) / np.sqrt(width), jnp.zeros((width,)))
              for i in range(depth)]
    batch_ = {"x": jax.random.normal(ks[-2], (batch, width)),
              "y": jax.random.normal(ks[-1], (batch, width))}

    def loss(params, b):
        h = b["x"]
        for w, bias in params:
            h = jnp.tanh(h @ w + bias)
        return jnp.mean((h - b["y"]) ** 2)

    return loss, params, batch_


def densenet(depth: int = 6, width: int = 32, batch: int = 128):
    """Plain JAX, DenseNet-style: each layer reads the concatenation of every earlier feature
    map, so the stack has no cut (one block); ``loss(ws, x)``."""
    rng = np.random.default_rng(1)
    ws = [jnp.asarray(rng.normal(size=(width * (i + 1), width)) * 0.2, jnp.float32)
          for i in range(depth)]
    x = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)

    def loss(ws, x):
        feats = [x]
        for w in ws:
            feats.append(jax.nn.relu(jnp.concatenate(feats, -1) @ w))
        return jnp.mean(feats[-1] ** 2)

    return loss, ws, x


class _LinenMLP(nn.Module):
    depth: int = 6
    width: int = 16

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth):
            x = jax.nn.gelu(nn.Dense(self.width)(x))
        return nn.Dense(3)(x)


def _xent(logits, labels):
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 3), -1))


def _data(batch: int, width: int):
    rng = np.random.default_rng(2)
    return (jnp.asarray(rng.normal(size=(batch, width)), jnp.float32),
            jnp.asarray(rng.integers(0, 3, size=batch), jnp.int32))


def linen_mlp(batch: int = 8):
    """A Flax linen GELU MLP classifier, ``loss(variables, (x, y))``."""
    m = _LinenMLP()
    x, y = _data(batch, 16)
    variables = m.init(jax.random.PRNGKey(0), x)

    def loss(v, b):
        return _xent(m.apply(v, b[0]), b[1])

    return loss, variables, (x, y)


class _NnxMLP(nnx.Module):
    def __init__(self, depth: int, width: int, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.head = nnx.Linear(width, 3, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.head(x)


def nnx_mlp(batch: int = 8):
    """A Flax nnx tanh MLP as users write it, split into ``(graphdef, state)``; the loss merges
    them (``loss(state, (x, y))``)."""
    graphdef, state = nnx.split(_NnxMLP(6, 16, nnx.Rngs(0)))
    x, y = _data(batch, 16)

    def loss(state, b):
        return _xent(nnx.merge(graphdef, state)(b[0]), b[1])

    return loss, state, (x, y)


class _Block(nn.Module):
    """Pre-LN transformer block: self-attention and a GELU MLP, both residual."""

    width: int
    heads: int

    @nn.compact
    def __call__(self, x, _):
        h = nn.SelfAttention(num_heads=self.heads, deterministic=True)(nn.LayerNorm()(x))
        x = x + h
        h = nn.Dense(self.width)(jax.nn.gelu(nn.Dense(2 * self.width)(nn.LayerNorm()(x))))
        return x + h, None


class _ScannedTransformer(nn.Module):
    layers: int
    width: int
    heads: int
    vocab: int

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width)(tokens)
        stack = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True},
                        length=self.layers)
        x, _ = stack(self.width, self.heads)(x, None)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def linen_scan_transformer(layers: int = 4, width: int = 16, heads: int = 2, vocab: int = 16):
    """A Flax linen transformer whose blocks run under ``nn.scan`` (GELU MLPs), next-token
    cross-entropy on tokens (2, 6)."""
    m = _ScannedTransformer(layers, width, heads, vocab)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, vocab, size=(2, 6)), jnp.int32)
    variables = m.init(jax.random.PRNGKey(0), tokens)

    def loss(v, t):
        logp = jax.nn.log_softmax(m.apply(v, t[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(logp, t[:, 1:, None], axis=-1))

    return loss, variables, tokens
