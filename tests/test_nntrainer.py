"""NNTrainer: execution orders, lifespans and merges, planners, and the swap policy end to end."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from helpers.event_oracle import oracle_peak
from helpers.mlp_models import mlp_setup, relu_mlp_loss

import policies
import remat
from policies.nntrainer import NNTrainer
from remat.core.errors import InfeasibleBudgetError, InvalidPlanError
from remat.core.layout import PLACEMENTS, max_live_lower_bound, validate
from solvers.nntrainer_plan import (
    AG,
    CD,
    CG,
    INPLACE,
    OTHER,
    PLANNERS,
    POOL,
    VIEW,
    WEIGHTED,
    LayerChain,
    basic,
    execution_orders,
    lifespans,
    optimized_v1,
    planner_table,
    residency,
    swap_latency,
)


def test_execution_orders_reverse_backward_index():
    eo = execution_orders(3)  # notes §2.2: L0 F=0 CG=9 CD=10 AG=11, ..., L2 F=2 CG=3
    assert eo.tolist() == [[0, 9, 10, 11], [1, 6, 7, 8], [2, 3, 4, 5]]
    assert sorted(eo.ravel().tolist()) == list(range(12))
    clip = execution_orders(3, grad_clip=True)
    assert clip[:, CG].tolist() == [7, 5, 3] and (clip[:, CD] == clip[:, CG] + 1).all()
    assert clip[:, AG].tolist() == [9, 10, 11]
    nt = execution_orders(3, [True, False, True])
    assert nt[1, CG] == nt[1, CD] == nt[1, AG] == 6 and nt[1, 0] == 1  # F


def test_fig5_merges():
    """Conv (weighted) -> sigmoid (in place) -> flatten (view): only X0, X1, D3, W0, dW0 need
    memory, with X0 over EOs {0, 9} and X1 (X2, X3 merged in) over {0, 1, 2, 7} (+ the loss's
    read of the output at EO 3)."""
    ch = LayerChain(4, np.array([8, 8, 8]), np.array([2, 0, 0]), np.array([WEIGHTED, INPLACE, VIEW]))
    t = lifespans(ch)
    assert sorted(t.names) == ["D3", "W0", "X0", "X1", "dW0"]
    at = dict(zip(t.names, range(len(t.names))))
    assert t.eos[at["X0"]].tolist() == [0, 9]
    assert t.eos[at["X1"]].tolist() == [0, 1, 2, 3, 7]
    assert sorted(t.members[at["X1"]]) == ["X1", "X2", "X3"]
    assert sorted(t.members[at["D3"]]) == ["D1", "D2", "D3"]
    assert t.eos[at["dW0"]].tolist() == [9, 11]
    assert t.intervals[at["W0"]].tolist() == [0, 11] and t.is_weight[at["W0"]]
    # two in-place activations in a row: the first one's backward reads its output, so the
    # second may not overwrite it (modify-view refused, a fresh tensor instead)
    t2 = lifespans(LayerChain(4, np.array([8, 8]), np.array([0, 0]), np.array([INPLACE, INPLACE])))
    assert "X2" in t2.names and "X1" not in t2.names
    unmerged = lifespans(ch, merge=False)
    assert len(unmerged.names) == 9


def _random_chain(rng, n):
    kind = rng.choice([WEIGHTED, INPLACE, VIEW, OTHER], size=n, p=[0.4, 0.3, 0.1, 0.2])
    kind[0] = WEIGHTED
    wb = np.where(kind == WEIGHTED, rng.integers(1, 50, size=n), 0)
    return LayerChain(int(rng.integers(1, 100)), rng.integers(1, 100, size=n), wb, kind,
                      rng.random(n) > 0.2)


@pytest.mark.parametrize("seed", range(8))
def test_planners_valid_and_ordered(seed):
    rng = np.random.default_rng(seed)
    t = lifespans(_random_chain(rng, int(rng.integers(2, 30))), grad_clip=bool(seed % 2))
    bound = max_live_lower_bound(t.intervals, t.sizes)
    table = planner_table(t.intervals, t.sizes)
    for fn in PLANNERS.values():
        validate(t.intervals, t.sizes, fn(t.intervals, t.sizes))
    assert table["bound"] == bound
    assert table["basic"] == int(t.sizes.sum()) >= table["optimized_v1"] >= bound
    assert table["first_fit"] >= bound and table["optimized_v3"] >= bound
    # random interval sets too (not only chains)
    iv = np.sort(rng.integers(0, 40, size=(60, 2)), axis=1)
    s = rng.choice([4, 8, 16], size=60)
    off = optimized_v1(iv, s)
    validate(iv, s, off)
    assert (off + s).max() >= max_live_lower_bound(iv, s)
    assert (basic(iv, s) + s).max() == s.sum()
    assert PLACEMENTS["nntrainer_v1"] is optimized_v1


def test_swap_latency_model():
    c = [1.0, 1.0, 1.0, 1.0]
    sync = swap_latency(c, ([2], [2], [0.5]), ([1], [1], [0.25]))
    assert sync == pytest.approx(4.75)
    early = swap_latency(c, ([1], [2], [0.5]), ([0], [1], [0.25]))  # hidden behind compute
    assert early == pytest.approx(4.0)
    late = swap_latency(c, ([1], [2], [1.5]), ([], [], []))
    assert late == pytest.approx(4.5)


@functools.cache
def _mlp():
    params, batch = mlp_setup(6, 64, 32)
    g = remat.extract(relu_mlp_loss, params, batch, stages="module")
    return params, batch, g


def _assert_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_no_swap_layout():
    _, _, g = _mlp()
    p = NNTrainer().plan(g)
    assert not p.paging and p.R.sum() == g.n  # no recomputation
    assert p.meta["peak_bytes"] == g.no_remat_peak()
    assert p.offsets is not None and p.meta["arena_bytes"] >= p.meta["peak_bytes"]
    assert p.meta["layout"] == "nntrainer_v1"
    with pytest.raises(InfeasibleBudgetError) as e:
        NNTrainer(budget=g.no_remat_peak() - 1).plan(g)
    assert e.value.min_feasible_bytes == g.no_remat_peak()


def test_swap_plans_execute():
    params, batch, g = _mlp()
    rv, rg = jax.value_and_grad(relu_mlp_loss)(params, batch)
    none = NNTrainer().plan(g)
    pro = NNTrainer(swap=True, lookahead=1).plan(g)
    ond = NNTrainer(swap="on_demand").plan(g)
    assert none.meta["peak_bytes"] > pro.meta["peak_bytes"] >= ond.meta["peak_bytes"]
    assert pro.meta["latency_s"] <= ond.meta["latency_s"]
    assert none.meta["latency_s"] <= pro.meta["latency_s"]
    for p in (pro, ond):
        assert p.paging and p.offsets is not None
        sim = remat.simulate(g, p, device="pixel-4")
        assert oracle_peak(g, p) == p.meta["peak_bytes"]
        value, grads, stats = remat.execute(g, p, params, batch)
        _assert_close(value, rv)
        _assert_close(grads, rg)
        assert abs(stats.peak_bytes - sim.peak_bytes) <= 0.05 * sim.peak_bytes
        assert stats.bytes_paged == sim.bytes_paged == p.meta["bytes_paged"]


def test_swap_budget():
    _, _, g = _mlp()
    full = NNTrainer(swap=True, lookahead=1).plan(g)
    lo, hi = full.meta["peak_bytes"], g.no_remat_peak()
    b = (lo + hi) // 2
    p = NNTrainer(swap=True, lookahead=1, budget=b).plan(g)
    assert p.meta["peak_bytes"] <= b < hi
    assert 0 < p.meta["bytes_paged"] <= full.meta["bytes_paged"]
    with pytest.raises(InfeasibleBudgetError) as e:
        NNTrainer(swap=True, lookahead=1, budget=lo - 1).plan(g)
    assert e.value.min_feasible_bytes == lo
    assert isinstance(policies.get("nntrainer", swap="on_demand"), NNTrainer)
    with pytest.raises(InvalidPlanError):
        NNTrainer(swap="sometimes").plan(g)


def test_async_paging_same_memory_and_grads_as_sync(monkeypatch):
    """The executor's background transfers (write-behind, prefetch at the plan's page-ins)
    change nothing but timing: gradients equal jax.value_and_grad of the original, and the
    measured live-bytes timeline (a page-in counted from its start) is the synchronous one,
    within 5% of the simulator's peak.  Reads are slowed down so that page-ins are still under
    way when the next samples are taken."""
    import time

    import remat.executor as ex

    load = ex._load

    def slow_load(stored):
        time.sleep(0.02)
        return load(stored)

    monkeypatch.setattr(ex, "_load", slow_load)
    params, batch, g = _mlp()
    rv, rg = jax.value_and_grad(relu_mlp_loss)(params, batch)
    p = NNTrainer(swap=True, lookahead=2).plan(g)
    sim = remat.simulate(g, p)
    runs = {m: remat.execute(g, p, params, batch, paging=m) for m in ("async", "sync")}
    for m, (value, grads, st) in runs.items():
        _assert_close(value, rv)
        _assert_close(grads, rg)
        assert st.paging == m
        assert st.bytes_paged_out + st.bytes_paged_in == st.bytes_paged == sim.bytes_paged > 0
        assert st.bytes_paged_out == int(p.page_out.sum(0) @ g.sizes)
        assert abs(st.peak_bytes - sim.peak_bytes) <= 0.05 * sim.peak_bytes
    a, s = runs["async"][2], runs["sync"][2]
    np.testing.assert_array_equal(a.timeline["live_bytes"], s.timeline["live_bytes"])
    assert a.peak_bytes == s.peak_bytes
    assert s.page_wait_s > 0  # synchronous transfers are all waiting time
    _, _, none = remat.execute(g, NNTrainer().plan(g), params, batch)
    assert none.paging == "none" and none.bytes_paged == 0


@pytest.mark.parametrize("where", ["_store", "_load"])
def test_paging_failure_is_typed_and_threads_joined(monkeypatch, where):
    import threading

    import remat.executor as ex
    from remat.core.errors import PagingError

    params, batch, g = _mlp()
    p = NNTrainer(swap=True, lookahead=1).plan(g)

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ex, where, broken)
    with pytest.raises(PagingError) as e:
        remat.execute(g, p, params, batch, paging="async")
    assert isinstance(e.value.__cause__, OSError) and e.value.node is not None
    assert not [t for t in threading.enumerate() if t.name.startswith("remat-page")]
    with pytest.raises(PagingError):
        remat.execute(g, p, params, batch, paging="sync")
    with pytest.raises(InvalidPlanError):
        remat.execute(g, p, params, batch, paging="later")


def test_swap_layout_reflects_swap():
    """A swap plan's arena is laid out on its device lifetimes (a page-in is a new allocation):
    it shrinks with the peak (NNTrainer's V3 planner under swap, V1 without)."""
    _, _, g = _mlp()
    none = NNTrainer().plan(g)
    for kw in (dict(swap=True, lookahead=1), dict(swap="on_demand")):
        p = NNTrainer(**kw).plan(g)
        assert p.meta["layout"] == "nntrainer_v3"
        assert p.meta["peak_bytes"] <= p.meta["arena_bytes"] < none.meta["arena_bytes"]
        assert p.meta["arena_bytes"] <= 1.2 * p.meta["peak_bytes"]
        lt = remat.core.layout.lifetimes(p.validate(g))
        validate(lt.intervals, lt.sizes, p.offsets)
    assert NNTrainer(swap=True, placement="nntrainer_v1").plan(g).meta["layout"] == "nntrainer_v1"


def test_residency_bound_paper_c2_cd():
    """conv -> relu (in place) -> conv -> relu -> max-pool keeping its argmax: the residency at
    the second conv's CD is its incoming and outgoing derivatives plus its weight (the paper's
    32.14 MiB = 16 + 16 MiB + 147 KiB for vgg16's c2 at batch 64, 32x32x64)."""
    act, w1, w2, pooled = 64 * 32 * 32 * 64 * 4, (27 * 64 + 64) * 4, (576 * 64 + 64) * 4, 2**22
    ch = LayerChain(64 * 32 * 32 * 3 * 4, np.array([act, act, act, act, pooled]),
                    np.array([w1, 0, w2, 0, 0]),
                    np.array([WEIGHTED, INPLACE, WEIGHTED, INPLACE, POOL]))
    res = residency(ch)
    eo = execution_orders(ch.n)
    assert res[eo[2, CD]] == 2 * act + w2
    assert round(res[eo[2, CD]] / 2**20, 2) == 32.14
    t = lifespans(ch)
    assert "I4" in t.names  # the pool's index tensor, read at its CD
    at = dict(zip(t.names, range(len(t.names))))
    x4 = next(k for k, m in enumerate(t.members) if "X4" in m)
    assert eo[4, CD] not in t.eos[x4].tolist()  # the pool's input is not kept for its CD
    assert t.eos[at["I4"]].tolist() == [eo[4, 0], eo[4, CD]]
    assert res.max() == 2 * act + 2 * w2  # at CG of c2: its input, derivative, W and dW
