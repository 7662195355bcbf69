"""Policies compose (policies/combinators.py): WarmStarted, Reordered, BestOf, Fallback, each over
more than one registered policy; Checkmate's options as combinators; the one
``min_feasible_budget`` contract; ``plan.stats``."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import numpy as np
import pytest
from helpers.event_oracle import oracle_peak
from helpers.limits import SAFETY_S

import policies
import remat
from policies import BasePolicy, BestOf, Fallback, PolicyContext, Reordered, WarmStarted
from policies.checkmate import WARM_STARTS, Checkmate, CheckmateMILP
from remat.core.errors import (
    InfeasibleBudgetError,
    InvalidOptionError,
    NotApplicableError,
    SolverTimeoutError,
)
from remat.core.graph import chain_graph
from remat.core.plan import PlanStats

ROOT = pathlib.Path(__file__).resolve().parents[1]


def chain12():
    """12 layers, sizes 1-8 B and costs 0.5-2 (seed 0): at 95 % greedy_remat, melon and sage
    recompute more than ChainDP's optimum."""
    rng = np.random.default_rng(0)
    return chain_graph(12, sizes=rng.integers(1, 9, 12), fwd_costs=rng.uniform(0.5, 2, 12))


def fan_graph(k: int = 6):
    """``k`` sources ``x_i`` (100 B) each read by ``y_i`` (1 B), all summed by ``z``, numbered
    x_1..x_k, y_1..y_k, z: the program order holds every ``x`` at once (peak ``100 k + 1``),
    x_1, y_1, x_2, y_2, ... holds one."""
    names = [f"x{i}" for i in range(k)] + [f"y{i}" for i in range(k)] + ["z"]
    edges = [(i, k + i) for i in range(k)] + [(k + i, 2 * k) for i in range(k)]
    return remat.make_graph(names, edges, out_bytes=[100] * k + [1] * k + [1],
                            time_s=[1.0] * (2 * k + 1))


def cost(plan) -> float:
    return float(plan.meta["compute_cost"]) * plan.microbatches


def same_plan(a, b) -> bool:
    return np.array_equal(a.R, b.R) and np.array_equal(a.S, b.S)


@dataclasses.dataclass(frozen=True)
class Counting(BasePolicy):
    """Test policy: ChainDP's plan, counting how often it is planned."""

    calls: list = dataclasses.field(default_factory=list, compare=False)
    budget: int | None = None

    def solve(self, graph, budget_bytes, ctx):
        self.calls.append(budget_bytes)
        return policies.ChainDP().plan(graph, budget_bytes)


@dataclasses.dataclass(frozen=True)
class NoIncumbent(BasePolicy):
    """Test policy: a solver that finds nothing in time (bound: every node once, + 1)."""

    budget: int | None = None

    def solve(self, graph, budget_bytes, ctx):
        raise SolverTimeoutError("no incumbent (test)", bound=float(graph.costs.sum()) + 1.0)


# ------------------------------------------------------------------------------- WarmStarted
@pytest.mark.parametrize("base", ["greedy_remat", "melon", "sage"])
def test_warm_started_is_never_worse_than_its_start(base):
    g = chain12()
    b = remat.resolve_budget("95%", g)
    alone = policies.get(base).plan(g, b)
    start = policies.ChainDP().plan(g, b)
    assert cost(start) < cost(alone)  # the start is better: the combinator must notice
    p = WarmStarted(base, start=("chain_dp",)).plan(g, b)
    assert cost(p) == pytest.approx(cost(start)) and same_plan(p, start)
    assert p.meta["best_of"] == "chain_dp" and p.meta["policy"] == f"warm_started({base})"
    assert p.meta["warm_starts"] == {"chain_dp": pytest.approx(cost(start))}
    assert remat.simulate(g, p).peak_bytes <= b
    # a worse start changes nothing: base's plan, as it is
    q = WarmStarted(base, start=("recompute_all",)).plan(g, b)
    assert same_plan(q, alone) and "best_of" not in q.meta


