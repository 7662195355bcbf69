"""The policy contract (policies.base): one wrapper for budgets, validation, stats and context."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from helpers.event_oracle import hand_compute_cost, oracle_peak
from helpers.limits import SAFETY_S

import policies
import remat
from policies import BasePolicy, PolicyContext, checkpoint_all_plan
from remat.core.errors import (
    InfeasibleBudgetError,
    InvalidOptionError,
    NotApplicableError,
    SolverError,
    UnknownNameError,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_example():
    spec = importlib.util.spec_from_file_location("every_kth_example", ROOT / "examples" / "every_kth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dag():
    # diamond forward graph with a backward pass: not a chain
    return remat.make_graph(
        ["a", "b", "c", "d", "gd", "gc", "gb", "ga"],
        [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (2, 4), (1, 4), (4, 5), (4, 6), (5, 7), (6, 7),
         (0, 7)],
        out_bytes=[4, 8, 8, 2, 2, 8, 8, 4], time_s=[1.0] * 8, is_backward=[False] * 4 + [True] * 4)


FAST = ["checkpoint_all", "recompute_all", "jax_policy", "sqrtn", "griewank", "chain_dp",
        "greedy_remat", "pebbling"]


@pytest.mark.parametrize("name", FAST)
def test_every_policy_reports_the_same_stats(name):
    g = remat.chain_graph(10, sizes=[3, 5, 2, 7, 4, 4, 6, 1, 3, 5], name="c10")
    fixed = ("checkpoint_all", "recompute_all", "jax_policy")  # plans that ignore the budget
    budget = None if name in fixed else int(0.8 * g.no_remat_peak())
    p = policies.get(name, budget=budget).plan(g)
    m = p.meta
    assert m["policy"] == name
    assert m["budget"] == budget
    assert m["status"] in policies.base.STATUSES
    # against the independent oracle and a hand sum, not remat.simulate (the same fold as meta)
    peak = oracle_peak(g, p)
    assert m["peak_bytes"] == peak
    assert m["compute_cost"] == pytest.approx(hand_compute_cost(g, p))
    assert m["objective_unit"] == "cost" and m["objective"] > 0
    assert m["solve_time_s"] >= 0
    s = p.stats  # the same, typed
    assert s == remat.core.plan.PlanStats(**{k: m[k] for k in s.as_meta()})
    assert (s.policy, s.budget, s.peak_bytes) == (name, budget, peak)
    if m["lower_bound"] is not None:
        assert m["lower_bound"] <= m["objective"] * (1 + 1e-9)
        assert 0 <= m["gap"] <= 1
    if budget is not None:
        assert peak <= budget


def test_chain_policies_say_not_applicable_on_a_dag():
    g = _dag()
    for name in ("chain_dp", "griewank"):
        with pytest.raises(NotApplicableError, match="not a chain"):
            policies.get(name, budget="90%").plan(g)
    # a DAG policy plans it
    assert policies.get("checkmate", time_limit=SAFETY_S).plan(g).meta["status"] == "optimal"


def test_unknown_names_and_options_list_what_exists():
    with pytest.raises(UnknownNameError, match="available: .*chain_dp"):
        policies.get("nosuch")
    with pytest.raises(UnknownNameError, match="budget"):
        policies.get("sqrtn", time_limit=3)
    assert "time_limit" in policies.option_names("checkmate")
    assert "time_limit" not in policies.option_names("sqrtn")


def test_a_plan_over_budget_is_refused_by_the_wrapper():
    @dataclasses.dataclass(frozen=True)
    class Liar(BasePolicy):
        budget: int | None = None

        def solve(self, graph, budget_bytes, ctx):
            return checkpoint_all_plan(graph)  # ignores the budget

    g = remat.chain_graph(6)
    with pytest.raises(SolverError, match="over the budget"):
        Liar(budget="50%").plan(g)


def test_an_illegal_plan_is_refused_by_the_wrapper():
    @dataclasses.dataclass(frozen=True)
    class Broken(BasePolicy):
        def solve(self, graph, budget_bytes, ctx):
            p = checkpoint_all_plan(graph)
            R = p.R.copy()
            R[0, 0] = False  # node 0 never runs
            return remat.Plan(R=R, S=p.S)

    with pytest.raises(remat.errors.InvalidPlanError):
        Broken().plan(remat.chain_graph(4))


def test_shortcut_and_infeasible_budget():
    g = remat.chain_graph(8)
    p = policies.ChainDP().plan(g)  # no budget: the shortcut, checkpoint-all
    assert p.meta["status"] == "optimal" and p.meta["gap"] == 0.0
    assert p.compute_counts().sum() == g.n
    with pytest.raises(InfeasibleBudgetError) as e:
        policies.ChainDP(budget=1).plan(g)
    assert e.value.min_feasible_bytes > 1


def test_context_time_limit_reaches_the_solver(monkeypatch):
    """A context's 2 s limit, not the option's 600 s, is what the solver gets, and its LP
    phase (path cuts) and every HiGHS MILP under it get a share of it (the limits are recorded
    as they are passed: no clock is raced; which phases run in 2 s depends on the machine)."""
    import policies.checkmate as pc
    import solvers.checkmate.solve_state as cm
    from solvers.milp import MilpModel

    seen = {"solve_checkmate": [], "path_cuts": [], "highs": []}
    real_solve, real_cuts, real_highs = pc.solve_checkmate, cm.path_cut_loop, MilpModel.solve

    def solve_checkmate(problem, **kw):
        seen["solve_checkmate"].append(kw["time_limit"])
        return real_solve(problem, **kw)

    def path_cut_loop(problem, formulation, time_limit, **kw):
        seen["path_cuts"].append(time_limit)
        return real_cuts(problem, formulation, time_limit, **kw)

    def highs(self, *args, **kw):
        seen["highs"].append(kw["time_limit"])
        return real_highs(self, *args, **kw)

    monkeypatch.setattr(pc, "solve_checkmate", solve_checkmate)
    monkeypatch.setattr(cm, "path_cut_loop", path_cut_loop)
    monkeypatch.setattr(MilpModel, "solve", highs)
    rng = np.random.default_rng(0)
    n = 30
    g = remat.chain_graph(n, sizes=rng.integers(1, 9, n).tolist(), name="c30")
    p = policies.Checkmate(budget="40%", time_limit=600).plan(
        g, ctx=PolicyContext(time_limit=2.0))
    assert p.meta["status"] in ("optimal", "time_limit", "feasible")
    assert len(seen["solve_checkmate"]) == 1 and 0 < seen["solve_checkmate"][0] <= 2.0
    assert len(seen["path_cuts"]) == 1 and 0 < seen["path_cuts"][0] <= 0.25 * 2.0
    assert all(0 < t <= 2.0 for t in seen["highs"]), seen["highs"]


def test_example_policy_of_the_readme():
    mod = _load_example()
    g = remat.chain_graph(12, sizes=[2] * 12)
    pol = policies.get("every_kth", budget="70%")
    assert isinstance(pol, mod.EveryKth)
    p = pol.plan(g)
    assert remat.simulate(g, p).peak_bytes <= int(np.ceil(0.7 * g.no_remat_peak()))
    assert p.meta["k"] >= 2 and p.meta["policy"] == "every_kth"


def test_cli_runs_a_plugin_policy(capsys, tmp_path):
    from experiments.cli import main

    path = tmp_path / "chain12.json"
    remat.chain_graph(12, sizes=[2] * 12).to_json(path)
    rc = main(["compare", str(path), "--budget", "70%", "--plot", "",
               "--plugin", str(ROOT / "examples" / "every_kth.py"),
               "--policies", "every_kth", "sqrtn"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("every_kth"))
    assert "heuristic" in line


# --------------------------------------------------------------------------- micro-batches
@dataclasses.dataclass(frozen=True)
class HalveBatch(BasePolicy):
    """Test policy: choose 2 micro-batches through ``ctx.graph_at`` and keep everything."""

    budget: int | None = None

    def solve(self, graph, budget_bytes, ctx):
        if ctx.graph_at is None or 2 not in ctx.microbatch_counts():
            raise NotApplicableError("needs a batch to split")
        small = ctx.graph_at(2)
        assert small.no_remat_peak() < graph.no_remat_peak()
        return dataclasses.replace(checkpoint_all_plan(small), microbatches=2)


def _mlp():
    from helpers.user_models import tanh_chain

    return tanh_chain(L=4, B=16, W=32)


def test_a_policy_can_choose_microbatches_and_the_drop_in_honours_it():
    loss, ws, x = _mlp()
    vg = remat.value_and_grad(loss, HalveBatch())
    v, g = jax.jit(vg)(ws, x)
    v0, g0 = jax.jit(jax.value_and_grad(loss))(ws, x)
    np.testing.assert_allclose(v, v0, rtol=1e-5)
    for a, b in zip(g, g0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    app = vg.applied(ws, x)
    assert app.plan.microbatches == 2
    assert app.graph.meta["batch_size"] == 8  # the plan's columns are the half-batch graph
    full = remat.extract(loss, ws, x)
    assert app.graph.no_remat_peak() < full.no_remat_peak()


def test_user_microbatches_fix_the_split():
    loss, ws, x = _mlp()
    vg = remat.value_and_grad(loss, "checkpoint_all", microbatches=4)
    v, _ = vg(ws, x)
    assert vg.applied(ws, x).plan.microbatches == 4
    np.testing.assert_allclose(v, loss(ws, x), rtol=1e-5)
    with pytest.raises(NotApplicableError):  # the user fixed the split: no graph_at
        remat.value_and_grad(loss, HalveBatch(), microbatches=2)(ws, x)


def test_a_policy_without_solve_cannot_be_made_and_bad_plugins_are_one_line(capsys, tmp_path):
    @dataclasses.dataclass(frozen=True)
    class NoDecision(BasePolicy):
        budget: int | None = None

    with pytest.raises(TypeError, match="solve"):
        NoDecision()
    from experiments.cli import main

    path = tmp_path / "c.json"
    remat.chain_graph(4).to_json(path)
    for plug in (str(tmp_path / "missing.py"), "no_such_module_xyz"):
        assert main(["plan", str(path), "--policy", "sqrtn", "--plugin", plug]) == 2
        assert "remat: error: no plugin" in capsys.readouterr().err


BAD_OPTIONS = [
    ("sqrtn", dict(mode="fast")),
    ("greedy_remat", dict(score="random")),
    ("pebbling", dict(method="bogus")),
    ("pebbling", dict(witness_states=0)),
    ("sage", dict(order="reverse")),
    ("sage", dict(mtp=0)),
    ("checkmate", dict(relax="sdp")),
    ("checkmate", dict(order="random")),
    ("checkmate", dict(order_share=2.0)),
    ("peak_shave", dict(orders=-1)),
    ("chain_dp", dict(max_levels=0)),
]


@pytest.mark.parametrize("name,options", BAD_OPTIONS, ids=lambda x: str(x))
def test_a_bad_option_value_is_one_error_type(name, options):
    """Every policy rejects an option value it does not take with InvalidOptionError (at
    construction or before planning), naming the option."""
    g = remat.core.graph.chain_graph(4, sizes=[4, 8, 4, 8])
    with pytest.raises(InvalidOptionError, match=next(iter(options))):
        policies.get(name, budget="80%", **options).plan(g)
