"""The lazy HiGHS loop run as a portfolio of random seeds (:mod:`solvers.checkmate.lazy_portfolio`).

Checked against the single search (its optimum is the reference, not the portfolio's own
bookkeeping), on random DAGs, a random-width chain and a Flax nnx MLP; schedules are replayed
against the budget."""

from __future__ import annotations

import pytest
from helpers.checkmate_problems import chain_problem, random_problem
from helpers.limits import HIGHS_SPENT, SAFETY_S

from remat.core.errors import InfeasibleBudgetError, SolverError
from solvers.checkmate import min_feasible_budget, solve_checkmate
from solvers.checkmate.formulation import Formulation
from solvers.checkmate.frontier import best_heuristic
from solvers.checkmate.lazy_portfolio import portfolio_size, solve_lazy_portfolio
from solvers.checkmate.problem import schedule_cost, schedule_memory
from solvers.checkmate.solve_state import SolveClock, SolveState


def _portfolio(P, seeds=(0, 1), time_limit=SAFETY_S, delay_s=0.0, mip_gap=1e-6, options=None):
    h = best_heuristic(P, P.budget)
    warm = (h[1], h[2]) if h is not None and h[3] <= P.budget else None
    state = SolveState(P, SolveClock(time_limit), warm=warm, formulation=Formulation(),
                       mip_gap=mip_gap, options=options)
    return solve_lazy_portfolio(state, seeds, delay_s=delay_s)


