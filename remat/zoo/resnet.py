"""ResNet-18 and ResNet-50 (He et al. 2016), as used by POET (ResNet-18), Checkmate and Sage
(ResNet-50).

Structure (torchvision layout, "v1.5": the stride of a bottleneck sits on its 3x3 conv):
  * stem: ImageNet ``7x7/2 conv -> BN -> ReLU -> 3x3/2 max pool``; CIFAR (``stem="cifar"``,
    the default for images under 100 px) ``3x3/1 conv -> BN -> ReLU`` and no pool.
  * four stages of residual blocks, widths ``64, 128, 256, 512`` (x ``width/64``), the first
    block of stages 2-4 strided; shortcut = identity, or ``1x1 conv + BN`` when the shape changes.
    ResNet-18: 2-2-2-2 basic blocks (two 3x3 convs); ResNet-50: 3-4-6-3 bottlenecks
    (1x1, 3x3, 1x1 with expansion 4).
  * global average pool, ``head`` dense layer.

BatchNorm runs in train mode (batch statistics; ``batch_stats`` is a mutable collection).
Published parameter counts (torchvision): ResNet-18 11,689,512 and ResNet-50 25,557,032 at
1000 classes; ResNet-18 with the CIFAR stem and 10 classes: 11,173,962 (the widely used
CIFAR-10 ResNet-18). POET's own ``resnet18_cifar`` is a narrower 3-stage 16/32/64 network;
``widths=(16, 32, 64), stage_sizes=(2, 2, 2)`` approximates it (POET adds a 3x3 conv shortcut
to every block, this zoo keeps He et al.'s identity shortcuts).

Submodules: ``stem``, ``stage{s}_block{b}`` (with ``conv1``/``conv2``[/``conv3``] and
``shortcut``), ``head``.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np

from remat.zoo._common import (
    ModelOptionError,
    ModelSpec,
    build_spec,
    check_positive,
    image_batch,
    scaled,
    softmax_xent,
)
from remat.zoo.layers import ConvBN, global_avg_pool, max_pool


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus shortcut; ``x[B,H,W,Cin] -> [B,H/s,W/s,features]``."""

    features: int
    strides: int = 1
    batch_norm: bool = True
    expansion = 1

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        y = ConvBN(self.features, 3, self.strides, batch_norm=self.batch_norm, name="conv1")(x, train)
        y = ConvBN(self.features, 3, 1, act=None, batch_norm=self.batch_norm, name="conv2")(y, train)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = ConvBN(self.features, 1, self.strides, padding=0, act=None, batch_norm=self.batch_norm,
                       name="shortcut")(x, train)
        return nn.relu(x + y)


class Bottleneck(nn.Module):
    """1x1 (reduce) -> 3x3 (strided) -> 1x1 (expand x4) conv-BN layers plus shortcut."""

    features: int
    strides: int = 1
    batch_norm: bool = True
    expansion = 4

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        out = self.features * self.expansion
        y = ConvBN(self.features, 1, 1, padding=0, batch_norm=self.batch_norm, name="conv1")(x, train)
        y = ConvBN(self.features, 3, self.strides, batch_norm=self.batch_norm, name="conv2")(y, train)
        y = ConvBN(out, 1, 1, padding=0, act=None, batch_norm=self.batch_norm, name="conv3")(y, train)
        if self.strides != 1 or x.shape[-1] != out:
            x = ConvBN(out, 1, self.strides, padding=0, act=None, batch_norm=self.batch_norm,
                       name="shortcut")(x, train)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """``image[B, H, W, 3] -> logits[B, num_classes]``."""

    stage_sizes: Sequence[int]
    block: str = "basic"  # or "bottleneck"
    widths: Sequence[int] = (64, 128, 256, 512)
    num_classes: int = 1000
    stem: str = "imagenet"  # or "cifar"
    batch_norm: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        block_cls = BasicBlock if self.block == "basic" else Bottleneck
        if self.stem == "imagenet":
            x = ConvBN(self.widths[0], 7, 2, padding=3, batch_norm=self.batch_norm,
                       name="stem")(x, train)
            x = max_pool(x, 3, 2, padding=1)
        else:
            x = ConvBN(self.widths[0], 3, 1, padding=1, batch_norm=self.batch_norm,
                       name="stem")(x, train)
        for s, (n_blocks, w) in enumerate(zip(self.stage_sizes, self.widths), start=1):
            for b in range(n_blocks):
                strides = 2 if (s > 1 and b == 0) else 1
                x = block_cls(w, strides, batch_norm=self.batch_norm,
                              name=f"stage{s}_block{b + 1}")(x, train)
        return nn.Dense(self.num_classes, name="head")(global_avg_pool(x))


