"""A deep multilayer perceptron: the chain benchmark of the rematerialization papers.

``depth`` blocks of ``Dense(width) -> ReLU`` (each its own submodule ``block{i}``, so one
graph stage per layer) and a linear classifier ``head``. Parameters:
``in_features*width + width + (depth-1)*(width^2 + width) + width*num_classes + num_classes``.
Loss: mean softmax cross-entropy.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from remat.zoo._common import ModelSpec, build_spec, check_positive, softmax_xent


class MLPBlock(nn.Module):
    """``x[B, *] -> relu(x @ W + b)[B, width]``."""

    width: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.relu(nn.Dense(self.width, name="dense")(x))


class MLP(nn.Module):
    """``depth`` :class:`MLPBlock` layers then a linear head; ``x[B, in] -> logits[B, classes]``."""

    depth: int = 16
    width: int = 1024
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        for i in range(self.depth):
            x = MLPBlock(self.width, name=f"block{i}")(x)
        return nn.Dense(self.num_classes, name="head")(x)


def build_mlp(
    batch_size: int = 8,
    *,
    depth: int = 16,
    width: int = 1024,
    in_features: int | None = None,
    num_classes: int = 10,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
) -> ModelSpec:
    """``mlp``: batch ``{"x": float32[B, in_features], "label": int32[B]}``.

    Args:
      depth: number of hidden ``Dense+ReLU`` blocks (16 as in the toolchain probe).
      width: hidden units per block.
      in_features: input width (default ``width``).
      num_classes: classifier outputs.
    """
    in_features = width if in_features is None else in_features
    check_positive("mlp", batch_size=batch_size, depth=depth, width=width,
                   in_features=in_features, num_classes=num_classes)
    rng = np.random.default_rng(seed)
    batch = {
        "x": rng.standard_normal((batch_size, in_features), np.float32),
        "label": rng.integers(0, num_classes, (batch_size,), dtype=np.int32),
    }
    module = MLP(depth=depth, width=width, num_classes=num_classes)
    opts = dict(batch_size=batch_size, depth=depth, width=width, in_features=in_features,
                num_classes=num_classes, seed=seed)
    return build_spec("mlp", module, batch, input_key="x",
                      objective=lambda logits, b: softmax_xent(logits, b["label"]),
                      seed=seed, abstract=abstract, options=opts, init=init)
