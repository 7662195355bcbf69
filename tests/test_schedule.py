"""The replay memory model (remat.core.schedule.replay, remat.simulate) against hand counts.

Every expected number below was counted by hand from the rules in :mod:`remat.core.plan`: entering
step t the live set is S[t]; a computed node allocates its output; a value is freed right after
its last reader in the step unless it is carried into S[t+1]; a resident value that is neither
read nor carried is dropped at the step start (it still counts in ``step_start_bytes``).
Sizes are distinct so every sum names exactly one live set.
"""

from __future__ import annotations

import numpy as np
import pytest

import remat
from policies import checkpoint_all_plan
from remat.core.errors import InvalidPlanError
from remat.core.schedule import replay

# x(0) -> y(1) -> z(2) -> w(3) -> v(4), plus x -> v (a long skip edge).
NAMES = ["x", "y", "z", "w", "v"]
SIZES = [8, 1, 8, 1, 2]
COSTS = [1.0, 2.0, 4.0, 8.0, 16.0]
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)]
X, Y, Z, W, V = range(5)


@pytest.fixture
def g():
    return remat.make_graph(NAMES, EDGES, out_bytes=SIZES, time_s=COSTS, name="skip5")


def plan(steps, carry):
    """steps[t]: nodes run in step t; carry[t]: the set S[t] (carry[0] must be empty)."""
    T = len(steps)
    R = np.zeros((T, 5), dtype=bool)
    S = np.zeros((T, 5), dtype=bool)
    for t, nodes in enumerate(steps):
        R[t, list(nodes)] = True
        S[t, list(carry[t])] = True
    return remat.Plan(R=R, S=S, meta={"policy": "hand"})


def test_checkpoint_all_hand_count(g):
    # step x: {x}=8; y: {x,y}=9 (x waits for v); z: {x,y,z}=17 (y read by z);
    # w: {x,z,w}=17 (y freed after z); v: {x,w,v}=11 (z freed after w).
    rep = replay(g, checkpoint_all_plan(g))
    assert rep.live_bytes.tolist() == [8, 9, 17, 17, 11]
    assert rep.node.tolist() == [0, 1, 2, 3, 4]
    # entering step t: outputs of earlier nodes still read at step >= t
    assert rep.step_start_bytes.tolist() == [0, 8, 9, 16, 9]
    assert rep.peak_bytes == 17
    assert g.no_remat_peak() == 17


def test_single_step_plan_frees_at_last_reader(g):
    rep = replay(g, plan([[X, Y, Z, W, V]], [[]]))
    assert rep.live_bytes.tolist() == [8, 9, 17, 17, 11]
    assert rep.step_start_bytes.tolist() == [0]
    assert rep.peak_bytes == 17


def test_recompute_plan_lowers_peak(g):
    # step 0 runs x, y and keeps y; step 1 runs z, w and keeps w; step 2 recomputes x, runs v.
    p = plan([[X, Y], [Z, W], [X, V]], [[], [Y], [W]])
    rep = replay(g, p)
    # x:8, y: x+y=9 (x dropped: not carried) | z: y+z=9, w: z+w=9 | x: w+x=9, v: w+x+v=11
    assert rep.live_bytes.tolist() == [8, 9, 9, 9, 9, 11]
    assert rep.step.tolist() == [0, 0, 1, 1, 2, 2]
    assert rep.node.tolist() == [X, Y, Z, W, X, V]
    assert rep.step_start_bytes.tolist() == [0, 1, 1]
    assert rep.peak_bytes == 11
    r = remat.simulate(g, p)
    assert r.peak_bytes == 11
    assert r.recomputations == 1
    assert r.compute_time_s == pytest.approx(1 + 2 + 4 + 8 + 1 + 16)
    assert r.overhead == pytest.approx(32 / 31)


def test_carried_value_counts_in_every_step_it_crosses(g):
    # x is carried through steps 1 and 2 instead of being recomputed.
    p = plan([[X, Y], [Z, W], [V]], [[], [X, Y], [X, W]])
    rep = replay(g, p)
    # x:8, y:9 | z: x+y+z=17, w: x+z+w=17 | v: x+w+v=11
    assert rep.live_bytes.tolist() == [8, 9, 17, 17, 11]
    assert rep.step_start_bytes.tolist() == [0, 9, 9]
    assert rep.peak_bytes == 17
    assert remat.simulate(g, p).recomputations == 0


