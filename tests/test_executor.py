"""remat.execute: gradients equal jax.value_and_grad's under any legal plan, and the executor's
measured peak agrees with the simulator's prediction."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.checks import assert_same, run_and_check
from helpers.event_oracle import oracle_peak
from helpers.extract_models import MODELS, make_mlp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
import remat
from remat.core.errors import InvalidPlanError
from remat.core.plan import Plan, plan_from_order


def ondemand_plan(g, keep: np.ndarray, policy: str = "ondemand") -> Plan:
    """Step t computes node t, first recomputing (in index order) every missing input, recursively.

    ``keep[t, i]``: carry node i's output from step t into step t+1 if resident.  Any ``keep`` gives
    a legal plan (missing values are recomputed from the arguments at worst).
    """
    n = g.n
    S = np.zeros((n, n), dtype=bool)
    order = []
    for t in range(n):
        comp: set[int] = set()

        def ensure(i, t=t, comp=comp):
            if S[t, i] or i in comp:
                return
            for p in g.preds[i]:
                ensure(p)
            comp.add(i)

        for p in g.preds[t]:
            ensure(p)
        comp.add(t)
        order.append(sorted(comp))
        if t + 1 < n:
            R_t = np.zeros(n, dtype=bool)
            R_t[list(comp)] = True
            S[t + 1] = (S[t] | R_t) & keep[t]
    return plan_from_order(g, order, keep=keep, policy=policy)


def every_kth_plan(g, k: int = 4) -> Plan:
    """Keep every k-th forward stage (and the loss) during the forward pass, drop the rest after
    use; in the backward pass recompute missing forward values right before the backward stage
    that needs them and keep them until their last reader."""
    n = g.n
    bw = g.is_backward_array
    first_bwd = int(np.argmax(bw))
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    ckpt = (i % k == 0) | bw[None, :] | (i == first_bwd - 1)
    keep = (g.last_reader[None, :] > t) & (ckpt | (t >= first_bwd) | (i == t))
    return ondemand_plan(g, keep, policy=f"every_{k}")


@pytest.mark.parametrize("name", sorted(MODELS) + ["mlp_deep"])
def test_plans_match_value_and_grad_and_simulator(name):
    """Checkpoint-all and a recomputing plan (every 4th forward stage kept) on one graph."""
    if name == "mlp_deep":
        loss, params, batch = make_mlp(depth=10, width=32, batch=16)
    else:
        loss, params, batch = MODELS[name]()
    g = remat.extract(loss, params, batch, stages="module")
    stats, sim = run_and_check(loss, params, batch, g, policies.checkpoint_all_plan(g))
    assert sim.peak_bytes == g.no_remat_peak()
    assert len(stats.timeline["live_bytes"]) == 2 * g.n  # one step-start + one node sample per step
    if len(g.forward_nodes) < 3:
        return
    plan = every_kth_plan(g, 4)
    plan.validate(g)
    assert plan.R.sum() > g.n  # it recomputes
    stats, sim = run_and_check(loss, params, batch, g, plan)
    assert sim.recomputations == stats.stage_runs - g.n
    if name == "mlp_deep":
        assert stats.peak_bytes < g.no_remat_peak()


def test_stage_functions_are_compiled_once():
    loss, params, batch = make_mlp(depth=3)
    g = remat.extract(loss, params, batch, stages="module")
    plan = every_kth_plan(g, 2)
    remat.execute(g, plan, params, batch)
    fns = dict(g.program.cache)
    assert set(fns) == set(range(g.n))
    remat.execute(g, plan, params, batch)
    assert all(g.program.cache[i] is fns[i] for i in fns)


@functools.cache
def _paging_case():
    loss, params, batch = make_mlp(depth=4, width=16, batch=8)
    return loss, params, batch, remat.extract(loss, params, batch, stages="module")


@pytest.mark.parametrize("store", ["host", "file"])
def test_paging_roundtrip(store):
    loss, params, batch, g = _paging_case()  # one graph: its compiled stages are shared
    base = policies.checkpoint_all_plan(g)
    S = base.S.copy()
    f = 1  # fwd/MLP/Dense_1: paged out in the step after its last forward reader (at the step
    # start, POET semantics), paged back in at the end of the step before its first backward reader
    r = min(d for d in g.succs[f] if g.nodes[d].is_backward)
    t_out = max([d for d in g.succs[f] if d < r], default=f) + 1
    assert t_out + 1 < r
    page_out = np.zeros_like(S)
    page_in = np.zeros_like(S)
    page_out[t_out, f] = True
    page_in[r - 1, f] = True
    S[t_out + 1 : r, f] = False
    plan = Plan(R=base.R, S=S, page_out=page_out, page_in=page_in, meta={"policy": "paging"})
    plan.validate(g)
    value, grads, stats = remat.execute(g, plan, params, batch, paging_store=store)
    rv, rg = jax.value_and_grad(loss)(params, batch)
    assert_same(value, rv)
    assert_same(grads, rg)
    sim = remat.simulate(g, plan)
    assert stats.bytes_paged == 2 * g.nodes[f].out_bytes == sim.bytes_paged
    assert stats.peak_bytes_bookkeeping == oracle_peak(g, plan)
    assert abs(stats.peak_bytes - sim.peak_bytes) <= 0.05 * sim.peak_bytes
    # the paged value is off the device between t_out and r: the step-start samples show it
    tl = stats.timeline
    start = tl["node"] == -1
    starts = dict(zip(tl["step"][start].tolist(), tl["bookkeeping_bytes"][start].tolist()))
    ref = dict(enumerate((base.S.astype(np.int64) @ g.sizes).tolist()))
    assert starts[t_out + 1] == ref[t_out + 1] - g.nodes[f].out_bytes
    assert starts[r] == ref[r]


def test_illegal_plan_raises():
    loss, params, batch = make_mlp(depth=3)
    g = remat.extract(loss, params, batch, stages="module")
    plan = policies.checkpoint_all_plan(g)
    S = plan.S.copy()
    S[2:, 0] = False  # drop fwd 0 before its backward readers without recomputing it
    with pytest.raises(InvalidPlanError):
        remat.execute(g, Plan(R=plan.R, S=S), params, batch)


# ------------------------------------------------------------------ random DAG functions + plans
W = 4


@st.composite
def dag_and_plan(draw):
    n_ops = draw(st.integers(2, 6))
    ops = []
    n_vals, n_w = 1, 0
    for _ in range(n_ops):
        kind = draw(st.sampled_from(["matmul", "tanh", "add"]))
        a = draw(st.integers(0, n_vals - 1))
        if kind == "add":
            ops.append(("add", a, draw(st.integers(0, n_vals - 1))))
        elif kind == "matmul":
            ops.append(("matmul", a, n_w))
            n_w += 1
        else:
            ops.append(("tanh", a))
        n_vals += 1
    if n_w == 0:
        ops.append(("matmul", n_vals - 1, 0))
        n_w, n_vals = 1, n_vals + 1
    n_out = draw(st.integers(1, min(3, n_vals - 1)))
    seed = draw(st.integers(0, 2**16))
    keep_p = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    stages = draw(st.sampled_from(["module", "module", 2, 3]))
    return ops, n_w, n_out, seed, keep_p, stages


def build_dag(ops, n_w, n_out, seed):
    rng = np.random.default_rng(seed)
    params = [jnp.asarray(rng.normal(size=(W, W)) * 0.6, jnp.float32) for _ in range(n_w)]
    x = jnp.asarray(rng.normal(size=(3, W)), jnp.float32)

    def loss(p, x):
        vals = [x]
        for k, op in enumerate(ops):
            with jax.named_scope(f"op{k}"):
                if op[0] == "matmul":
                    vals.append(vals[op[1]] @ p[op[2]])
                elif op[0] == "tanh":
                    vals.append(jnp.tanh(vals[op[1]]))
                else:
                    vals.append(vals[op[1]] + vals[op[2]])
        return sum(jnp.mean(v * v) for v in vals[-n_out:])

    return loss, params, x


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_and_plan())
def test_random_dag_random_legal_plan(case):
    ops, n_w, n_out, seed, keep_p, stages = case
    loss, params, x = build_dag(ops, n_w, n_out, seed)
    g = remat.extract(loss, params, x, stages=stages)
    rng = np.random.default_rng(seed)
    keep = rng.random((g.n, g.n)) < keep_p
    plan = ondemand_plan(g, keep)
    plan.validate(g)
    run_and_check(loss, params, x, g, plan)


def test_argnums_tuple_and_unused_parameter():
    from helpers.extract_models import make_plain

    loss, params, x = make_plain()
    g = remat.extract(loss, params, x, argnums=(0, 1), stages="module")
    value, grads, _ = remat.execute(g, policies.checkpoint_all_plan(g), params, x)
    rv, rg = jax.value_and_grad(loss, argnums=(0, 1))(params, x)
    assert_same(value, rv)
    assert_same(grads, rg)

    def loss2(p, x):  # p["b"] is unused: its gradient is a zero the program emits directly
        return jnp.sum(jnp.tanh(x @ p["a"]))

    p2 = {"a": jnp.ones((5, 2)) * 0.1, "b": jnp.ones((3,))}
    g2 = remat.extract(loss2, p2, x, stages="eqn")
    value, grads, _ = remat.execute(g2, policies.checkpoint_all_plan(g2), p2, x)
    assert_same((value, grads), jax.value_and_grad(loss2)(p2, x))


def test_scan_cond_while_model():
    """nn.scan over layers, lax.cond and a (non-differentiated) while loop run as whole stages."""
    import flax.linen as nn

    class Blk(nn.Module):
        @nn.compact
        def __call__(self, c, _):
            return nn.relu(nn.Dense(8)(c)), None

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(8)(x)
            scan = nn.scan(Blk, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
            x, _ = scan()(x, None)
            return nn.Dense(2)(x)

    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8)), jnp.float32)
    mod = M()
    params = mod.init(jax.random.PRNGKey(0), x)

    def loss(p, x):
        y = mod.apply(p, x)
        y = jax.lax.cond(jnp.sum(y) > 0, lambda y: y * 2.0, jnp.sin, y)
        scale = jax.lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, jnp.tanh(s[1])), (0, jnp.sum(x)))[1]
        return jnp.mean((y * scale) ** 2)

    g = remat.extract(loss, params, x, stages="module")
    assert g.meta["notes"]  # the while-loop FLOP caveat is recorded
    prims = {p for ps in g.meta["node_primitives"] for p in ps}
    assert {"scan", "cond", "while"} <= prims
    run_and_check(loss, params, x, g, policies.checkpoint_all_plan(g))
    run_and_check(loss, params, x, g, every_kth_plan(g, 2))
