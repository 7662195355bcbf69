"""MobileNetV2 (Sandler et al. 2018), as in Checkmate's, Melon's and Sage's benchmarks.

torchvision layout: ``stem`` 3x3/2 conv-BN-ReLU6 (32 ch), 17 inverted-residual blocks from the
table (t, c, n, s) = (1,16,1,1) (6,24,2,2) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2)
(6,320,1,1); each block ``block{i}`` is ``expand`` (1x1, omitted when t = 1) -> ``depthwise``
(3x3, ``feature_group_count = channels``) -> ``project`` (1x1, linear), with a residual add when
stride 1 and channels match; then ``last_conv`` 1x1 to 1280 ch, global average pool, ``head``.
Channel counts are rounded with torchvision's ``_make_divisible(v, 8)`` after ``width_mult``.

Published parameter count (torchvision ``mobilenet_v2``, 1000 classes, width 1.0): 3,504,872.
The classifier dropout (0.2) is off by default (``dropout=0.2`` restores it, with
``batch["dropout_rng"]``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from remat.zoo._common import (
    ModelOptionError,
    ModelSpec,
    build_spec,
    check_positive,
    dropout_key,
    image_batch,
    softmax_xent,
)
from remat.zoo.layers import ConvBN, global_avg_pool

INVERTED_RESIDUAL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: nearest multiple of ``divisor``, never 10% below ``v``."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class InvertedResidual(nn.Module):
    """``x[B,H,W,Cin] -> [B,H/s,W/s,features]``; expand t x, depthwise 3x3, linear project."""

    features: int
    strides: int
    expand_ratio: int

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        cin = x.shape[-1]
        hidden = int(round(cin * self.expand_ratio))
        y = x
        if self.expand_ratio != 1:
            y = ConvBN(hidden, 1, padding=0, act=nn.relu6, name="expand")(y, train)
        y = ConvBN(hidden, 3, self.strides, groups=hidden, act=nn.relu6, name="depthwise")(y, train)
        y = ConvBN(self.features, 1, padding=0, act=None, name="project")(y, train)
        if self.strides == 1 and cin == self.features:
            y = x + y
        return y


class MobileNetV2(nn.Module):
    """``image[B, H, W, 3] -> logits[B, num_classes]``."""

    num_classes: int = 1000
    width_mult: float = 1.0
    dropout: float = 0.0
    inverted_residual_setting: tuple[tuple[int, int, int, int], ...] = INVERTED_RESIDUAL_SETTING

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        c = make_divisible(32 * self.width_mult)
        x = ConvBN(c, 3, 2, act=nn.relu6, name="stem")(x, train)
        i = 0
        for t, ch, n, s in self.inverted_residual_setting:
            out = make_divisible(ch * self.width_mult)
            for j in range(n):
                i += 1
                x = InvertedResidual(out, s if j == 0 else 1, t, name=f"block{i}")(x, train)
        last = make_divisible(1280 * max(1.0, self.width_mult))
        x = ConvBN(last, 1, padding=0, act=nn.relu6, name="last_conv")(x, train)
        x = global_avg_pool(x)
        if self.dropout > 0:
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.num_classes, name="head")(x)


def build_mobilenet_v2(
    batch_size: int = 8,
    *,
    image_size: int = 224,
    num_classes: int | None = None,
    width_mult: float = 1.0,
    inverted_residual_setting: tuple[tuple[int, int, int, int], ...] | None = None,
    dropout: float = 0.0,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
) -> ModelSpec:
    """``mobilenet_v2``: batch ``{"image": float32[B, S, S, 3], "label": int32[B]}``.

    Args:
      image_size: default 224 (ImageNet; Melon and Sage resize CIFAR to 224).
      num_classes: default 10 up to 64 px, else 1000.
      width_mult: channel multiplier (1.0; e.g. 0.25 for tests).
      inverted_residual_setting: the (t, c, n, s) table (torchvision's argument of the same
        name); default :data:`INVERTED_RESIDUAL_SETTING`, a shorter table for tests.
    """
    num_classes = (10 if image_size <= 64 else 1000) if num_classes is None else num_classes
    check_positive("mobilenet_v2", batch_size=batch_size, image_size=image_size,
                   num_classes=num_classes)
    if not width_mult > 0:
        raise ModelOptionError(f"mobilenet_v2: width_mult={width_mult} must be positive")
    setting = INVERTED_RESIDUAL_SETTING if inverted_residual_setting is None else tuple(
        tuple(int(v) for v in row) for row in inverted_residual_setting)
    if not setting or any(len(row) != 4 or min(row) < 1 for row in setting):
        raise ModelOptionError(f"mobilenet_v2: bad inverted_residual_setting {setting!r}")
    rng = np.random.default_rng(seed)
    batch = image_batch(rng, batch_size, image_size, 3, num_classes)
    if dropout > 0:
        batch["dropout_rng"] = dropout_key(seed)
    module = MobileNetV2(num_classes=num_classes, width_mult=width_mult, dropout=dropout,
                         inverted_residual_setting=setting)
    opts = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                width_mult=width_mult, inverted_residual_setting=setting, dropout=dropout,
                seed=seed)
    return build_spec("mobilenet_v2", module, batch, input_key="image",
                      objective=lambda logits, b: softmax_xent(logits, b["label"]),
                      seed=seed, abstract=abstract, options=opts, init=init)
