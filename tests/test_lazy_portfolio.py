"""The lazy HiGHS loop run as a portfolio of random seeds (:mod:`solvers.checkmate.lazy_portfolio`).

Checked against the single search (its optimum is the reference, not the portfolio's own
bookkeeping), on random DAGs, a random-width chain and a Flax nnx MLP; schedules are replayed
against the budget."""

from __future__ import annotations

import pytest
from test_checkmate import _random_problem
from test_path_cuts import _chain_problem

import remat
from remat.errors import InfeasibleBudgetError, SolverError
from solvers.checkmate import min_feasible_budget, solve_checkmate
from solvers.checkmate.formulation import Formulation
from solvers.checkmate.frontier import best_heuristic
from solvers.checkmate.lazy_portfolio import solve_lazy_portfolio
from solvers.checkmate.milp import SolveClock, _LpBound, _portfolio_size
from solvers.checkmate.problem import schedule_cost, schedule_memory


def _portfolio(P, seeds=(0, 1), time_limit=30.0, delay_s=0.0, mip_gap=1e-4):
    h = best_heuristic(P, P.budget)
    warm = (h[1], h[2]) if h is not None and h[3] <= P.budget else None
    return solve_lazy_portfolio(P, warm, Formulation(), SolveClock(time_limit), mip_gap, seeds,
                                True, None, False, _LpBound(), {}, delay_s=delay_s)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_portfolio_proves_the_single_search_optimum(seed):
    """Random DAGs (12-16 nodes) between their smallest feasible budget and the no-remat peak,
    and a 24-layer random-size chain at 30 %: every member started at once, the portfolio
    proves the optimum the single search proves, its schedule fits on replay and costs what
    it says, and each member is listed."""
    problems = [_chain_problem(L=24, seed=seed)]
    for n in (12, 16):
        P0 = _random_problem(n, 7 * seed + n, 1.0)
        lo = min_feasible_budget(P0)[0]
        problems.append(P0.with_budget(lo + int(0.3 * (P0.budget - lo))))
    for P in problems:
        ref = solve_checkmate(P, time_limit=30, mip_gap=1e-6, portfolio=1)
        sol = _portfolio(P, seeds=(0, 1, 2), mip_gap=1e-6)
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
    """``portfolio=None``: two searches with two cores or more and no ``threads`` given; one
    otherwise."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert _portfolio_size(None, None) == 2
    assert _portfolio_size(None, 2) == 1
    assert _portfolio_size(3, 2) == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert _portfolio_size(None, None) == 1


def test_other_seeds_start_only_after_the_delay():
    """A 12-layer chain at 50 % is solved well within a 60 s delay: the first member finishes
    alone and is the only one listed; with no delay every member runs and is listed."""
    P = _chain_problem(L=12, frac=0.5)
    late = _portfolio(P, seeds=(0, 1), delay_s=60.0)
    now = _portfolio(P, seeds=(0, 1), delay_s=0.0)
    assert late.status == now.status == "optimal"
    assert late.objective == pytest.approx(now.objective, rel=1e-6)
    assert [m["seed"] for m in late.meta["portfolio"]["members"]] == [0]
    assert [m["seed"] for m in now.meta["portfolio"]["members"]] == [0, 1]


def test_time_limit_returns_the_best_schedule_and_bound():
    """A 0.3 s limit on a 36-layer chain at 25 %: a schedule that fits comes back, its bound
    below the proven optimum, its status ``optimal`` only when the gap closed."""
    P = _chain_problem(L=36, seed=3, frac=0.25)
    sol = _portfolio(P, time_limit=0.3)
    assert schedule_memory(P, sol.R, sol.S)[0] <= P.budget
    ref = solve_checkmate(P, time_limit=60, portfolio=1)
    assert ref.status == "optimal"
    assert sol.lower_bound <= ref.objective * (1 + 1e-9)
    assert sol.objective >= ref.lower_bound * (1 - 1e-9)
    assert (sol.status == "optimal") == (sol.gap <= 1e-4)


def test_infeasible_budget_and_bad_input_are_typed_errors():
    P = _chain_problem(L=10)
    lo = min_feasible_budget(P)[0]
    with pytest.raises(InfeasibleBudgetError) as e:
        solve_checkmate(P.with_budget(lo - 1), time_limit=20, portfolio=2)
    assert e.value.min_feasible_bytes == lo
    for bad in (0, -1, True, 1.5):
        with pytest.raises(SolverError, match="portfolio"):
            solve_checkmate(P.with_budget(lo), time_limit=5, portfolio=bad)
    with pytest.raises(SolverError, match="distinct seeds"):
        _portfolio(P, seeds=(1, 1))
    with pytest.raises(SolverError, match="distinct seeds"):
        _portfolio(P, seeds=(0,))


def test_portfolio_plan_on_a_model_we_did_not_write():
    """A 16-layer Flax nnx MLP at 30 %, one stage per layer: Checkmate with a two-seed
    portfolio and with one search prove the same optimum; the portfolio's plan fits on replay
    and gives jax's value and gradients through ``remat.value_and_grad`` (rtol 1e-5), with its
    saved residual bytes within the plan's or a warning."""
    from dropin import assert_residuals_within_plan_or_warned, run_against_jax
    from test_checkmate import mlp_we_did_not_write

    import policies
    from remat.schedule import replay

    loss, args, g = mlp_we_did_not_write("nnx")
    b = remat.resolve_budget("30%", g)
    two, one = (policies.get("checkmate", budget=b, time_limit=40, portfolio=k).plan(g)
                for k in (2, 1))
    assert two.meta["status"] == one.meta["status"] == "optimal"
    assert two.meta["objective"] == pytest.approx(one.meta["objective"], rel=2e-4)
    assert replay(g, two).peak_bytes <= b
    vg = remat.value_and_grad(loss, policies.get("checkmate", budget="30%", time_limit=40,
                                                 portfolio=2), stages=1000)
    ap, fid = run_against_jax(vg, loss, *args)
    assert ap.plan.meta["status"] == "optimal"
    assert_residuals_within_plan_or_warned(ap, fid)
