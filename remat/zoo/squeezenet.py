"""SqueezeNet (Iandola et al. 2016), as in OLLA's and Melon's benchmarks.

torchvision layout. Version ``"1.0"``: ``stem`` 7x7/2 conv (96) + ReLU, 3x3/2 max pool
(ceil mode), ``fire2``-``fire4``, pool, ``fire5``-``fire8``, pool, ``fire9``; version ``"1.1"``:
3x3/2 stem (64) with the pools after the stem, ``fire3`` and ``fire5``. A fire module is a 1x1
``squeeze`` conv + ReLU feeding two parallel ``expand1x1`` / ``expand3x3`` convs + ReLU whose
outputs are concatenated on channels. Classifier: ``classifier`` 1x1 conv to ``num_classes``,
ReLU, global average pool (torchvision keeps that ReLU, so logits are non-negative). All convs
have biases; there is no BatchNorm.

Published parameter counts (torchvision, 1000 classes): squeezenet1_0 1,248,424;
squeezenet1_1 1,235,496. Classifier dropout (0.5) is off by default (``dropout=0.5``
restores it, with ``batch["dropout_rng"]``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from remat.zoo._common import (
    ModelOptionError,
    ModelSpec,
    build_spec,
    check_positive,
    dropout_key,
    image_batch,
    scaled,
    softmax_xent,
)
from remat.zoo.layers import ConvBN, global_avg_pool, max_pool

# (squeeze, expand1x1, expand3x3) per fire module, torchvision order; "M" = 3x3/2 ceil max pool.
FIRE_CFG = {
    "1.0": ("M", (16, 64, 64), (16, 64, 64), (32, 128, 128), "M", (32, 128, 128), (48, 192, 192),
            (48, 192, 192), (64, 256, 256), "M", (64, 256, 256)),
    "1.1": ("M", (16, 64, 64), (16, 64, 64), "M", (32, 128, 128), (32, 128, 128), "M",
            (48, 192, 192), (48, 192, 192), (64, 256, 256), (64, 256, 256)),
}


def _spatial_ok(size: int, version: str) -> bool:
    size = (size - 7) // 2 + 1 if version == "1.0" else (size - 3) // 2 + 1
    for item in FIRE_CFG[version]:
        if item == "M":
            if size < 3:
                return False
            size = -(-(size - 3) // 2) + 1
    return size >= 1


def min_image_size(version: str) -> int:
    """Smallest input side for which every 3x3/2 pool sees at least a 3x3 map."""
    return next(s for s in range(7, 512) if _spatial_ok(s, version))


class Fire(nn.Module):
    """``x[B,H,W,Cin] -> [B,H,W,e1+e3]``: squeeze 1x1, then concat(expand 1x1, expand 3x3)."""

    squeeze: int
    expand1x1: int
    expand3x3: int

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        s = ConvBN(self.squeeze, 1, padding=0, batch_norm=False, name="squeeze")(x, train)
        a = ConvBN(self.expand1x1, 1, padding=0, batch_norm=False, name="expand1x1")(s, train)
        b = ConvBN(self.expand3x3, 3, padding=1, batch_norm=False, name="expand3x3")(s, train)
        return jnp.concatenate([a, b], axis=-1)


class SqueezeNet(nn.Module):
    """``image[B, H, W, 3] -> logits[B, num_classes]``."""

    version: str = "1.0"
    num_classes: int = 1000
    width: int = 64  # scales every channel count by width/64
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        w = self.width
        if self.version == "1.0":
            x = ConvBN(scaled(96, w, 64), 7, 2, padding=0, batch_norm=False, name="stem")(x, train)
        else:
            x = ConvBN(scaled(64, w, 64), 3, 2, padding=0, batch_norm=False, name="stem")(x, train)
        fire = 2
        for item in FIRE_CFG[self.version]:
            if item == "M":
                x = max_pool(x, 3, 2, ceil_mode=True)
            else:
                sq, e1, e3 = (scaled(c, w, 64) for c in item)
                x = Fire(sq, e1, e3, name=f"fire{fire}")(x, train)
                fire += 1
        if self.dropout > 0:
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = ConvBN(self.num_classes, 1, padding=0, batch_norm=False, name="classifier")(x, train)
        return global_avg_pool(x)


def build_squeezenet(
    batch_size: int = 8,
    *,
    image_size: int = 224,
    num_classes: int | None = None,
    version: str = "1.0",
    width: int = 64,
    dropout: float = 0.0,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
) -> ModelSpec:
    """``squeezenet``: batch ``{"image": float32[B, S, S, 3], "label": int32[B]}``.

    Args:
      image_size: default 224 (at least :func:`min_image_size`: 29 px for 1.0, 25 for 1.1).
      version: ``"1.0"`` (default) or ``"1.1"``.
      width: channel scale (64 = the published widths).
    """
    num_classes = (10 if image_size <= 64 else 1000) if num_classes is None else num_classes
    check_positive("squeezenet", batch_size=batch_size, image_size=image_size,
                   num_classes=num_classes, width=width)
    if version not in FIRE_CFG:
        raise ModelOptionError(f"squeezenet: version={version!r} must be '1.0' or '1.1'")
    if image_size < min_image_size(version):
        raise ModelOptionError(
            f"squeezenet {version}: image_size={image_size} is below {min_image_size(version)} px"
        )
    rng = np.random.default_rng(seed)
    batch = image_batch(rng, batch_size, image_size, 3, num_classes)
    if dropout > 0:
        batch["dropout_rng"] = dropout_key(seed)
    module = SqueezeNet(version=version, num_classes=num_classes, width=width, dropout=dropout)
    opts = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                version=version, width=width, dropout=dropout, seed=seed)
    return build_spec("squeezenet", module, batch, input_key="image",
                      objective=lambda logits, b: softmax_xent(logits, b["label"]),
                      seed=seed, abstract=abstract, options=opts, init=init)