def test_warm_starts_reach_the_milp_and_are_planned_when_read():
    g = chain12()
    b = remat.resolve_budget("80%", g)
    milp = CheckmateMILP(time_limit=SAFETY_S, threads=1)
    p = WarmStarted(milp, start=("sqrtn", "greedy_remat")).plan(g, b)
    sq = policies.SqrtN().plan(g, b)
    assert p.meta["tried"]["sqrtn"] == pytest.approx(cost(sq))  # re-cut into frontier form
    assert "greedy_remat" in p.meta["tried"] and cost(p) <= cost(sq) + 1e-9
    assert "warm_starts" not in milp.plan(g, b).meta  # the MILP alone was handed nothing
    # compare=False: a base that never reads ctx.warm_starts never plans them
    counting = Counting()
    WarmStarted("greedy_remat", start=(counting,), compare=False).plan(g, b)
    assert counting.calls == []
    WarmStarted("greedy_remat", start=(counting,)).plan(g, b)
    assert counting.calls == [b]


def test_a_base_sees_the_starts_in_its_context():
    seen = []

    @dataclasses.dataclass(frozen=True)
    class Reader(BasePolicy):
        budget: int | None = None

        def solve(self, graph, budget_bytes, ctx):
            seen.extend((s.name, s.plan is not None) for s in ctx.warm_starts)
            return policies.RecomputeAll().plan(graph)

    g = chain12()
    p = WarmStarted(Reader(), start=("chain_dp", "griewank", "chain_dp")).plan(g, "60%")
    assert seen == [("chain_dp", True), ("griewank", True), ("chain_dp#2", True)]
    assert p.meta["best_of"] == "chain_dp"  # recompute-all is the dearest plan
    dag = fan_graph(3)
    seen.clear()
    WarmStarted(Reader(), start=("chain_dp",)).plan(dag)
    assert seen == [("chain_dp", False)]  # not a chain: the start is there, without a plan


# --------------------------------------------------------------------------------- Reordered
@pytest.mark.parametrize("base", ["greedy_remat", "sage",
                                  CheckmateMILP(time_limit=SAFETY_S, threads=1)])
def test_reordered_fits_without_recomputation_where_the_program_order_cannot(base):
    g = fan_graph(6)
    b = 300  # the program order peaks at 601 B
    inner = policies.get(base) if isinstance(base, str) else base
    alone = inner.plan(g, b)
    assert cost(alone) > g.costs.sum()  # recomputes in the program's order
    p = Reordered(base, time_limit=SAFETY_S, threads=1).plan(g, b)
    assert p.meta["order"] == "min_peak"
    assert p.meta["order_peak_bytes"] < p.meta["program_peak_bytes"] == g.no_remat_peak()
    assert cost(p) == pytest.approx(g.costs.sum())  # every node once
    assert remat.simulate(g, p).peak_bytes <= b  # a plan of the original graph


def test_reordered_plans_the_program_order_when_nothing_is_better():
    g = chain12()  # a chain has one topological order
    p = Reordered("greedy_remat", time_limit=SAFETY_S, threads=1).plan(g, "80%")
    assert p.meta["order"] == "program"
    assert same_plan(p, policies.GreedyRemat().plan(g, "80%"))
    with pytest.raises(InvalidOptionError, match="share"):
        Reordered("greedy_remat", share=1.5)
    # a combinator without a budget plans at its base's
    p = Reordered(policies.GreedyRemat(budget="80%"), time_limit=SAFETY_S, threads=1).plan(g)
    assert p.meta["budget"] == remat.resolve_budget("80%", g)


