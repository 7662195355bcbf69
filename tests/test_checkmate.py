"""Checkmate MILP and LP rounding, checked against an independent brute force and remat's replay.

The brute force enumerates every frontier-advancing schedule of a tiny graph (n <= 7) by dynamic
programming over the set of outputs carried between steps, with its own step-by-step memory
evaluator written from the semantics in ``remat/core/plan.py``; every optimum it finds is turned into a
``remat.Plan`` and re-checked with ``remat.simulate``.
"""

import itertools
import math

import numpy as np
import pytest
from helpers.checkmate_problems import random_problem
from helpers.event_oracle import oracle_peak, oracle_schedule_peak
from helpers.limits import HIGHS_SPENT, SAFETY_S
from helpers.models_we_did_not_write import (
    dropin_we_did_not_write,
    mlp_we_did_not_write,
    plan_we_did_not_write,
)

import policies
import remat
from remat.core.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from remat.core.schedule import replay
from solvers.checkmate import (
    CheckmateProblem,
    Formulation,
    checkpoint_all_schedule,
    heuristic_schedules,
    min_feasible_budget,
    normalize,
    schedule_memory,
    solve_checkmate,
    solve_checkmate_lp,
    to_frontier_form,
)


# ------------------------------------------------------------------------ brute force
def _subsets(items):
    items = list(items)
    for r in range(len(items) + 1):
        yield from itertools.combinations(items, r)


def _step(sizes, preds, users, S_t, R_t, S_next):
    """Peak bytes of one step, or None when illegal (a missing input or a bad carry)."""
    comp = sorted(R_t)
    live = set(S_t)
    peak = sum(sizes[i] for i in live)

    def wanted(i, pos):
        return i in S_next or any(j in comp[pos:] for j in users[i])

    live = {i for i in live if wanted(i, 0)}
    for p, k in enumerate(comp):
        if any(q not in live for q in preds[k]):
            return None
        live.add(k)
        peak = max(peak, sum(sizes[i] for i in live))
        live = {i for i in live if wanted(i, p + 1)}
    if not set(S_next) <= live:
        return None
    return peak


def _transitions(graph):
    """Every legal step (t, S_t, R_t, S_next) with its cost and peak."""
    n = graph.n
    sizes = graph.sizes.tolist()
    costs = graph.costs.tolist()
    preds = [set(p) for p in graph.preds]
    users = [set(u) for u in graph.succs]
    out = []
    states = {(): None}
    for t in range(n):
        nxt = set()
        for S_t in states:
            for extra in _subsets(range(t)):
                R_t = set(extra) | {t}
                resident = set(S_t) | R_t
                nexts = [()] if t == n - 1 else list(_subsets(sorted(i for i in resident if i <= t)))
                for S_n in nexts:
                    pk = _step(sizes, preds, users, S_t, R_t, set(S_n))
                    if pk is None:
                        continue
                    out.append((t, S_t, tuple(sorted(R_t)), S_n, sum(costs[i] for i in R_t), pk))
                    nxt.add(S_n)
        states = dict.fromkeys(nxt)
    return out


def brute_force(graph, budget, trans):
    """Minimum cost over frontier schedules with peak <= budget: (cost, Plan) or (inf, None)."""
    n = graph.n
    best = {(): (0.0, [])}
    for t in range(n):
        new = {}
        for tt, S_t, R_t, S_n, c, pk in trans:
            if tt != t or pk > budget or S_t not in best:
                continue
            cost = best[S_t][0] + c
            if S_n not in new or cost < new[S_n][0] - 1e-12:
                new[S_n] = (cost, best[S_t][1] + [(S_t, R_t)])
        best = new
    if () not in best:
        return math.inf, None
    cost, steps = best[()]
    R = np.zeros((n, n), bool)
    S = np.zeros((n, n), bool)
    for t, (S_t, R_t) in enumerate(steps):
        R[t, list(R_t)] = True
        S[t, list(S_t)] = True
    return cost, remat.Plan(R=R, S=S)


def _diamond(seed):
    # a -> {b, c} -> d -> e, plus "backward" nodes reading forward values
    rng = np.random.default_rng(seed)
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (1, 4), (4, 5), (2, 5), (0, 5)]
    n = 6
    return remat.make_graph(
        [f"v{i}" for i in range(n)], edges,
        out_bytes=rng.integers(1, 6, n).tolist(), time_s=rng.integers(1, 5, n).astype(float).tolist(),
        name=f"diamond{seed}",
    )


