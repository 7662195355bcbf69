"""ChainDP's ``polish`` option: schedules of an inexact DP (sizes rounded to memory levels) with
recomputations pruned while the replayed peak fits the real budget: never dearer, never over the
budget, exact plans untouched, and the same gradients through the drop-in on a Flax MLP and a
plain-JAX MLP we did not write for this."""

from __future__ import annotations

import numpy as np
import pytest

import remat
from policies.chain_dp import ChainDP
from remat.core.schedule import replay


def _chain(L, seed):
    rng = np.random.default_rng(seed)
    return remat.chain_graph(L, sizes=rng.integers(1, 100, L), fwd_costs=rng.uniform(1, 3, L))


def _cost(g, plan):
    return float(plan.R.sum(axis=0) @ g.costs)


@pytest.mark.parametrize("seed", range(4))
def test_polish_is_never_dearer_and_fits(seed):
    g = _chain(60, seed)
    b = int(0.4 * g.no_remat_peak())
    raw = ChainDP(budget=b, max_levels=12, polish=False).plan(g)
    pol = ChainDP(budget=b, max_levels=12).plan(g)
    assert not raw.meta["exact"]
    pol.validate(g)
    assert replay(g, pol).peak_bytes <= b and pol.R.any(axis=0).all()
    assert _cost(g, pol) <= _cost(g, raw) + 1e-9
    if "dp_cost_unpolished" in pol.meta:
        assert pol.meta["dp_cost_unpolished"] == pytest.approx(_cost(g, raw))


def test_polish_uses_the_bytes_rounding_left():
    """The 500-layer chain of experiments/chain_dp_timing.py at 50 %: the DP's plans (sizes
    rounded to levels) leave bytes unused; the polished plan is cheaper and peaks higher, still
    within the budget."""
    rng = np.random.default_rng(500)
    g = remat.chain_graph(500, sizes=rng.integers(1, 100, 500), fwd_costs=rng.uniform(1, 3, 500))
    b = int(0.5 * g.no_remat_peak())
    raw = ChainDP(budget=b, polish=False).plan(g)
    pol = ChainDP(budget=b).plan(g)
    p_raw, p_pol = replay(g, raw).peak_bytes, replay(g, pol).peak_bytes
    assert p_raw < p_pol <= b
    assert _cost(g, pol) < 0.99 * _cost(g, raw)


def test_exact_plans_are_not_touched():
    g = _chain(12, 1)
    b = int(0.5 * g.no_remat_peak())
    a = ChainDP(budget=b).plan(g)
    c = ChainDP(budget=b, polish=False).plan(g)
    assert a.meta["exact"] and np.array_equal(a.R, c.R) and np.array_equal(a.S, c.S)
    assert "dp_cost_unpolished" not in a.meta


@pytest.mark.parametrize("frontend", ["linen", "plain"])
def test_polished_plans_through_the_drop_in(frontend):
    """Inexact DP (8 memory levels) at 60-75 %, polished, applied by remat.value_and_grad: the
    value and gradients of jax.value_and_grad (rtol 1e-5), saved residual bytes within the
    plan's or a warning naming them."""
    from helpers.dropin import assert_residuals_within_plan_or_warned, run_against_jax
    from helpers.mlp_models import mlp_setup, tanh_mlp_loss

    from experiments.milp_unseen import random_width_mlp

    if frontend == "linen":
        loss, params, batch = random_width_mlp(3, layers=24, batch=16, numpy_params=True)
    else:
        loss = tanh_mlp_loss
        params, batch = mlp_setup(24, 16, 16)
    budget = {"linen": "75%", "plain": "60%"}[frontend]  # above each one's smallest
    pol = ChainDP(budget=budget, max_levels=8)
    vg = remat.value_and_grad(loss, pol)
    ap, fid = run_against_jax(vg, loss, params, batch)
    g, plan = ap.graph, ap.plan
    assert plan.meta["policy"] == "chain_dp" and not plan.meta["exact"]
    assert plan.meta["dp_cost_unpolished"] > plan.meta["compute_cost"]  # it was polished
    assert replay(g, plan).peak_bytes <= remat.resolve_budget(budget, g)
    assert_residuals_within_plan_or_warned(ap, fid)


def test_polished_plan_measured_by_the_executor():
    """A polished plan run op by op by remat.execute on a plain-JAX MLP: jax.value_and_grad's
    value and gradients, measured peak within 5 % of the replayed peak, which fits the budget."""
    from helpers.checks import run_and_check
    from helpers.mlp_models import mlp_setup, tanh_mlp_loss

    params, batch = mlp_setup(24, 16, 16)
    g = remat.extract(tanh_mlp_loss, params, batch)
    b = remat.resolve_budget("60%", g)
    plan = ChainDP(budget=b, max_levels=8).plan(g)
    assert plan.meta["dp_cost_unpolished"] > plan.meta["compute_cost"]  # it was polished
    stats, sim = run_and_check(tanh_mlp_loss, params, batch, g, plan)
    assert sim.peak_bytes <= b and stats.peak_bytes <= 1.05 * b