def test_resident_but_unused_value_dropped_at_step_start(g):
    # y is carried into step 2 but nobody reads it there and it is not carried on: it stays to
    # the end of step 1 (w: y+z+w = 10), counts in step 2's start bytes (w + y = 2), and is gone
    # while x and v run (x: w+x = 9, v: w+x+v = 11).
    p = plan([[X, Y], [Z, W], [X, V]], [[], [Y], [Y, W]])
    rep = replay(g, p)
    assert rep.step_start_bytes.tolist() == [0, 1, 2]
    assert rep.live_bytes.tolist() == [8, 9, 9, 10, 9, 11]


def test_value_carried_across_a_step_that_does_not_read_it():
    # a(100) is carried through step 1, which runs only b(1) (b does not read a); c reads both
    # in step 2.  Step 1: start {a}=100, b runs with {a, b}=101; step 2: c with {a, b, c}=102.
    g = remat.make_graph(
        ["a", "b", "c"], [(0, 2), (1, 2)], out_bytes=[100, 1, 1], time_s=[1, 1, 1]
    )
    R = np.eye(3, dtype=bool)
    S = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0]], dtype=bool)
    rep = replay(g, remat.Plan(R=R, S=S))
    assert rep.live_bytes.tolist() == [100, 101, 102]
    assert rep.step_start_bytes.tolist() == [0, 100, 101]
    assert rep.peak_bytes == 102


def test_missing_input_is_illegal(g):
    # v runs in step 2 without x resident or recomputed.
    p = plan([[X, Y], [Z, W], [V]], [[], [Y], [W]])
    with pytest.raises(InvalidPlanError) as e:
        replay(g, p)
    assert e.value.step == 2 and e.value.node == "v"
    with pytest.raises(InvalidPlanError):
        p.validate(g)
    with pytest.raises(InvalidPlanError):
        remat.simulate(g, p)


def test_carrying_a_value_that_is_not_resident_is_illegal(g):
    # z is claimed resident entering step 1 but was never computed in step 0.
    p = plan([[X, Y], [Z, W], [X, V]], [[], [Y, Z], [W]])
    with pytest.raises(InvalidPlanError) as e:
        replay(g, p)
    assert e.value.step == 1 and e.value.node == "z"


def test_resident_before_anything_ran_is_illegal(g):
    p = plan([[X, Y, Z, W, V]], [[X]])
    with pytest.raises(InvalidPlanError) as e:
        replay(g, p)
    assert e.value.step == 0 and e.value.node == "x"


def test_node_never_computed_is_illegal(g):
    p = plan([[X, Y], [Z, W]], [[], [Y]])
    with pytest.raises(InvalidPlanError) as e:
        p.validate(g)
    assert e.value.node == "v"


def test_non_strict_replay_reports_memory_of_illegal_plan(g):
    p = plan([[X, Y], [Z, W], [V]], [[], [Y], [W]])
    rep = replay(g, p, strict=False)
    # v runs with only w (its present input) and itself: 1 + 2
    assert rep.live_bytes.tolist() == [8, 9, 9, 9, 3]


def test_chain_graph_checkpoint_all_hand_count():
    # chain_graph(2, sizes=[1, 10]): f0(1) f1(10) loss(10) b1(10) b0(1)
    # edges f0->f1, f1->loss, loss->b1, b1->b0, f0->b0, f1->b1, f0->b1.
    g = remat.chain_graph(2, sizes=[1, 10])
    assert [v.name for v in g.nodes] == ["f0", "f1", "loss", "b1", "b0"]
    rep = replay(g, checkpoint_all_plan(g))
    # f0: 1; f1: f0+f1=11; loss: f0+f1+loss=21; b1: f0+f1+loss+b1=31; b0: f0+b1+b0=12
    assert rep.live_bytes.tolist() == [1, 11, 21, 31, 12]
    assert rep.peak_bytes == 31 == g.no_remat_peak()