def _graphs():
    yield remat.chain_graph(3, sizes=[2, 1, 3], fwd_costs=[1.0, 3.0, 2.0])  # n = 7
    yield remat.chain_graph(2, sizes=[4, 1], fwd_costs=[2.0, 1.0])  # n = 5
    yield _diamond(0)
    yield _diamond(1)


def _check_plan(graph, sol, budget):
    plan = remat.Plan(R=sol.R, S=sol.S)
    plan.validate(graph)
    rep = remat.simulate(graph, plan)
    assert rep.peak_bytes <= budget
    assert oracle_peak(graph, plan) == sol.peak_bytes  # sol's is the event program's
    assert rep.compute_time_s == pytest.approx(sol.objective, rel=1e-9)
    return rep


@pytest.mark.parametrize("gi", range(4))
def test_milp_equals_brute_force_at_every_budget(gi):
    graph = list(_graphs())[gi]
    trans = _transitions(graph)
    P = CheckmateProblem.from_graph(graph)
    top = graph.no_remat_peak()
    feasible = []
    for b in range(1, top + 1):
        ref, ref_plan = brute_force(graph, b, trans)
        if math.isinf(ref):
            with pytest.raises(InfeasibleBudgetError):
                solve_checkmate(P.with_budget(b), time_limit=SAFETY_S)
            continue
        feasible.append(b)
        # the brute force's own optimum is legal and fits according to remat's replay
        rep = remat.simulate(graph, ref_plan)
        assert rep.peak_bytes <= b and rep.compute_time_s == pytest.approx(ref)
        for lazy in (False, True):  # the MILP itself, its memory chain whole or added lazily
            sol = solve_checkmate(P.with_budget(b), time_limit=SAFETY_S, lp_first=False,
                                  lazy_memory=lazy)
            assert sol.status == "optimal" and sol.meta["method"] in ("milp", "checkpoint_all")
            assert sol.objective == pytest.approx(ref, rel=1e-9), (b, lazy, sol.objective, ref)
            _check_plan(graph, sol, b)
    # the smallest feasible budget is what InfeasibleBudgetError reports, and min - 1 raises
    mn = feasible[0]
    assert min_feasible_budget(P) == (mn, True)
    with pytest.raises(InfeasibleBudgetError) as err:
        solve_checkmate(P.with_budget(mn - 1), time_limit=SAFETY_S)
    assert err.value.min_feasible_bytes == mn


def test_formulation_variants_agree_with_the_paper_form():
    graph = remat.chain_graph(3, sizes=[2, 1, 3], fwd_costs=[1.0, 3.0, 2.0])
    P = CheckmateProblem.from_graph(graph)
    P = P.with_budget(min_feasible_budget(P)[0] + 1)
    assert P.budget < graph.no_remat_peak()
    plain = solve_checkmate(P, formulation=Formulation(False, False, False), warm_start=None,
                            time_limit=SAFETY_S)
    strong = solve_checkmate(P, time_limit=SAFETY_S)
    allon = solve_checkmate(P, formulation=Formulation(True, True, True), time_limit=SAFETY_S)
    assert plain.objective == pytest.approx(strong.objective) == pytest.approx(allon.objective)


def test_reduced_lp_bound_is_weaker_but_valid(chain20):
    from solvers.checkmate import add_checkmate_core
    from solvers.milp import MilpModel

    b = math.ceil(0.5 * chain20.no_remat_peak())
    P = CheckmateProblem.from_graph(chain20, b)
    bounds = []
    for form in (Formulation(memory_chain=False), Formulation()):
        m = MilpModel()
        v = add_checkmate_core(m, P, formulation=form)
        bounds.append(m.solve(relax=True).objective * v.cost_unit)
    exact = solve_checkmate(P, time_limit=SAFETY_S).objective
    assert bounds[0] <= bounds[1] + 1e-6 <= exact + 2e-6
    assert bounds[0] >= float(chain20.costs.sum()) - 1e-6


def test_min_feasible_above_frontier_bound_uses_the_milp():
    # a -> b, a -> c, b -> d, c -> d with big a: the frontier bound (d + b + c) is not attainable
    # because a must stay until both b and c ran (or be recomputed, which needs nothing but
    # memory for a again).  Brute force gives the true minimum.
    g = remat.make_graph(["a", "b", "c", "d"], [(0, 1), (0, 2), (1, 3), (2, 3)],
                         out_bytes=[5, 3, 3, 1], time_s=[1, 1, 1, 1])
    trans = _transitions(g)
    true_min = next(b for b in range(1, 30) if not math.isinf(brute_force(g, b, trans)[0]))
    P = CheckmateProblem.from_graph(g)
    assert P.frontier_lower_bound() < true_min
    assert min_feasible_budget(P) == (true_min, True)
    with pytest.raises(InfeasibleBudgetError) as err:
        solve_checkmate(P.with_budget(true_min - 1), time_limit=SAFETY_S)
    assert err.value.min_feasible_bytes == true_min
    assert solve_checkmate(P.with_budget(true_min), time_limit=SAFETY_S).peak_bytes <= true_min


