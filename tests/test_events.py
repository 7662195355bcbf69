"""The event program (remat.events) against an independent oracle and by hand.

The oracle :func:`helpers.event_oracle.oracle_run` is a deliberately plain Python interpreter of
the rules written in :mod:`remat.core.plan` and :mod:`remat.core.schedule` (sets and loops, no
numpy, no code shared with ``remat.events``).  It and the event program must agree, on many
random graphs and plans, about legality, the bytes live at every compute, the step-start bytes
and the peak.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.event_oracle import oracle_peak, oracle_run
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
import remat
from remat.core import events as ev
from remat.core.errors import InvalidPlanError, RematError
from remat.core.schedule import fold, replay


# ------------------------------------------------------------------ the oracle
def check_against_oracle(g, plan) -> bool:
    """Assert the event program and the oracle agree on ``plan``; return its legality."""
    e = g.edge_array.tolist()
    mats = [None if m is None else m.tolist() for m in (plan.page_in, plan.page_out, plan.S_aux)]
    ref = oracle_run(g.n, g.sizes.tolist(), e, plan.R.tolist(), plan.S.tolist(), *mats)
    try:
        ev.lower(g, plan, strict=True)
        legal = True
    except InvalidPlanError:
        legal = False
    assert legal == ref.legal
    loose = ev.lower(g, plan, strict=False)
    rep = fold(loose)
    assert rep.live_bytes.tolist() == ref.compute_live
    assert rep.step_start_bytes.tolist() == ref.step_start
    assert rep.peak_bytes == ref.peak
    per_step = list(ref.step_start)
    for t, live in zip(rep.step.tolist(), ref.compute_live):
        per_step[t] = max(per_step[t], live)
    assert loose.step_peak_bytes.tolist() == per_step
    check_invariants(g, plan, loose)
    return legal


def check_invariants(g, plan, events) -> None:
    """Structural facts any event program has."""
    k = events.kind
    assert (np.diff(events.step) >= 0).all()
    assert (k == ev.STEP).sum() == plan.num_steps
    assert (k == ev.COMPUTE).sum() == plan.R.sum()
    delta = np.where(events.creates, events.bytes, 0) - np.where(k == ev.FREE, events.bytes, 0)
    assert np.array_equal(np.cumsum(delta), events.live)
    assert events.step_start_bytes.tolist() == (plan.S.astype(np.int64) @ g.sizes).tolist()
    # every allocation is freed exactly once, later, and the program ends empty
    made = events.alloc[events.creates]
    freed = events.alloc[k == ev.FREE]
    assert sorted(made.tolist()) == sorted(freed.tolist()) == list(range(events.num_allocs))
    freed_at = {int(events.alloc[i]): i for i in np.flatnonzero(k == ev.FREE)}
    for i in np.flatnonzero(events.creates):
        assert freed_at[int(events.alloc[i])] > i
    assert events.live[-1] == 0


# ------------------------------------------------------------------ random graphs and plans
@st.composite
def graphs(draw, max_n=8):
    n = draw(st.integers(1, max_n))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    edges = [p for p in pairs if draw(st.booleans())] if pairs else []
    sizes = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    return remat.make_graph([f"v{i}" for i in range(n)], edges, out_bytes=sizes, time_s=[1.0] * n)


def frontier_plan(g, keep_rng) -> remat.Plan:
    """A legal plan: step t runs node t after (re)running, from the resident set, whatever of
    its ancestry is missing; a random subset of what is resident at the step end is kept."""
    n = g.n
    R = np.zeros((n, n), dtype=bool)
    S = np.zeros((n, n), dtype=bool)
    for t in range(n):
        todo, seen = [t], set()
        while todo:
            v = todo.pop()
            if v in seen or S[t, v]:
                continue
            seen.add(v)
            todo.extend(g.preds[v])
        R[t, sorted(seen)] = True
        if t + 1 < n:
            S[t + 1] = (S[t] | R[t]) & (keep_rng.random(n) < 0.5)
    return remat.Plan(R=R, S=S, meta={"policy": "frontier"})


@settings(max_examples=150, deadline=None)
@given(graphs(), st.integers(0, 2**31))
def test_random_legal_plans_agree_with_oracle(g, seed):
    rng = np.random.default_rng(seed)
    plan = frontier_plan(g, rng)
    assert check_against_oracle(g, plan)
    assert check_against_oracle(g, policies.checkpoint_all_plan(g))


@settings(max_examples=200, deadline=None)
@given(graphs(), st.integers(1, 8), st.integers(0, 2**31), st.sampled_from([0.1, 0.3, 0.6]))
def test_random_matrices_agree_with_oracle(g, T, seed, p):
    """Mostly illegal plans: legality and the as-if-legal memory must agree."""
    rng = np.random.default_rng(seed)
    R = rng.random((T, g.n)) < p
    S = rng.random((T, g.n)) < p
    if rng.random() < 0.3:
        S[0] = False
    check_against_oracle(g, remat.Plan(R=R, S=S))


@settings(max_examples=150, deadline=None)
@given(graphs(), st.integers(0, 2**31), st.booleans())
def test_random_paging_agrees_with_oracle(g, seed, with_aux):
    """Page-outs/ins sprinkled over a legal plan, with S thinned where a value is paged out:
    some of these are legal POET plans, many are not."""
    rng = np.random.default_rng(seed)
    base = frontier_plan(g, rng)
    T, n = base.R.shape
    page_out = base.S & (rng.random((T, n)) < 0.3)
    S = base.S.copy()
    page_in = np.zeros_like(S)
    for t, i in zip(*np.nonzero(page_out)):
        later = [u for u in range(t + 1, T) if S[u, i]]
        if later and rng.random() < 0.7:
            back = int(rng.choice(later))
            S[t + 1 : back, i] = False
            page_in[back - 1, i] = back - 1 > t or rng.random() < 0.5
    S_aux = None
    if with_aux:
        S_aux = np.zeros_like(S)
        S_aux[1:] = np.logical_or.accumulate(page_out, axis=0)[:-1]
        S_aux &= rng.random((T, n)) < 0.9
    plan = remat.Plan(R=base.R, S=S, page_in=page_in, page_out=page_out, S_aux=S_aux)
    check_against_oracle(g, plan)


POLICY_NAMES = [
    "checkpoint_all", "recompute_all", "sqrtn", "greedy_remat", "griewank", "chain_dp", "pebbling"
]
BUDGETS = [None, "90%", "80%", "60%"]


def policy_plan(g, name, budget):
    """The policy's plan, or None where it does not apply or the budget is infeasible."""
    try:
        return policies.get(name).plan(g, budget=budget)
    except RematError:
        return None


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.integers(1, 9), min_size=6, max_size=6),
    st.sampled_from(POLICY_NAMES),
    st.sampled_from(BUDGETS),
)
def test_policy_plans_agree_with_oracle(layers, sizes, name, budget):
    g = remat.chain_graph(layers, sizes=sizes[:layers])
    plan = policy_plan(g, name, budget)
    if plan is not None:
        assert check_against_oracle(g, plan)


