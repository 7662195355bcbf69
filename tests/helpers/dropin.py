"""Shared checks of a drop-in ``remat.value_and_grad``: value and gradients against
``jax.value_and_grad`` of the unmodified loss, and how it reports the saved-residual bytes it
realised against the plan's prediction."""

from __future__ import annotations

import warnings

import jax

from helpers.checks import assert_same
from remat.fidelity import FIDELITY_RTOL, RematFidelityWarning


def run_against_jax(vg, loss, *args):
    """Run the drop-in ``jax.jit(vg)(*args)`` with warnings recorded (planned while jit traces
    it, as in a training step); assert its value and gradients equal
    ``jax.jit(jax.value_and_grad(loss))(*args)`` (rtol 1e-5).  Jitted, not eager: one
    compilation instead of one per primitive (a 24-layer linen MLP's drop-in test spent 20 of
    its 25 s compiling ops one by one); ``tests/test_apply.py`` runs drop-ins eagerly.

    Returns:
      ``(applied, fidelity)``: ``vg.applied(*args)`` and the RematFidelityWarnings raised.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grads = jax.jit(vg)(*args)
        ap = vg.applied(*args)
    rv, rg = jax.jit(jax.value_and_grad(loss))(*args)
    assert_same(value, rv)
    assert_same(grads, rg)
    return ap, [w for w in caught if issubclass(w.category, RematFidelityWarning)]


def assert_residuals_within_plan_or_warned(ap, fid) -> None:
    """Saved residual bytes above the plan's by more than FIDELITY_RTOL come with a warning that
    names them; otherwise no warning, and bytes that differ from the plan's are named in a
    note."""
    over = ap.residual_bytes > ap.predicted_residual_bytes * (1 + FIDELITY_RTOL)
    if over:  # more memory than planned: a warning with the numbers
        assert fid and ap.warnings and str(ap.residual_bytes) in str(fid[0].message)
    else:  # within the plan: no warning, a note when not equal
        assert not fid and not ap.warnings
        assert ap.residual_bytes == ap.predicted_residual_bytes or any(
            str(ap.residual_bytes) in n for n in ap.notes)


def plain_dag_loss():
    """``(loss, ws, x)``: a plain-JAX network (no modules) with skip connections and a
    concatenation, ten 24 x 24 weights, batch 64."""
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 12)
    ws = [jax.random.normal(keys[i], (24, 24)) / 5 for i in range(10)]
    x = jax.random.normal(keys[11], (64, 24))

    def loss(ws, x):
        h = [jnp.tanh(x @ ws[0])]
        for i in range(1, 9):
            z = h[-1] @ ws[i]
            if i % 3 == 0:
                z = z + h[-3]
            if i == 5:
                z = jnp.concatenate([z, h[1]], axis=1)[:, :24]
            h.append(jnp.sin(z) if i % 2 else jnp.tanh(z))
        return jnp.mean((h[-1] @ ws[9]) ** 2)

    return loss, ws, x
