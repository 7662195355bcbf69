"""The small plain-JAX MLP shared by the apply / measure / micro-batch tests: one
``jax.named_scope`` per layer (the extractor's module scopes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def make_mlp_loss(act):
    """``loss(params, batch)``: ``act(h @ w + b)`` per layer, then mean squared error to
    ``batch["y"]``."""

    def mlp_loss(params, batch):
        h = batch["x"]
        for i, (w, b) in enumerate(params):
            with jax.named_scope(f"layer{i}"):
                h = act(h @ w + b)
        return jnp.mean((h - batch["y"]) ** 2)

    return mlp_loss


relu_mlp_loss = make_mlp_loss(jax.nn.relu)
tanh_mlp_loss = make_mlp_loss(jnp.tanh)


def mlp_setup(depth: int, width: int, batch: int, seed: int = 0, bias: float = 0.0):
    """``(params, batch)``: ``depth`` (width × width) layers with scaled normal weights and a
    constant ``bias``; ``x``/``y`` of shape (batch, width)."""
    ks = jax.random.split(jax.random.PRNGKey(seed), depth + 2)
    params = [(jax.random.normal(ks[i], (width, width)) / np.sqrt(width), jnp.full((width,), bias))
              for i in range(depth)]
    b = {"x": jax.random.normal(ks[-2], (batch, width)), "y": jax.random.normal(ks[-1], (batch, width))}
    return params, b
