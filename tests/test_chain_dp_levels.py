"""ChainDP's compiled fast path: the level portfolio, plans near the persistent optimum computed
without rounding, and the exact smallest budget when nothing fits (the ``(min, max)`` recursion
now runs only then)."""

from __future__ import annotations

import numpy as np
import pytest

import remat
from policies.chain_dp import ChainDP, chain_problem
from remat.core.errors import (
    BudgetFormatError,
    InfeasibleBudgetError,
    InvalidGraphError,
    InvalidOptionError,
)
from remat.core.schedule import replay
from solvers.chain_dp import (
    compiled_available,
    level_portfolio,
    min_feasible_budget,
    solve_chain,
)


def test_compiled_kernels_are_installed():
    """numba is a core dependency: the compiled path (everything below) must be the one that
    runs, not the numpy fallback."""
    assert compiled_available()


def _mib_chain(L: int, seed: int):
    rng = np.random.default_rng(seed)
    return remat.chain_graph(L, sizes=rng.integers(1, 9, L) * 2**20,
                             fwd_costs=rng.uniform(1, 3, L))


def _cost(g, plan) -> float:
    return float(np.asarray(g.costs)[replay(g, plan, strict=True).node].sum())


def _optimum(g, b: int) -> float:
    """The persistent class's optimum: the compiled DP with one level per MiB (no rounding)."""
    sol = solve_chain(chain_problem(g)[0], b, mode="fast", max_levels=10**9, table_bytes=2**33)
    assert sol.exact
    return sol.cost


def test_an_explicit_level_count_is_the_only_one_tried():
    g = _mib_chain(300, 0)
    b = int(0.3 * g.no_remat_peak())
    assert level_portfolio(chain_problem(g)[0], b, 40) == [40]
    plan = ChainDP(budget=b, max_levels=40).plan(g)
    assert [t["levels"] for t in plan.meta["dp_levels_tried"]] == [40]
    assert replay(g, plan, strict=True).peak_bytes <= b


def test_default_plan_no_dearer_than_fixed_level_counts_when_unrounded_is_out_of_reach():
    """120 layers of 10^5..10^6-byte values (gcd 1: millions of levels unrounded): the default
    plan fits and is no dearer than the plan of 256 or of 16 levels alone."""
    rng = np.random.default_rng(8)
    L = 120
    g = remat.chain_graph(L, sizes=rng.integers(10**5, 10**6, L), fwd_costs=rng.uniform(1, 3, L))
    b = int(0.3 * g.no_remat_peak())
    plan = ChainDP(budget=b).plan(g)
    assert replay(g, plan, strict=True).peak_bytes <= b
    coarse = min(float(ChainDP(budget=b, max_levels=k).plan(g).compute_counts() @ g.costs)
                 for k in (256, 16))
    assert float(plan.compute_counts() @ g.costs) <= coarse * (1 + 1e-9)


@pytest.mark.parametrize("seed", [101, 102])
def test_plans_near_the_unrounded_optimum(seed):
    """300-layer chains, sizes 1..8 MiB, 30 % of the no-remat peak (~400 levels of one MiB).
    The default plan is within 0.5 % of the persistent optimum; a 16-level table (every size
    one level or more), polished, within 1.5 % (cheapest-recomputation-first alone left it
    3.5-4.2 % above on these chains)."""
    g = _mib_chain(300, seed)
    b = int(0.3 * g.no_remat_peak())
    opt = _optimum(g, b)
    default = ChainDP(budget=b).plan(g)
    coarse = ChainDP(budget=b, max_levels=16).plan(g)
    for plan, tol in ((default, 0.005), (coarse, 0.015)):
        plan.validate(g)
        assert replay(g, plan, strict=True).peak_bytes <= b
        assert not plan.meta["exact"] and plan.meta["status"] == "feasible"
        assert opt * (1 - 1e-9) <= _cost(g, plan) <= opt * (1 + tol)
    assert coarse.meta["polish_order"] in ("density", "cost")


def test_exact_fill_is_the_optimum_untouched():
    g = _mib_chain(120, 3)
    b = 200 * 2**20
    plan = ChainDP(budget=b).plan(g)
    assert plan.meta["exact"] and plan.meta["status"] == "optimal"
    assert "dp_cost_unpolished" not in plan.meta
    assert _cost(g, plan) == pytest.approx(_optimum(g, b), rel=1e-9)


def test_smallest_budget_is_exact_when_nothing_fits():
    """Budgets at and below the persistent class's smallest: one byte below raises with that
    minimum (the (min, max) recursion runs only then); at it, a plan that fits."""
    rng = np.random.default_rng(7)
    g = remat.chain_graph(80, sizes=rng.integers(1, 100, 80), fwd_costs=rng.uniform(1, 3, 80))
    lo = min_feasible_budget(chain_problem(g)[0], drop_anchors=False)
    with pytest.raises(InfeasibleBudgetError) as ei:
        ChainDP(budget=lo - 1).plan(g)
    assert ei.value.min_feasible_bytes == lo
    plan = ChainDP(budget=lo).plan(g)
    assert replay(g, plan, strict=True).peak_bytes <= lo
    assert plan.meta.get("min_budget", lo) == lo


