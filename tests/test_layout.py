"""remat.layout: lifetimes, the layout validator, bounds, and the placements."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from helpers.event_oracle import oracle_peak
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
import remat
from remat.core import layout
from remat.core.errors import InvalidPlanError, UnknownNameError

# Six allocations [start, end] (inclusive event indices) and sizes, placed by hand below.
IV = np.array([[0, 9], [1, 3], [2, 9], [3, 4], [4, 9], [5, 9]])
SIZES = np.array([1, 3, 1, 2, 4, 2])


def collides(iv, sizes, off) -> bool:
    """Plain pairwise check, independent of layout.validate."""
    for a, b in itertools.combinations(range(len(sizes)), 2):
        both_live = iv[a][0] <= iv[b][1] and iv[b][0] <= iv[a][1]
        apart = off[a] + sizes[a] <= off[b] or off[b] + sizes[b] <= off[a]
        if both_live and sizes[a] and sizes[b] and not apart:
            return True
    return False


def test_first_fit_by_hand():
    # a0 -> [0,1); a1 -> [1,4); a2 -> [4,5); a3 (a1 still live at 3) -> top [5,7);
    # a4 (size 4; gap [1,4) too small) -> top [7,11); a5 (a3 gone): gaps [1,4) and [5,7) -> 1
    off = layout.first_fit(IV, SIZES)
    assert off.tolist() == [0, 1, 4, 5, 7, 1]
    assert layout.arena_size(off, SIZES) == 11
    # live bytes: events 4..9 hold a0, a2, a4 and a3 or a5: 1 + 1 + 4 + 2 = 8
    assert layout.max_live_lower_bound(IV, SIZES) == 8
    assert layout.fragmentation(IV, SIZES, off) == pytest.approx(11 / 8 - 1)
    layout.validate(IV, SIZES, off)


def test_best_fit_takes_the_tightest_gap():
    # as first fit, except a5 goes into the exact-size gap [5,7)
    assert layout.best_fit(IV, SIZES).tolist() == [0, 1, 4, 5, 7, 5]


def test_greedy_by_size_by_hand():
    # order a4, a1, a3, a5, a0, a2: a4 -> 0; a1 (not live with a4) -> 0; a3 (with a4, a1) -> 4;
    # a5 (with a4 only) -> 4; a0 (with all) -> 6; a2 -> 7.  Arena 8 = max live: no fragmentation.
    off = layout.greedy_by_size(IV, SIZES)
    assert off.tolist() == [6, 0, 7, 4, 0, 4]
    assert layout.arena_size(off, SIZES) == 8 == layout.max_live_lower_bound(IV, SIZES)
    assert layout.fragmentation(IV, SIZES, off) == 0.0


def test_overlapping_layout_is_rejected():
    with pytest.raises(InvalidPlanError, match="overlaps"):
        layout.validate(IV, SIZES, np.zeros(6, dtype=np.int64))
    off = layout.first_fit(IV, SIZES)
    off[5] = 5  # [5,7): a3 there ended at event 4, a5 starts at 5
    layout.validate(IV, SIZES, off)
    off[5] = 6  # [6,8) overlaps a4's [7,11) while both live
    msg = r"allocation 4 at \[7, 11\) overlaps allocation 5 at \[6, 8\), both live at event 5"
    with pytest.raises(InvalidPlanError, match=msg):
        layout.validate(IV, SIZES, off)
    with pytest.raises(InvalidPlanError, match="offsets"):
        layout.validate(IV, SIZES, off[:3])
    with pytest.raises(InvalidPlanError, match="non-negative"):
        layout.validate(IV, SIZES, -np.ones(6, dtype=np.int64))


@st.composite
def lifetimes(draw):
    A = draw(st.integers(0, 40))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 60, A)
    end = start + rng.integers(0, 25, A)
    sizes = rng.integers(0, 50, A) * rng.choice([1, 64], A)
    return np.stack([start, end], axis=1).reshape(-1, 2), sizes


PLACEMENTS = [
    layout.first_fit,
    layout.best_fit,
    layout.greedy_by_size,
    # Melon-style: longest lifetime first, lowest non-colliding offset, through the engine
    lambda iv, s: layout.place(iv, s, np.argsort(-(iv[:, 1] - iv[:, 0]), kind="stable")),
    lambda iv, s: layout.place(iv, s, np.arange(len(s))[::-1], fit="best"),
]


@settings(max_examples=150, deadline=None)
@given(lifetimes())
def test_every_placement_is_valid_and_above_the_bound(case):
    iv, sizes = case
    bound = layout.max_live_lower_bound(iv, sizes)
    for place in PLACEMENTS:
        off = place(iv, sizes)
        layout.validate(iv, sizes, off)
        assert not collides(iv, sizes, off)
        assert layout.arena_size(off, sizes) >= bound
        assert layout.fragmentation(iv, sizes, off) >= 0.0


@settings(max_examples=100, deadline=None)
@given(lifetimes(), st.sampled_from(["first", "best"]))
def test_online_sweep_equals_the_general_engine(case, fit):
    """In allocation order the live-block sweep and the all-pairs engine place identically."""
    iv, sizes = case
    order = np.argsort(iv[:, 0], kind="stable")
    assert np.array_equal(
        layout._place_online(iv, sizes, order, fit), layout._place_offline(iv, sizes, order, fit)
    )


@settings(max_examples=150, deadline=None)
@given(lifetimes(), st.integers(0, 2**31))
def test_validator_agrees_with_pairwise_check(case, seed):
    iv, sizes = case
    rng = np.random.default_rng(seed)
    off = rng.integers(0, max(int(sizes.sum()), 1) // 2 + 1, len(sizes))
    try:
        layout.validate(iv, sizes, off)
        ok = True
    except InvalidPlanError:
        ok = False
    assert ok == (not collides(iv, sizes, off))


def test_validator_on_many_allocations_live_together():
    rng = np.random.default_rng(0)
    A = 3000
    iv = np.stack([np.arange(A), np.arange(A) + A], axis=1)  # all pairwise live together
    sizes = rng.integers(1, 5, A)
    off = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    layout.validate(iv, sizes, off)
    off[-1] = off[0]
    with pytest.raises(InvalidPlanError, match=f"allocation 0 .*overlaps allocation {A - 1}"):
        layout.validate(iv, sizes, off)


def test_max_live_bound_of_an_event_program_is_its_peak():
    g = remat.chain_graph(6, sizes=[3, 1, 4, 1, 5, 9])
    for plan in (policies.checkpoint_all_plan(g), policies.get("sqrtn").plan(g)):
        events = plan.validate(g)
        lt = layout.lifetimes(events)
        assert len(lt.sizes) == events.num_allocs == plan.R.sum()
        assert layout.max_live_lower_bound(lt.intervals, lt.sizes) == events.peak_bytes
        assert (lt.intervals[:, 0] < lt.intervals[:, 1]).all()
        assert lt.sizes.tolist() == g.sizes[lt.node].tolist()


def test_recomputed_value_gets_one_allocation_per_computation():
    g = remat.chain_graph(4, sizes=1)
    plan = policies.get("recompute_all").plan(g)
    lt = layout.lifetimes(plan.validate(g))
    counts = np.bincount(lt.node, minlength=g.n)
    assert counts.tolist() == plan.compute_counts().tolist()


@pytest.mark.parametrize("placement", ["first_fit", "best_fit", "greedy_by_size"])
def test_allocate_fills_offsets_and_simulate_reports_the_arena(placement):
    g = remat.chain_graph(8, sizes=[5, 1, 7, 2, 8, 3, 6, 4])
    plan = policies.get("sqrtn").plan(g)
    laid = layout.allocate(g, plan, placement=placement)
    assert laid.offsets.shape == (int(plan.R.sum()),)
    assert laid.meta["layout"] == placement
    laid.validate(g)
    rep = remat.simulate(g, laid)
    assert rep.peak_bytes == oracle_peak(g, plan)  # offsets change no residency
    lt = layout.lifetimes(plan.validate(g))
    top = max(o + s for o, s in zip(laid.offsets.tolist(), lt.sizes.tolist()))  # by hand
    assert rep.arena_bytes == laid.meta["arena_bytes"] == top >= rep.peak_bytes
    assert rep.fragmentation == pytest.approx(rep.arena_bytes / rep.peak_bytes - 1)


def test_simulate_without_offsets_uses_a_default_layout():
    g = remat.chain_graph(5, sizes=[2, 9, 1, 7, 3])
    plan = policies.checkpoint_all_plan(g)
    rep = remat.simulate(g, plan)
    lt = layout.lifetimes(plan.validate(g))
    assert rep.arena_bytes == layout.arena_size(layout.best_fit(lt.intervals, lt.sizes), lt.sizes)
    assert rep.fragmentation >= 0.0
    assert remat.simulate(g, plan, placement="greedy_by_size").arena_bytes >= rep.peak_bytes
    skipped = remat.simulate(g, plan, placement=None)
    assert skipped.arena_bytes is None and skipped.fragmentation is None


def test_plan_validate_checks_offsets():
    g = remat.chain_graph(3, sizes=[4, 2, 3])
    laid = layout.allocate(g, policies.checkpoint_all_plan(g))
    with pytest.raises(InvalidPlanError, match="overlaps"):
        dataclasses.replace(laid, offsets=np.zeros_like(laid.offsets)).validate(g)
    with pytest.raises(InvalidPlanError, match="offsets for"):
        dataclasses.replace(laid, offsets=laid.offsets[:-1]).validate(g)
    with pytest.raises(InvalidPlanError, match="1-D integer"):
        dataclasses.replace(laid, offsets=np.zeros((2, 2)))
    with pytest.raises(InvalidPlanError):
        remat.simulate(g, dataclasses.replace(laid, offsets=np.zeros_like(laid.offsets)))


def test_custom_and_unknown_placements():
    g = remat.chain_graph(3, sizes=[4, 2, 3])
    plan = policies.checkpoint_all_plan(g)

    def stacked(iv, sizes):  # never reuses memory: always valid, arena = total bytes
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    laid = layout.allocate(g, plan, placement=stacked)
    assert laid.meta["layout"] == "stacked"
    assert laid.meta["arena_bytes"] == int(g.sizes.sum())

    def broken(iv, sizes):
        return np.zeros(len(sizes), dtype=np.int64)

    with pytest.raises(InvalidPlanError, match="overlaps"):
        layout.allocate(g, plan, placement=broken)
    with pytest.raises(UnknownNameError):
        layout.allocate(g, plan, placement="tetris")
