"""Models written the way users of plain JAX, Flax nnx, Flax linen and Equinox write them (no
scopes the project adds), for the drop-in on code the project did not write.

Each builder returns ``(loss, params, batch)`` with ``loss(params, batch)`` a float32 scalar.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def tanh_chain(L=32, B=256, W=64, seed=0):
    """A plain-JAX chain ``tanh(h @ w)`` over a list of weight matrices."""
    key = jax.random.PRNGKey(seed)
    ws = [jax.random.normal(jax.random.fold_in(key, i), (W, W)) / np.sqrt(W) for i in range(L)]
    x = jax.random.normal(jax.random.fold_in(key, L), (B, W))

    def loss(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)

    return loss, ws, x


def plain_transformer(blocks=4, B=2, T=16, D=32, H=2, seed=0):
    """A pre-LN transformer in plain jnp: dicts of arrays, no modules, no scopes."""
    rng = np.random.default_rng(seed)

    def w(*s):
        return jnp.asarray(rng.normal(size=s) / np.sqrt(s[0]), jnp.float32)

    params = {
        "emb": w(50, D),
        "blocks": [{"qkv": w(D, 3 * D), "o": w(D, D), "up": w(D, 4 * D), "down": w(4 * D, D),
                    "g1": jnp.ones(D), "g2": jnp.ones(D)} for _ in range(blocks)],
        "head": w(D, 50),
    }
    tokens = jnp.asarray(rng.integers(0, 50, size=(B, T)), jnp.int32)

    def ln(x, g):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return g * (x - m) / jnp.sqrt(v + 1e-5)

    def loss(p, tokens):
        x = p["emb"][tokens]
        mask = jnp.tril(jnp.ones((T, T), bool))
        for blk in p["blocks"]:
            q, k, v = jnp.split(ln(x, blk["g1"]) @ blk["qkv"], 3, axis=-1)
            q, k, v = (a.reshape(B, T, H, D // H) for a in (q, k, v))
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
            a = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, T, D) @ blk["o"]
            x = x + jax.nn.gelu(ln(x, blk["g2"]) @ blk["up"]) @ blk["down"]
        logits = x @ p["head"]
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return loss, params, tokens


def nnx_mlp(L=12, B=64, W=32, seed=0):
    """A Flax nnx MLP (``nnx.Linear`` + tanh) through ``nnx.split`` / ``nnx.merge``."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(W, W, rngs=rngs) for _ in range(L)])

        def __call__(self, x):
            for lin in self.layers:
                x = jnp.tanh(lin(x))
            return x

    graphdef, state = nnx.split(MLP(nnx.Rngs(seed)))
    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (B, W))

    def loss(state, x):
        return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

    return loss, state, x


def linen_sumsq_mlp(L=12, B=256, seed=0):
    """A Flax linen MLP of ``L`` ``Dense`` + tanh layers of random widths 16..96 whose loss
    ``jnp.sum(y ** 2)`` is read by no backward node (the derivative needs ``y`` only)."""
    import flax.linen as nn

    rng = np.random.default_rng(seed)
    widths = [int(w) for w in rng.integers(16, 97, size=L)]

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for w in widths:
                x = jnp.tanh(nn.Dense(w)(x))
            return x

    model = MLP()
    x = jnp.asarray(rng.normal(size=(B, 24)), jnp.float32)
    # parameters drawn with numpy in linen's layout (scaled normal kernels, zero biases), not
    # by ``model.init``: its PRNG program took 15-24 s to run or compile at 36 layers
    dims = (24, *widths)
    params = {"params": {f"Dense_{i}": {
        "kernel": jnp.asarray(rng.normal(size=dims[i:i + 2]) / np.sqrt(dims[i]), jnp.float32),
        "bias": jnp.zeros(dims[i + 1], jnp.float32)} for i in range(L)}}

    def loss(p, x):
        return jnp.sum(model.apply(p, x) ** 2)

    return loss, params, x


def equinox_mlp(L=10, B=64, W=32, seed=0):
    """An Equinox MLP of ``eqx.nn.Linear`` layers, parameters split with ``eqx.partition``."""
    import equinox as eqx

    class MLP(eqx.Module):
        layers: list

        def __init__(self, key):
            self.layers = [eqx.nn.Linear(W, W, key=k) for k in jax.random.split(key, L)]

        def __call__(self, x):
            for lin in self.layers:
                x = jax.nn.relu(jax.vmap(lin)(x))
            return x

    params, static = eqx.partition(MLP(jax.random.PRNGKey(seed)), eqx.is_array)
    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (B, W))

    def loss(params, x):
        return jnp.mean(eqx.combine(params, static)(x) ** 2)

    return loss, params, x