def _oracle_peak(g, R, S) -> int:
    """The independent checker of tests/test_events.py (tests/helpers/event_oracle.py; shares no
    code with remat.events, which both ``schedule_memory`` and ``replay`` use)."""
    from helpers.event_oracle import oracle_run

    return oracle_run(g.n, g.sizes, g.edge_array, R, S).peak


def test_schedule_memory_matches_replay_on_heuristics_and_random_schedules():
    rng = np.random.default_rng(0)
    g = remat.chain_graph(6, sizes=rng.integers(1, 9, 6).tolist(), fwd_costs=1.0)
    P = CheckmateProblem.from_graph(g)
    for _, R, S in heuristic_schedules(P):
        plan = remat.Plan(R=R, S=S)
        plan.validate(g)
        assert schedule_memory(P, R, S)[0] == replay(g, plan).peak_bytes == _oracle_peak(g, R, S)
    # random legal schedules (including wasteful ones): S random, R = everything needed
    n = g.n
    for _ in range(20):
        S = np.tril(rng.random((n, n)) < 0.4, -1)
        R = np.tril(rng.random((n, n)) < 0.3) | np.eye(n, dtype=bool)
        R = R | np.tril(~S, -1)  # recompute whatever is not held: always legal
        plan = remat.Plan(R=R, S=S)
        # keep only carries that are legal
        for t in range(n - 1):
            S[t + 1] &= S[t] | R[t]
        plan = remat.Plan(R=R, S=S)
        plan.validate(g)
        assert schedule_memory(P, R, S)[0] == replay(g, plan).peak_bytes == _oracle_peak(g, R, S)
        Rn, Sn = normalize(P, R, S)
        pn = remat.Plan(R=Rn, S=Sn)
        pn.validate(g)
        assert replay(g, pn).peak_bytes <= replay(g, plan).peak_bytes
        assert Rn.sum() <= R.sum()


@pytest.fixture(scope="module")
def chain20():
    rng = np.random.default_rng(7)
    L = 10
    return remat.chain_graph(L, sizes=rng.integers(1, 9, L) * 1024, fwd_costs=rng.uniform(0.5, 2, L))


@pytest.mark.parametrize("frac", [0.5, 0.7])
def test_lp_rounding_between_bound_and_milp(chain20, frac):
    b = math.ceil(frac * chain20.no_remat_peak())
    P = CheckmateProblem.from_graph(chain20, b)
    exact = solve_checkmate(P, time_limit=SAFETY_S)
    assert exact.status == "optimal"
    lp = solve_checkmate_lp(P, time_limit=SAFETY_S)
    assert lp.objective >= exact.objective - 1e-9
    assert exact.objective >= lp.lower_bound - 1e-6
    assert lp.gap == pytest.approx((lp.objective - lp.lower_bound) / lp.objective)
    _check_plan(chain20, lp, b)
    _check_plan(chain20, exact, b)


def test_highs_and_cvxpy_backends_agree(chain20):
    b = math.ceil(0.5 * chain20.no_remat_peak())
    P = CheckmateProblem.from_graph(chain20, b)
    h = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False)
    c = solve_checkmate(P, time_limit=SAFETY_S, backend="cvxpy")
    assert h.meta["method"] == c.meta["method"] == "milp"
    assert h.status == c.status == "optimal"
    assert c.objective == pytest.approx(h.objective, rel=1e-6)
    _check_plan(chain20, c, b)


