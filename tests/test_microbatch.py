"""remat.microbatch: splitting rule, lax.scan accumulation, and the op-by-op micro-batched
executor (peak activation bytes fall about k-fold, gradients unchanged)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.mlp_models import mlp_setup, tanh_mlp_loss

import remat
from remat import microbatch
from remat.apply import execute_microbatched
from remat.core.errors import MicrobatchError

mlp_loss = tanh_mlp_loss


def setup(depth=4, width=32, batch=256):
    return mlp_setup(depth, width, batch)


def test_split_and_merge_rule():
    params, batch = setup(batch=8)
    batch = dict(batch, scale=jnp.float32(2.0), key=jax.random.PRNGKey(3), table=jnp.ones((5, 8)))
    assert microbatch.batch_size((params, batch)) == 8
    stacked, spec = microbatch.split_args((params, batch), 0, 4)
    assert [s.shape for s in stacked] == [(4, 2, 32), (4, 2, 32)]  # x and y only
    mb = microbatch.merge(spec, [s[1] for s in stacked])
    np.testing.assert_array_equal(np.asarray(mb[1]["x"]), np.asarray(batch["x"][2:4]))
    assert mb[1]["table"].shape == (5, 8) and mb[1]["key"].shape == (2,)  # not split
    assert mb[0] is not None and jax.tree_util.tree_structure(mb) == jax.tree_util.tree_structure((params, batch))
    shapes = microbatch.microbatch_args((params, batch), 0, 4)
    assert shapes[1]["x"].shape == (2, 32) and shapes[1]["table"].shape == (5, 8)
    with pytest.raises(MicrobatchError):
        microbatch.split_args((params, batch), 0, 3)
    with pytest.raises(MicrobatchError):
        microbatch.batch_size((params,), 0)  # nothing to split


def test_scan_accumulate_matches_python_loop():
    params, batch = setup(depth=2, batch=12)
    vg = jax.value_and_grad(mlp_loss)
    v, g = jax.jit(lambda p, b: microbatch.accumulate(vg, (p, b), 0, 3))(params, batch)
    parts = [jax.tree_util.tree_map(lambda a, j=j: a[4 * j : 4 * j + 4], batch) for j in range(3)]
    outs = [vg(params, p) for p in parts]
    np.testing.assert_allclose(float(v), sum(float(o[0]) for o in outs) / 3, rtol=1e-5)
    ref_g = jax.tree_util.tree_map(lambda *a: sum(a) / 3, *[o[1] for o in outs])
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_executor_peak_falls_k_fold_with_4_microbatches():
    params, batch = setup(depth=4, width=32, batch=256)
    v_ref, g_ref = jax.value_and_grad(mlp_loss)(params, batch)
    v1, g1, st1, graph1, _ = execute_microbatched(mlp_loss, params, batch, microbatches=1)
    v4, g4, st4, graph4, plan4 = execute_microbatched(mlp_loss, params, batch, microbatches=4)
    assert plan4.microbatches == 4 and len(st4.per_microbatch_peak_bytes) == 4
    assert graph4.meta.get("batch_size") in (64, None)
    for v, g in ((v1, g1), (v4, g4)):
        np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    ratio = st1.peak_bytes / st4.peak_bytes
    # activations are 32 KiB per value at B=256, params 4 KiB per layer: close to 4x
    assert 3.0 <= ratio <= 4.5, (st1.peak_bytes, st4.peak_bytes)
    # per micro-batch peaks equal each other (same schedule, same shapes)
    assert len(set(st4.per_microbatch_peak_bytes)) == 1
    assert st4.accumulator_bytes == sum(a.nbytes for a in jax.tree_util.tree_leaves(g_ref))


def test_executor_microbatches_with_a_plan():
    params, batch = setup(depth=6, width=16, batch=64)
    v_ref, g_ref = jax.value_and_grad(mlp_loss)(params, batch)
    v, g, st, graph, plan = execute_microbatched(
        mlp_loss, params, batch, policy="sqrtn", microbatches=2, reduction="mean"
    )
    assert plan.R.sum() > graph.n  # it recomputes
    np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert st.peak_bytes <= remat.simulate(graph, plan).peak_bytes * 1.05 + 4096


def test_microbatch_transform_composes_with_any_value_and_grad():
    """``remat.microbatch.microbatch`` wraps jax's and remat's value_and_grad alike."""
    params, batch = setup(batch=64)
    ref_v, ref_g = jax.jit(jax.value_and_grad(mlp_loss))(params, batch)
    for vg in (jax.value_and_grad(mlp_loss), remat.value_and_grad(mlp_loss, "sqrtn")):
        v, g = jax.jit(microbatch.microbatch(vg, 4))(params, batch)
        np.testing.assert_allclose(v, ref_v, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert microbatch.microbatch(jax.value_and_grad(mlp_loss), 1) is not None
    with pytest.raises(MicrobatchError):
        microbatch.microbatch(jax.value_and_grad(mlp_loss), 0)
    with pytest.raises(MicrobatchError):
        microbatch.microbatch(jax.value_and_grad(mlp_loss), 2, reduction="max")
