"""U-Net (Ronneberger et al. 2015), the segmentation benchmark of Checkmate (``vgg_unet``) and
of memory-planning papers.

Encoder: ``depth`` levels ``enc{i}`` of two 3x3 conv + ReLU (``width * 2^i`` channels) each
followed by a 2x2 max pool; ``bottleneck`` (two 3x3 convs, ``width * 2^depth`` channels);
decoder levels ``dec{i}``: 2x2 stride-2 transposed conv ``up`` halving the channels, concatenation
with the matching encoder output (the skip connection), two 3x3 convs; ``out_conv`` 1x1 to
``num_classes``. Convs use "same" padding (the paper used valid padding and cropping), so the
output has the input's size. ``batch_norm=True`` adds BatchNorm after every 3x3 conv (as in
many modern re-implementations).

Parameters at the paper's widths (``width=64``, ``depth=4``, 3 input channels, 2 classes,
no BatchNorm): 31,031,810 (hand formula in the tests).
Loss: per-pixel softmax cross-entropy, mean over batch and pixels.
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
    softmax_xent,
)
from remat.zoo.layers import ConvBN


class DoubleConv(nn.Module):
    """Two 3x3 conv (+BN) + ReLU layers: ``x[B,H,W,*] -> [B,H,W,features]``."""

    features: int
    batch_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        x = ConvBN(self.features, 3, batch_norm=self.batch_norm, name="conv1")(x, train)
        return ConvBN(self.features, 3, batch_norm=self.batch_norm, name="conv2")(x, train)


class UpBlock(nn.Module):
    """2x2/2 transposed conv, concat with the skip tensor, :class:`DoubleConv`."""

    features: int
    batch_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, skip: jax.Array, train: bool = True) -> jax.Array:
        x = nn.ConvTranspose(self.features, (2, 2), strides=(2, 2), padding="VALID", name="up")(x)
        x = jnp.concatenate([skip, x], axis=-1)
        return DoubleConv(self.features, self.batch_norm, name="convs")(x, train)


class UNet(nn.Module):
    """``image[B, H, W, C] -> logits[B, H, W, num_classes]``; ``H, W`` multiples of ``2^depth``."""

    num_classes: int = 2
    width: int = 64
    depth: int = 4
    batch_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        skips = []
        for i in range(self.depth):
            x = DoubleConv(self.width * 2**i, self.batch_norm, name=f"enc{i + 1}")(x, train)
            skips.append(x)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = DoubleConv(self.width * 2**self.depth, self.batch_norm, name="bottleneck")(x, train)
        for i in reversed(range(self.depth)):
            x = UpBlock(self.width * 2**i, self.batch_norm, name=f"dec{i + 1}")(x, skips[i], train)
        return nn.Conv(self.num_classes, (1, 1), name="out_conv")(x)


def build_unet(
    batch_size: int = 8,
    *,
    image_size: int = 128,
    in_channels: int = 3,
    num_classes: int = 2,
    width: int = 64,
    depth: int = 4,
    batch_norm: bool = False,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
) -> ModelSpec:
    """``unet``: batch ``{"image": float32[B, S, S, in_channels], "mask": int32[B, S, S]}``.

    Args:
      image_size: ``S`` (default 128), a multiple of ``2^depth``.
      num_classes: segmentation classes per pixel (2, as in the paper).
      width: channels of the first level (64); level ``i`` has ``width * 2^i``.
      depth: number of down/up-sampling levels (4).
    """
    check_positive("unet", batch_size=batch_size, image_size=image_size, in_channels=in_channels,
                   num_classes=num_classes, width=width, depth=depth)
    if image_size % 2**depth:
        raise ModelOptionError(f"unet: image_size={image_size} must be a multiple of 2^{depth}")
    rng = np.random.default_rng(seed)
    batch = {
        "image": rng.standard_normal((batch_size, image_size, image_size, in_channels), np.float32),
        "mask": rng.integers(0, num_classes, (batch_size, image_size, image_size), dtype=np.int32),
    }
    module = UNet(num_classes=num_classes, width=width, depth=depth, batch_norm=batch_norm)
    opts = dict(batch_size=batch_size, image_size=image_size, in_channels=in_channels,
                num_classes=num_classes, width=width, depth=depth, batch_norm=batch_norm, seed=seed)
    return build_spec("unet", module, batch, input_key="image",
                      objective=lambda logits, b: softmax_xent(logits, b["mask"]),
                      seed=seed, abstract=abstract, options=opts, init=init)
