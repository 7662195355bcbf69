"""The complete pebbling search (solvers.pebbling_search) and the Pebbling policy's witness
method: decisions against an exhaustive search of every schedule on tiny DAGs, the witness's
memory against remat's replay, recomputation pruning, the published n = 250 instance no other
method fitted, typed errors, and witness plans through the drop-in on code we did not write."""

import numpy as np
import pytest
from helpers.bench_graphs import FILES, needs_bench
from helpers.generated_models import EXAMPLES, FRONTENDS, Spec, build
from helpers.limits import SAFETY_S
from helpers.pebbling_oracle import exact_min_peak, random_dag

import remat
from policies.pebbling import Pebbling
from remat.core.errors import (
    BudgetFormatError,
    InfeasibleBudgetError,
    InvalidGraphError,
    InvalidOptionError,
    RematError,
    UnknownNameError,
)
from remat.core.schedule import replay
from solvers.bounds import frontier_lower_bound
from solvers.pebbling_search import (
    copy_ends,
    decide,
    prune_best,
    prune_recomputation,
    sequence_live_bytes,
)


def _valid_witness(g, seq, budget):
    """Every node runs, inputs before readers, and the peak of the run order fits."""
    assert set(seq) == set(range(g.n))
    copy_ends(seq, g.preds)  # raises when a node runs before an input
    return int(sequence_live_bytes(seq, g.preds, g.sizes).max()) <= budget


@pytest.mark.parametrize("seed", range(10))
def test_decisions_equal_the_exhaustive_minimum(seed):
    """Feasible exactly from the smallest peak of any schedule up (witness fits), proven
    infeasible below it, on random 6- and 8-node DAGs (several sinks, skips)."""
    g = random_dag(seed, 6 if seed < 5 else 8)
    exact = exact_min_peak(g)
    for b in range(max(0, exact - 4), g.no_remat_peak() + 2):
        d = decide(g.preds, g.sizes, b, time_limit=SAFETY_S)
        if b >= exact:
            assert d.status == "feasible", (b, exact, d)
            assert _valid_witness(g, d.schedule, b)
            assert d.peak_bytes == int(sequence_live_bytes(d.schedule, g.preds, g.sizes).max())
        else:
            assert d.status == "infeasible" and d.proof in ("single step", "exhaustive search")


@pytest.mark.parametrize("seed", range(6))
def test_witness_plan_replays_as_its_run_order(seed):
    """The plan made from a witness replays (remat's event program) to the live bytes the
    search's own accounting gives its run order, event by event, and fits the budget."""
    g = random_dag(seed, 8)
    b = exact_min_peak(g)
    plan = Pebbling(witness_time_s=SAFETY_S, method="witness").plan(g, budget=b)
    plan.validate(g)
    rep = replay(g, plan)
    np.testing.assert_array_equal(rep.live_bytes,
                                  sequence_live_bytes(list(rep.node), g.preds, g.sizes))
    assert rep.peak_bytes <= b and plan.meta["method"] == "witness"
    assert plan.R.any(axis=0).all()


@pytest.mark.parametrize("order", ["cost", "density"])
def test_prune_removes_every_recomputation_when_memory_allows(order):
    g = remat.chain_graph(8, sizes=3)
    tight = decide(g.preds, g.sizes, int(0.45 * g.no_remat_peak()), time_limit=SAFETY_S)
    seq = list(tight.schedule)
    assert len(seq) > g.n  # the tight witness recomputes
    loose = prune_recomputation(seq, g.preds, g.sizes, g.costs, int(g.sizes.sum()), order=order)
    assert sorted(loose) == list(range(g.n))  # each node once
    same = prune_recomputation(seq, g.preds, g.sizes, g.costs, tight.peak_bytes, order=order)
    assert _valid_witness(g, same, tight.peak_bytes)
    assert g.costs[same].sum() <= g.costs[seq].sum()


def test_prune_best_keeps_the_cheaper_order():
    """Recompute-heavy ChainDP schedules (8 memory levels, unpolished) of 60-layer chains with
    sizes 1..8, pruned at their real budget: prune_best's run order costs the smaller of the two
    orders and names it, fits, and both orders win somewhere; with no recomputation it returns
    the order unchanged and says so."""
    from policies.chain_dp import ChainDP

    won = set()
    for seed, frac in [(0, 0.3), (1, 0.5), (5, 0.9)]:
        rng = np.random.default_rng(seed)
        g = remat.chain_graph(60, sizes=rng.integers(1, 9, 60), fwd_costs=rng.uniform(1, 3, 60))
        b = int(frac * g.no_remat_peak())
        seq = [int(v) for v in replay(g, ChainDP(budget=b, max_levels=8, polish=False).plan(g)).node]
        cost = {o: g.costs[prune_recomputation(seq, g.preds, g.sizes, g.costs, b, order=o)].sum()
                for o in ("cost", "density")}
        got, order = prune_best(seq, g.preds, g.sizes, g.costs, b)
        assert g.costs[got].sum() == pytest.approx(min(cost.values()))
        assert order is not None and g.costs[got].sum() == pytest.approx(cost[order])
        assert _valid_witness(g, got, b)
        won.add(min(cost, key=lambda o: (cost[o], o != "density")))
    assert won == {"cost", "density"}
    once = list(range(g.n))  # no recomputation: nothing to remove
    same, order = prune_best(once, g.preds, g.sizes, g.costs, 0)
    assert order is None and same == once