@settings(max_examples=30, deadline=None)
@given(
    graphs(max_n=7),
    st.sampled_from(["recompute_all", "greedy_remat", "pebbling"]),
    st.sampled_from(BUDGETS),
)
def test_policy_plans_on_dags_agree_with_oracle(g, name, budget):
    plan = policy_plan(g, name, budget)
    if plan is not None:
        assert check_against_oracle(g, plan)


def test_policy_plans_recompute():
    """The policy cases above are not vacuous: some plans recompute."""
    g = remat.chain_graph(6, sizes=[3, 1, 4, 1, 5, 9])
    names = ("greedy_remat", "chain_dp", "sqrtn", "griewank")
    plans = [policy_plan(g, name, "80%") for name in names]
    recomputing = [p for p in plans if p is not None and p.R.sum() > g.n]
    assert len(recomputing) >= 2
    for p in recomputing:
        assert check_against_oracle(g, p)


# ------------------------------------------------------------------ by hand
@pytest.fixture
def skip5():
    # x(0) -> y(1) -> z(2) -> w(3) -> v(4), plus x -> v; sizes 8 1 8 1 2 (tests/test_schedule.py)
    return remat.make_graph(
        ["x", "y", "z", "w", "v"],
        [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)],
        out_bytes=[8, 1, 8, 1, 2],
        time_s=[1.0] * 5,
    )


def steps_plan(n, steps, carry, **extra):
    T = len(steps)
    R = np.zeros((T, n), dtype=bool)
    S = np.zeros((T, n), dtype=bool)
    for t in range(T):
        R[t, list(steps[t])] = True
        S[t, list(carry[t])] = True
    return remat.Plan(R=R, S=S, **extra)


