"""Shared pieces of the model zoo: :class:`ModelSpec`, the spec builder, losses and batches.

Every zoo model is a Flax linen module whose ``__call__(inputs, train: bool)`` returns logits.
:func:`build_spec` wraps it into a pure loss ``loss_fn(variables, batch) -> float32[]`` and a
``loss_and_state_fn(variables, batch) -> (float32[], new_state)`` for training loops that keep
BatchNorm statistics (``jax.value_and_grad(..., has_aux=True)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from remat.core.errors import RematError


class ModelOptionError(RematError, ValueError):
    """A zoo model option is out of range (e.g. an image size the network cannot downsample)."""


@dataclasses.dataclass(frozen=True, eq=False)
class ModelSpec:
    """A zoo model, ready to train.

    Attributes:
      name: zoo name (``"resnet18"``).
      module: the Flax linen module; ``module.apply(variables, inputs, train=...)`` gives logits.
      variables: the full variables dict ``{"params": ..., "batch_stats": ...}`` (``batch_stats``
        only for BatchNorm models); arrays, or ``jax.ShapeDtypeStruct`` leaves when built with
        ``abstract=True``.
      batch: dict of arrays (inputs, targets and, for dropout models, ``"dropout_rng"``:
        a raw ``uint32[2]`` PRNG key).
      loss_fn: ``loss_fn(variables, batch) -> float32[]``, the mean loss; pure (BatchNorm runs in
        train mode with batch statistics; the updated running statistics are discarded).
      loss_and_state_fn: ``(variables, batch) -> (loss, new_state)`` where ``new_state`` is the
        dict of updated mutable collections (``{"batch_stats": ...}``, or ``{}``).
      reduction: how the per-example losses are reduced (``"mean"``).
      mutable: the mutable collections the loss updates (``("batch_stats",)`` or ``()``).
      options: the resolved construction options (image size, width, ...).
    """

    name: str
    module: Any
    variables: Any
    batch: Any
    loss_fn: Callable[[Any, Any], jax.Array]
    loss_and_state_fn: Callable[[Any, Any], tuple[jax.Array, Any]]
    reduction: str = "mean"
    mutable: tuple[str, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def params(self) -> Any:
        """The trainable parameters ``variables["params"]``."""
        return self.variables["params"]

    def param_count(self) -> int:
        """Number of trainable scalars in ``variables["params"]`` (running statistics excluded)."""
        return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params)))

    def param_bytes(self) -> int:
        """Bytes of ``variables["params"]``."""
        return int(
            sum(
                int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                for x in jax.tree_util.tree_leaves(self.params)
            )
        )

    @staticmethod
    def merge_state(variables: Mapping[str, Any], new_state: Mapping[str, Any]) -> dict:
        """``variables`` with the collections in ``new_state`` replaced (after a train step)."""
        return {**variables, **new_state}


# ------------------------------------------------------------------------------- losses
def softmax_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy, ``float32[]``; ``logits[..., C]``, integer ``labels[...]``."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return jnp.mean(ce)


def weighted_softmax_xent(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Cross-entropy averaged over positions with ``weights > 0`` (masked LM); ``float32[]``."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    w = weights.astype(jnp.float32)
    return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)


# ------------------------------------------------------------------------------- helpers
def check_positive(name: str, **values: int) -> None:
    """Raise :class:`ModelOptionError` unless every value is a positive integer."""
    for key, v in values.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ModelOptionError(f"{name}: option {key}={v!r} must be a positive integer")


def scaled(channels: int, width: int, base: int) -> int:
    """``channels`` scaled by ``width / base`` (at least 1): the width option of CNNs."""
    return max(1, int(round(channels * width / base)))


def _as_abstract(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


_EMBED_STD = {"wpe": 0.01}  # GPT-2's position table; other embeddings use 0.02


def numpy_init(abstract_variables: Any, seed: int) -> dict:
    """Random variables for the shapes in ``abstract_variables``, drawn with NumPy.

    The families are Flax's defaults, so the values are distributed as ``module.init``'s:
    ``kernel`` LeCun-normal (normal truncated at 2 sigma, std ``1/sqrt(fan_in)``, with
    ``fan_in = prod(shape[:-1])``: Dense ``[in, out]``, Conv ``[kh, kw, in/groups, out]``),
    ``bias`` 0, ``scale`` 1 (BatchNorm/LayerNorm), running ``mean`` 0 and ``var`` 1, embedding
    tables ``N(0, 0.02^2)`` (``wpe`` ``N(0, 0.01^2)``), anything else 0. No XLA compile is
    needed, which makes building the larger models cheap (``module.init`` would compile the
    forward pass and one threefry kernel per shape).
    """
    rng = np.random.default_rng(seed)

    def trunc_normal(shape):
        z = rng.standard_normal(shape, dtype=np.float32)
        bad = np.abs(z) > 2
        while bad.any():
            z[bad] = rng.standard_normal(int(bad.sum()), dtype=np.float32)
            bad = np.abs(z) > 2
        return z / np.float32(0.87962566103423978)  # std of N(0,1) truncated at +-2

    def fill(path, leaf):
        key = str(getattr(path[-1], "key", path[-1]))
        shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
        if key == "kernel":
            fan_in = int(np.prod(shape[:-1])) or 1
            x = trunc_normal(shape) / np.float32(np.sqrt(fan_in))
        elif key in ("scale", "var"):
            x = np.ones(shape, np.float32)
        elif key == "embedding" or key.endswith("embeddings") or key in _EMBED_STD:
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(_EMBED_STD.get(key, 0.02))
        else:  # bias, mean, mlm_bias
            x = np.zeros(shape, np.float32)
        return jax.device_put(x.astype(dtype, copy=False))

    return dict(jax.tree_util.tree_map_with_path(fill, abstract_variables))


def build_spec(
    name: str,
    module: Any,
    batch: dict[str, Any],
    *,
    input_key: str,
    objective: Callable[[jax.Array, Mapping[str, Any]], jax.Array],
    seed: int,
    abstract: bool,
    options: Mapping[str, Any],
    init: str = "numpy",
) -> ModelSpec:
    """Initialise ``module`` and wrap it into a :class:`ModelSpec`.

    ``batch`` holds numpy arrays; ``objective(logits, batch)`` is the scalar loss. Variable
    shapes come from ``jax.eval_shape(module.init)`` on a one-example slice of the inputs
    (parameter shapes do not depend on the batch size). ``init="numpy"`` (default) fills them
    with :func:`numpy_init` from ``seed``; ``init="flax"`` runs the module's own initialisers
    under ``jax.jit`` from ``jax.random.PRNGKey(seed)`` (slower: it compiles the forward pass);
    ``abstract=True`` keeps ``jax.ShapeDtypeStruct`` leaves and allocates nothing.
    """
    inputs1 = batch[input_key][:1]

    def flax_init():
        return module.init({"params": jax.random.PRNGKey(seed)}, inputs1, train=False)

    shapes = dict(jax.eval_shape(flax_init))
    if abstract:
        variables = shapes
        jbatch = _as_abstract(batch)
    else:
        if init == "numpy":
            variables = numpy_init(shapes, seed)
        elif init == "flax":
            variables = dict(jax.jit(flax_init)())
        else:
            raise ModelOptionError(f"{name}: init={init!r} must be 'numpy' or 'flax'")
        jbatch = jax.device_put(batch)
    mutable = tuple(k for k in variables if k != "params")

    def loss_and_state_fn(variables, batch):
        rngs = {"dropout": batch["dropout_rng"]} if "dropout_rng" in batch else None
        if mutable:
            logits, state = module.apply(
                variables, batch[input_key], train=True, mutable=list(mutable), rngs=rngs
            )
            state = dict(state)
        else:
            logits = module.apply(variables, batch[input_key], train=True, rngs=rngs)
            state = {}
        return objective(logits, batch).astype(jnp.float32), state

    def loss_fn(variables, batch):
        return loss_and_state_fn(variables, batch)[0]

    loss_fn.__name__ = f"{name}_loss"
    loss_fn.__qualname__ = loss_fn.__name__
    loss_fn.__doc__ = f"Mean training loss of zoo model {name!r}: (variables, batch) -> float32[]."
    return ModelSpec(
        name=name,
        module=module,
        variables=variables,
        batch=jbatch,
        loss_fn=loss_fn,
        loss_and_state_fn=loss_and_state_fn,
        reduction="mean",
        mutable=mutable,
        options={**options, "init": init},
    )


def image_batch(
    rng: np.random.Generator, batch_size: int, image_size: int, channels: int, num_classes: int
) -> dict[str, np.ndarray]:
    """``{"image": float32[B, H, W, C] ~ N(0, 1), "label": int32[B] in [0, num_classes)}``."""
    return {
        "image": rng.standard_normal((batch_size, image_size, image_size, channels), np.float32),
        "label": rng.integers(0, num_classes, (batch_size,), dtype=np.int32),
    }


def dropout_key(seed: int) -> np.ndarray:
    """A raw ``uint32[2]`` PRNG key for ``batch["dropout_rng"]`` (threefry layout)."""
    return np.array([0, (seed * 7919 + 1) % (2**32)], dtype=np.uint32)
