"""The drop-in's budget is the compiled step's temp bytes (issue #33, items 1, 3 and 6).

The closed loop (:func:`remat.compiled_budget.fit`) is tested on stand-ins for the policy and the
compiler (deterministic, no JAX), and end to end in a subprocess with XLA:CPU's
``cse_barrier_expander`` off: every compiled figure there is read from an independent
``jax.jit(...).lower().compile()`` of the public transform, not from the loop's bookkeeping.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest
from helpers.xla_subprocess import run_json

import remat
from remat.compiled_budget import fit
from remat.core.budget import Modelled, parse_budget, resolve_against
from remat.core.errors import BudgetFormatError, InfeasibleBudgetError


# --------------------------------------------------------------------------- budget specs
def test_budget_specs_parse_the_same_for_both_meanings():
    assert parse_budget("50%") == ("fraction", 0.5)
    assert parse_budget("0.3x") == ("fraction", 0.3)
    assert parse_budget("1.5KiB") == ("bytes", 1536.0)
    assert parse_budget(remat.modelled("2MiB")) == ("bytes", 2.0 * 2**20)
    assert resolve_against("50%", 1001) == 501
    assert resolve_against("12GiB", 7) == 12 * 2**30
    assert remat.modelled("60%") == Modelled("60%")
    with pytest.raises(BudgetFormatError):
        remat.modelled("sixty percent")


# --------------------------------------------------------------------------- the loop, stand-ins
@dataclasses.dataclass
class _Plan:
    R: np.ndarray
    meta: dict
    microbatches: int = 1


@dataclasses.dataclass
class _App:
    plan: _Plan


def _world(min_internal: int, compiled_of, levels=range(0, 10_001, 100)):
    """A policy whose plans are indexed by the internal budget rounded down to a level, refusing
    budgets below ``min_internal``; ``compiled_of(level)`` is the plan's compiled temp."""
    calls = {"plan": 0, "compile": 0}

    def plan_at(b):
        calls["plan"] += 1
        if b < min_internal:
            raise InfeasibleBudgetError(b, min_internal)
        level = max(v for v in levels if v <= max(b, min_internal))
        R = np.zeros((1, 64), bool)
        R[0, : level // 200 + 1] = True
        return _App(_Plan(R, {"peak_bytes": level, "budget": b, "level": level}))

    def temp_of(app):
        calls["compile"] += 1
        return compiled_of(app.plan.meta["level"])

    return plan_at, temp_of, calls


def test_loop_lands_in_the_budget_when_the_model_over_counts_4x():
    plan_at, temp_of, calls = _world(400, lambda level: level // 4 + 50)
    # the model says 10 000 bytes where XLA compiles 2 550: the first internal budget scales by it
    res = fit(plan_at, temp_of, 1000, first_budget=1000 * 10_000 // 2_550, recomputes=lambda a: True)
    assert res.compiled_temp <= 1000  # the budget is a cap
    assert res.compiled_temp >= 0.9 * 1000  # uses the budget
    assert res.compiles == calls["compile"] <= 4
    assert [r.compiled_temp for r in res.rounds if r.compiled_temp is not None]


def test_loop_corrects_an_under_estimate_and_never_returns_a_plan_over_the_budget():
    plan_at, temp_of, _ = _world(400, lambda level: 3 * level)
    res = fit(plan_at, temp_of, 6000, first_budget=6000, recomputes=lambda a: True)
    assert res.compiled_temp <= 6000
    assert res.rounds[0].compiled_temp > 6000  # the first guess did not fit


def test_the_budget_is_a_cap_a_plan_two_percent_over_is_not_returned():
    plan_at, temp_of, _ = _world(0, lambda level: int(level * 1.02))
    res = fit(plan_at, temp_of, 5000, first_budget=5000, recomputes=lambda a: True)
    assert res.rounds[0].compiled_temp == 5100  # the first plan, 2 % over
    assert res.compiled_temp <= 5000


def test_loop_reports_the_smallest_compiled_temp_when_nothing_fits():
    plan_at, temp_of, _ = _world(2000, lambda level: level + 500)
    with pytest.raises(InfeasibleBudgetError) as e:
        fit(plan_at, temp_of, 1000, first_budget=800, recomputes=lambda a: True)
    assert e.value.budget == 1000
    assert e.value.min_feasible_bytes == 2500  # the policy's smallest plan, compiled
    assert "compiled" in str(e.value)


def test_a_plan_that_recomputes_nothing_is_compiled_before_the_loop_refuses():
    """Compiled temp not monotone in the internal budget: every plan that recomputes compiles
    over the budget, the plan that keeps everything (XLA holds only what the backward reads)
    under it.  Without the ceiling the loop refuses; with it, it returns that plan."""
    compiled = lambda level: 500 if level >= 9000 else 2000 + level // 10  # noqa: E731
    plan_at, temp_of, _ = _world(1000, compiled)
    with pytest.raises(InfeasibleBudgetError) as e:
        fit(plan_at, temp_of, 1000, first_budget=3000, recomputes=lambda a: True)
    assert e.value.min_feasible_bytes == 2100  # the smallest plan, over the budget
    plan_at, temp_of, calls = _world(1000, compiled)
    res = fit(plan_at, temp_of, 1000, first_budget=3000, recomputes=lambda a: True,
              ceiling_budget=10_000)
    assert res.compiled_temp == 500 and res.applied.plan.meta["level"] == 10_000
    assert res.compiles == calls["compile"] <= 4 + 1
    # where the ceiling's plan does not fit either, the refusal names the smallest of all
    plan_at, temp_of, _ = _world(1000, lambda level: 1500 if level >= 9000 else 2000)
    with pytest.raises(InfeasibleBudgetError) as e:
        fit(plan_at, temp_of, 1000, first_budget=3000, recomputes=lambda a: True,
            ceiling_budget=10_000)
    assert e.value.min_feasible_bytes == 1500 and "reached at 9.77 KiB" in str(e.value)


def test_loop_spends_at_most_its_compiles_and_reuses_a_plan_it_met():
    plan_at, temp_of, calls = _world(0, lambda level: 5000 if level > 300 else 100,
                                     levels=(0, 5000))
    res = fit(plan_at, temp_of, 1000, first_budget=9000, recomputes=lambda a: True,
              max_compiles=2)
    assert calls["compile"] <= 2
    assert res.compiled_temp == 100
    assert any(r.reused for r in res.rounds) or len(res.rounds) == calls["compile"]


def test_loop_stops_at_a_fitting_plan_that_recomputes_nothing():
    plan_at, temp_of, calls = _world(0, lambda level: 10)
    res = fit(plan_at, temp_of, 1000, first_budget=5000, recomputes=lambda a: False)
    assert calls["compile"] == 1 and res.compiled_temp == 10


def test_predictions_choose_where_the_loop_starts_compiling():
    """A predictor that is right puts the first compile at a fitting plan using the budget:
    one compile where the ratio steps from a 4x over-count took more."""
    compiled = lambda level: level // 4 + 50  # noqa: E731
    plan_at, temp_of, calls = _world(400, compiled)
    ref = fit(plan_at, temp_of, 1000, first_budget=1000, recomputes=lambda a: True)
    plan_at, temp_of, calls = _world(400, compiled)
    res = fit(plan_at, temp_of, 1000, first_budget=1000, recomputes=lambda a: True,
              predict_of=lambda a: compiled(a.plan.meta["level"]))
    assert ref.compiles >= 2 and res.compiles == calls["compile"] == 1
    assert 900 <= res.compiled_temp <= 1000
    predicted = [r for r in res.rounds if r.predicted_temp is not None]
    assert 1 <= len(predicted) <= 4 and all(r.compiled_temp is None for r in predicted)


def test_a_compile_rescales_the_predictions_that_choose_the_next_plan():
    """Plans between internal budgets 10 000 and 12 300 all compile to the same 8 488 bytes,
    3 % over the budget, and the predictor reads 2 000 bytes low everywhere.  Stepping by the
    compiled ratio alone (3 % a step) spends the loop's compiles there and refuses a budget
    that plans below 10 000 meet; predictions scaled by the last compile's error, with steps
    that grow while the figure does not change, reach them."""
    def compiled(level):
        if level >= 12_400:
            return int(0.7 * level)
        if level >= 10_000:
            return 8_488
        return 6_000 + level // 10 if level >= 7_000 else 11_000

    plan_at, temp_of, calls = _world(0, compiled, levels=range(0, 16_001, 100))
    res = fit(plan_at, temp_of, 8_240, first_budget=16_000, recomputes=lambda a: True,
              predict_of=lambda a: compiled(a.plan.meta["level"]) - 2_000)
    assert res.compiled_temp <= 8_240, res.rounds
    assert 7_000 <= res.applied.plan.meta["level"] < 10_000
    assert res.compiles == calls["compile"] <= 4


def test_the_loop_steps_by_the_secant_where_the_temp_has_a_fixed_part():
    """Compiled temp = 20 000 + the plan's level: the local ratio steps ~1/3 of the way a time
    and spends 4 compiles over the budget (the loop then returned the policy's smallest plan,
    0.8 of the budget); the secant through two compiles lands within ``ACCEPT`` on the third."""
    plan_at, temp_of, calls = _world(0, lambda level: 20_000 + level)
    res = fit(plan_at, temp_of, 25_000, first_budget=10_000, recomputes=lambda a: True)
    assert 0.95 * 25_000 <= res.compiled_temp <= 25_000, res.rounds
    assert calls["compile"] <= 3


def test_a_wrong_prediction_is_corrected_by_the_compiles():
    """Predictions 3x under the compiled temp start the loop too high; what it returns is
    still a compiled plan within the budget."""
    plan_at, temp_of, _ = _world(400, lambda level: 3 * level)
    res = fit(plan_at, temp_of, 6000, first_budget=6000, recomputes=lambda a: True,
              predict_of=lambda a: a.plan.meta["level"])
    assert res.compiled_temp <= 6000
    assert any(r.compiled_temp is not None and r.compiled_temp > 6000 for r in res.rounds)


def test_with_costs_the_loop_returns_the_cheapest_fitting_plan():
    """Compiled temp falls past a level (XLA drops what a kept stage does not need) while the
    cost keeps falling: by temp the loop returns the plan below it, by cost the one above."""
    compiled = {0: 300, 2000: 900, 3000: 700}.get
    cost = lambda a: 10_000 - a.plan.meta["level"]  # noqa: E731
    runs = {}
    for name, kw in (("temp", {}), ("cost", {"cost_of": cost})):
        plan_at, temp_of, _ = _world(0, compiled, levels=(0, 2000, 3000))
        # 900 fits but leaves 10% unused: the loop steps up until ACCEPT or its compiles run out
        runs[name] = fit(plan_at, temp_of, 1000, first_budget=2000, recomputes=lambda a: True,
                         accept=0.99, **kw)
    assert runs["temp"].compiled_temp == 900
    assert runs["cost"].compiled_temp == 700
    assert cost(runs["cost"].applied) < cost(runs["temp"].applied)


def test_plans_with_the_same_runs_but_other_scan_decisions_or_regions_are_compiled_apart():
    """The applied step depends on a plan's scan decisions and checkpoint regions, not only on
    ``R``: a plan met again is one with all of them equal (a reused compiled figure of another
    step once returned a scanned transformer's plan at 1.27x its budget)."""
    from remat.compiled_budget import plan_key
    from remat.core.regions import CheckpointRegion
    from remat.core.scan_plan import ScanDecision

    R = np.ones((1, 4), bool)
    key = lambda meta: plan_key(_App(_Plan(R, meta)))  # noqa: E731
    assert key({}) == key({"peak_bytes": 1})
    assert key({"scans": (ScanDecision(3, frozenset({1})),)}) != key(
        {"scans": (ScanDecision(3, frozenset({2})),)})
    assert key({"scans": (ScanDecision(3, frozenset({1, 2})),)}) == key(
        {"scans": (ScanDecision(3, frozenset({2, 1})),)})
    assert key({"regions": (CheckpointRegion(0, 2, (1,)),)}) != key(
        {"regions": (CheckpointRegion(0, 2, ()),)})
    assert key({}) != key({"trim_segments": False})


# --------------------------------------------------------------------------- in-process semantics
def test_semantics_follow_what_the_compiler_keeps():
    """Without the flag, XLA:CPU on older JAX undoes ``jax.checkpoint``: the budget then falls
    back to the model with a warning; where the compiler keeps it, the budget is compiled."""
    import jax
    import jax.numpy as jnp

    from remat.compiled_budget import keeps_checkpoint

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    ws = [jnp.full((128, 128), 0.01, jnp.float32)] * 8
    x = jnp.ones((512, 128), jnp.float32)
    vg = remat.value_and_grad(loss, "checkmate", budget="70%")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        value, grads = vg(ws, x)
        app = vg.applied(ws, x)
    ref_value, ref_grads = jax.value_and_grad(loss)(ws, x)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)
    if keeps_checkpoint(jax.default_backend()):
        assert app.budget_semantics == "compiled"
        assert app.compiled_temp_bytes <= app.budget_bytes
    else:
        assert app.budget_semantics == "modelled-fallback"
        assert any("undoes jax.checkpoint" in str(x.message) for x in w)
    modelled = remat.value_and_grad(loss, "checkmate", budget=remat.modelled("70%")).applied(ws, x)
    assert modelled.budget_semantics == "modelled" and not modelled.rounds
    assert modelled.plan.meta["budget"] == remat.resolve_budget("70%", modelled.graph)


# --------------------------------------------------------------------------- end to end, flag on
_E2E = r"""
import json, warnings
import jax, jax.numpy as jnp, numpy as np
import remat, policies
from remat.core.errors import InfeasibleBudgetError

def mlp():
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.normal(size=(256, 256)) * 0.06, jnp.float32) for _ in range(10)]
    x = jnp.asarray(rng.normal(size=(512, 256)), jnp.float32)
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)
    return loss, ws, x

def transformer(layers=3, B=4, T=64, D=64, H=4):
    rng = np.random.default_rng(1)
    draw = lambda *s: jnp.asarray(rng.normal(size=s) * 0.1, jnp.float32)
    p = [dict(qkv=draw(D, 3 * D), out=draw(D, D), fc1=draw(D, 4 * D), fc2=draw(4 * D, D))
         for _ in range(layers)]
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    def norm(h):
        mu = h.mean(-1, keepdims=True)
        return (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    def loss(p, x):
        for blk in p:
            q, k, v = jnp.split(norm(x) @ blk["qkv"], 3, axis=-1)
            q, k, v = (a.reshape(B, T, H, D // H) for a in (q, k, v))
            s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D // H)
            s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e9)
            a = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1), v).reshape(B, T, D)
            x = x + a @ blk["out"]
            x = x + jax.nn.gelu(norm(x) @ blk["fc1"]) @ blk["fc2"]
        return jnp.mean(x ** 2)
    return loss, p, x

def temp(f, *a):
    return int(jax.jit(f).lower(*a).compile().memory_analysis().temp_size_in_bytes)

rows = []
# the MLP at 30 % was refused on jax 0.12 (a typed error naming the smallest compiled temp
# reached); the assertions take a refusal or a fit at any row
for name, build, pcts in [("mlp", mlp, (30, 70)), ("transformer", transformer, (50, 70))]:
    loss, p, b = build()
    base = temp(jax.value_and_grad(loss), p, b)
    ref_v, ref_g = jax.value_and_grad(loss)(p, b)
    for pct in pcts:
        pol = policies.get("checkmate", time_limit=600.0)
        vg = remat.value_and_grad(loss, pol, budget=f"{pct}%")
        row = dict(model=name, pct=pct, base=base)
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                app = vg.applied(p, b)
        except InfeasibleBudgetError as e:
            row.update(error=True, budget=e.budget, min_feasible=e.min_feasible_bytes)
            rows.append(row); continue
        v, g = jax.jit(vg)(p, b)
        err = max(float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(y)) + 1e-30))
                  for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)))
        row.update(error=False, budget=app.budget_bytes, compiled=temp(vg, p, b),
                   loop_compiled=app.compiled_temp_bytes, baseline=app.baseline_temp_bytes,
                   recomputes=bool((app.plan.R.sum(0) >= 2).any()),
                   compiles=sum(1 for r in app.rounds if r.compiled_temp is not None and not r.reused),
                   semantics=app.budget_semantics, notes=list(app.notes),
                   value_err=abs(float(v) - float(ref_v)) / abs(float(ref_v)), grad_err=err)
        rows.append(row)
print(json.dumps(rows))
"""


@pytest.mark.slow
def test_compiled_budget_end_to_end_with_the_flag():
    rows = run_json(_E2E)
    assert len(rows) == 4
    for r in rows:
        if r["error"]:  # a typed refusal naming the smallest compiled temp reached
            assert r["min_feasible"] > r["budget"], r
            continue
        assert r["semantics"] == "compiled", r
        assert r["baseline"] == r["base"], r
        # the public transform's compiled step, compiled here independently
        assert r["compiled"] <= r["budget"], r
        assert r["compiled"] == r["loop_compiled"], r
        if r["recomputes"] and r["compiled"] < 0.6 * r["budget"]:
            assert any("of the budget" in n for n in r["notes"]), r
        assert r["compiles"] <= 4, r
        assert r["value_err"] < 1e-5 and r["grad_err"] < 1e-4, r
    fitted = [r for r in rows if not r["error"]]
    assert len(fitted) >= 3, json.dumps(rows)


# ----------------------------------------------------------- generated models, the installed JAX
@pytest.mark.parametrize("frontend", ("plain", "linen", "nnx"))
def test_compiled_budget_on_generated_models(frontend):
    """On models the project did not write (hypothesis: skip connections, concatenations, scanned
    stacks, losses that do and do not read the network's output), a drop-in budget gives either
    a step whose independently compiled temp is within the budget, a typed error naming a
    larger smallest budget, or, where this JAX's XLA:CPU undoes ``jax.checkpoint`` (no flag in
    this process), the modelled fallback with a warning. Value and gradients equal JAX's."""
    import jax
    from helpers.dropin import run_against_jax
    from helpers.generated_models import LOSSES, build, specs
    from helpers.limits import SAFETY_S
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import policies
    from remat.fidelity import RematFidelityWarning

    seen = {"semantics": set(), "losses": set()}

    @settings(max_examples=5, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(specs(frontends=(frontend,), max_depth=5), st.sampled_from(LOSSES),
           st.sampled_from(("50%", "70%", "90%")))
    def check(spec, loss_name, budget):
        spec = dataclasses.replace(spec, loss=loss_name)
        seen["losses"].add(loss_name)
        loss, params, batch = build(spec)
        vg = remat.value_and_grad(loss, policies.get("checkmate", time_limit=SAFETY_S),
                                  budget=budget)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                app = vg.applied(params, batch)
            except InfeasibleBudgetError as e:
                assert e.min_feasible_bytes > e.budget, (spec, budget)
                seen["semantics"].add("infeasible")
                return
        seen["semantics"].add(app.budget_semantics)
        run_against_jax(vg, loss, params, batch)
        if app.budget_semantics == "compiled":
            compiled = jax.jit(vg).lower(params, batch).compile().memory_analysis()
            assert compiled.temp_size_in_bytes <= app.budget_bytes, (spec, budget)
            assert compiled.temp_size_in_bytes == app.compiled_temp_bytes, (spec, budget)
        else:
            assert app.budget_semantics == "modelled-fallback", app.budget_semantics
            assert any(issubclass(w.category, RematFidelityWarning) for w in caught), spec

    check()
    assert seen["semantics"] - {"infeasible"}, seen  # at least one budget was met, not refused


def test_a_policy_refusing_every_budget_is_a_typed_error_with_an_unknown_minimum():
    """The loop met no plan at all: its error says the minimum is unknown and why (it raised
    ``OverflowError`` formatting an infinite minimum before)."""
    def plan_at(b):
        raise InfeasibleBudgetError(b, 10 ** 9 if b else 0, "the policy's own refusal")

    with pytest.raises(InfeasibleBudgetError, match="unknown.*the policy's own refusal"):
        fit(plan_at, lambda a: 0, 1000, first_budget=800, recomputes=lambda a: True)


def test_the_loop_charges_a_plan_the_recomputation_its_trimmed_checkpoints_add():
    """A stage plan that keeps every stage runs its kept stages under ``jax.checkpoint``
    (segment trimming): JAX recomputes inside them what the backward reads, so the applied step
    runs more FLOPs than the plan's compute counts say.  The loop's cost of such a plan is its
    modelled cost times the applied over the planned FLOPs; a plan applied as regions (no
    trimming) costs its modelled cost."""
    import jax
    import jax.numpy as jnp

    from remat.apply import _cost_with_trimming, _modelled_cost, _trimmed
    from remat.flops import jaxpr_flops

    rng = np.random.default_rng(1)
    B, T, D = 4, 32, 32
    p = [{k: jnp.asarray(rng.normal(size=s) * 0.1, jnp.float32)
          for k, s in (("qkv", (D, 3 * D)), ("fc1", (D, 4 * D)), ("fc2", (4 * D, D)))}
         for _ in range(2)]
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)

    def loss(p, x):
        for blk in p:
            q, k, v = jnp.split(x @ blk["qkv"], 3, axis=-1)
            s = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(D)
            x = x + jnp.einsum("bts,bsd->btd", jax.nn.softmax(s, -1), v)
            x = x + jax.nn.gelu(x @ blk["fc1"]) @ blk["fc2"]
        return jnp.mean(x ** 2)

    def flops(f):
        return jaxpr_flops(jax.make_jaxpr(jax.value_and_grad(f))(p, x))

    base = flops(loss)
    cost = _cost_with_trimming(lambda: base, 0, False)
    keep = remat.value_and_grad(loss, "checkmate", budget=remat.modelled("100%")).applied(p, x)
    assert not (keep.plan.R.sum(0) >= 2).any()  # the plan recomputes nothing ...
    assert _trimmed(keep)
    applied = flops(keep.fn) / base
    assert applied > 1.05, applied  # ... but its step runs more FLOPs
    assert cost(keep) == pytest.approx(_modelled_cost(keep) * applied, rel=1e-9)
    hier = remat.value_and_grad(loss, "hierarchical", budget=remat.modelled("70%")).applied(p, x)
    assert not _trimmed(hier)
    assert cost(hier) == _modelled_cost(hier)


_FRESH_CONTEXT = r"""
import dataclasses, json, time, warnings
import jax.numpy as jnp
import policies, remat
from remat.core.errors import InfeasibleBudgetError

seen = []


@dataclasses.dataclass(frozen=True)
class Recording(type(policies.get("sqrtn"))):
    def solve(self, graph, budget_bytes, ctx):
        seen.append((ctx.compiled_budget, ctx.time_left(1000.0)))
        time.sleep(1.0)
        return super().solve(graph, budget_bytes, ctx)


def loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x * x)


ws = [jnp.full((32, 32), 0.01 * (i + 1)) for i in range(8)]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    vg = remat.value_and_grad(loss, Recording(), budget="50%")
    try:
        semantics = vg.applied(ws, jnp.ones((64, 32))).budget_semantics
    except InfeasibleBudgetError:
        semantics = "compiled"  # refused after its plans and compiles
print(json.dumps(dict(seen=seen, semantics=semantics)))
"""


def test_each_plan_of_the_loop_gets_a_fresh_context_marked_compiled():
    """Every plan the drop-in's loop makes gets ``ctx.compiled_budget`` and the policy's whole
    time limit: the context's clock starts at that plan, not at the first one (a loop of
    several plans and compiles left a time-limited solver less each round)."""
    r = run_json(_FRESH_CONTEXT)
    assert r["semantics"] == "compiled", r
    seen = r["seen"]
    assert len(seen) >= 2, r
    assert all(c for c, _ in seen), r
    assert min(t for _, t in seen) >= 999.0, r
