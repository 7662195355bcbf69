"""Every zoo model, end to end at tiny sizes: a recomputing plan run by the executor and applied
by ``remat.value_and_grad`` (SqrtN, and Checkmate at 60 %) gives ``jax.value_and_grad``'s loss and
gradients, and the executor's
measured peak matches the simulator's prediction (within 5%) and falls below checkpoint-all's."""

import jax
import numpy as np
import pytest
from helpers.limits import SAFETY_S

import policies
import remat
from remat.core.errors import InfeasibleBudgetError

TINY = {
    "mlp": dict(depth=6, width=32),
    "vgg16": dict(width=4, fc_width=16, image_size=32),
    "resnet18": dict(width=4, image_size=16),
    "resnet50": dict(width=4, image_size=64),  # 2x2 final maps: BatchNorm over 8 values, not 2
    "mobilenet_v2": dict(width_mult=0.25, image_size=32),
    "squeezenet": dict(width=8, image_size=32),
    "unet": dict(width=4, depth=2, image_size=16),
    "bert_small": dict(seq_len=8, hidden=32, num_layers=2, num_heads=2, vocab_size=64, max_len=16),
    "gpt2_small": dict(seq_len=8, hidden=32, num_layers=2, num_heads=2, vocab_size=64, max_len=16),
}


def _close(got, ref, rtol=1e-5, atol=1e-6, scaled=False):
    """Leaf by leaf; ``scaled``: ``atol`` also ``rtol`` times the leaf's largest magnitude (an
    element near zero in a leaf of size-1 entries carries the leaf's rounding, not its own)."""
    g, r = jax.tree.leaves(got), jax.tree.leaves(ref)
    assert len(g) == len(r)
    for a, b in zip(g, r):
        b = np.asarray(b)
        tol = max(atol, rtol * float(np.abs(b).max(initial=0.0))) if scaled else atol
        np.testing.assert_allclose(np.asarray(a), b, rtol=rtol, atol=tol)


def test_every_zoo_model_is_covered():
    assert sorted(TINY) == sorted(remat.zoo.available())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_zoo_model_plans_run_exactly(name):
    loss, params, batch = remat.zoo.get(name, batch_size=2, **TINY[name])
    ref = jax.jit(jax.value_and_grad(loss))(params, batch)
    g = remat.extract(loss, params, batch)

    full = policies.checkpoint_all_plan(g)
    plan = policies.SqrtN().plan(g)
    assert plan.R.sum() > g.n, "the plan must recompute something"
    peaks = {}
    for label, p in (("all", full), ("sqrtn", plan)):
        value, grads, stats = remat.execute(g, p, params, batch)
        # op by op against one jitted step: float32 reassociation; on jax 0.8 resnet50's
        # gradients differ by up to 4.7e-6 on entries near zero in leaves of magnitude ~4
        # (relative 9e-4 there): compared at 1e-4 of each leaf's scale (a wrong plan is off by O(1))
        _close((value, grads), ref, rtol=1e-4, scaled=True)
        sim = remat.simulate(g, p).peak_bytes
        assert abs(stats.peak_bytes - sim) <= 0.05 * sim, (label, stats.peak_bytes, sim)
        peaks[label] = stats.peak_bytes
    assert peaks["sqrtn"] < peaks["all"]

    out = jax.jit(remat.value_and_grad(loss, policies.SqrtN()))(params, batch)
    _close(out, ref)
    # Checkmate at 60 % through the drop-in: jax's gradients or a typed refusal of the budget
    try:
        vg = remat.value_and_grad(loss, policies.get("checkmate", budget="60%", time_limit=SAFETY_S))
        out = jax.jit(vg)(params, batch)
    except InfeasibleBudgetError as e:
        assert e.min_feasible_bytes > e.budget
    else:
        _close(out, ref, rtol=1e-4)