def test_time_limit_returns_incumbent():
    """HiGHS out of time at its first check (:data:`helpers.limits.HIGHS_SPENT`: the same outcome
    at any speed; the rest of the solve, path cuts included, has the safety net) on a 40-layer
    chain at 30 %: the warm start comes back, fitting, with status ``time_limit``, a gap and the
    LP's bound; without a warm start there is nothing to return and the time-out is raised."""
    rng = np.random.default_rng(3)
    L = 40
    g = remat.chain_graph(L, sizes=rng.integers(1, 9, L), fwd_costs=rng.uniform(0.5, 2, L))
    b = math.ceil(0.3 * g.no_remat_peak())
    P = CheckmateProblem.from_graph(g, b)
    sol = solve_checkmate(P, time_limit=SAFETY_S, options=HIGHS_SPENT)
    assert sol.status == "time_limit"
    assert sol.lower_bound <= sol.objective and sol.gap > 0
    assert sol.meta["lp_bound"] <= sol.lower_bound + 1e-9
    assert sol.objective == pytest.approx(sol.meta["warm_start_objective"], rel=1e-12)
    _check_plan(g, sol, b)
    # without a warm start and with no time, there is no incumbent to return
    with pytest.raises(SolverTimeoutError):
        solve_checkmate(P, time_limit=SAFETY_S, warm_start=None,
                        options={**HIGHS_SPENT, "mip_heuristic_effort": 0.0})
    # the lazy chain at its time limit: a schedule that fits on replay, no dearer than the
    # warm start, with the relaxation's bound below it and the round recorded
    lazy = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, options=HIGHS_SPENT)
    assert lazy.meta["memory_chain"] == "lazy" and lazy.status == "time_limit"
    assert float(g.costs.sum()) <= lazy.lower_bound < lazy.objective
    assert lazy.objective <= lazy.meta["warm_start_objective"] + 1e-9
    assert lazy.meta["lazy_rounds"] and lazy.meta["lazy_rounds"][-1]["status"] == "time_limit"
    _check_plan(g, lazy, b)
    with pytest.raises(SolverTimeoutError) as err:  # and with nothing to return: the bound
        solve_checkmate(P, time_limit=SAFETY_S, warm_start=None, lp_first=False,
                        options={**HIGHS_SPENT, "mip_heuristic_effort": 0.0})
    assert err.value.bound is None or err.value.bound <= lazy.objective


# ---------------------------------------------------------------------------- policy
def test_policy_registry_and_plan(chain20):
    pol = policies.get("checkmate", budget="55%", time_limit=SAFETY_S)
    plan = pol.plan(chain20)
    b = remat.resolve_budget("55%", chain20)
    plan.validate(chain20)
    rep = remat.simulate(chain20, plan)
    assert rep.peak_bytes <= b
    for key in ("policy", "budget", "status", "solve_time_s", "gap", "objective", "lower_bound"):
        assert key in plan.meta
    assert plan.meta["policy"] == "checkmate" and plan.meta["budget"] == b
    assert plan.meta["objective"] == pytest.approx(rep.compute_time_s)
    # relax="lp" never beats the exact optimum
    lp = policies.get("checkmate", relax="lp").plan(chain20, budget=b)
    assert remat.simulate(chain20, lp).compute_time_s >= rep.compute_time_s - 1e-9


def test_policy_checkpoint_all_shortcut_and_infeasible(chain20):
    pol = policies.get("checkmate")
    full = pol.plan(chain20, budget=chain20.no_remat_peak())
    assert full.meta["status"] == "optimal"
    assert np.array_equal(full.R, np.eye(chain20.n, dtype=bool))
    P = CheckmateProblem.from_graph(chain20)
    lb = P.frontier_lower_bound()
    with pytest.raises(InfeasibleBudgetError) as err:
        pol.plan(chain20, budget=lb - 1)
    mn = err.value.min_feasible_bytes
    assert mn >= lb
    ok = pol.plan(chain20, budget=mn)
    assert remat.simulate(chain20, ok).peak_bytes <= mn


def test_to_frontier_form_recuts_other_schedules():
    from remat.core.plan import plan_from_order
    from solvers.checkmate import to_frontier_form

    g = remat.chain_graph(4, sizes=[3, 1, 2, 2], fwd_costs=[1.0, 2.0, 1.0, 1.0])
    L = 4
    # forward in one step, then backward steps; f1 is dropped and recomputed from f0 for b2
    order = [list(range(L + 1))]
    bw = [2 * L - i for i in reversed(range(L))]  # b3, b2, b1, b0 node indices
    order += [[bw[0]], [1, bw[1]], [bw[2]], [bw[3]]]
    keep = np.ones((len(order), g.n), bool)
    keep[0, 1] = False  # drop f1 after the forward step
    plan = plan_from_order(g, order, keep=keep, policy="test")
    plan.validate(g)
    P = CheckmateProblem.from_graph(g)
    R, S = to_frontier_form(P, plan.R)
    fplan = remat.Plan(R=R, S=S)
    fplan.validate(g)
    assert R.shape == (g.n, g.n) and np.diag(R).all()
    assert remat.simulate(g, fplan).compute_time_s == pytest.approx(remat.simulate(g, plan).compute_time_s)
    assert schedule_memory(P, R, S)[0] == oracle_peak(g, fplan)
    # a schedule whose first computations are out of index order cannot be re-cut
    R_bad = np.zeros((2, g.n), bool)
    R_bad[0, 1:] = True
    R_bad[1, 0] = True
    assert to_frontier_form(P, R_bad) is None


