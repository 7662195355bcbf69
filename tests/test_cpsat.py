"""The CP-SAT back end (solvers/milp/backends/cpsat.py): same optima as HiGHS, valid bounds with fractional
costs, typed errors on data it cannot take."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers.limits import SAFETY_S

pytest.importorskip("ortools")

import remat  # noqa: E402
from policies.checkmate import Checkmate  # noqa: E402
from remat.core.errors import SolverError  # noqa: E402
from solvers.milp import MilpModel  # noqa: E402


def knapsack(values, weights, cap):
    """max values @ x s.t. weights @ x <= cap, as a minimisation of -values."""
    m = MilpModel("knap")
    x = m.add_vars("x", len(values), 0.0, 1.0, integer=True)
    m.add_rows_coo(np.zeros(len(values), np.int64), x, np.asarray(weights, float), 1,
                   hi=float(cap))
    m.add_objective(x, -np.asarray(values, float))
    return m


def test_fractional_costs_give_the_brute_force_optimum_and_a_valid_bound():
    rng = np.random.default_rng(0)
    for _ in range(5):
        k = 10
        vals = rng.uniform(0.1, 3.0, k)  # fractional: the objective is scaled to integers
        w = rng.integers(1, 20, k)
        cap = int(w.sum() // 2)
        best = min(-(vals @ np.array(b)) for b in itertools.product((0, 1), repeat=k)
                   if np.array(b) @ w <= cap)
        sol = knapsack(vals, w, cap).solve("cpsat", time_limit=SAFETY_S)
        assert sol.status == "optimal" and sol.backend == "cpsat"
        assert sol.objective == pytest.approx(best, rel=1e-7)
        assert sol.bound <= best + 1e-12  # corrected for rounding: never above the optimum
        assert sol.x @ w <= cap


def test_non_integral_rows_and_missing_incumbents_are_typed_errors():
    m = knapsack([1.0, 2.0], [0.5, 1.0], 1)  # 0.5 is not an integer coefficient
    with pytest.raises(SolverError, match="integer data"):
        m.solve("cpsat", time_limit=5)
    with pytest.raises(SolverError, match="unknown MILP backend"):
        knapsack([1.0], [1], 1).solve("gurobi", time_limit=5)
    inf = knapsack([1.0, 1.0], [3, 3], 2)
    inf.add_rows_coo(np.zeros(2, np.int64), np.arange(2), np.ones(2), 1, lo=1.0)  # infeasible
    assert inf.solve("cpsat", time_limit=SAFETY_S).status == "infeasible"


@pytest.mark.parametrize("solver", ["cpsat", "race"])
@pytest.mark.parametrize("graph", ["uniform_chain", "random_chain", "dag"])
def test_checkmate_on_cpsat_matches_highs_optimum(graph, solver):
    rng = np.random.default_rng(1)
    if graph == "uniform_chain":  # identical layers: the symmetric case CP-SAT is used for
        g = remat.chain_graph(7)
    elif graph == "random_chain":
        g = remat.chain_graph(7, sizes=rng.integers(1, 9, 7) * 1000,
                              fwd_costs=rng.uniform(1, 3, 7))
    else:
        from helpers.graphs import fan_and_skip_graph

        g = fan_and_skip_graph(4, 4)
    b = int(0.6 * g.no_remat_peak())
    ref = Checkmate(budget=b, time_limit=SAFETY_S).plan(g)
    got = Checkmate(budget=b, time_limit=SAFETY_S, solver=solver).plan(g)
    assert ref.meta["status"] == got.meta["status"] == "optimal"
    assert got.meta["backend"] == solver and got.meta["method"] == "milp"  # the MILP ran
    assert got.meta["objective"] == pytest.approx(ref.meta["objective"], rel=1e-6)
    assert got.meta["peak_bytes"] <= b  # replayed by the wrapper
    assert got.meta["lower_bound"] <= ref.meta["objective"] * (1 + 1e-9)


def test_highs_still_solves_after_races_either_solver_won():
    """A race cancels the loser; HiGHS's state must not leak into later solves (resetting its
    thread pool inside a race, after an earlier HiGHS solve had started it, once made every
    later HiGHS solve end 'Not Set')."""
    from remat.core.errors import InfeasibleBudgetError
    from solvers.checkmate import CheckmateProblem, solve_checkmate

    solved = 0
    for seed in range(1, 8):
        rng = np.random.default_rng(seed)
        g = remat.chain_graph(8, sizes=rng.integers(1, 9, 8) * 1000,
                              fwd_costs=rng.uniform(1, 3, 8))
        prob = CheckmateProblem.from_graph(g, int(0.55 * g.no_remat_peak()))
        try:
            before = solve_checkmate(prob, time_limit=SAFETY_S, warm_start=None, lp_first=False)
        except InfeasibleBudgetError:
            continue
        race = solve_checkmate(prob, time_limit=SAFETY_S, backend="race", warm_start=None,
                               lp_first=False)
        after = solve_checkmate(prob, time_limit=SAFETY_S, warm_start=None, lp_first=False)
        assert before.status == race.status == after.status == "optimal"
        assert race.objective == pytest.approx(before.objective, rel=1e-6)
        assert after.objective == pytest.approx(before.objective, rel=1e-6)
        solved += 1
    assert solved >= 3


def test_bad_solver_options_are_typed_errors_before_any_work():
    from remat.core.errors import RematError

    g = remat.chain_graph(4, sizes=100)
    with pytest.raises(SolverError, match="unknown MILP backend 'gurobi'"):
        Checkmate(budget="70%", solver="gurobi").plan(g)
    with pytest.raises(SolverError, match="unknown MILP backend"):
        __import__("policies").get("poet", solver="gurobi", device=None).plan(g, budget="70%")
    with pytest.raises(SolverError, match="integer programs only"):
        knapsack([1.0], [1], 1).solve("cpsat", time_limit=5, relax=True)
    with pytest.raises(SolverError, match="at least one worker"):
        knapsack([1.0], [1], 1).solve("cpsat", time_limit=5, threads=0)
    with pytest.raises(SolverError, match="cpsat_workers"):
        knapsack([1.0], [1], 1).solve("race", time_limit=5, options={"cpsat_workers": 0})
    assert issubclass(SolverError, RematError)


def test_a_race_without_ortools_is_refused_not_run_on_highs_alone(monkeypatch):
    from solvers.milp.backends import cpsat

    monkeypatch.setattr(cpsat, "available", lambda: False)
    with pytest.raises(SolverError, match="needs OR-Tools"):
        knapsack([1.0], [1], 1).solve("race", time_limit=5)
    with pytest.raises(SolverError, match="needs OR-Tools"):
        Checkmate(budget="70%", solver="race").plan(remat.chain_graph(4, sizes=100))
