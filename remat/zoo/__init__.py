"""The model zoo: Flax linen models used by the rematerialization papers, randomly initialised.

``remat.zoo.get(name, batch_size=8, **options) -> (loss_fn, variables, batch)`` with
``loss_fn(variables, batch) -> float32[]`` (mean cross-entropy); ``variables`` is the full Flax
variables dict (``{"params": ...}``, plus ``"batch_stats"`` for BatchNorm models, whose loss
runs BatchNorm in train mode with ``mutable=["batch_stats"]`` and returns only the loss).
``remat.zoo.get_model`` returns the :class:`ModelSpec` with the module and
``loss_and_state_fn`` (``(loss, new_state)``, for ``has_aux`` training loops)::

    spec = remat.zoo.get_model("resnet18", batch_size=32)
    (loss, state), g = jax.value_and_grad(spec.loss_and_state_fn, has_aux=True)(
        spec.variables, spec.batch)
    variables = spec.merge_state(sgd(spec.variables, g), state)

Models (defaults follow the papers that used them; see each module's docstring):

===============  ===========================================  ==========================
name             structure                                    default input
===============  ===========================================  ==========================
``mlp``          16 x (Dense 1024 + ReLU) + head              x[B, 1024]
``vgg16``        13 conv3x3 + 3 FC (POET's vgg16 / cifar)     32x32x3, 10 classes
``resnet18``     basic blocks 2-2-2-2, BN (POET)              32x32x3, 10 classes
``resnet50``     bottlenecks 3-4-6-3, BN (Checkmate, Sage)    224x224x3, 1000 classes
``mobilenet_v2`` inverted residuals, depthwise convs, BN      224x224x3, 1000 classes
``squeezenet``   fire modules, v1.0 (OLLA, Melon)             224x224x3, 1000 classes
``unet``         4-level encoder/decoder, skip concats        128x128x3, 2 classes/pixel
``bert_small``   4 x post-LN encoder, H=512, MLM head         64 tokens, vocab 8192
``gpt2_small``   12 x pre-LN causal decoder, H=768            128 tokens, vocab 8192
===============  ===========================================  ==========================

Every builder takes ``batch_size``, ``seed`` (parameters from ``jax.random.PRNGKey(seed)``,
batch from ``numpy.random.default_rng(seed)``), ``abstract`` (``True``: shapes only, through
``jax.eval_shape``; no arrays are allocated) and width/depth/size options for tests.
Nothing is downloaded.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from remat.core.errors import UnknownNameError
from remat.zoo._common import ModelOptionError, ModelSpec

__all__ = ["ModelSpec", "ModelOptionError", "UnknownOptionError", "available", "get",
           "get_model", "option_names"]


class UnknownOptionError(UnknownNameError, TypeError):
    """An option the zoo model does not take; the message lists the ones it does (a
    ``TypeError`` too, as Python's own unexpected-keyword error)."""

# name -> (module, builder function); modules load on first use.
_REGISTRY: dict[str, tuple[str, str]] = {
    "mlp": ("remat.zoo.mlp", "build_mlp"),
    "vgg16": ("remat.zoo.vgg", "build_vgg16"),
    "resnet18": ("remat.zoo.resnet", "build_resnet18"),
    "resnet50": ("remat.zoo.resnet", "build_resnet50"),
    "mobilenet_v2": ("remat.zoo.mobilenet", "build_mobilenet_v2"),
    "squeezenet": ("remat.zoo.squeezenet", "build_squeezenet"),
    "unet": ("remat.zoo.unet", "build_unet"),
    "bert_small": ("remat.zoo.transformer", "build_bert_small"),
    "gpt2_small": ("remat.zoo.transformer", "build_gpt2_small"),
}


def available() -> list[str]:
    """Names of the zoo models, sorted."""
    return sorted(_REGISTRY)


def _builder(name: str):
    key = name.lower().replace("-", "_") if isinstance(name, str) else name
    if key not in _REGISTRY:
        raise UnknownNameError("zoo model", str(name), available())
    mod, fn = _REGISTRY[key]
    return getattr(importlib.import_module(mod), fn)


def get_model(name: str, batch_size: int = 8, **options: Any) -> ModelSpec:
    """Build zoo model ``name`` as a :class:`ModelSpec`.

    Args:
      name: one of :func:`available` (``-`` and ``_`` are interchangeable, case-insensitive).
      batch_size: examples per batch.
      **options: the model's options (``seed``, ``abstract``, ``image_size``, ``width``,
        ``depth``, ``seq_len``, ...; see the builder in the model's module).

    Raises:
      UnknownNameError: unknown ``name``.
      ModelOptionError: an option out of range.
      UnknownOptionError: an option the model does not take (lists those it takes).
    """
    builder = _builder(name)
    known = option_names(name)
    bad = sorted(set(options) - set(known))
    if bad:
        raise UnknownOptionError(f"option of zoo model {name!r}", bad[0], list(known))
    return builder(batch_size, **options)


def option_names(name: str) -> tuple[str, ...]:
    """The keyword options of zoo model ``name`` besides ``batch_size``.

    Raises:
      UnknownNameError: unknown ``name``.
    """
    sig = inspect.signature(_builder(name))
    return tuple(p.name for p in sig.parameters.values()
                 if p.name != "batch_size" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def get(name: str, batch_size: int = 8, **options: Any) -> tuple[Any, Any, Any]:
    """``(loss_fn, variables, batch)`` of zoo model ``name``; see :func:`get_model`.

    ``loss_fn(variables, batch)`` is a pure function returning the mean loss as ``float32[]``;
    ``variables`` is the full Flax variables dict (the thing to differentiate).
    """
    spec = get_model(name, batch_size, **options)
    return spec.loss_fn, spec.variables, spec.batch