def test_large_coprime_sizes_use_scaled_units_and_stay_exact():
    # sizes with gcd 1 and totals ~1e10 bytes force non-integer memory units
    sizes = [2_000_000_011, 1_000_000_007, 3_000_000_019]
    g = remat.chain_graph(3, sizes=sizes, fwd_costs=[1.0, 3.0, 2.0])
    trans = _transitions(g)
    P = CheckmateProblem.from_graph(g)
    peaks = sorted({tr[5] for tr in trans if tr[5] < g.no_remat_peak()})
    checked = 0
    for b in peaks:  # budgets exactly at attainable peaks: the tightest cases
        ref, _ = brute_force(g, b, trans)
        if math.isinf(ref):
            continue
        sol = solve_checkmate(P.with_budget(b), time_limit=SAFETY_S)
        assert sol.objective == pytest.approx(ref, rel=1e-9)
        _check_plan(g, sol, b)
        checked += 1
    assert checked >= 3


def test_warm_start_vector_satisfies_every_row():
    # U and FREE computed directly from (R, S) must satisfy the model exactly, and U's maximum
    # must equal the replayed peak (the MILP's memory model on normalised schedules)
    from solvers.checkmate import add_checkmate_core, checkmate_vector
    from solvers.milp import MilpModel

    rng = np.random.default_rng(11)
    L = 8
    g = remat.chain_graph(L, sizes=rng.integers(1, 9, L).tolist(), fwd_costs=rng.uniform(0.5, 2, L))
    P = CheckmateProblem.from_graph(g)
    for form in (Formulation(), Formulation(True, True, True)):
        for _, R, S in heuristic_schedules(P):
            peak = replay(g, remat.Plan(R=R, S=S)).peak_bytes
            m = MilpModel()
            v = add_checkmate_core(m, P.with_budget(peak), formulation=form)
            x = checkmate_vector(m, v, P, R, S)
            obj, viol = m.evaluate(x)
            assert viol <= 1e-9
            assert obj * v.cost_unit == pytest.approx(float(g.costs @ R.sum(0)))
            assert x[v.U[v.U >= 0]].max() * v.mem_unit == pytest.approx(peak)


@pytest.mark.parametrize("exact", [True, False])
def test_lp_rounding_claims_infeasibility_only_when_proven(monkeypatch, exact):
    """When no rounding and no heuristic fits, LP rounding may only raise InfeasibleBudgetError
    if the peak-minimising MILP *proved* its minimum; an unproven best peak is a time-out."""
    import solvers.checkmate.lp_round as lr

    g = remat.chain_graph(5, sizes=[3, 1, 4, 1, 5])
    budget = int(0.8 * g.no_remat_peak())
    prob = CheckmateProblem.from_graph(g, budget=budget)
    R0, S0 = checkpoint_all_schedule(prob)
    # the names lp_round looks up: no rounding, no heuristic, only a min-peak schedule over budget
    monkeypatch.setattr(lr, "min_r_given_s", lambda problem, S: (R0, S0))  # never fits
    monkeypatch.setattr(lr, "best_heuristic", lambda problem, b: None)
    monkeypatch.setattr(
        lr, "min_peak_schedule", lambda problem, left, *a, **k: (budget + 1, exact, R0, S0)
    )
    expected = InfeasibleBudgetError if exact else SolverTimeoutError
    with pytest.raises(expected):
        lr.solve_checkmate_lp(prob, time_limit=10)


