"""Checkmate instances from models the project did not write (a Flax nnx MLP, a random-width
Flax linen MLP), their plans and their drop-in, cached: the tests of three modules plan the
same instances."""

from __future__ import annotations

import functools

import policies
import remat
from helpers.limits import SAFETY_S
from solvers.checkmate import CheckmateProblem


@functools.cache
def mlp_we_did_not_write(model: str):
    """``(loss, args, graph, budget)`` of a 10-layer Flax nnx MLP (``"nnx"``) or a 14-layer
    random-width Flax linen MLP (``"linen-random-width"``), extracted with one stage per layer
    under the pinned host profile (:func:`helpers.limits.pinned_host_profile`: the same costs,
    so the same MILP, on every machine); ``budget`` is 30 % of the way from the smallest feasible
    budget to the no-remat peak (bytes), where schedules recompute.  Cached: the tests of
    three modules plan the same instances."""
    from experiments.milp_unseen import random_width_mlp
    from helpers.limits import pinned_host_profile
    from helpers.user_models import nnx_mlp
    from solvers.checkmate import min_feasible_budget

    if model == "nnx":
        loss, params, x = nnx_mlp(L=10)
        args = (params, x)
    else:
        loss, params, batch = random_width_mlp(3, layers=14, numpy_params=True)
        args = (params, batch)
    with pinned_host_profile():
        g = remat.extract(loss, *args, stages=1000)
    lo = min_feasible_budget(CheckmateProblem.from_graph(g), time_limit=SAFETY_S)[0]
    return loss, args, g, lo + int(0.3 * (g.no_remat_peak() - lo))


@functools.cache
def plan_we_did_not_write(model: str, **options):
    """Checkmate's plan of :func:`mlp_we_did_not_write` at its budget: two-search portfolio
    (whatever the core count), no warm start, ``options`` on top, :data:`helpers.limits.SAFETY_S`.
    Cached.  Without a warm start the variants compared are the MILPs alone (each proves in
    under 2 s; the warm start, ChainDP's exact DP in Python, took 6 s per plan); the drop-in
    (:func:`dropin_we_did_not_write`) plans with the default warm start."""
    _, _, g, b = mlp_we_did_not_write(model)
    return policies.get("checkmate", budget=b, time_limit=SAFETY_S,
                        **{"portfolio": 2, "warm_start": False, **options}).plan(g)


@functools.cache
def dropin_we_did_not_write(model: str):
    """``(applied, fidelity_warnings)`` of ``remat.value_and_grad`` with the default Checkmate
    (warm-started) at the budget of :func:`mlp_we_did_not_write`, two-search portfolio, its
    value and gradients checked against jax's (rtol 1e-5) by :func:`helpers.dropin.run_against_jax`.
    Cached."""
    from helpers.dropin import run_against_jax
    from helpers.limits import pinned_host_profile

    loss, args, _, b = mlp_we_did_not_write(model)
    policy = policies.get("checkmate", budget=b, time_limit=SAFETY_S, portfolio=2)
    with pinned_host_profile():  # the drop-in extracts the graph again: the same costs
        return run_against_jax(remat.value_and_grad(loss, policy, stages=1000), loss, *args)
