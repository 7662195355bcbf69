"""GreedyRemat (DTR-style greedy eviction): legality, budget fit, no-remat limit, its own
minimum feasible budget, and never cheaper than the Checkmate MILP optimum."""

import math

import numpy as np
import pytest
from helpers.bench_graphs import FILES, needs_bench
from helpers.limits import SAFETY_S

import policies
import remat
from policies.greedy_remat import GreedyRemat
from remat.core.errors import InfeasibleBudgetError

LAYERED = [f for f in FILES if f.name.startswith("random_layered_n100_")
           or f.name.startswith("random_layered_n500_")]


def _hand_peak_no_remat(g) -> int:
    """Independent no-remat peak: per-node loop, output i live from i to its last reader."""
    best = 0
    for t in range(g.n):
        live = sum(g.nodes[i].out_bytes for i in range(t + 1)
                   if i == t or any(d >= t for d in g.succs[i]))
        best = max(best, live)
    return best


def _check(g, plan, budget):
    plan.validate(g)
    rep = remat.simulate(g, plan)
    assert rep.peak_bytes <= budget
    assert plan.meta["status"] == "heuristic" and plan.meta["budget"] == budget
    assert plan.R.any(axis=0).all()
    return rep


@pytest.mark.parametrize("frac", [1.0, 0.8, 0.6, 0.45])
def test_chain_fits_budget(frac):
    rng = np.random.default_rng(0)
    g = remat.chain_graph(8, sizes=rng.integers(1, 9, 8).tolist(), fwd_costs=rng.uniform(0.5, 2, 8))
    b = math.ceil(frac * _hand_peak_no_remat(g))
    try:
        plan = GreedyRemat().plan(g, budget=b)
    except InfeasibleBudgetError as e:
        assert e.min_feasible_bytes > b
        plan = GreedyRemat().plan(g, budget=int(e.min_feasible_bytes))
        _check(g, plan, int(e.min_feasible_bytes))
        return
    _check(g, plan, b)


def test_chain_reduces_memory():
    g = remat.chain_graph(10, sizes=4)
    peak = _hand_peak_no_remat(g)
    b = math.ceil(0.7 * peak)
    rep = _check(g, GreedyRemat().plan(g, budget=b), b)
    assert rep.peak_bytes < peak and rep.recomputations > 0


@pytest.mark.parametrize("score", ["auto", "dtr", "belady", "size"])
def test_at_no_remat_peak_recomputes_nothing(score):
    g = remat.chain_graph(6, sizes=[3, 1, 4, 1, 5, 9])
    peak = _hand_peak_no_remat(g)
    plan = GreedyRemat(score=score).plan(g, budget=peak + 5)
    _check(g, plan, peak + 5)
    assert int(plan.R.sum()) == g.n
    assert GreedyRemat(score=score).plan(g).R.sum() == g.n  # no budget: no-remat peak


def test_infeasible_carries_a_budget_that_works():
    g = remat.chain_graph(5, sizes=[3, 1, 4, 1, 5])
    with pytest.raises(InfeasibleBudgetError) as ei:
        GreedyRemat().plan(g, budget=2)
    mf = int(ei.value.min_feasible_bytes)
    assert mf > 2 and "heuristic" in str(ei.value)
    # a node plus its inputs must fit: independent lower bound for any schedule
    lower = max(g.nodes[v].out_bytes + sum(g.nodes[p].out_bytes for p in g.preds[v])
                for v in range(g.n))
    assert mf >= lower
    _check(g, GreedyRemat().plan(g, budget=mf), mf)


def test_never_below_checkmate_optimum():
    g = remat.chain_graph(4, sizes=[3, 1, 2, 2], fwd_costs=[1.0, 2.0, 1.0, 1.0])
    peak = _hand_peak_no_remat(g)
    checked = 0
    for b in range(peak, 0, -1):
        try:
            gp = GreedyRemat().plan(g, budget=b)
        except InfeasibleBudgetError:
            continue
        opt = policies.Checkmate(time_limit=SAFETY_S).plan(g, budget=b)
        assert opt.meta["status"] == "optimal"
        c_greedy = float(gp.compute_counts() @ g.costs)
        c_opt = float(opt.compute_counts() @ g.costs)
        assert c_greedy >= c_opt - 1e-9
        checked += 1
    assert checked >= 2


def test_registered():
    assert "greedy_remat" in policies.available()
    assert isinstance(policies.get("greedy_remat"), GreedyRemat)


@needs_bench
@pytest.mark.parametrize("path", LAYERED, ids=lambda p: p.name.split("_w")[0])
@pytest.mark.parametrize("m", [1.0, 0.9, 0.8])
def test_random_layered(path, m):
    g = remat.load_graph(path)
    peak = g.no_remat_peak()
    b = math.ceil(m * peak)
    pol = GreedyRemat()
    try:
        plan = pol.plan(g, budget=b)
    except InfeasibleBudgetError as e:
        mf = int(e.min_feasible_bytes)
        assert b < mf <= peak
        plan, b = pol.plan(g, budget=mf), mf
    rep = _check(g, plan, b)
    if m >= 1.0:
        assert rep.recomputations == 0 and int(plan.R.sum()) == g.n