def test_policy_never_returns_worse_than_a_candidate_it_tried(chain20, monkeypatch):
    """When the solver's incumbent is costlier than a schedule tried as a warm start (a
    rejected warm start, a time-out right after presolve), the cheaper schedule is returned,
    and every candidate is listed in ``meta["tried"]``."""
    import policies.checkmate as pc
    from solvers.checkmate import CheckmateSolution, schedule_cost

    b = remat.resolve_budget("65%", chain20)
    P = CheckmateProblem.from_graph(chain20, b)
    fitting = []
    for name in ("recompute_all", "sqrtn", "greedy_remat", "pebbling"):
        ff = to_frontier_form(P, policies.get(name).plan(chain20, budget=b).R)
        if ff is not None:
            R, S = normalize(P, *ff)
            if schedule_memory(P, R, S)[0] <= b:
                fitting.append((schedule_cost(P, R), R, S))
    worst = max(fitting, key=lambda c: c[0])

    def bad_solver(problem, **kw):  # a valid but poor incumbent with a weak bound
        peak = schedule_memory(problem, worst[1], worst[2])[0]
        return CheckmateSolution(worst[1], worst[2], "time_limit", worst[0],
                                 float(problem.costs.sum()), 0.5, peak, 0.0, 0.0)

    monkeypatch.setattr(pc, "solve_checkmate", bad_solver)
    plan = policies.get("checkmate", budget=b).plan(chain20)
    tried = {k: v for k, v in plan.meta["tried"].items() if v is not None}
    assert "chain_dp" in tried and "solver" in tried
    assert plan.meta["best_of"] != "solver"
    rep = remat.simulate(chain20, plan)
    assert rep.peak_bytes <= b
    assert rep.compute_time_s == pytest.approx(min(tried.values()))
    assert rep.compute_time_s < worst[0]
    # the plan of every other policy tried, planned independently, is no cheaper
    for name in ("chain_dp", "sqrtn"):
        other = policies.get(name).plan(chain20, budget=b)
        assert remat.simulate(chain20, other).compute_time_s >= rep.compute_time_s - 1e-9


def test_lns_improves_any_start_and_full_window_is_the_milp_optimum():
    """Anytime LNS (solvers.checkmate.lns): from the costliest fitting start it never gets worse,
    every schedule fits by replay, and a window covering every step proves the MILP optimum."""
    from solvers.checkmate.lns import solve_checkmate_lns

    rng = np.random.default_rng(11)
    L = 14
    g = remat.chain_graph(L, sizes=rng.integers(1, 9, L) * 1024, fwd_costs=rng.uniform(0.5, 2, L))
    b = remat.resolve_budget("40%", g)
    P = CheckmateProblem.from_graph(g, b)
    starts = []
    for name in ("recompute_all", "sqrtn", "greedy_remat", "pebbling"):
        try:
            plan = policies.get(name).plan(g, budget=b)
        except remat.errors.RematError:
            continue
        ff = to_frontier_form(P, plan.R)
        if ff is not None and schedule_memory(P, *normalize(P, *ff))[0] <= b:
            starts.append(normalize(P, *ff))
    assert starts
    R0, S0 = max(starts, key=lambda rs: float(P.costs @ rs[0].sum(0)))
    c0 = float(P.costs @ R0.sum(0))
    sol = solve_checkmate_lns(P, (R0, S0), time_limit=SAFETY_S, window=4, window_time=SAFETY_S)
    assert sol.objective <= c0 + 1e-9
    plan = remat.Plan(R=sol.R, S=sol.S)
    rep = remat.simulate(g, plan)
    assert rep.peak_bytes <= b and rep.compute_time_s == pytest.approx(sol.objective)
    assert sol.lower_bound <= sol.objective + 1e-9
    exact = solve_checkmate(P, time_limit=SAFETY_S)
    assert exact.status == "optimal"
    assert sol.lower_bound <= exact.objective * (1 + 1e-6)
    full = solve_checkmate_lns(P, (R0, S0), time_limit=SAFETY_S, window=P.n, lp_bound=False)
    assert full.status == "optimal"
    assert full.objective == pytest.approx(exact.objective, rel=1e-4)
    # the policy's anytime mode returns a plan no worse than any candidate it tried
    lp = policies.get("checkmate", budget=b, lns=True, time_limit=SAFETY_S).plan(g)
    tried = [v for v in lp.meta["tried"].values() if v is not None]
    assert remat.simulate(g, lp).compute_time_s <= min(tried) + 1e-9


