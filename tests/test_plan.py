"""Plan legality checks and budgets."""

import numpy as np
import pytest

import policies
import remat
from remat.core.errors import BudgetFormatError, InfeasibleBudgetError, InvalidPlanError
from remat.core.plan import plan_from_order


def test_validate_catches_missing_input():
    g = remat.chain_graph(3)
    p = policies.checkpoint_all_plan(g)
    S = p.S.copy()
    S[4, 2] = False  # f2 dropped before b2 (step 4) reads it
    with pytest.raises(InvalidPlanError, match="f2"):
        remat.Plan(R=p.R, S=S).validate(g)


def test_validate_catches_carry_without_residency():
    g = remat.chain_graph(2)
    p = policies.checkpoint_all_plan(g)
    S = p.S.copy()
    S[1, 1] = True  # f1 is "held" entering step 1 but it runs only in step 1
    with pytest.raises(InvalidPlanError, match="carried|resident"):
        remat.Plan(R=p.R, S=S).validate(g)


def test_validate_catches_never_computed_node():
    g = remat.chain_graph(2)
    p = policies.checkpoint_all_plan(g)
    R = p.R.copy()
    R[-1, -1] = False
    with pytest.raises(InvalidPlanError, match="never computed"):
        remat.Plan(R=R, S=p.S).validate(g)


def test_recompute_plan_lowers_peak_and_costs_recomputation():
    # chain of 4 unit layers: drop f1 after the forward pass and recompute it for b1/b2.
    g = remat.chain_graph(4, sizes=1)
    n = g.n  # f0..f3 (0-3), loss (4), b3 (5), b2 (6), b1 (7), b0 (8)
    order = [[t] for t in range(n)]
    order[6] = [1, 6]  # recompute f1 before b2 (b2 reads f2, f1, b3)
    keep = np.ones((n, n), dtype=bool)
    keep[2:6, 1] = False  # f1 is dropped once f2 has run, until its recomputation in step 6
    last = g.last_reader
    for t in range(n):
        keep[t] &= last > t  # drop outputs nobody reads later
    p = plan_from_order(g, order, keep=keep, policy="test")
    p.validate(g)
    rep = remat.simulate(g, p)
    assert rep.recomputations == 1
    assert rep.overhead == pytest.approx((g.costs.sum() + g.costs[1]) / g.costs.sum())
    assert rep.peak_bytes < g.no_remat_peak()


def test_checkpoint_all_rejects_small_budget_with_min():
    g = remat.chain_graph(5, sizes=1)
    with pytest.raises(InfeasibleBudgetError) as ei:
        policies.get("checkpoint_all").plan(g, budget=3)
    assert ei.value.min_feasible_bytes == g.no_remat_peak()


@pytest.mark.parametrize(
    "spec,expected",
    [(1000, 1000), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("2KiB", 2048)],
)
def test_budget_parsing(spec, expected):
    assert remat.resolve_budget(spec) == expected


def test_relative_budget_uses_ceil_of_no_remat_peak():
    g = remat.chain_graph(5, sizes=3)  # peak 21
    assert remat.resolve_budget("50%", g) == 11  # ceil(10.5)
    assert remat.resolve_budget("0.5x", g) == 11


@pytest.mark.parametrize("bad", ["60 percent", "-5", "abc", True, [1]])
def test_budget_errors_are_typed(bad):
    with pytest.raises(BudgetFormatError):
        remat.resolve_budget(bad, remat.chain_graph(2))


def test_planstats_is_exported_from_the_facade():
    """``remat.PlanStats`` is the class a policy's ``plan.stats`` is, and it is in ``__all__``."""
    from remat.core.plan import PlanStats

    assert remat.PlanStats is PlanStats and "PlanStats" in remat.__all__
    g = remat.chain_graph(2)
    p = policies.get("checkpoint_all").plan(g, "100%")
    assert isinstance(p.stats, remat.PlanStats)