def test_unrounded_fill_when_affordable():
    """100 layers of 1..99-byte values at 30 %: ~1650 levels of one byte; the default fills them
    all (no rounding) and equals the persistent optimum, unpolished."""
    rng = np.random.default_rng(100)
    g = remat.chain_graph(100, sizes=rng.integers(1, 100, 100), fwd_costs=rng.uniform(1, 3, 100))
    b = int(0.3 * g.no_remat_peak())
    plan = ChainDP(budget=b).plan(g)
    assert plan.meta["exact"] and plan.meta["status"] == "optimal"
    assert "dp_cost_unpolished" not in plan.meta
    assert replay(g, plan, strict=True).peak_bytes <= b
    assert _cost(g, plan) == pytest.approx(_optimum(g, b), rel=1e-9)


@pytest.mark.parametrize("frontend,layers", [("linen", 90), ("plain", 100)])
def test_default_portfolio_on_extracted_models(frontend, layers):
    """Graphs extracted from Flax linen (random widths) and plain-JAX MLPs, one stage per layer
    (past the exact mode's 32): the default ChainDP plans through the compiled level portfolio
    with rounded sizes; each plan validates and its replay fits the budget."""
    from helpers.mlp_models import mlp_setup, tanh_mlp_loss

    from experiments.milp_unseen import random_width_mlp

    if frontend == "linen":  # (Module.init runs eagerly: tens of seconds at 90 layers)
        loss, params, batch = random_width_mlp(5, layers=layers, batch=16, numpy_params=True)
    else:
        loss = tanh_mlp_loss
        params, batch = mlp_setup(layers, 16, 16, seed=2)
    g = remat.extract(loss, params, batch, stages=1000)
    b = remat.resolve_budget("45%", g)
    plan = ChainDP(budget=b).plan(g)
    plan.validate(g)
    assert plan.meta["dp_levels_tried"] and not plan.meta["exact"]
    assert replay(g, plan, strict=True).peak_bytes <= b


def test_unrounded_plan_through_the_drop_in():
    """A 48-layer plain-JAX MLP, one stage per layer: the default fills one level per gcd
    (~6000 levels, compiled path); remat.value_and_grad gives jax.value_and_grad's value and
    gradients (rtol 1e-5), saved residual bytes within the plan's or warned."""
    from helpers.dropin import assert_residuals_within_plan_or_warned, run_against_jax
    from helpers.mlp_models import mlp_setup, tanh_mlp_loss

    params, batch = mlp_setup(48, 16, 16, seed=2)
    vg = remat.value_and_grad(tanh_mlp_loss, ChainDP(budget="45%"), stages=1000)
    ap, fid = run_against_jax(vg, tanh_mlp_loss, params, batch)
    g, plan = ap.graph, ap.plan
    assert plan.meta["policy"] == "chain_dp" and plan.meta["dp_levels_tried"]
    assert plan.meta["exact"] and plan.meta["status"] == "optimal"
    assert replay(g, plan).peak_bytes <= remat.resolve_budget("45%", g)
    assert_residuals_within_plan_or_warned(ap, fid)


def test_default_portfolio_plan_measured_by_the_executor():
    """The default plan of an 80-layer plain-JAX MLP at 45 % (rounded sizes, polished), run op
    by op by remat.execute: jax.value_and_grad's value and gradients, a measured peak within
    5 % of the replayed one, which fits the budget."""
    from helpers.checks import run_and_check
    from helpers.mlp_models import mlp_setup, tanh_mlp_loss

    params, batch = mlp_setup(80, 16, 16, seed=2)
    g = remat.extract(tanh_mlp_loss, params, batch, stages=1000)
    b = remat.resolve_budget("45%", g)
    plan = ChainDP(budget=b).plan(g)
    assert plan.meta["dp_levels_tried"] and not plan.meta["exact"]
    stats, sim = run_and_check(tanh_mlp_loss, params, batch, g, plan)
    assert sim.peak_bytes <= b and stats.peak_bytes <= 1.05 * b


def test_random_chains_plan_or_name_the_exact_minimum():
    """Chains of 33-120 layers (the compiled path) with sizes from several ranges, zeros
    included, zero costs included, at budgets from just under the persistent class's minimum
    to the no-remat peak: a plan that validates and fits, or InfeasibleBudgetError naming that
    minimum exactly, and only below it."""
    rng = np.random.default_rng(2026)
    for case in range(9):
        L = int(rng.integers(33, 121))
        hi = int(rng.choice([3, 100, 5000]))
        sizes = rng.integers(0, hi, L)
        sizes[rng.random(L) < 0.1] = 0
        costs = rng.uniform(0, 3, L) * (rng.random(L) > 0.1)
        g = remat.chain_graph(L, sizes=sizes, fwd_costs=costs)
        lo = min_feasible_budget(chain_problem(g)[0], drop_anchors=False)
        for b in sorted({max(lo - 1, 0), lo, int(rng.integers(lo, g.no_remat_peak() + 1)),
                         g.no_remat_peak()}):
            try:
                plan = ChainDP(budget=b).plan(g)
            except InfeasibleBudgetError as e:
                assert b < lo and e.min_feasible_bytes == lo, (case, b, lo)
                continue
            plan.validate(g)
            assert b >= lo and replay(g, plan, strict=True).peak_bytes <= b, (case, b)
            if b < g.no_remat_peak():  # (at the peak: no recomputation, no DP)
                assert plan.meta["dp_mode"] == "fast"