@pytest.mark.parametrize("kinds", [("nodes",), ("steps", "nodes")])
def test_lns_node_windows_never_worse_and_fit(kinds):
    """Node windows (columns freed in every step) and step windows together: the LNS result is
    never costlier than its start, fits the budget by replay of the schedule, and its bound is
    below the exact optimum."""
    from solvers.checkmate.lns import solve_checkmate_lns, windows

    P = random_problem(24, 3, 0.7)
    g = remat.make_graph([f"v{i}" for i in range(P.n)], [tuple(e) for e in P.edges.tolist()],
                         out_bytes=[int(s) for s in P.sizes], time_s=[float(c) for c in P.costs])
    start = None
    for name in ("greedy_remat", "pebbling"):  # the DAG heuristics that fit this budget
        ff = to_frontier_form(P, policies.get(name).plan(g, budget=P.budget).R)
        assert ff is not None
        R, S = normalize(P, *ff)
        if schedule_memory(P, R, S)[0] <= P.budget and (
                start is None or P.costs @ R.sum(0) > P.costs @ start[0].sum(0)):
            start = (R, S)
    assert start is not None
    c0 = float(P.costs @ start[0].sum(0))
    # every neighbourhood offered has recomputation inside it, most first
    for w in (2, 4, 8):
        wins = windows(P, start[0], w, kinds)
        waste_s = start[0].astype(float) @ P.costs - P.costs
        waste_n = (start[0].sum(0) - 1.0) * P.costs
        sc = [float((waste_s if k == "steps" else waste_n)[a:b].sum()) for k, a, b in wins]
        assert all(x > 0 for x in sc) and sc == sorted(sc, reverse=True)
    sol = solve_checkmate_lns(P, start, time_limit=SAFETY_S, window=4, window_time=SAFETY_S,
                              neighbourhoods=kinds)
    assert sol.objective < c0 - 1e-6  # the start (pebbling, greedy_remat) is not optimal here
    # the only other window is the full one (the whole MILP) once the width reaches n
    assert all(s["kind"] in kinds or (s["t0"], s["t1"]) == (0, P.n)
               for s in sol.meta["lns_steps"])
    rep = replay(g, remat.Plan(R=sol.R, S=sol.S))
    assert rep.peak_bytes <= P.budget
    assert float(P.costs @ sol.R.sum(0)) == pytest.approx(sol.objective)
    exact = solve_checkmate(P, time_limit=SAFETY_S)
    assert exact.status == "optimal"
    assert sol.lower_bound <= exact.objective * (1 + 1e-6) <= sol.objective * (1 + 1e-6)
    with pytest.raises(remat.errors.SolverError):
        solve_checkmate_lns(P, start, time_limit=5, neighbourhoods=("rows",))


def test_lp_rounding_without_fallback_raises_with_its_bound():
    """At the frontier bound of this chain no LP rounding fits: the default falls back (to the
    peak-minimising MILP's schedule), heuristic_fallback=False raises SolverTimeoutError with
    the LP bound instead, and that bound is below the fallback's cost (a valid bound)."""
    from solvers.checkmate import CheckmateProblem, solve_checkmate_lp

    rng = np.random.default_rng(7)
    g = remat.chain_graph(6, sizes=rng.integers(1, 9, 6) * 100, fwd_costs=rng.uniform(1, 3, 6))
    b = CheckmateProblem.from_graph(g, None).frontier_lower_bound()
    prob = CheckmateProblem.from_graph(g, b)
    with_fb = solve_checkmate_lp(prob, time_limit=SAFETY_S)
    assert "no rounding fitted" in with_fb.meta["method"]
    with pytest.raises(SolverTimeoutError, match="no LP rounding fits") as ei:
        solve_checkmate_lp(prob, time_limit=SAFETY_S, heuristic_fallback=False)
    assert ei.value.bound is not None
    assert ei.value.bound == pytest.approx(with_fb.lower_bound)
    assert ei.value.bound <= with_fb.objective * (1 + 1e-9)


def test_warm_start_is_no_worse_than_a_fine_chain_dp_on_a_random_chain():
    """On a 50-layer chain with random sizes and costs at 30 %, ChainDP's fast-mode default
    (256 memory levels) costs 1.1754x and 4096 levels 1.1744x; the MILP is warm-started with
    the finer one, so even a MILP with almost no time returns at most that cost, and the plan
    fits on replay."""
    rng = np.random.default_rng(0)
    g = remat.chain_graph(50, sizes=rng.integers(1000, 6000, 50), fwd_costs=rng.uniform(0.5, 2, 50))
    b = int(0.3 * g.no_remat_peak())
    fine = policies.get("chain_dp", max_levels=4096).plan(g, budget=b)
    p = policies.get("checkmate", time_limit=2.0).plan(g, budget=b)
    cost = lambda q: float(g.costs @ q.R.sum(0))  # noqa: E731
    assert replay(g, p, strict=True).peak_bytes <= b
    assert cost(p) <= cost(fine) * (1 + 1e-9), (cost(p) / g.costs.sum(), cost(fine) / g.costs.sum())