@pytest.mark.parametrize("seed,frac", [(3, 0.8), (4, 0.9)])  # one each way
def test_auto_keeps_the_cheaper_of_the_two_methods(seed, frac):
    g = random_dag(seed, 12)
    b = int(frac * g.no_remat_peak())
    plans = {m: Pebbling(witness_time_s=SAFETY_S, method=m).plan(g, budget=b)
             for m in ("steps", "witness", "auto")}
    cost = {m: float(p.R.sum(0) @ g.costs) for m, p in plans.items()}
    cheaper = min(("steps", "witness"), key=lambda m: (cost[m], m != "steps"))
    assert cost["auto"] == cost[cheaper] and plans["auto"].meta["method"] == cheaper
    assert plans["auto"].meta["witness"] == "feasible"


# skips, a concatenation, a scanned stack, a loss nobody reads; relu at both ends, so that a budget
# lies strictly between the largest single-step need and the no-remat peak on every JAX (with
# EXAMPLES[0]'s tanh ends, jax 0.12 differentiates tanh from its output and the two meet)
SCANNED_SKIPS = {**EXAMPLES[0], "acts": ("relu", "tanh", "gelu", "sigmoid", "relu")}

N250 = [f for f in FILES if f.name.startswith("random_layered_n250_")]


@needs_bench
@pytest.mark.slow
@pytest.mark.parametrize("path", N250, ids=lambda p: p.name[:20])
def test_published_n250_fits_the_budget_no_other_method_fitted(path):
    """m = 0.6 of the Checkmate benchmark's n = 250 DAG (88 104 B): the step-wise walk, peak
    shaving, LP rounding and the MILP found nothing under 90 970 B; the witness fits, replayed.
    One byte under the widest node's single-step need is proven infeasible."""
    g = remat.core.graph_io.load_graph(path)
    plan = Pebbling(witness_time_s=SAFETY_S).plan(g, budget=88_104)
    rep = remat.simulate(g, plan)
    assert rep.peak_bytes <= 88_104 and plan.R.any(axis=0).all()
    assert plan.meta["method"] == "witness"
    d = decide(g.preds, g.sizes, frontier_lower_bound(g.sizes, g.edge_array) - 1,
               time_limit=SAFETY_S)
    assert d.status == "infeasible" and d.proof == "single step"


def test_limits_say_unknown_and_prove_nothing():
    g = random_dag(1, 40)
    b = int(0.5 * g.no_remat_peak())
    d = decide(g.preds, g.sizes, b, max_states=1)
    assert d.status == "unknown" and d.schedule is None and d.node is not None


def test_infeasible_error_is_proven_and_names_the_exact_minimum():
    g = random_dag(4, 7)
    exact = exact_min_peak(g)
    with pytest.raises(InfeasibleBudgetError, match="proven") as ei:
        Pebbling(witness_time_s=SAFETY_S, method="witness").plan(g, budget=exact - 1)
    assert int(ei.value.min_feasible_bytes) == exact


def test_typed_errors():
    g = random_dag(0, 5)
    with pytest.raises(BudgetFormatError):
        decide(g.preds, g.sizes, -1)
    with pytest.raises(BudgetFormatError):
        decide(g.preds, g.sizes, 2.5)
    with pytest.raises(InvalidGraphError):
        decide([(), (0,)], [1], 5)  # lengths differ
    with pytest.raises(InvalidGraphError):
        decide([(1,), ()], [1, 1], 5)  # an input after its reader
    with pytest.raises(RematError):
        decide(g.preds, g.sizes, 100, max_states=0)
    with pytest.raises(InvalidGraphError):
        sequence_live_bytes([1, 0], [(), (0,)], [1, 1])  # node 1 before its input
    with pytest.raises(InvalidGraphError):
        sequence_live_bytes([0, 2], [(), (0,)], [1, 1])  # no node 2
    with pytest.raises(InvalidGraphError):
        prune_recomputation([0, 1], [(), (0,)], [1, 1], [1.0], 5)  # costs too short
    with pytest.raises(BudgetFormatError):
        prune_recomputation([0, 1], [(), (0,)], [1, 1], [1.0, 1.0], -1)
    with pytest.raises(UnknownNameError):
        prune_recomputation([0, 1], [(), (0,)], [1, 1], [1.0, 1.0], 5, order="size")
    with pytest.raises(InvalidOptionError):
        Pebbling(method="bogus").plan(g, budget="80%")
    with pytest.raises(InvalidOptionError):
        Pebbling(method="witness", frontier=True).plan(g, budget="80%")
    with pytest.raises(InvalidOptionError):
        Pebbling(witness_states=0).plan(g, budget="80%")


