"""The drop-in on the installed JAX, on models written outside the zoo (and the zoo's scanned
transformers; every zoo model: tests/test_zoo_end_to_end.py): Checkmate at
60%, SqrtN and (scanned models) ScanLayers plan, apply through ``remat.value_and_grad`` under
``jax.jit`` and give ``jax.value_and_grad``'s value and gradients (rtol 1e-4), or refuse the budget
with :class:`~remat.core.errors.InfeasibleBudgetError` naming the smallest feasible one.

CI runs this at both ends of the supported JAX range (``.ci/run``).
"""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from helpers import generated_models, outside_models
from helpers.limits import SAFETY_S

import policies
import remat
from remat.core.errors import InfeasibleBudgetError, RematWarning
from remat.fidelity import RematFidelityWarning

ZOO = {  # the scanned zoo transformers (every zoo model: tests/test_zoo_end_to_end.py)
    "bert_small": dict(seq_len=4, hidden=8, num_layers=2, num_heads=2, vocab_size=16, max_len=8),
    "gpt2_small": dict(seq_len=4, hidden=8, num_layers=2, num_heads=2, vocab_size=16, max_len=8),
}
SCANNED_ZOO = ("bert_small", "gpt2_small")


def _zoo(name, **extra):
    return lambda: remat.zoo.get(name, batch_size=2, **{**ZOO[name], **extra})


def _generated_scan(frontend):
    spec = generated_models.Spec(
        widths=(8, 8, 8), acts=("gelu", "tanh", "relu"), kinds=("dense", "add", "dense"),
        skips=(-1, 0, -1), loss="xent", frontend=frontend, scan=3, batch=4)
    return lambda: generated_models.build(spec)


MODELS = {
    **{f"zoo/{n}[scan]": _zoo(n, scan=True) for n in SCANNED_ZOO},
    "plain_tanh_mlp": outside_models.plain_tanh_mlp,
    "plain_transformer": lambda: outside_models.plain_transformer(layers=3),
    "linen_mlp": outside_models.linen_mlp,
    "nnx_mlp": outside_models.nnx_mlp,
    "custom_vjp_mlp": outside_models.custom_vjp_mlp,
    "linen_scan_transformer": outside_models.linen_scan_transformer,
    "plain_scan[generated]": _generated_scan("plain"),
    "nnx_scan[generated]": _generated_scan("nnx"),
}
SCANNED = {f"zoo/{n}[scan]" for n in SCANNED_ZOO} | {
    "linen_scan_transformer", "plain_scan[generated]", "nnx_scan[generated]"}


def _policies(model):
    """Checkmate at 60 %, SqrtN, and ScanLayers at 60 % on scanned models."""
    return ["checkmate", "sqrtn"] + (["scan_layers"] if model in SCANNED else [])


def _policy(name):
    if name == "checkmate":
        return policies.get("checkmate", budget="60%", time_limit=SAFETY_S)
    if name == "scan_layers":
        return policies.get("scan_layers", budget="60%")
    return policies.get(name)


def _close(got, want, label):
    (gv, gg), (wv, wg) = got, want
    np.testing.assert_allclose(np.asarray(gv), np.asarray(wv), rtol=1e-4, atol=1e-6, err_msg=label)
    g, w = jax.tree.leaves(gg), jax.tree.leaves(wg)
    assert len(g) == len(w) and jax.tree.structure(gg) == jax.tree.structure(wg)
    for a, b in zip(g, w):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6,
                                   err_msg=label)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_dropin_gives_jax_gradients_on_the_installed_jax(model):
    loss, params, batch = MODELS[model]()
    want = jax.jit(jax.value_and_grad(loss))(params, batch)
    for policy in _policies(model):
        vg = remat.value_and_grad(loss, _policy(policy))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RematWarning)  # no primitive costed by the fallback
                warnings.simplefilter("ignore", RematFidelityWarning)
                ap = vg.applied(params, batch)
        except InfeasibleBudgetError as e:  # a typed refusal naming the smallest feasible budget
            assert e.min_feasible_bytes > e.budget, (policy, e)
            continue
        assert ap.graph.meta["unknown_primitives"] == ()
        if policy == "scan_layers":
            assert ap.plan.meta.get("scans"), "ScanLayers must decide every scan"
        _close(jax.jit(vg)(params, batch), want, policy)