def test_lazy_memory_chain_equals_the_full_model():
    """The lazily chained MILP (relaxations without the U/FREE rows, the chain added on the
    steps whose replayed peak is over) proves the full model's optimum on random DAGs at
    budgets between their smallest feasible one and the no-remat peak, and its schedule fits
    on replay; some instances need a second round (the relaxation alone overshoots), and the
    overshooting schedules repaired on the way are schedules (no cheaper than the optimum)."""
    from solvers.checkmate import min_feasible_budget

    rounds, repaired = [], []
    for seed in (1, 2, 3):  # (seed 0's 16-node DAG at 50 % alone took 6 s: 4 rounds, 3 repairs)
        for n in (12, 14, 16):
            P = random_problem(n, 100 * seed + n, 1.0)
            top, lo = P.budget, min_feasible_budget(P)[0]
            for frac in (0.15, 0.5):
                Pb = P.with_budget(lo + int(frac * (top - lo)))
                full = solve_checkmate(Pb, time_limit=SAFETY_S, lp_first=False,
                                       lazy_memory=False, warm_start=None)
                lazy = solve_checkmate(Pb, time_limit=SAFETY_S, lp_first=False, warm_start=None)
                assert full.status == lazy.status == "optimal"
                assert lazy.objective == pytest.approx(full.objective, rel=2e-4)
                assert oracle_schedule_peak(Pb, lazy.R, lazy.S) == lazy.peak_bytes <= Pb.budget
                assert lazy.objective == pytest.approx(float(Pb.costs @ lazy.R.sum(0)))
                if lazy.meta.get("memory_chain") == "lazy":
                    rounds.append(len(lazy.meta["lazy_rounds"]))
                    for r in lazy.meta["lazy_rounds"]:  # overshooting schedules repaired
                        if r.get("repair", {}).get("objective") is not None:
                            repaired.append(r["repair"]["objective"] / full.objective)
    assert len(rounds) >= 12 and max(rounds) >= 2, rounds
    assert repaired and min(repaired) >= 1 - 1e-6, repaired


@pytest.mark.parametrize("model", ["nnx", "linen-random-width"])
def test_lazy_memory_policy_on_models_we_did_not_write(model):
    """Checkmate with the memory chain added lazily (the default) and whole, on a 10-layer Flax
    nnx MLP and a 14-layer random-width Flax linen MLP (one stage per layer), where schedules
    recompute: both prove the same optimum; the plan through remat.value_and_grad (the graph
    extracted again, warm-started) is that optimum, gives jax's value and gradients (rtol 1e-5) and
    keeps its saved residual bytes within the plan's, or warns; the executor runs it with jax's
    gradients and measured live bytes within 5 % of the replay."""
    from helpers.dropin import assert_residuals_within_plan_or_warned

    loss, args, g, b = mlp_we_did_not_write(model)
    lazy, full = plan_we_did_not_write(model), plan_we_did_not_write(model, lazy_memory=False)
    assert lazy.meta["memory_chain"] == "lazy" and "memory_chain" not in full.meta
    assert lazy.meta["status"] == full.meta["status"] == "optimal"
    assert lazy.meta["objective"] == pytest.approx(full.meta["objective"], rel=2e-4)
    assert lazy.meta["objective"] > g.costs.sum() * (1 + 1e-3)  # it recomputes
    assert replay(g, lazy).peak_bytes <= b
    ap, fid = dropin_we_did_not_write(model)
    assert ap.plan.meta["memory_chain"] == "lazy" and ap.plan.meta["status"] == "optimal"
    # the drop-in runs the lazy policy again: its optimum is checked against the whole model's
    assert ap.plan.meta["objective"] == pytest.approx(full.meta["objective"], rel=2e-4)
    assert_residuals_within_plan_or_warned(ap, fid)
    # the op-by-op executor's measured live bytes: within 5 % of the replay, and the budget
    from helpers.checks import run_and_check

    stats, _ = run_and_check(loss, *args, g, lazy)
    assert stats.peak_bytes <= b * 1.05


@pytest.mark.parametrize("steps", [(-1,), (99,), (0.5,), ("a",)])
def test_chain_steps_out_of_range_is_a_typed_error(steps):
    from solvers.checkmate import add_checkmate_core
    from solvers.milp import MilpModel

    P = random_problem(8, 1, 1.0)
    with pytest.raises(SolverError, match="chain_steps"):
        add_checkmate_core(MilpModel(), P, formulation=Formulation(chain_steps=steps))