def _build_resnet(
    name: str,
    default_size: int,
    default_stages: tuple[int, ...],
    block: str,
    batch_size: int,
    image_size: int | None,
    num_classes: int | None,
    width: int,
    widths: Sequence[int] | None,
    stage_sizes: Sequence[int] | None,
    stem: str,
    seed: int,
    abstract: bool,
    init: str,
    batch_norm: bool = True,
) -> ModelSpec:
    image_size = default_size if image_size is None else image_size
    num_classes = (10 if image_size <= 64 else 1000) if num_classes is None else num_classes
    stage_sizes = tuple(default_stages if stage_sizes is None else stage_sizes)
    widths = tuple(scaled(c, width, 64) for c in (64, 128, 256, 512)[: len(stage_sizes)]) \
        if widths is None else tuple(widths)
    check_positive(name, batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                   width=width, **{f"stage{i}": n for i, n in enumerate(stage_sizes)},
                   **{f"width{i}": w for i, w in enumerate(widths)})
    if len(widths) != len(stage_sizes):
        raise ModelOptionError(f"{name}: widths {widths} and stage_sizes {stage_sizes} differ in length")
    if stem == "auto":
        stem = "cifar" if image_size < 100 else "imagenet"
    if stem not in ("cifar", "imagenet"):
        raise ModelOptionError(f"{name}: stem={stem!r} must be 'auto', 'cifar' or 'imagenet'")
    rng = np.random.default_rng(seed)
    batch = image_batch(rng, batch_size, image_size, 3, num_classes)
    module = ResNet(stage_sizes=stage_sizes, block=block, widths=widths,
                    num_classes=num_classes, stem=stem, batch_norm=bool(batch_norm))
    opts = dict(batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                widths=widths, stage_sizes=stage_sizes, stem=stem, seed=seed,
                batch_norm=bool(batch_norm))
    return build_spec(name, module, batch, input_key="image",
                      objective=lambda logits, b: softmax_xent(logits, b["label"]),
                      seed=seed, abstract=abstract, options=opts, init=init)


def build_resnet18(
    batch_size: int = 8,
    *,
    image_size: int | None = None,
    num_classes: int | None = None,
    width: int = 64,
    widths: Sequence[int] | None = None,
    stage_sizes: Sequence[int] | None = None,
    stem: str = "auto",
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
    batch_norm: bool = True,
) -> ModelSpec:
    """``resnet18``: batch ``{"image": float32[B, S, S, 3], "label": int32[B]}``.

    Args:
      image_size: default 32 (CIFAR, as in POET); 224 gives the ImageNet network.
      num_classes: default 10 up to 64 px, else 1000.
      width: stage-1 channels (64); stages scale as 1, 2, 4, 8 x ``width/64``.
      widths / stage_sizes: explicit per-stage channels / block counts (default 2-2-2-2).
      stem: ``"auto"`` (CIFAR stem below 100 px), ``"cifar"`` or ``"imagenet"``.
      batch_norm: ``True`` (default) conv-BN layers; ``False``: convolutions with bias and no
        normalisation (no batch coupling, so gradient accumulation is exact).
    """
    return _build_resnet("resnet18", 32, (2, 2, 2, 2), "basic", batch_size, image_size,
                         num_classes, width, widths, stage_sizes, stem, seed, abstract, init,
                         batch_norm)


def build_resnet50(
    batch_size: int = 8,
    *,
    image_size: int | None = None,
    num_classes: int | None = None,
    width: int = 64,
    widths: Sequence[int] | None = None,
    stage_sizes: Sequence[int] | None = None,
    stem: str = "auto",
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
    batch_norm: bool = True,
) -> ModelSpec:
    """``resnet50``: as :func:`build_resnet18` with 3-4-6-3 bottleneck blocks; default 224 px
    (ImageNet, as in Checkmate and Sage)."""
    return _build_resnet("resnet50", 224, (3, 4, 6, 3), "bottleneck", batch_size, image_size,
                         num_classes, width, widths, stage_sizes, stem, seed, abstract, init,
                         batch_norm)
