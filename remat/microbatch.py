"""Micro-batching (gradient accumulation): split the batch, run each part, accumulate.

Two runners share one splitting rule (:func:`split_args`):

* :func:`microbatch` — the composable transform (as ``optax.microbatching``): wraps any
  ``value_and_grad``-like function ``vg(*args) -> (value, grads)`` into one that splits the
  batch into ``k`` micro-batches and accumulates, ``microbatch(jax.value_and_grad(f), 4)``;
  :func:`accumulate` is its one-call form;
* :func:`accumulate` — inside ``jax.jit``: ``lax.scan`` over the micro-batches of a
  ``value_and_grad`` function (used by ``remat.value_and_grad(..., microbatches=k)``);
* :func:`execute` — op by op: run a plan's schedule with
  :func:`remat.execute` on the graph extracted at micro-batch size, once per micro-batch, and
  accumulate the gradients on the host side of the loop, measuring each micro-batch's peak.

Splitting rule: only the *non-differentiated* arguments (those not in ``argnums``) are split.
The batch size ``B`` is the leading dimension of their largest leaf with ``ndim >= 1`` (PRNG
key arrays excluded).  Every leaf whose leading dimension is ``B`` is split into ``k`` equal parts
along axis 0; other leaves (scalars, PRNG keys, per-batch constants) are passed unchanged to every
micro-batch (so dropout in each micro-batch draws from the same key).

Reductions: ``"mean"`` assumes the loss is a mean over the batch, so the full-batch value and
gradients are the mean over micro-batches; ``"sum"`` sums them.  Losses that are not separable
over the batch (BatchNorm in train mode) give the per-micro-batch statistics result, as in any
gradient accumulation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from remat import executor
from remat.core.errors import MicrobatchError
from remat.frontend import batch_size as _batch_size
from remat.frontend import is_key as _is_key

__all__ = [
    "MicrobatchError",
    "microbatch",
    "batch_size",
    "split_args",
    "microbatch_args",
    "accumulate",
    "execute",
    "MicrobatchStats",
]


def _argnums_tuple(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def batch_size(args: Sequence[Any], argnums: int | Sequence[int] = 0) -> int:
    """``B`` by the front end's one rule (:func:`remat.frontend.batch_size`).

    Raises:
      MicrobatchError: no non-differentiated leaf with a batch axis.
    """
    B = _batch_size(args, argnums)
    if B is None:
        raise MicrobatchError(
            "micro-batching needs a non-differentiated argument with a batch axis (axis 0); "
            f"argnums={argnums!r} leaves none"
        )
    return B


def _check_k(B: int, k: int) -> None:
    if int(k) != k or k < 1:
        raise MicrobatchError(f"microbatches must be a positive integer, got {k!r}")
    if B % k:
        raise MicrobatchError(f"microbatches={k} does not divide the batch size {B}")


def split_args(args: Sequence[Any], argnums: int | Sequence[int], k: int):
    """Split the batch leaves of the non-differentiated arguments into ``k`` parts.

    Returns:
      ``(stacked, spec)``: ``stacked`` is the list of the batch leaves reshaped to
      ``[k, B // k, ...]`` (scan over its leading axis), ``spec`` what :func:`merge` needs to
      rebuild one micro-batch's arguments from a slice of ``stacked``.
    """
    B = batch_size(args, argnums)
    _check_k(B, k)
    nums = _argnums_tuple(argnums)
    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    owner = []  # argument index of each leaf
    for j, a in enumerate(args):
        owner += [j] * len(jax.tree_util.tree_leaves(a))
    mask = [
        owner[i] not in nums and np.ndim(x) >= 1 and not _is_key(x) and np.shape(x)[0] == B
        for i, x in enumerate(leaves)
    ]
    stacked = [
        jnp.reshape(x, (k, B // k) + tuple(np.shape(x)[1:])) for x, m in zip(leaves, mask) if m
    ]
    return stacked, (tree, leaves, mask)


def merge(spec, part: Sequence[Any]) -> tuple:
    """One micro-batch's arguments: split leaves from ``part`` (one slice of the stacked list),
    the others unchanged."""
    tree, leaves, mask = spec
    it = iter(part)
    return jax.tree_util.tree_unflatten(tree, [next(it) if m else x for x, m in zip(leaves, mask)])


def microbatch_args(args: Sequence[Any], argnums: int | Sequence[int], k: int) -> tuple:
    """``jax.ShapeDtypeStruct`` arguments of one micro-batch (for extraction and planning)."""
    B = batch_size(args, argnums)
    _check_k(B, k)
    nums = _argnums_tuple(argnums)

    def shrink(x, j):
        shape = tuple(np.shape(x))
        dt = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        if j not in nums and len(shape) >= 1 and not _is_key(x) and shape[0] == B:
            shape = (B // k,) + shape[1:]
        return jax.ShapeDtypeStruct(shape, dt)

    return tuple(jax.tree_util.tree_map(lambda x, j=j: shrink(x, j), a) for j, a in enumerate(args))


def microbatch(
    vg: Callable,
    microbatches: int,
    *,
    argnums: int | Sequence[int] = 0,
    reduction: str = "mean",
    has_aux: bool = False,
    aux_mode: str = "stack",
) -> Callable:
    """Gradient accumulation as a transform of a ``value_and_grad``-like function.

    Args:
      vg: ``vg(*args) -> (value, grads)`` (``((value, aux), grads)`` with ``has_aux``), e.g.
        ``jax.value_and_grad(loss)`` or ``remat.value_and_grad(loss, policy)``.
      microbatches: ``k``, the number of equal parts the batch is split into along axis 0 (the
        non-differentiated arguments' batch leaves, :func:`split_args`).
      argnums: the differentiated arguments (never split), as given to ``vg``'s maker.
      reduction: ``"mean"`` (the loss is a batch mean: value and grads are averaged over the
        micro-batches) or ``"sum"``.
      has_aux, aux_mode: ``vg`` returns an aux; ``"stack"`` it over micro-batches (leading axis
        ``k``) or keep the ``"last"`` one (BatchNorm-style state).

    Returns:
      A function of the full-batch arguments returning what ``vg`` returns, reduced over the
      ``k`` micro-batches with one ``lax.scan`` (jit-able; peak memory is one micro-batch's plus
      the gradient accumulator).  ``k == 1`` returns ``vg`` itself.
    """
    if int(microbatches) != microbatches or microbatches < 1:
        raise MicrobatchError(f"microbatches must be a positive integer, got {microbatches!r}")
    if reduction not in ("mean", "sum"):
        raise MicrobatchError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if int(microbatches) == 1:
        return vg

    def run(*args):
        return accumulate(vg, args, argnums, int(microbatches), reduction=reduction,
                          has_aux=has_aux, aux_mode=aux_mode)

    return run


def accumulate(
    vg: Callable,
    args: Sequence[Any],
    argnums: int | Sequence[int],
    k: int,
    *,
    reduction: str = "mean",
    has_aux: bool = False,
    aux_mode: str = "stack",
):
    """``lax.scan`` gradient accumulation of ``vg`` (a ``jax.value_and_grad``-like function).

    Returns what ``vg(*args)`` returns, with value and grads reduced over the ``k`` micro-batches
    (``"mean"`` or ``"sum"``); with ``has_aux`` the aux is stacked (leading axis ``k``) or the
    last micro-batch's (``aux_mode="last"``).
    """
    stacked, spec = split_args(args, argnums, k)
    nums = _argnums_tuple(argnums)
    single = isinstance(argnums, int)
    diff = args[argnums] if single else tuple(args[j] for j in nums)
    first = merge(spec, [s[0] for s in stacked])
    out_shape = jax.eval_shape(vg, *first)
    (val_shape, _grad_shape) = out_shape
    loss_shape = val_shape[0] if has_aux else val_shape
    zeros_g = jax.tree_util.tree_map(lambda p: jnp.zeros(np.shape(p), jnp.result_type(p)), diff)
    zero_l = jnp.zeros(loss_shape.shape, loss_shape.dtype)

    def body(carry, part):
        acc_l, acc_g = carry
        v, g = vg(*merge(spec, part))
        loss, aux = (v if has_aux else (v, None))
        acc_g = jax.tree_util.tree_map(lambda a, b: a + b.astype(a.dtype), acc_g, g)
        return (acc_l + loss, acc_g), aux

    (tot_l, tot_g), auxs = jax.lax.scan(body, (zero_l, zeros_g), stacked)
    if reduction == "mean":
        tot_l = tot_l / k
        tot_g = jax.tree_util.tree_map(lambda a: a / k, tot_g)
    if has_aux:
        if aux_mode == "last":
            auxs = jax.tree_util.tree_map(lambda a: a[-1], auxs)
        return (tot_l, auxs), tot_g
    return tot_l, tot_g


# --------------------------------------------------------------------------- op-by-op executor
@dataclasses.dataclass(frozen=True)
class MicrobatchStats:
    """Per-micro-batch executor statistics.

    Attributes:
      peak_bytes: max over micro-batches of the executor's measured peak activation bytes
        (``ExecStats.peak_bytes``; the accumulator is not included).
      per_microbatch_peak_bytes: the measured peak of each micro-batch, bytes.
      accumulator_bytes: bytes of the gradient accumulator held across micro-batches.
      microbatches: ``k``.
      wall_s: total wall time, seconds.
      stats: the executor's ``ExecStats`` of each micro-batch.
    """

    peak_bytes: int
    per_microbatch_peak_bytes: tuple[int, ...]
    accumulator_bytes: int
    microbatches: int
    wall_s: float
    stats: tuple = dataclasses.field(default=(), repr=False)


def execute(graph, plan, *args, argnums: int | Sequence[int] | None = None, reduction: str = "mean"):
    """Run ``plan`` (made on ``graph``, extracted at micro-batch size) on full-batch ``args``,
    ``plan.microbatches`` micro-batches one after the other, with :func:`remat.execute`.

    Returns:
      ``(value, grads, MicrobatchStats)`` with value and grads reduced as ``reduction`` says
      (shaped like ``jax.value_and_grad(fn, argnums)(*args)``).
    """

    if argnums is None:
        argnums = graph.meta.get("argnums", 0)
    k = int(plan.microbatches)
    t0 = time.perf_counter()
    if k == 1:
        v, g, st = executor.execute(graph, plan, *args)
        return v, g, MicrobatchStats(int(st.peak_bytes), (int(st.peak_bytes),), 0, 1,
                                     time.perf_counter() - t0, (st,))
    stacked, spec = split_args(args, argnums, k)
    acc_v = acc_g = None
    peaks, stats = [], []
    for j in range(k):
        part = [s[j] for s in stacked]
        mb = merge(spec, part)
        mb = jax.block_until_ready(mb)
        v, g, st = executor.execute(graph, plan, *mb)
        peaks.append(int(st.peak_bytes))
        stats.append(st)
        if acc_g is None:
            acc_v, acc_g = v, g
        else:
            acc_v = acc_v + v
            acc_g = jax.tree_util.tree_map(jnp.add, acc_g, g)
        del v, g, mb, part
    if reduction == "mean":
        acc_v = acc_v / k
        acc_g = jax.tree_util.tree_map(lambda a: a / k, acc_g)
    acc_bytes = int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(acc_g)))
    st = MicrobatchStats(max(peaks), tuple(peaks), acc_bytes, k, time.perf_counter() - t0, tuple(stats))
    return acc_v, acc_g, st