def test_recompute_plan_events_by_hand(skip5):
    # step 0 runs x, y, keeps y; step 1 runs z, w, keeps w; step 2 recomputes x and runs v.
    p = steps_plan(5, [[0, 1], [2, 3], [0, 4]], [[], [1], [3]])
    e = ev.lower(skip5, p)
    assert e.describe([v.name for v in skip5.nodes]) == [
        "t=0 step -> live 0 B",
        "t=0 compute x +8 B -> live 8 B (alloc 0)",
        "t=0 compute y +1 B -> live 9 B (alloc 1)",
        "t=0 free x -8 B -> live 1 B (alloc 0)",
        "t=1 step -> live 1 B",
        "t=1 compute z +8 B -> live 9 B (alloc 2)",
        "t=1 free y -1 B -> live 8 B (alloc 1)",
        "t=1 compute w +1 B -> live 9 B (alloc 3)",
        "t=1 free z -8 B -> live 1 B (alloc 2)",
        "t=2 step -> live 1 B",
        "t=2 compute x +8 B -> live 9 B (alloc 4)",
        "t=2 compute v +2 B -> live 11 B (alloc 5)",
        "t=2 free x -8 B -> live 3 B (alloc 4)",
        "t=2 free w -1 B -> live 2 B (alloc 3)",
        "t=2 free v -2 B -> live 0 B (alloc 5)",
    ]
    assert e.num_allocs == 6 and e.peak_bytes == 11
    assert fold(e).live_bytes.tolist() == [8, 9, 9, 9, 9, 11]
    assert replay(skip5, p).live_bytes.tolist() == [8, 9, 9, 9, 9, 11]


def test_unused_resident_value_is_freed_at_step_start_and_recompute_replaces(skip5):
    # y is carried into step 2 where nobody reads it: freed right after the step starts.
    # x is carried into step 1 and recomputed there: the old copy is freed just before.
    p = steps_plan(5, [[0, 1], [0, 2, 3], [4]], [[], [0, 1], [0, 1, 3]])
    e = ev.lower(skip5, p)
    lines = e.describe([v.name for v in skip5.nodes])
    i = lines.index("t=2 step -> live 10 B")
    assert lines[i + 1] == "t=2 free y -1 B -> live 9 B (alloc 1)"
    j = lines.index("t=1 step -> live 9 B")
    assert lines[j + 1 : j + 3] == [
        "t=1 free x -8 B -> live 1 B (alloc 0)",
        "t=1 compute x +8 B -> live 9 B (alloc 2)",
    ]
    check_against_oracle(skip5, p)


def test_paging_events_by_hand():
    # a(4) -> b(1) -> c(2) -> d(1), a -> d.  a is paged out at step 1's start, dropped from the
    # device after b reads it, and paged back in at the end of step 2 for d.
    edges = [(0, 1), (1, 2), (2, 3), (0, 3)]
    g = remat.make_graph(["a", "b", "c", "d"], edges, out_bytes=[4, 1, 2, 1], time_s=[1] * 4)
    R = np.eye(4, dtype=bool)
    S = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0]], dtype=bool)
    page_out = np.zeros_like(S)
    page_in = np.zeros_like(S)
    page_out[1, 0] = True
    page_in[2, 0] = True
    p = remat.Plan(R=R, S=S, page_out=page_out, page_in=page_in)
    assert ev.lower(g, p).describe([v.name for v in g.nodes])[2:] == [
        "t=1 step -> live 4 B",
        "t=1 page_out a 4 B -> live 4 B",
        "t=1 compute b +1 B -> live 5 B (alloc 1)",
        "t=1 free a -4 B -> live 1 B (alloc 0)",
        "t=2 step -> live 1 B",
        "t=2 compute c +2 B -> live 3 B (alloc 2)",
        "t=2 free b -1 B -> live 2 B (alloc 1)",
        "t=2 page_in a +4 B -> live 6 B (alloc 3)",
        "t=3 step -> live 6 B",
        "t=3 compute d +1 B -> live 7 B (alloc 4)",
        "t=3 free a -4 B -> live 3 B (alloc 3)",
        "t=3 free c -2 B -> live 1 B (alloc 2)",
        "t=3 free d -1 B -> live 0 B (alloc 4)",
    ]
    assert check_against_oracle(g, p)
    # a also stays on the device through step 2: the page-in moves bytes but allocates nothing
    S2 = S.copy()
    S2[2, 0] = True
    p2 = dataclasses.replace(p, S=S2)
    assert "t=2 page_in a 4 B -> live 6 B" in ev.lower(g, p2).describe([v.name for v in g.nodes])
    assert check_against_oracle(g, p2)
    # a page-in in the step of the page-out is illegal (storage holds it from the next step)
    bad = np.zeros_like(S)
    bad[1, 0] = True
    with pytest.raises(InvalidPlanError, match="secondary storage"):
        ev.lower(g, dataclasses.replace(p, page_in=bad))
    assert not check_against_oracle(g, dataclasses.replace(p, page_in=bad))


