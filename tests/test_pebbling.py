"""The pebbling heuristic (policies.pebbling) and the pebbling lower bound
(solvers.pebbling_bound), both checked against an exhaustive search of every schedule on tiny
DAGs, and the heuristic on Moccasin's random layered graphs at budgets greedy_remat misses."""

import math

import numpy as np
import pytest
from helpers.bench_graphs import FILES, needs_bench
from helpers.limits import SAFETY_S
from helpers.pebbling_oracle import exact_min_peak, random_dag

import policies
import remat
from policies.pebbling import Pebbling
from remat.core.errors import InfeasibleBudgetError
from solvers.pebbling_bound import prove_infeasible


def _check(g, plan, budget):
    plan.validate(g)
    rep = remat.simulate(g, plan)
    assert rep.peak_bytes <= budget
    assert plan.R.any(axis=0).all()
    return rep


@pytest.mark.parametrize("seed", range(12))
def test_bound_and_heuristic_agree_with_exhaustive_search(seed):
    g = random_dag(seed, 6)
    exact = exact_min_peak(g)
    peak = g.no_remat_peak()
    assert exact <= peak
    preds, sizes = g.preds, g.sizes
    for b in range(max(1, exact - 3), peak + 1):
        proof = prove_infeasible(preds, sizes, b)
        try:
            plan = Pebbling(witness_time_s=SAFETY_S).plan(g, budget=b)
        except InfeasibleBudgetError:
            plan = None
        if b >= exact:
            assert not proof.proven, f"bound claims infeasible at {b} >= exact {exact}"
            assert plan is not None, f"no plan at {b} >= exact {exact} (the witness search is complete)"
        if plan is not None:
            assert b >= exact
            _check(g, plan, b)
    # on graphs this small the bound is tight: exact - 1 is proven infeasible
    assert prove_infeasible(preds, sizes, exact - 1).proven


@pytest.mark.parametrize("score", ["auto", "dtr", "belady", "size"])
def test_at_no_remat_peak_recomputes_nothing(score):
    g = random_dag(3, 10)
    peak = g.no_remat_peak()
    plan = Pebbling(witness_time_s=SAFETY_S, score=score).plan(g, budget=peak)
    _check(g, plan, peak)
    assert int(plan.R.sum()) == g.n and plan.R.shape == (g.n, g.n)


def test_infeasible_error_names_a_working_budget():
    g = remat.chain_graph(6, sizes=[3, 1, 4, 1, 5, 9])
    with pytest.raises(InfeasibleBudgetError) as ei:
        Pebbling(witness_time_s=SAFETY_S, method="steps").plan(g, budget=5)
    mf = int(ei.value.min_feasible_bytes)
    assert mf > 5 and "not a proven bound" in str(ei.value)
    _check(g, Pebbling(witness_time_s=SAFETY_S).plan(g, budget=mf), mf)


def test_chain_tight_budget_fits_where_greedy_does_not_need_more():
    g = remat.chain_graph(12, sizes=4)
    peak = g.no_remat_peak()
    b = math.ceil(0.5 * peak)
    rep = _check(g, Pebbling(witness_time_s=SAFETY_S).plan(g, budget=b), b)
    assert rep.peak_bytes < peak and rep.recomputations > 0


def test_registered():
    assert isinstance(policies.get("pebbling"), Pebbling)


LAYERED_N100 = [f for f in FILES if f.name.startswith("random_layered_n100_")]


@needs_bench
@pytest.mark.parametrize("path", LAYERED_N100, ids=lambda p: p.name.split("_w")[0])
@pytest.mark.parametrize("m", [0.7, 0.6])
def test_random_layered_where_greedy_fails(path, m):
    g = remat.load_graph(path)
    b = math.ceil(m * g.no_remat_peak())
    with pytest.raises(InfeasibleBudgetError):
        policies.get("greedy_remat").plan(g, budget=b)
    _check(g, Pebbling(witness_time_s=SAFETY_S).plan(g, budget=b), b)


def test_bound_proves_below_single_step_need():
    g = random_dag(5, 8)
    need = max(int(g.sizes[v] + g.sizes[list(g.preds[v])].sum()) for v in range(g.n))
    r = prove_infeasible(g.preds, g.sizes, need - 1)
    assert r.proven and r.node is not None
    assert not prove_infeasible(g.preds, g.sizes, g.no_remat_peak()).proven


def test_bound_reports_unknown_instead_of_guessing():
    g = random_dag(7, 40)
    need = max(int(g.sizes[v] + g.sizes[list(g.preds[v])].sum()) for v in range(g.n))
    r = prove_infeasible(g.preds, g.sizes, need + 1, max_states=1)
    assert not r.proven
    assert all(0 <= v < g.n for v in r.unknown_nodes)




@pytest.mark.parametrize("seed", range(4))
def test_frontier_mode_is_checkmate_form(seed):
    """frontier=True plans are Checkmate frontier stages: T = n, step t ends with node t, no
    node twice in a step, only earlier nodes recomputed."""
    g = random_dag(seed, 12)
    peak = g.no_remat_peak()
    for frac in (1.0, 0.9, 0.8, 0.7):
        b = math.ceil(frac * peak)
        try:
            plan = Pebbling(witness_time_s=SAFETY_S, frontier=True).plan(g, budget=b)
        except InfeasibleBudgetError as e:
            assert e.min_feasible_bytes > b
            continue
        _check(g, plan, b)
        R = plan.R
        assert R.shape == (g.n, g.n)
        assert R.diagonal().all() and not np.triu(R, 1).any()


@needs_bench
@pytest.mark.parametrize("path", LAYERED_N100, ids=lambda p: p.name.split("_w")[0])
def test_checkmate_warm_started_by_dag_heuristics(path):
    """On a random layered DAG no chain policy applies; the MILP's warm start now comes from
    a general-DAG heuristic (greedy_remat, frontier-mode pebbling or peak_shave), and the
    returned plan fits."""
    g = remat.load_graph(path)
    b = math.ceil(0.8 * g.no_remat_peak())
    plan = policies.Checkmate(time_limit=10).plan(g, budget=b)
    _check(g, plan, b)
    assert any(h in str(plan.meta.get("warm_start"))
               for h in ("greedy_remat", "pebbling", "peak_shave"))


def test_bound_rejects_bad_input_with_typed_errors():
    from remat.core.errors import BudgetFormatError, InvalidGraphError

    with pytest.raises(InvalidGraphError):
        prove_infeasible([(), (0,)], [1], 5)  # lengths differ
    with pytest.raises(InvalidGraphError) as ei:
        prove_infeasible([(), (0,)], [1, -2], 5)
    assert ei.value.node == 1
    with pytest.raises(InvalidGraphError):
        prove_infeasible([(1,), ()], [1, 1], 5)  # not topological: node 0 reads node 1
    with pytest.raises(BudgetFormatError):
        prove_infeasible([(), (0,)], [1, 1], -1)