# ------------------------------------------------------------------------------------ BestOf
def test_best_of_returns_the_cheapest_and_breaks_ties_by_order():
    g = chain12()
    b = remat.resolve_budget("95%", g)
    alone = {n: policies.get(n).plan(g, b) for n in ("greedy_remat", "sqrtn", "chain_dp",
                                                       "pebbling")}
    p = BestOf(["greedy_remat", "sqrtn", "chain_dp"]).plan(g, b)
    assert p.meta["best_of"] == "chain_dp" and same_plan(p, alone["chain_dp"])
    assert p.meta["candidates"] == {n: pytest.approx(cost(alone[n]))
                                    for n in ("greedy_remat", "sqrtn", "chain_dp")}
    # pebbling and ChainDP cost the same here, with different plans: the first listed wins
    assert cost(alone["pebbling"]) == cost(alone["chain_dp"])
    assert not same_plan(alone["pebbling"], alone["chain_dp"])
    assert same_plan(BestOf(["pebbling", "chain_dp"]).plan(g, b), alone["pebbling"])
    assert same_plan(BestOf(["chain_dp", "pebbling"]).plan(g, b), alone["chain_dp"])


def test_best_of_errors():
    g = chain12()
    with pytest.raises(InfeasibleBudgetError) as e:  # 7 B: no policy fits
        BestOf(["sqrtn", "greedy_remat"]).plan(g, "10%")
    mins = []
    for n in ("sqrtn", "greedy_remat"):
        with pytest.raises(InfeasibleBudgetError) as ei:
            policies.get(n).plan(g, "10%")
        mins.append(ei.value.min_feasible_bytes)
    assert mins[0] != mins[1] and e.value.min_feasible_bytes == min(mins)
    dag = fan_graph(3)
    with pytest.raises(NotApplicableError):
        BestOf(["chain_dp", "griewank"]).plan(dag, "90%")
    p = BestOf(["chain_dp", "greedy_remat"]).plan(dag, "90%")  # a chain policy is skipped
    assert p.meta["best_of"] == "greedy_remat" and p.meta["candidates"]["chain_dp"] is None
    with pytest.raises(InvalidOptionError):
        BestOf([])
    with pytest.raises(remat.errors.UnknownNameError):
        BestOf(["nosuch"])


# ---------------------------------------------------------------------------------- Fallback
@pytest.mark.parametrize("then", ["pebbling", "greedy_remat"])
def test_fallback_returns_the_second_plan_as_a_time_limit_incumbent(then):
    g = chain12()
    b = remat.resolve_budget("80%", g)
    p = Fallback(NoIncumbent(), then=then).plan(g, b)
    alone = policies.get(then).plan(g, b)
    assert same_plan(p, alone) and p.meta["best_of"] == then
    assert p.meta["status"] == "time_limit"
    lb = float(g.costs.sum()) + 1.0
    assert p.meta["lower_bound"] == pytest.approx(min(lb, cost(alone)))
    assert p.meta["gap"] == pytest.approx(max(0.0, (cost(alone) - lb) / cost(alone)))
    with pytest.raises(SolverTimeoutError, match="test"):  # nothing fits: the primary's error
        Fallback(NoIncumbent(), then=then).plan(g, "10%")
    # an error not in ``on`` is not handed over
    with pytest.raises(InfeasibleBudgetError):
        Fallback("sqrtn", then=then).plan(g, "10%")
    q = Fallback("sqrtn", then=then, on=InfeasibleBudgetError).plan(g, "60%")
    assert same_plan(q, policies.get(then).plan(g, "60%")) and q.meta["status"] == "heuristic"


# ----------------------------------------------------------------- Checkmate, as combinators
def test_checkmate_options_are_combinators():
    assert isinstance(Checkmate(warm_start=False).composed(), CheckmateMILP)
    ws = Checkmate().composed()
    assert isinstance(ws, WarmStarted) and ws.start == WARM_STARTS and ws.compare
    assert isinstance(ws.base, CheckmateMILP) and not isinstance(ws.base, Checkmate)
    assert not Checkmate(relax="lp").composed().compare  # LP rounding's plan stays its own
    ro = Checkmate(order="min_peak", order_share=0.4, threads=1, time_limit=7.0).composed()
    assert isinstance(ro, Reordered) and (ro.share, ro.threads, ro.time_limit) == (0.4, 1, 7.0)
    assert isinstance(ro.base, Fallback) and isinstance(ro.base.then, policies.Pebbling)
    assert isinstance(ro.base.primary, WarmStarted)
    assert Checkmate().milp() == CheckmateMILP()
    assert set(policies.option_names("checkmate")) == {
        f.name for f in dataclasses.fields(CheckmateMILP)} | {"order", "order_share"}
    g = chain12()
    p = policies.get("checkmate", budget="80%", time_limit=SAFETY_S, threads=1).plan(g)
    assert set(p.meta["warm_starts"]) == {"chain_dp", "sqrtn"} <= set(p.meta["tried"])


