"""Griewank / revolve (solvers/revolve.py, policies/griewank.py) against hand values, an
independent recurrence, and ChainDP on uniform chains."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

import remat
from policies.chain_dp import ChainDP, chain_problem
from policies.griewank import Griewank
from remat.core.errors import InfeasibleBudgetError, NotApplicableError
from solvers.revolve import beta, repetition_number, revolve_cost


@cache
def treeverse(l, c):  # noqa: E741  (Griewank's notation)
    """Reference: the nested-checkpointing recurrence, solved by brute force over the split."""
    if l == 1:
        return 0
    if c == 1:
        return l * (l - 1) // 2
    return min(j + treeverse(l - j, c - 1) + treeverse(j, c) for j in range(1, l))


def test_beta_hand_values():
    assert beta(2, 3) == 10 and beta(1, 4) == 5 and beta(3, 0) == 1 and beta(0, 7) == 1
    assert repetition_number(10, 2) == 3  # beta(2, 2) = 6 < 10 <= beta(2, 3) = 10
    assert revolve_cost(10, 2) == 3 * 10 - beta(3, 2) == 20
    assert revolve_cost(7, 1) == 21  # single slot: 6 + 5 + ... + 1


def test_formula_equals_recurrence():
    for c in range(1, 7):
        for l in range(1, 45):  # noqa: E741
            assert revolve_cost(l, c) == treeverse(l, c), (l, c)


def revolve_model_chain(L):
    """Uniform chain in revolve's own model: b_i reads only its input f_{i-1} (it re-tapes the
    step itself) and the incoming gradient; gradients are as large as activations, so the
    working memory of a backward step equals that of a forward sweep (revolve's slot model)."""
    names = [f"f{i}" for i in range(L)] + ["loss"] + [f"b{i}" for i in reversed(range(L))]
    bidx = {i: 2 * L - i for i in range(L)}
    edges = [(i, i + 1) for i in range(L)] + [(L, bidx[L - 1])]
    edges += [(bidx[i + 1], bidx[i]) for i in range(L - 1)] + [(i - 1, bidx[i]) for i in range(1, L)]
    return remat.make_graph(names, edges, out_bytes=[1] * (2 * L + 1),
                            time_s=[1.0] * L + [0.0] + [1.0] * L,
                            is_backward=[False] * (L + 1) + [True] * L)


@pytest.mark.parametrize("L", [5, 8, 13])
def test_griewank_count_equals_chain_dp_on_uniform_chains(L):
    g = revolve_model_chain(L)
    _, fwd, _, _ = chain_problem(g)
    K = len(fwd)
    for s in range(0, K):
        plan = Griewank(slots=s).plan(g)
        rep = remat.simulate(g, plan)
        evals = int(plan.compute_counts()[fwd].sum())
        # revolve advances t(K + 1, s + 1) times (steps 0..K, the loss step last); no tapes here
        assert evals == revolve_cost(K + 1, s + 1) == plan.meta["forward_evals"]
        dp = ChainDP(budget=rep.peak_bytes).plan(g)
        assert int(dp.compute_counts()[fwd].sum()) == evals, (L, s)


def test_griewank_on_layer_chain_counts_and_dp_bound():
    L = 9
    g = remat.chain_graph(L, sizes=1, fwd_costs=1.0)
    _, fwd, _, _ = chain_problem(g)
    for s in range(0, L):
        plan = Griewank(slots=s).plan(g)
        plan.validate(g)
        evals = int(plan.compute_counts()[fwd].sum())
        assert evals == plan.meta["forward_evals"]
        # b_i reads f_i too: one taping evaluation per layer 1..L-1 on top of the advances
        assert evals == revolve_cost(L + 1, s + 1) + (L - 1)
        rep = remat.simulate(g, plan)
        dp = remat.simulate(g, ChainDP(budget=rep.peak_bytes).plan(g))
        assert dp.compute_time_s <= rep.compute_time_s + 1e-9


def test_budget_picks_cheapest_fitting_slot_count():
    rng = np.random.default_rng(1)
    L = 10
    g = remat.chain_graph(L, sizes=rng.integers(1, 5, L), fwd_costs=rng.uniform(1, 2, L))
    B = int(0.55 * g.no_remat_peak())
    plan = Griewank(budget=B).plan(g)
    rep = remat.simulate(g, plan)
    assert rep.peak_bytes <= B and plan.meta["status"] == "heuristic"
    for s in range(L):
        other = remat.simulate(g, Griewank(slots=s).plan(g))
        if other.peak_bytes <= B:
            assert rep.compute_time_s <= other.compute_time_s + 1e-9
    with pytest.raises(InfeasibleBudgetError):
        Griewank(budget=2).plan(g)


def test_default_slots_log_n_and_non_chain_error():
    g = remat.chain_graph(16)
    assert Griewank().plan(g).meta["slots"] == 4
    g2 = remat.make_graph(["a", "b", "c", "ga"], [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3)],
                          out_bytes=[1] * 4, time_s=[1.0] * 4, is_backward=[False] * 3 + [True])
    with pytest.raises(NotApplicableError):
        Griewank(slots=1).plan(g2)