def test_typed_errors_for_bad_counts_and_budgets():
    from solvers.chain_dp.compiled import cost_dp
    from solvers.pebbling_search import prune_best

    g = _mib_chain(40, 0)
    prob = chain_problem(g)[0]
    for bad in (0, -3, 2.5, "x", True):
        with pytest.raises(InvalidOptionError):
            ChainDP(budget="50%", max_levels=bad).plan(g)
        with pytest.raises(InvalidOptionError):
            level_portfolio(prob, 10 * 2**20, bad)
    with pytest.raises(InvalidOptionError):
        ChainDP(budget="50%", max_first=0).plan(g)
    for bad in (-1, 1.5):
        with pytest.raises(BudgetFormatError):
            level_portfolio(prob, bad)
    with pytest.raises(InvalidOptionError):
        cost_dp(prob, 10 * 2**20, max_levels=0, table_bytes=2**30, rounding="nearest",
                slack_levels=0)
    with pytest.raises(BudgetFormatError):
        cost_dp(prob, -1, max_levels=16, table_bytes=2**30, rounding="nearest", slack_levels=0)
    with pytest.raises(InvalidGraphError):
        prune_best([0, 1], [(), (0,)], [1, 1], [1.0], 5)  # costs too short


def _scanned_stack(pre: int = 40, layers: int = 24, d: int = 32, batch: int = 32, seed: int = 0):
    """Plain JAX: ``pre`` tanh layers unrolled, then ``layers`` more in a ``lax.scan``."""
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    p = {"pre": jax.random.normal(ks[0], (pre, d, d)) / np.sqrt(d),
         "stack": jax.random.normal(ks[1], (layers, d, d)) / np.sqrt(d)}
    x = jax.random.normal(ks[2], (batch, d))

    def loss(p, x):
        h = x
        for i in range(pre):
            h = jnp.tanh(h @ p["pre"][i])
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, p["stack"])
        return jnp.mean(h ** 2)

    return loss, p, x


@pytest.mark.parametrize("model,budget", [("nnx", "50%"), ("linen-sumsq", "50%"),
                                          ("scanned", "80%")])
def test_rounded_polished_plans_through_the_drop_in(model, budget):
    """Rounded (16 levels), polished compiled-path plans through remat.value_and_grad on code
    we did not write: a 36-layer Flax nnx MLP, a 36-layer Flax linen MLP whose loss
    ``sum(y ** 2)`` no backward node reads, and a plain-JAX net whose last 24 layers are a
    ``lax.scan`` stack (one stage).  jax.value_and_grad's value and gradients (rtol 1e-5), the
    replayed peak within the budget, saved residual bytes within the plan's or warned."""
    from helpers.dropin import assert_residuals_within_plan_or_warned, run_against_jax
    from helpers.user_models import linen_sumsq_mlp, nnx_mlp

    loss, params, x = {"nnx": lambda: nnx_mlp(L=36),
                       "linen-sumsq": lambda: linen_sumsq_mlp(L=36, B=64),
                       "scanned": _scanned_stack}[model]()
    vg = remat.value_and_grad(loss, ChainDP(budget=budget, max_levels=16), stages=1000)
    ap, fid = run_against_jax(vg, loss, params, x)
    g, plan = ap.graph, ap.plan
    assert [t["levels"] for t in plan.meta["dp_levels_tried"]] == [16]
    assert not plan.meta["exact"] and plan.meta["polish_order"] in ("density", "cost")
    assert replay(g, plan).peak_bytes <= remat.resolve_budget(budget, g)
    assert_residuals_within_plan_or_warned(ap, fid)


def test_collector_paused_during_the_compiled_solve_and_restored_after():
    """The compiled path runs with the cyclic collector off (its allocations triggered full
    collections: 0.79-0.91 s instead of a steady 0.80 s on 1000 layers) and leaves the
    caller's setting as it found it, on success and on a typed error."""
    import gc

    import solvers.chain_dp.compiled as compiled

    seen = []
    real = compiled.cost_dp

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    rng = np.random.default_rng(5)
    g = remat.chain_graph(600, sizes=rng.integers(1, 9, 600) * 2**20,
                          fwd_costs=rng.uniform(1, 3, 600))
    b = int(0.3 * g.no_remat_peak())
    compiled.cost_dp = spy
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            plan = ChainDP(budget=b).plan(g)
            assert gc.isenabled() is enabled
            assert replay(g, plan, strict=True).peak_bytes <= b
            with pytest.raises(InfeasibleBudgetError):
                ChainDP(budget=int(g.sizes.max())).plan(g)
            assert gc.isenabled() is enabled
    finally:
        compiled.cost_dp = real
        (gc.enable if was else gc.disable)()
    assert seen and not any(seen)
