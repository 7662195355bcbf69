"""Shared set-up of the Sage figure scripts (``sage_*.py``): the models at CPU-friendly sizes,
their planning context, and running a plan micro-batch by micro-batch with the executor.

Models (batch 32, Sage's mini-batch):

* ``resnet50``: bottlenecks 3-4-6-3 without BatchNorm (``batch_norm=False``: convolutions with
  bias; gradient accumulation is then exact), widths 16-32-64-128 (x4 expansion), 32x32 images;
* ``resnet50_bn``: the same with BatchNorm (batch-coupled);
* ``bert_small``: 4 post-LN encoder layers, hidden 128, 4 heads, 64 tokens, vocabulary 2048,
  dropout 0 (a dropout key shared by micro-batches would draw other masks than the full batch),
  and exactly 10 masked positions per sequence (the loss divides by the number of masked
  positions, so equal counts make the micro-batch mean equal the full-batch loss).

``quick=True`` shrinks the batch to 8 and the images to 16 px, 2 encoder layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import remat
from remat import microbatch
from remat.planning import planning_context

MASKED_PER_ROW = 10


def model(name: str, quick: bool = False, batch: int | None = None):
    """``(loss_fn, params, batch)`` of one of the module docstring's models."""
    B = batch or (8 if quick else 32)
    if name in ("resnet50", "resnet50_bn"):
        return remat.zoo.get("resnet50", batch_size=B, image_size=16 if quick else 32, width=16,
                             batch_norm=name == "resnet50_bn")
    if name == "bert_small":
        f, p, b = remat.zoo.get("bert_small", batch_size=B, hidden=128, num_layers=2 if quick
                                else 4, num_heads=4, seq_len=64, vocab_size=2048, dropout=0.0)
        rng = np.random.default_rng(0)
        T = 64
        w = np.zeros((B, T), np.float32)
        for r in range(B):
            w[r, rng.choice(T, MASKED_PER_ROW, replace=False)] = 1.0
        targets = np.asarray(b["targets"])
        from remat.zoo.transformer import MASK_ID

        b = {"tokens": jnp.asarray(np.where(w > 0, MASK_ID, targets).astype(np.int32)),
             "targets": jnp.asarray(targets), "weights": jnp.asarray(w)}
        return f, p, b
    raise ValueError(name)


def setup(name: str, quick: bool = False, stages="auto", batch: int | None = None):
    """``(f, params, batch, graph, ctx)``."""
    f, p, b = model(name, quick, batch)
    g = remat.extract(f, p, b, stages=stages)
    ctx = planning_context(f, (p, b), g, stages=stages)
    return f, p, b, g, ctx


def run(g, ctx, plan, p, b):
    """Execute ``plan`` op by op (micro-batch by micro-batch).  Returns ``(value, grads,
    MicrobatchStats)``."""
    gk = g if plan.microbatches == 1 else ctx.graph_at(plan.microbatches)
    return microbatch.execute(gk, plan, p, b)


def grad_error(grads, ref) -> float:
    """Largest ``|g - ref| / max|ref|`` over the gradient leaves (0: identical)."""
    out = 0.0
    for a, c in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref)):
        a, c = np.asarray(a), np.asarray(c)
        out = max(out, float(np.max(np.abs(a - c)) / (np.max(np.abs(c)) + 1e-30)))
    return out