def test_lower_arrays_without_a_graph_names_indices():
    sizes = np.array([3, 5, 7])
    edges = np.array([[0, 1], [1, 2]])
    R = np.eye(3, dtype=bool)
    S = np.zeros((3, 3), dtype=bool)
    S[1, 0] = True  # 0 is carried but 2 needs 1, which is not carried
    with pytest.raises(InvalidPlanError) as ei:
        ev.lower_arrays(sizes, edges, R, S)
    assert ei.value.step == 2 and ei.value.node == 2 and "input 1 is not resident" in str(ei.value)
    e = ev.lower_arrays(sizes, edges, R, S, strict=False, names=["p", "q", "r"])
    assert fold(e).live_bytes.tolist() == [3, 8, 7]


def test_first_error_is_the_earliest_in_execution_order():
    # step 1 reads a missing input, step 2 is carried illegally: the step-1 error wins, and a
    # carry found at the end of step 0 beats a missing input in step 1.
    sizes = np.ones(3, dtype=np.int64)
    edges = np.array([[0, 1], [1, 2]])
    R = np.eye(3, dtype=bool)
    S = np.zeros((3, 3), dtype=bool)
    S[2, 0] = True  # 0 carried into step 2 without being resident (dropped at step 1)
    with pytest.raises(InvalidPlanError) as ei:
        ev.lower_arrays(sizes, edges, R, S)
    assert (ei.value.step, ei.value.node) == (1, 1)
    S[1, 2] = True  # 2 carried into step 1 before it ever ran: found at the end of step 0
    with pytest.raises(InvalidPlanError) as ei:
        ev.lower_arrays(sizes, edges, R, S)
    assert (ei.value.step, ei.value.node) == (1, 2) and "carried" in str(ei.value)


def test_validate_returns_the_event_program(skip5):
    p = policies.checkpoint_all_plan(skip5)
    e = p.validate(skip5)
    assert isinstance(e, ev.Events)
    assert e.peak_bytes == skip5.no_remat_peak() == oracle_peak(skip5, p)


def test_empty_graph_and_steps_without_computes():
    g = remat.make_graph([], [], out_bytes=[], time_s=[])
    e = ev.lower(g, remat.Plan(R=np.zeros((0, 0), bool), S=np.zeros((0, 0), bool)))
    assert len(e) == 0 and e.peak_bytes == 0 and e.num_allocs == 0
    g = remat.make_graph(["a", "b"], [(0, 1)], out_bytes=[2, 3], time_s=[1, 1])
    R = np.array([[1, 0], [0, 0], [0, 1]], dtype=bool)
    S = np.array([[0, 0], [1, 0], [1, 0]], dtype=bool)
    p = remat.Plan(R=R, S=S)
    assert check_against_oracle(g, p)
    assert replay(g, p).step_start_bytes.tolist() == [0, 2, 2]


def test_lower_arrays_rejects_arrays_of_another_graph():
    sizes, edges = np.array([1, 2]), np.array([[0, 1]])
    R = np.eye(2, dtype=bool)
    S = np.zeros((2, 2), dtype=bool)
    with pytest.raises(InvalidPlanError, match="columns"):
        ev.lower_arrays(sizes, edges, np.ones((2, 3), bool), np.zeros((2, 3), bool))
    with pytest.raises(InvalidPlanError, match="one shape"):
        ev.lower_arrays(sizes, edges, R, S[:1])
    with pytest.raises(remat.errors.InvalidGraphError, match="edge endpoint"):
        ev.lower_arrays(sizes, np.array([[0, 5]]), R, S)
    with pytest.raises(remat.errors.InvalidGraphError, match="negative"):
        ev.lower_arrays(np.array([1, -2]), edges, R, S)
    from solvers.bounds import frontier_lower_bound

    assert frontier_lower_bound(sizes, edges) == 3  # node 1 runs with node 0's output live
    with pytest.raises(remat.errors.InvalidGraphError):
        frontier_lower_bound(sizes, np.array([[0, 5]]))
    with pytest.raises(remat.errors.InvalidGraphError):
        frontier_lower_bound(np.array([1, -2]), edges)