@pytest.mark.parametrize("frontend", ("plain-dag",) + FRONTENDS)
def test_witness_plans_through_the_drop_in(frontend):
    """Witness plans halfway between the largest single-step need and the no-remat peak,
    applied by remat.value_and_grad: the value
    and gradients of jax.value_and_grad (rtol 1e-5), saved residual bytes within the plan's or
    a warning naming them; plain JAX with skips and a concatenation, and generated linen, nnx,
    Equinox and plain models with a scanned stack under a loss no backward node reads."""
    from helpers.dropin import (
        assert_residuals_within_plan_or_warned,
        plain_dag_loss,
        run_against_jax,
    )

    if frontend == "plain-dag":
        loss, params, batch = plain_dag_loss()
        kw = dict(stages="eqn")
    else:
        loss, params, batch = build(Spec(frontend=frontend, **SCANNED_SKIPS))
        kw = {}
    g = remat.extract(loss, params, batch, **kw)
    need = frontier_lower_bound(g.sizes, g.edge_array)
    budget = (need + g.no_remat_peak()) // 2  # between the smallest possible and no remat
    vg = remat.value_and_grad(
        loss, Pebbling(witness_time_s=SAFETY_S, method="witness", budget=budget), **kw)
    ap, fid = run_against_jax(vg, loss, params, batch)
    assert ap.plan.meta["method"] == "witness" and ap.graph.n == g.n
    assert ap.plan.meta["peak_bytes"] <= budget < g.no_remat_peak()
    assert_residuals_within_plan_or_warned(ap, fid)


def test_repeated_inputs_zero_sizes_isolated_nodes_and_the_empty_graph():
    """An input listed twice counts once (a bit-set sum once made it another node), zero-size
    values and a node nobody reads are scheduled, and the empty graph fits any budget."""
    dup = [(), (0, 0), (1, 0, 1), (), (2, 2)]
    once = [(), (0,), (0, 1), (), (2,)]
    sizes = [3, 0, 4, 5, 2]
    for b in range(4, 16):
        a, c = (decide(dup, sizes, b, time_limit=SAFETY_S),
                decide(once, sizes, b, time_limit=SAFETY_S))
        assert a.status == c.status and a.schedule == c.schedule, b
        if a.status == "feasible":
            assert sorted(set(a.schedule)) == list(range(5))
            assert int(sequence_live_bytes(a.schedule, dup, sizes).max()) <= b
            pruned = prune_recomputation(a.schedule, dup, sizes, np.ones(5), b)
            assert int(sequence_live_bytes(pruned, dup, sizes).max()) <= b
    assert decide(once, sizes, 6).status == "infeasible"  # node 2 needs 3 + 0 + 4 = 7 B
    assert decide([], [], 0).status == "feasible"


@pytest.mark.parametrize("seed", range(3))
def test_step_wise_plans_are_pruned_and_still_fit(seed):
    """method="steps": the walk's plan with recomputations pruned is cheaper than the walk's
    own schedule (pebbling_steps) on random 30-node DAGs at 60 %, and its replay fits."""
    from policies.pebbling import pebbling_steps

    g = random_dag(seed, 30)
    b = int(0.6 * g.no_remat_peak())
    raw = pebbling_steps(g, b, "dtr")
    plan = Pebbling(witness_time_s=SAFETY_S, method="steps", score="dtr").plan(g, budget=b)
    assert remat.simulate(g, plan).peak_bytes <= b and plan.R.any(axis=0).all()
    assert float(plan.R.sum(axis=0) @ g.costs) < sum(g.costs[e].sum() for e in raw[0])


@pytest.mark.parametrize("frontend", ("plain-dag", "linen", "nnx"))
def test_witness_plans_measured_by_the_executor(frontend):
    """A witness plan run op by op by remat.execute: jax.value_and_grad's value and gradients,
    and the measured peak of live device bytes within 5 % of the replayed peak, which fits the
    budget and is below the no-remat peak."""
    from helpers.checks import run_and_check
    from helpers.dropin import plain_dag_loss

    if frontend == "plain-dag":
        loss, params, batch = plain_dag_loss()
    else:
        loss, params, batch = build(Spec(frontend=frontend, **SCANNED_SKIPS))
    g = remat.extract(loss, params, batch)
    budget = (frontier_lower_bound(g.sizes, g.edge_array) + g.no_remat_peak()) // 2
    plan = Pebbling(witness_time_s=SAFETY_S, method="witness", budget=budget).plan(g)
    stats, sim = run_and_check(loss, params, batch, g, plan)
    assert sim.peak_bytes <= budget < g.no_remat_peak()
    assert stats.peak_bytes <= 1.05 * budget