def _between(P0, frac):
    """``P0`` at ``frac`` of the way from its smallest feasible budget to its no-remat peak."""
    lo = min_feasible_budget(P0, time_limit=SAFETY_S)[0]
    return P0.with_budget(lo + int(frac * (P0.budget - lo)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_portfolio_proves_the_single_search_optimum(seed):
    """Random DAGs (12-16 nodes) 30 % of the way from their smallest feasible budget to the
    no-remat peak, and a 24-layer random-size chain at 45 %: every member started at once, the
    portfolio proves the optimum the single search proves, its schedule fits on replay and
    costs what it says, and each member is listed."""
    problems = [chain_problem(L=24, seed=seed, frac=0.45)]
    for n in (12, 16):
        problems.append(_between(random_problem(n, 7 * seed + n, 1.0), 0.3))
    for P in problems:
        ref = solve_checkmate(P, time_limit=SAFETY_S, mip_gap=1e-6, portfolio=1)
        sol = _portfolio(P, seeds=(0, 1, 2))
        assert ref.status == sol.status == "optimal"
        assert sol.objective == pytest.approx(ref.objective, rel=1e-6)
        assert sol.objective == pytest.approx(schedule_cost(P, sol.R), rel=1e-12)
        assert schedule_memory(P, sol.R, sol.S)[0] <= P.budget
        assert sol.lower_bound <= ref.objective * (1 + 1e-9)
        members = sol.meta["portfolio"]["members"]
        assert [m["seed"] for m in members] == [0, 1, 2]
        assert any(m["status"] == "optimal" for m in members)
        assert sol.meta["portfolio"]["winner"] in (0, 1, 2)


def test_default_is_two_searches_unless_threads_are_set(monkeypatch):
    """``portfolio=None``: more than one search with two cores or more and no ``threads``
    given; one otherwise; an explicit count as given."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert portfolio_size(None, None) > 1
    assert portfolio_size(None, 2) == 1
    assert portfolio_size(3, 2) == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert portfolio_size(None, None) == 1


def test_other_seeds_start_only_after_the_delay():
    """A 12-layer chain at 50 % with a delay longer than any solve (the safety net's): the
    first member finishes alone and is the only one listed; with no delay every member runs
    and is listed."""
    P = chain_problem(L=12, frac=0.5)
    late = _portfolio(P, seeds=(0, 1), delay_s=SAFETY_S)
    now = _portfolio(P, seeds=(0, 1), delay_s=0.0)
    assert late.status == now.status == "optimal"
    assert late.objective == pytest.approx(now.objective, rel=1e-6)
    assert [m["seed"] for m in late.meta["portfolio"]["members"]] == [0]
    assert [m["seed"] for m in now.meta["portfolio"]["members"]] == [0, 1]


def test_time_limit_returns_the_best_schedule_and_bound():
    """Every member's HiGHS out of time at its first check
    (:data:`helpers.limits.HIGHS_SPENT`, the same at any speed) on a 24-layer chain at 45 %,
    whose heuristic start fits and is not optimal: that schedule comes back, fitting, with status
    ``time_limit``, a gap, and a bound below the proven optimum; every member is listed with its
    status."""
    P = chain_problem(L=24, seed=3, frac=0.45)
    h = best_heuristic(P, P.budget)
    sol = _portfolio(P, mip_gap=1e-4, options=HIGHS_SPENT)
    assert schedule_memory(P, sol.R, sol.S)[0] <= P.budget
    assert sol.objective == pytest.approx(schedule_cost(P, sol.R), rel=1e-12)
    assert sol.objective == pytest.approx(float(h[4]), rel=1e-9)  # the start, unimproved
    ref = solve_checkmate(P, time_limit=SAFETY_S, portfolio=1)
    assert ref.status == "optimal" and ref.objective < sol.objective * (1 - 1e-4)
    assert sol.status == "time_limit" and sol.gap > 1e-4
    assert sol.lower_bound <= ref.objective * (1 + 1e-9)
    assert sol.objective >= ref.lower_bound * (1 - 1e-9)
    assert [m["seed"] for m in sol.meta["portfolio"]["members"]] == [0, 1]
    assert {m["status"] for m in sol.meta["portfolio"]["members"]} == {"time_limit"}


def test_infeasible_budget_and_bad_input_are_typed_errors():
    P = chain_problem(L=10)
    lo = min_feasible_budget(P)[0]
    with pytest.raises(InfeasibleBudgetError) as e:
        solve_checkmate(P.with_budget(lo - 1), time_limit=SAFETY_S, portfolio=2)
    assert e.value.min_feasible_bytes == lo
    for bad in (0, -1, True, 1.5):
        with pytest.raises(SolverError, match="portfolio"):
            solve_checkmate(P.with_budget(lo), time_limit=SAFETY_S, portfolio=bad)
    with pytest.raises(SolverError, match="distinct seeds"):
        _portfolio(P, seeds=(1, 1))
    with pytest.raises(SolverError, match="distinct seeds"):
        _portfolio(P, seeds=(0,))


def test_portfolio_plan_on_a_model_we_did_not_write():
    """A 10-layer Flax nnx MLP, one stage per layer, at a budget where schedules recompute
    (:func:`test_checkmate.mlp_we_did_not_write`): Checkmate with a two-seed portfolio and with
    one search prove the same optimum; the portfolio's plan fits on replay and gives jax's value
    and gradients through ``remat.value_and_grad`` (rtol 1e-5), with its saved residual bytes
    within the plan's or a warning."""
    from helpers.dropin import assert_residuals_within_plan_or_warned
    from helpers.models_we_did_not_write import (
        dropin_we_did_not_write,
        mlp_we_did_not_write,
        plan_we_did_not_write,
    )

    from remat.core.schedule import replay

    _, _, g, b = mlp_we_did_not_write("nnx")
    two, one = plan_we_did_not_write("nnx"), plan_we_did_not_write("nnx", portfolio=1)
    assert two.meta["status"] == one.meta["status"] == "optimal"
    assert two.meta["objective"] == pytest.approx(one.meta["objective"], rel=2e-4)
    assert "portfolio" in two.meta and "portfolio" not in one.meta
    assert replay(g, two).peak_bytes <= b
    ap, fid = dropin_we_did_not_write("nnx")
    assert ap.plan.meta["status"] == "optimal" and "portfolio" in ap.plan.meta
    assert_residuals_within_plan_or_warned(ap, fid)
