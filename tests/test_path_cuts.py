"""Path cuts of the Checkmate MILP (:mod:`solvers.checkmate.path_cuts`).

Validity is checked against the exact separation itself: :func:`separate` finds the smallest
right-hand side over *every* path and every ``t0``, so at a legal integer schedule it must
find no violated row at all, whatever the schedule (random legal schedules, heuristics, MILP
optima).  A cut that drops a term or lets ``t0`` reach the value's own step fails these tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.checkmate_problems import chain_problem, random_problem
from helpers.limits import SAFETY_S

import remat
from solvers.checkmate import CheckmateProblem, min_feasible_budget, solve_checkmate
from solvers.checkmate.formulation import Formulation, add_checkmate_core
from solvers.checkmate.frontier import heuristic_schedules, min_r_given_s
from solvers.checkmate.path_cuts import PathCuts, path_cut_loop, separate
from solvers.checkmate.problem import schedule_cost, schedule_memory
from solvers.milp import MilpModel


def _legal_schedules(P: CheckmateProblem, rng, count: int):
    """Random legal frontier schedules: random checkpoint sets, cheapest ``R`` for each."""
    n = P.n
    for _ in range(count):
        p = rng.uniform(0.05, 0.9)
        S = np.tril(rng.random((n, n)) < p, -1)
        yield min_r_given_s(P, S)
    for _, R, S in heuristic_schedules(P):
        yield R, S


@pytest.mark.parametrize("seed", range(6))
def test_no_path_cut_cuts_off_a_legal_schedule(seed):
    """At a legal 0/1 schedule the exact separation (all demands, every ``t0``, the cheapest
    path) finds nothing violated."""
    rng = np.random.default_rng(seed)
    P = random_problem(int(rng.integers(8, 22)), seed, 1.0)
    count = 0
    for R, S in _legal_schedules(P, rng, 40):
        cuts = separate(P, R.astype(float), S.astype(float), eps=1e-9, per_demand=3,
                        frontier_only=False)
        assert cuts.num_rows == 0, (seed, cuts.num_rows)
        count += 1
    assert count >= 40


def test_no_path_cut_cuts_off_the_optimum_on_a_chain():
    """A chain where recomputation is needed: the exact optimum (no cuts) violates no row."""
    rng = np.random.default_rng(1)
    L = 14
    g = remat.chain_graph(L, sizes=rng.integers(1, 9, L), fwd_costs=rng.uniform(0.5, 2, L))
    P = CheckmateProblem.from_graph(g, math.ceil(0.35 * g.no_remat_peak()))
    sol = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, warm_start=None, mip_gap=1e-6)
    assert sol.status == "optimal" and sol.R.sum() > P.n  # something is recomputed
    cuts = separate(P, sol.R.astype(float), sol.S.astype(float), eps=1e-9, frontier_only=False)
    assert cuts.num_rows == 0


def _lp_point(P):
    model = MilpModel("lp")
    v = add_checkmate_core(model, P, budget=P.budget, formulation=Formulation(memory_chain=False))
    x = model.solve("highs", relax=True).x
    R = np.where(v.R >= 0, x[np.maximum(v.R, 0)], 0.0)
    S = np.where(v.S >= 0, x[np.maximum(v.S, 0)], 0.0)
    return model, v, x, R, S


def test_separated_rows_are_violated_by_the_lp_point_and_map_to_columns():
    """Rows found at the LP optimum are violated there by what :meth:`PathCuts.violation` says,
    the same number is what the model's columns give (``coo``), and ``subset`` / ``concat``
    keep rows and terms together."""
    P = chain_problem()
    model, v, x, R, S = _lp_point(P)
    cuts = separate(P, R, S, frontier_only=False)
    assert cuts.num_rows > 0
    viol = cuts.violation(R, S)
    assert np.all(viol > 1e-3)
    rows, cols, vals, lo = cuts.coo(v)
    act = np.bincount(rows, weights=vals * x[cols], minlength=cuts.num_rows)
    np.testing.assert_allclose(lo - act, viol, atol=1e-9)
    pick = np.arange(cuts.num_rows)[::3][::-1]
    sub = cuts.subset(pick)
    np.testing.assert_allclose(sub.violation(R, S), viol[pick], atol=1e-12)
    both = PathCuts.concat([sub, cuts])
    np.testing.assert_allclose(both.violation(R, S), np.r_[viol[pick], viol], atol=1e-12)


def test_cut_loop_raises_the_lp_bound_and_stays_below_the_optimum():
    """On a 24-layer chain at 30 % the LP's fractional recomputation chains are cut off: the
    bound rises strictly, and stays at or below the exact optimum."""
    P = chain_problem(L=24, seed=2)
    res = path_cut_loop(P, Formulation(), SAFETY_S, keep="all")
    first = res.rounds[0]["bound"]
    assert res.bound > first * (1 + 1e-6), (first, res.bound)
    assert res.stop in ("no_violated_row", "stalled", "max_rounds")
    opt = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, mip_gap=1e-6)
    assert opt.status == "optimal"
    assert res.bound <= opt.objective * (1 + 1e-9)
    assert res.cuts.num_rows > 0 and len(res.rounds) >= 2


def _lp_bound_with(P, cuts):
    model = MilpModel("lp")
    v = add_checkmate_core(model, P, budget=P.budget, formulation=Formulation(memory_chain=False))
    cuts.add_to(model, v)
    return model.solve("highs", relax=True).objective * v.cost_unit


@pytest.mark.parametrize("stop_at", [None, 6])
def test_kept_rows_alone_give_the_loop_its_bound(monkeypatch, stop_at):
    """``keep="dual"`` keeps the rows with a nonzero dual at the last LP solved to optimality:
    the small LP with those rows alone has the loop's bound.  ``stop_at``: the LP of that round
    ends unsolved (HiGHS hits an iteration limit, as a time limit would), which once left the
    loop reading duals of an unfinished solve and keeping no row at all."""
    P = chain_problem()
    if stop_at is not None:
        real = MilpModel.to_highs

        def to_highs(self, **kw):
            h, is_mip = real(self, **kw)
            runs = {"n": 0}
            run = h.run

            def limited_run():
                runs["n"] += 1
                if runs["n"] == stop_at:
                    h.setOptionValue("simplex_iteration_limit", 0)
                    h.clearSolver()
                return run()

            h.run = limited_run
            return h, is_mip

        monkeypatch.setattr(MilpModel, "to_highs", to_highs)
    res = path_cut_loop(P, Formulation(), SAFETY_S)
    monkeypatch.undo()
    if stop_at is not None:
        assert len(res.rounds) == stop_at - 1
        assert res.stop == "lp_iteration_limit_reached"
    else:
        assert res.stop in ("no_violated_row", "stalled")
    assert res.bound > res.rounds[0]["bound"] * (1 + 1e-6)
    assert 0 < res.cuts.num_rows
    assert _lp_bound_with(P, res.cuts) == pytest.approx(res.bound, rel=1e-7)


def test_cut_loop_time_limit_is_on_its_own_clock(monkeypatch):
    """HiGHS's time limit is checked against its run clock, which adds up every ``run()`` of
    one object.  Here that clock stands at 3 s before the first round (the LP solved over and
    over, time the loop does not count) and the loop has 2 s on a clock the test holds still,
    so every round has the whole 2 s (an LP here takes milliseconds) whatever the machine's
    speed: it must solve its rounds to the end (the limit was once set to the bare time left,
    so every LP stopped at once, and a 100-layer MLP's loop stopped after 13 of 19 rounds at
    8 s of its 15)."""
    from solvers.checkmate import path_cuts as pc

    P = chain_problem()
    real = MilpModel.to_highs

    def to_highs(self, **kw):
        h, is_mip = real(self, **kw)
        while h.getRunTime() < 3.0:
            h.clearSolver()
            h.run()
        return h, is_mip

    class Clock:  # the loop's own clock, stopped: it never sees its 2 s run out
        @staticmethod
        def perf_counter():
            return 0.0

    monkeypatch.setattr(MilpModel, "to_highs", to_highs)
    monkeypatch.setattr(pc, "time", Clock)
    res = path_cut_loop(P, Formulation(), 2.0)
    monkeypatch.undo()
    assert res.stop in ("no_violated_row", "stalled", "max_rounds"), res.stop
    assert len(res.rounds) >= 2


@pytest.mark.parametrize("lazy", [True, False])
def test_milp_with_path_cuts_finds_the_same_optimum(lazy):
    """Random DAGs between their smallest feasible budget and the no-remat peak: with and
    without the cuts the proven optimum is the same, and the schedule fits on replay."""
    with_cuts = 0
    for seed in (0, 1, 3, 4):
        for n in (12, 16):
            P0 = random_problem(n, 100 * seed + n, 1.0)
            top, lo = P0.budget, min_feasible_budget(P0)[0]
            for frac in (0.1, 0.4):
                P = P0.with_budget(lo + int(frac * (top - lo)))
                a = solve_checkmate(P, time_limit=SAFETY_S, mip_gap=1e-6, lazy_memory=lazy)
                b = solve_checkmate(P, time_limit=SAFETY_S, mip_gap=1e-6, lazy_memory=lazy,
                                    path_cuts=False)
                assert a.status == b.status == "optimal"
                assert a.objective == pytest.approx(b.objective, rel=1e-6)
                peak, _ = schedule_memory(P, a.R, a.S)
                assert peak <= P.budget
                assert a.objective == pytest.approx(schedule_cost(P, a.R))
                assert "path_cuts" not in b.meta
                with_cuts += a.meta.get("path_cuts", {}).get("rounds", 0) > 0
    assert with_cuts >= 8  # most instances went through the cut loop (not checkpoint-all)


@pytest.mark.parametrize("model", ["nnx", "linen-random-width"])
def test_path_cuts_on_models_we_did_not_write(model):
    """A 10-layer Flax nnx MLP and a 14-layer random-width Flax linen MLP, one stage per layer,
    at budgets where schedules recompute (:func:`test_checkmate.mlp_we_did_not_write`):
    Checkmate with and without path cuts proves the same optimum, and the plan made with them
    gives jax's value and gradients through ``remat.value_and_grad`` (rtol 1e-5) with its saved
    residual bytes within the plan's, or a warning."""
    from helpers.dropin import assert_residuals_within_plan_or_warned
    from helpers.models_we_did_not_write import (
        dropin_we_did_not_write,
        mlp_we_did_not_write,
        plan_we_did_not_write,
    )

    from remat.core.schedule import replay

    _, _, g, b = mlp_we_did_not_write(model)
    on, off = plan_we_did_not_write(model), plan_we_did_not_write(model, path_cuts=False)
    assert on.meta["status"] == off.meta["status"] == "optimal"
    assert on.meta["objective"] == pytest.approx(off.meta["objective"], rel=2e-4)
    assert on.meta["path_cuts"]["rounds"] >= 1 and "path_cuts" not in off.meta
    assert replay(g, on).peak_bytes <= b
    ap, fid = dropin_we_did_not_write(model)
    assert "path_cuts" in ap.plan.meta
    assert_residuals_within_plan_or_warned(ap, fid)


def test_bad_input_is_a_typed_error():
    from remat.core.errors import SolverError

    P = chain_problem(L=6)
    z = np.zeros((P.n, P.n))
    with pytest.raises(SolverError, match="shape"):
        separate(P, z[:-1], z)
    with pytest.raises(SolverError, match="per_demand"):
        separate(P, z, z, per_demand=0)
    with pytest.raises(SolverError, match="keep"):
        path_cut_loop(P, Formulation(), 5.0, keep="some")
    with pytest.raises(SolverError, match="time_limit"):
        path_cut_loop(P, Formulation(), -1.0)
