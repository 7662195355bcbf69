"""Small Flax building blocks shared by the zoo's CNNs (NHWC layout, float32).

Each block is its own named submodule so that Flax name stacks (``ResNet/stage2_block1/conv1``)
identify the layer an equation belongs to; ``remat.extract(stages="module")`` groups by them.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def pad2(p: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Symmetric spatial padding ``p`` on both sides (PyTorch ``padding=p``)."""
    return ((p, p), (p, p))


class ConvBN(nn.Module):
    """Conv (no bias when followed by BatchNorm) -> BatchNorm (train mode: batch statistics)
    -> activation (``act=None``: none).

    Shapes: ``x[B, H, W, Cin] -> y[B, H', W', features]``; ``groups=Cin=features`` gives a
    depthwise convolution.
    """

    features: int
    kernel: int = 3
    strides: int = 1
    padding: int | None = None  # default kernel // 2
    groups: int = 1
    batch_norm: bool = True
    act: Callable[[jax.Array], jax.Array] | None = nn.relu

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        p = self.kernel // 2 if self.padding is None else self.padding
        x = nn.Conv(
            self.features,
            (self.kernel, self.kernel),
            strides=(self.strides, self.strides),
            padding=pad2(p),
            feature_group_count=self.groups,
            use_bias=not self.batch_norm,
            name="conv",
        )(x)
        if self.batch_norm:
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name="bn")(x)
        return x if self.act is None else self.act(x)


def max_pool(x: jax.Array, window: int, stride: int, padding: int = 0, ceil_mode: bool = False):
    """Max pooling as PyTorch's ``MaxPool2d(window, stride, padding, ceil_mode)`` (NHWC)."""
    pads = []
    for size in x.shape[1:3]:
        lo = hi = padding
        if ceil_mode:
            span = size + 2 * padding - window
            out = -(-span // stride) + 1
            if (out - 1) * stride >= size + padding:  # PyTorch drops a window starting in padding
                out -= 1
            hi = max(padding, (out - 1) * stride + window - size - padding)
        pads.append((lo, hi))
    return nn.max_pool(x, (window, window), strides=(stride, stride), padding=tuple(pads))


def global_avg_pool(x: jax.Array) -> jax.Array:
    """``x[B, H, W, C] -> float32[B, C]``, the mean over the spatial axes."""
    return jnp.mean(x, axis=(1, 2))