def test_no_policy_looks_another_up_by_name():
    """Only the registry (base.py) and the combinators (names a user passes) call ``get``."""
    for path in sorted((ROOT / "policies").glob("*.py")):
        if path.name in ("base.py", "combinators.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                bare = isinstance(f, ast.Name) and f.id == "get"
                registry = (isinstance(f, ast.Attribute) and f.attr == "get"
                            and isinstance(f.value, ast.Name) and f.value.id in ("policies", "base"))
                assert not (bare or registry), f"{path.name}:{node.lineno} looks a policy up by name"
        assert "import policies\n" not in path.read_text(), path.name


# ------------------------------------------------------------------- min_feasible_budget
def test_the_wrapper_asks_min_feasible_budget():
    @dataclasses.dataclass(frozen=True)
    class Knows(BasePolicy):
        budget: int | None = None

        def solve(self, graph, budget_bytes, ctx):
            raise InfeasibleBudgetError(budget_bytes, None, "test reason")

        def min_feasible_budget(self, graph, ctx=None):
            return 42

    @dataclasses.dataclass(frozen=True)
    class DoesNotKnow(Knows):
        def min_feasible_budget(self, graph, ctx=None):
            return BasePolicy.min_feasible_budget(self, graph, ctx)

    g = chain12()
    with pytest.raises(InfeasibleBudgetError, match="42 bytes.*test reason") as e:
        Knows().plan(g, 5)
    assert e.value.min_feasible_bytes == 42 and e.value.budget == 5
    with pytest.raises(InfeasibleBudgetError, match="is unknown: test reason") as e:
        DoesNotKnow().plan(g, 5)
    assert e.value.min_feasible_bytes is None


@pytest.mark.parametrize("name", ["greedy_remat", "melon", "sage", "pebbling"])
def test_one_min_feasible_budget_signature(name):
    g = chain12()
    pol = policies.get(name, **({"search_time_s": None} if name == "melon" else {}))
    ctx = PolicyContext()
    mf = pol.min_feasible_budget(g, ctx)
    assert mf == pol.min_feasible_budget(g)  # ctx is optional
    assert pol.plan(g, mf).meta["peak_bytes"] <= mf
    with pytest.raises(InfeasibleBudgetError) as e:
        pol.plan(g, "10%", ctx=ctx)
    if name == "pebbling":  # its own search from the failed budget up, within search_rtol
        assert abs(e.value.min_feasible_bytes - mf) <= pol.search_rtol * g.no_remat_peak() + 1
    else:
        assert e.value.min_feasible_bytes == mf


# ------------------------------------------------------------------------------- plan.stats
@pytest.mark.parametrize("policy", ["sqrtn", "chain_dp", "pebbling",
                                    BestOf(["sqrtn", "greedy_remat"])])
def test_plan_stats_are_typed_and_read_the_meta(policy):
    g = chain12()
    pol = policies.get(policy) if isinstance(policy, str) else policy
    p = pol.plan(g, "80%")
    s = p.stats
    assert isinstance(s, PlanStats)
    assert s.as_meta() == {k: p.meta[k] for k in s.as_meta()}
    assert s.policy == pol.name and s.budget == remat.resolve_budget("80%", g)
    assert s.peak_bytes == oracle_peak(g, p) and s.status in policies.base.STATUSES
    assert PlanStats.from_meta({}) == PlanStats() and remat.Plan(R=p.R, S=p.S).stats.policy == "custom"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.status = "optimal"
