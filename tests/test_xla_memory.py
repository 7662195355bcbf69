"""The memory model calibrated to XLA (issue #33, item 2): :func:`remat.xla_memory.predict_temp_bytes`
against the compiled step's ``memory_analysis().temp_size_in_bytes`` on XLA:CPU with the
``cse_barrier_expander`` pass disabled (in a subprocess: XLA reads the flag once), and the
function's contract.

Plans are deterministic (no remat, ``sqrtn``, checkpoint-all: no solver time limit), so the
result does not depend on the machine's speed.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from helpers.xla_subprocess import run_json

import policies
import remat
from remat import xla_memory
from remat.core.graph import chain_graph

TOL = {"tanh_mlp": 0.10, "plain_transformer": 0.10, "linen_cnn": 0.05}
"""Predicted temp within 10% of the compiled one (both JAX ends), 5% on the CNN: its sqrt(n)
plan was 0.92x on jax 0.8 and 0.12 while an in-place write and its operand were two
allocations (XLA colocates them: one offset for both lives), 1.04x since."""

_SCRIPT = textwrap.dedent(
    """
    import json, warnings
    import jax
    import policies, remat
    from remat import xla_memory
    from remat.apply import apply_plan
    from experiments import memory_model_report as R

    MODELS = {
        "tanh_mlp": lambda: R.tanh_mlp(L=12, B=64, W=64),
        "plain_transformer": lambda: R.plain_transformer(blocks=2, B=2, T=16, D=32, H=2, V=64),
        "linen_cnn": lambda: R.linen_cnn(B=4, S=16, depth=4),
    }
    out = {}
    for name, make in MODELS.items():
        loss, params, batch = make()
        g = remat.extract(loss, params, batch)
        rows = []
        for pol in ("none", "sqrtn", "checkpoint_all"):
            if pol == "none":
                plan, fn = None, loss
            else:
                plan = (policies.checkpoint_all_plan(g) if pol == "checkpoint_all"
                        else policies.get(pol).plan(g))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fn = apply_plan(loss, (params, batch), None, graph=g, plan=plan).fn
            temp = R.compiled_temp(fn, (params, batch))
            rows.append(dict(policy=pol, predicted=xla_memory.predict_temp_bytes(g, plan),
                             compiled=temp, plan_peak=(g.no_remat_peak() if plan is None
                                                       else R.plan_peak(g, plan))))
        out[name] = rows
    # checkpointed tanh(x @ w + b) layers keeping x @ w: each recomputed tanh gets a buffer of
    # its own beside the kept product (no in-place write through a barrier), and a layer's data
    # gradient runs before its recomputation (XLA visits a barrier's elements last first)
    import jax.numpy as jnp
    ck = jax.checkpoint(lambda h, w, b: jnp.tanh(h @ w + b),
                        policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    def biased(params, x):
        for w, b in params:
            x = ck(x, w, b)
        return jnp.mean(x * x)
    args = ([(jnp.ones((128, 128)) / 128, jnp.zeros((128,))) for _ in range(8)],
            jnp.ones((1024, 128)))
    out["biased_mlp"] = [dict(policy="dots_with_no_batch_dims_saveable",
                              predicted=xla_memory.predict_step_temp_bytes(biased, *args),
                              compiled=R.compiled_temp(biased, args))]
    # residual tanh blocks on (batch, sequence, width) activations: XLA sinks the reshapes of
    # the 2-D dots through the elementwise backward, so a weight gradient's transposed copy
    # reads the written product instead of recomputing it (1.38x on jax 0.12 before)
    def block(h, w1, w2):
        return h + jnp.tanh(h @ w1) @ w2
    rows = []
    for pol in (None, jax.checkpoint_policies.nothing_saveable):
        blk = block if pol is None else jax.checkpoint(block, policy=pol)
        def residual(params, x, blk=blk):
            for w1, w2 in params:
                x = blk(x, w1, w2)
            return jnp.mean(x * x)
        args = ([(jnp.ones((64, 256)) / 64, jnp.ones((256, 64)) / 256)] * 2,
                jnp.ones((64, 32, 64)))
        rows.append(dict(policy="none" if pol is None else "nothing_saveable",
                         predicted=xla_memory.predict_step_temp_bytes(residual, *args),
                         compiled=R.compiled_temp(residual, args)))
    out["residual_mlp"] = rows
    print(json.dumps(out))
    """
)


def test_predicted_temp_within_tolerance_of_compiled_and_closer_than_the_plans_peak():
    """Three models (plain-JAX tanh MLP and transformer, a linen CNN) x three plans: the
    prediction within :data:`TOL` of XLA's compiled temp; a biased tanh MLP under JAX's
    ``dots_with_no_batch_dims_saveable`` within 2%, residual tanh blocks on 3-D activations
    (no remat, ``nothing_saveable``) within 10%.  On the transformer the plan's
    simulated peak is far off where the new model is not (checkpoint-all: the graph counts
    JAX's per-primitive residuals, the drop-in keeps only segment boundaries).  One test, one
    subprocess: a fixture shared by two tests ran twice when the two went to two workers."""
    measured = run_json(_SCRIPT)
    assert set(measured) == {"tanh_mlp", "plain_transformer", "linen_cnn", "biased_mlp",
                             "residual_mlp"}
    (biased,) = measured.pop("biased_mlp")  # 0.94 on jax 0.12 before the barrier rules
    assert abs(biased["predicted"] - biased["compiled"]) <= 0.02 * biased["compiled"], biased
    for r in measured.pop("residual_mlp"):
        assert abs(r["predicted"] - r["compiled"]) <= 0.10 * r["compiled"], r
    for model, rows in measured.items():
        assert [r["policy"] for r in rows] == ["none", "sqrtn", "checkpoint_all"]
        for r in rows:
            assert r["compiled"] > 0, (model, r)
            assert abs(r["predicted"] - r["compiled"]) <= TOL[model] * r["compiled"], (model, r)
    ca = measured["plain_transformer"][2]
    assert ca["plan_peak"] > 2 * ca["compiled"], ca
    assert abs(ca["predicted"] - ca["compiled"]) < abs(ca["plan_peak"] - ca["compiled"])


# ----------------------------------------------------------------------------- contract
def _mlp(L=6, B=16, W=32):
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(0), L + 1)
    ws = [jax.random.normal(k, (W, W)) / np.sqrt(W) for k in ks[:L]]
    x = jax.random.normal(ks[-1], (B, W))

    def loss(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)

    return loss, ws, x


def test_contract_int_nonnegative_and_checkpoint_all():
    loss, ws, x = _mlp()
    g = remat.extract(loss, ws, x)
    for plan in (None, policies.checkpoint_all_plan(g), policies.get("sqrtn").plan(g)):
        got = xla_memory.predict_temp_bytes(g, plan)
        assert isinstance(got, int) and got >= 0
    rep = xla_memory.temp_breakdown(g, policies.checkpoint_all_plan(g))
    assert rep.temp_bytes == xla_memory.predict_temp_bytes(g, policies.checkpoint_all_plan(g))
    assert rep.peak_live_bytes > 0 and rep.colocated_bytes >= 0 and rep.n_buffers > 0
    assert rep.at_peak and all(len(row) == 5 for row in rep.at_peak)


def test_contract_tiny_and_abstract_arguments():
    """A one-layer loss and ``jax.ShapeDtypeStruct`` arguments (nothing runs)."""
    import jax

    loss, ws, x = _mlp(L=1, B=2, W=2)
    spec = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (ws, x))
    g = remat.extract(loss, *spec)
    assert xla_memory.predict_temp_bytes(g, policies.checkpoint_all_plan(g)) >= 0
    assert xla_memory.predict_step_temp_bytes(loss, *spec) >= 0


def test_contract_rejects_loaded_graphs_and_foreign_plans():
    loss, ws, x = _mlp()
    g = remat.extract(loss, ws, x)
    with pytest.raises(remat.errors.ExtractionError, match="program"):
        xla_memory.predict_temp_bytes(chain_graph(4), None)
    other = remat.extract(*_mlp(L=3)[:1], *_mlp(L=3)[1:])
    with pytest.raises(remat.errors.InvalidPlanError, match="columns"):
        xla_memory.predict_temp_bytes(g, policies.checkpoint_all_plan(other))
