"""VGG-16 (Simonyan & Zisserman 2015, configuration D), as in Checkmate and POET.

13 conv3x3 layers (64, 64, M, 128, 128, M, 256x3, M, 512x3, M, 512x3, M) with ReLU, then the
classifier ``flatten -> fc1(4096) -> ReLU -> fc2(4096) -> ReLU -> predictions(num_classes)``,
exactly as ``poet/architectures/vgg.py`` of the POET authors' code (Patil et al., ICML 2022;
its flatten width is ``512 * (H/32) * (W/32)``, so the same network serves CIFAR at 32x32 and
ImageNet at 224x224).

Parameter counts (hand formula, checked in tests):
  * 224x224, 1000 classes: 138,357,544 (the published VGG-16 figure, e.g. torchvision ``vgg16``).
  * 32x32, 10 classes (POET's ``vgg16_cifar``): 14,714,688 conv + 2,101,248 + 16,781,312 +
    40,970 = 33,638,218.

Submodules follow Keras' names (``block1_conv1`` ... ``block5_conv3``, ``fc1``, ``fc2``,
``predictions``), the names in Checkmate's published VGG16 graph. Classifier dropout
(0.5 in the original) is off by default so the loss is deterministic; ``dropout=0.5`` restores
it and adds ``batch["dropout_rng"]``. ``batch_norm=True`` gives the VGG16-BN variant.
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
    scaled,
    softmax_xent,
)
from remat.zoo.layers import ConvBN

VGG16_CFG: tuple[tuple[int, ...], ...] = ((64, 64), (128, 128), (256, 256, 256),
                                          (512, 512, 512), (512, 512, 512))


class VGG16(nn.Module):
    """``image[B, H, W, 3] -> logits[B, num_classes]``; ``H, W`` multiples of 32."""

    num_classes: int = 1000
    width: int = 64
    fc_width: int = 4096
    batch_norm: bool = False
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        for b, convs in enumerate(VGG16_CFG, start=1):
            for i, c in enumerate(convs, start=1):
                x = ConvBN(scaled(c, self.width, 64), 3, batch_norm=self.batch_norm,
                           name=f"block{b}_conv{i}")(x, train)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        for name in ("fc1", "fc2"):
            x = nn.relu(nn.Dense(self.fc_width, name=name)(x))
            if self.dropout > 0:
                x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.num_classes, name="predictions")(x)


def build_vgg16(
    batch_size: int = 8,
    *,
    image_size: int = 32,
    num_classes: int | None = None,
    width: int = 64,
    fc_width: int = 4096,
    batch_norm: bool = False,
    dropout: float = 0.0,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
) -> ModelSpec:
    """``vgg16``: batch ``{"image": float32[B, S, S, 3], "label": int32[B]}``.

    Args:
      image_size: ``S``, a multiple of 32 (default 32: CIFAR, as in POET).
      num_classes: default 10 for images up to 64 px (CIFAR-10), else 1000 (ImageNet).
      width: channels of the first block (64); the others scale with it.
      fc_width: classifier hidden units (4096).
    """
    num_classes = (10 if image_size <= 64 else 1000) if num_classes is None else num_classes
    check_positive("vgg16", batch_size=batch_size, image_size=image_size,
                   num_classes=num_classes, width=width, fc_width=fc_width)
    if image_size % 32:
        raise ModelOptionError(f"vgg16: image_size={image_size} must be a multiple of 32")
    rng = np.random.default_rng(seed)
    batch = image_batch(rng, batch_size, image_size, 3, num_classes)
    if dropout > 0:
        batch["dropout_rng"] = dropout_key(seed)
    module = VGG16(num_classes=num_classes, width=width, fc_width=fc_width,
                   batch_norm=batch_norm, dropout=dropout)
    opts = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                width=width, fc_width=fc_width, batch_norm=batch_norm, dropout=dropout, seed=seed)
    return build_spec("vgg16", module, batch, input_key="image",
                      objective=lambda logits, b: softmax_xent(logits, b["label"]),
                      seed=seed, abstract=abstract, options=opts, init=init)
