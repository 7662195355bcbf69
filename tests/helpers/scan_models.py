"""Scanned models written for the scan tests (not taken from the zoo): a plain-JAX ``lax.scan``
over stacked weights (tanh MLP blocks and an attention-like block), a Flax linen ``nn.scan``
stack and a Flax nnx ``nnx.scan`` stack, small (width 16-32, 4-6 iterations).

Each builder returns ``(loss, params, batch)`` with ``loss(params, batch)`` a float32 scalar.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def scan_mlp(L=6, B=64, W=32, seed=0):
    """``lax.scan`` of ``h = tanh(h @ w)`` over stacked weights ``[L, W, W]``."""
    key = jax.random.PRNGKey(seed)
    ws = jax.random.normal(key, (L, W, W)) / np.sqrt(W)
    x = jax.random.normal(jax.random.fold_in(key, 1), (B, W))

    def loss(ws, x):
        def body(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(body, x, ws)
        return jnp.mean(h ** 2)

    return loss, ws, x


def scan_attention(L=4, B=4, T=16, D=16, seed=0):
    """``lax.scan`` of an attention-like block: ``softmax((h @ wq) h^T) h``, projected by ``wo``
    through ``tanh``, added to the stream (two projections, two batched contractions)."""
    rng = np.random.default_rng(seed)
    p = {"q": jnp.asarray(rng.normal(size=(L, D, D)) / np.sqrt(D), jnp.float32),
         "o": jnp.asarray(rng.normal(size=(L, D, D)) / np.sqrt(D), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)

    def loss(p, x):
        def body(h, w):
            s = jnp.einsum("btd,bsd->bts", h @ w["q"], h) / np.sqrt(D)
            a = jax.nn.softmax(s, axis=-1)
            return h + jnp.tanh(jnp.einsum("bts,bsd->btd", a, h) @ w["o"]), None

        h, _ = jax.lax.scan(body, x, p)
        return jnp.mean(h ** 2)

    return loss, p, x


def _linen_block(W):
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            h = jnp.tanh(nn.Dense(W)(h))
            return nn.LayerNorm()(h + nn.Dense(W)(jax.nn.gelu(h))), None

    return Block


def linen_scan(L=4, B=32, W=32, seed=0, policy=None):
    """Flax linen: ``nn.scan`` over a Dense-tanh-Dense-LayerNorm block (``nn.remat`` of the block
    with ``policy`` when given, as users write it)."""
    import flax.linen as nn

    block = _linen_block(W)
    if policy is not None:
        block = nn.remat(block, policy=policy, prevent_cse=False)

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                            length=L)
            h, _ = stack(name="layers")(x, None)
            return h

    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (B, W))
    net = Net()
    params = net.init(jax.random.PRNGKey(seed), x)["params"]

    def loss(params, x):
        return jnp.mean(net.apply({"params": params}, x) ** 2)

    return loss, params, x


def nnx_scan(L=4, B=32, W=32, seed=0):
    """Flax nnx: blocks created with ``nnx.vmap`` (stacked parameters), run by ``nnx.scan``
    (``in_axes=(nnx.Carry, 0)``), through ``nnx.split`` / ``nnx.merge``."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(W, 2 * W, rngs=rngs)
            self.down = nnx.Linear(2 * W, W, rngs=rngs)

        def __call__(self, h):
            return h + self.down(jnp.tanh(self.up(h)))

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return Block(rngs)

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.blocks = create(rngs)

        def __call__(self, x):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(h, block):
                return block(h)

            return forward(x, self.blocks)

    graphdef, state = nnx.split(Net(nnx.Rngs(seed)))
    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (B, W))

    def loss(state, x):
        return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

    return loss, state, x


MODELS = [scan_mlp, scan_attention, linen_scan, nnx_scan]
