"""Checks shared by the test modules: two pytrees equal to float32 precision, and a plan run by
the op-by-op executor against ``jax.value_and_grad`` and the simulator."""

from __future__ import annotations

import jax
import numpy as np

import remat
from helpers.event_oracle import oracle_peak


def assert_same(got, ref):
    gl, gt = jax.tree_util.tree_flatten(got)
    rl, rt = jax.tree_util.tree_flatten(ref)
    assert gt == rt
    for a, b in zip(gl, rl):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def run_and_check(loss, params, batch, g, plan):
    value, grads, stats = remat.execute(g, plan, params, batch)
    rv, rg = jax.jit(jax.value_and_grad(loss))(params, batch)
    assert_same(value, rv)
    assert_same(grads, rg)
    sim = remat.simulate(g, plan)
    # the executor interprets the same events as remat.simulate: its bookkeeping is checked
    # against the independent oracle; its measured live bytes against the replay's peak
    assert stats.peak_bytes_bookkeeping == oracle_peak(g, plan) == sim.peak_bytes
    assert abs(stats.peak_bytes - sim.peak_bytes) <= 0.05 * sim.peak_bytes, (stats.peak_bytes, sim.peak_bytes)
    assert stats.stage_runs == int(plan.R.sum())
    return stats, sim
