"""Tests of the measured device model (issue #33, item 4): :func:`remat.devices.calibrate`,
the per-kernel launch cost, contraction rates by primitive, the datasheet profiles of the H100
and A100 and :func:`remat.devices.for_backend`.

No assertion depends on the machine's speed: the measured numbers are checked for units and
for consistency with the wall time that measured them; how long a calibration takes is
``experiments/calibrate_report.py``'s question (``experiments/results/calibrate_cpu.json``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest
from helpers.limits import SAFETY_S, pinned_host_profile
from helpers.mlp_models import mlp_setup, relu_mlp_loss

import policies
import remat
from remat import devices
from remat.devices import DeviceProfile, DeviceProfileError

PLATFORM = jax.devices()[0].platform
OLD_STATIC = ["cortex-m0", "cortex-m4", "cortex-a72", "cortex-a72-nocache", "jetson-tx2",
              "pixel-4", "rtx-3090"]


@pytest.fixture(scope="module")
def prof() -> DeviceProfile:
    return devices.calibrate()


def _graph(flops, sizes, params=None, edges=(), prims=None):
    n = len(flops)
    meta = {} if prims is None else {"node_primitives": tuple(tuple(p) for p in prims)}
    return remat.make_graph([f"n{i}" for i in range(n)], list(edges), out_bytes=sizes,
                            time_s=[0.0] * n, flops=flops, param_bytes=params, meta=meta)


# ----------------------------------------------------------------------------- calibrate
def test_calibrate_returns_a_valid_profile_with_every_measurement(prof):
    assert isinstance(prof, DeviceProfile) and prof.name == f"calibrated-{PLATFORM}"
    for rate in (prof.flops_per_s, prof.matmul_flops_per_s, prof.conv_flops_per_s,
                 prof.memory_bandwidth):
        assert math.isfinite(rate) and 1e6 < rate < 1e17  # a unit slip is off by 1e3 or more
    assert prof.flops_per_s == prof.matmul_flops_per_s
    assert math.isfinite(prof.launch_s) and prof.launch_s >= 0
    assert prof.launch_s < 1e-2  # seconds, not microseconds
    cal = dict(prof.calibration)
    for key in ("matmul_flops_per_s", "conv_flops_per_s", "elementwise_bytes_per_s", "launch_s",
                "dispatch_s", "chain_call_s", "host_link_measured", "matmul_n", "conv_flops",
                "stream_bytes", "passes", "chain", "repeats", "wall_s", "matmul_call_1_s",
                "matmul_call_k_s", "conv_call_1_s", "conv_call_k_s", "stream_call_1_s",
                "stream_call_k_s"):
        assert key in cal, key
        assert math.isfinite(cal[key]) and cal[key] >= 0, key
    assert cal["wall_s"] > 0 and all(isinstance(v, float) for v in cal.values())
    assert cal["matmul_flops_per_s"] == prof.matmul_flops_per_s
    assert cal["conv_flops_per_s"] == prof.conv_flops_per_s
    assert cal["elementwise_bytes_per_s"] == prof.memory_bandwidth
    assert cal["launch_s"] == prof.launch_s
    # units: a matmul/conv pass (work over rate) is the slope between calls of 1 and `passes`
    # passes, or the longer call's mean pass, so never longer than that call; the stream's
    # slope is over half and all of its bytes, so its full pass is at most twice the longer
    # call. Each longer call was timed at least five times inside wall_s (five samples sum to
    # at least three times their median)
    t_mm = 2.0 * cal["matmul_n"] ** 3 / cal["matmul_flops_per_s"]
    t_conv = cal["conv_flops"] / cal["conv_flops_per_s"]
    t_stream = cal["stream_bytes"] / cal["elementwise_bytes_per_s"]
    tol = 1 + 1e-9
    assert t_mm <= cal["matmul_call_k_s"] * tol and t_conv <= cal["conv_call_k_s"] * tol
    assert t_stream <= 2 * cal["stream_call_k_s"] * tol
    assert 3 * (cal["matmul_call_k_s"] + cal["conv_call_k_s"] + cal["stream_call_k_s"]) \
        <= cal["wall_s"]
    assert cal["dispatch_s"] <= cal["wall_s"] and cal["chain_call_s"] <= cal["wall_s"]
    assert prof.source.startswith("calibrate() on")
    assert prof.name in prof.summary()


def test_calibrate_is_cached_per_backend(prof):
    assert devices.calibrate() is prof
    assert devices.calibrate(backend=PLATFORM) is prof
    assert devices.calibrate(repeats=5) is prof


@pytest.mark.skipif(PLATFORM != "cpu", reason="the CPU's host-link defaults")
def test_calibrated_cpu_keeps_the_documented_paging_defaults(prof):
    """On the CPU the device memory is host memory: no host link is measured, and the paging
    target is host_profile's assumed disk."""
    cal = dict(prof.calibration)
    assert cal["host_link_measured"] == 0.0 and cal["transfer_bytes"] == 0.0
    assert "device_to_host_bytes_per_s" not in cal
    assert (prof.storage_read_bw, prof.storage_write_bw) == (2e9, 1e9)
    assert prof.storage_latency_s == prof.write_latency_s == 1e-4
    assert prof.ram_bytes == devices._ram_bytes()


def test_a_plan_on_a_graph_extracted_with_the_calibrated_profile(prof):
    """``extract(..., device=calibrate())`` costs the graph with the measured profile, and a
    plan's modelled time is the profile's node times over its (re)computations."""
    params, batch = mlp_setup(depth=8, width=64, batch=32)
    g = remat.extract(relu_mlp_loss, params, batch, device=prof)
    assert g.meta["device"] == prof.name
    t, e = prof.node_costs(g)
    np.testing.assert_array_equal(g.costs, t)
    np.testing.assert_array_equal(g.energies, e)
    # contraction nodes run at the measured matmul rate, the others at flops_per_s
    rates = prof.flop_rates(g)
    has_dot = np.array(["dot_general" in p for p in g.meta["node_primitives"]])
    assert has_dot.any()
    np.testing.assert_array_equal(rates[has_dot], prof.matmul_flops_per_s)
    assert (t >= prof.launch_s).all()
    plan = policies.get("checkmate", budget="60%", time_limit=SAFETY_S).plan(g)
    assert plan.meta["status"] == "optimal"
    rep = remat.simulate(g, plan)
    want = float(plan.R.sum(axis=0) @ t)
    assert rep.compute_time_s == pytest.approx(want, rel=1e-12)
    assert rep.compute_time_s >= float(t.sum())
    assert remat.simulate(g, plan, prof).compute_time_s == pytest.approx(want, rel=1e-12)
    assert rep.peak_bytes <= math.ceil(0.6 * g.no_remat_peak())


# ------------------------------------------------------------------------------- launch_s
def test_launch_s_adds_exactly_launch_s_to_each_working_node():
    base = devices.get("pixel-4")
    q = dataclasses.replace(base, launch_s=3e-6)
    flops = [1e9, 0.0, 5e3, 0.0]
    sizes = [4_000_000, 8, 1_000, 16]
    g = _graph(flops, sizes, edges=[(0, 2), (1, 3)])
    t0, e0 = base.node_costs(g)
    t1, e1 = q.node_costs(g)
    np.testing.assert_allclose(t1 - t0, 3e-6, rtol=1e-9, atol=0)
    np.testing.assert_allclose(e1 - e0, 3e-6 * base.compute_watts, rtol=1e-9, atol=0)
    # an operation that moves no bytes and does no FLOPs launches nothing
    t, _ = q.op_costs([0.0, 0.0, 1.0], [0.0, 4.0, 0.0])
    assert t[0] == 0.0 and t[1] == pytest.approx(4.0 / base.memory_bandwidth + 3e-6)
    assert t[2] == pytest.approx(1.0 / base.flops_per_s + 3e-6)
    # POET's FLOP model is POET's formula: no launch cost
    np.testing.assert_array_equal(q.node_costs(g, model="poet")[0],
                                  base.node_costs(g, model="poet")[0])


def test_flop_rates_by_primitive():
    p = dataclasses.replace(devices.get("cortex-a72"), matmul_flops_per_s=1e11,
                            conv_flops_per_s=1e10)
    flops = [1e9] * 5
    prims = [("dot_general", "add"), ("conv_general_dilated",), ("exp", "mul"),
             ("dot_general", "conv_general_dilated"), ("scan",)]
    g = _graph(flops, [4] * 5, prims=prims)
    np.testing.assert_array_equal(p.flop_rates(g), [1e11, 1e10, 2e9, 1e10, 2e9])
    t, _ = p.node_costs(g)
    np.testing.assert_allclose(t, [1e-2, 1e-1, 0.5, 1e-1, 0.5], rtol=1e-12)
    # conv rate defaults to the matmul rate, the matmul rate to flops_per_s
    only_mm = dataclasses.replace(p, conv_flops_per_s=None)
    np.testing.assert_array_equal(only_mm.flop_rates(g), [1e11, 1e11, 2e9, 1e11, 2e9])
    only_cv = dataclasses.replace(p, matmul_flops_per_s=None)
    np.testing.assert_array_equal(only_cv.flop_rates(g), [2e9, 1e10, 2e9, 2e9, 2e9])
    # no rates, or no primitives in the graph: every node at flops_per_s
    assert devices.get("cortex-a72").flop_rates(g) is None
    g_plain = _graph(flops, [4] * 5)
    assert p.flop_rates(g_plain) is None
    np.testing.assert_allclose(p.node_costs(g_plain)[0], 0.5, rtol=1e-12)
    # POET's model uses flops_per_s whatever the primitives
    np.testing.assert_allclose(p.node_costs(g, model="poet")[0], 0.5, rtol=1e-12)


@pytest.mark.parametrize("name", OLD_STATIC)
def test_existing_profiles_keep_their_numbers(name):
    """The new fields default to the old model: no launch cost, one FLOP rate for every node,
    also on a graph that names its primitives."""
    p = devices.get(name)
    assert p.launch_s == 0.0 and p.matmul_flops_per_s is None and p.conv_flops_per_s is None
    flops = [1e9, 10.0, 3e6]
    sizes = [4_000_000, 8_000_000, 1_000]
    g = _graph(flops, sizes, edges=[(0, 1), (1, 2)],
               prims=[("dot_general",), ("conv_general_dilated",), ("add",)])
    moved = np.array([4e6, 8e6 + 4e6, 1e3 + 8e6])
    want = np.maximum(np.array(flops) / p.flops_per_s, moved / p.memory_bandwidth)
    t, e = p.node_costs(g)
    np.testing.assert_array_equal(t, want)
    np.testing.assert_array_equal(e, want * p.compute_watts)
    assert "launch" not in p.summary() and "matmul" not in p.summary()


def test_new_fields_are_validated():
    p = devices.get("cortex-m4")
    for bad in (dict(launch_s=-1e-6), dict(launch_s=float("nan")), dict(launch_s=math.inf),
                dict(matmul_flops_per_s=0.0), dict(matmul_flops_per_s=-1.0),
                dict(conv_flops_per_s=float("nan")), dict(conv_flops_per_s=math.inf)):
        with pytest.raises(DeviceProfileError):
            dataclasses.replace(p, **bad)
    ok = dataclasses.replace(p, launch_s=0.0, matmul_flops_per_s=1e9, conv_flops_per_s=2e9)
    assert ok.launch_s == 0.0


# ------------------------------------------------------------------------ datasheet GPUs
@pytest.mark.parametrize(
    "name, alias, fp32, tf32, bw, host_bw, watts",
    [("h100-sxm", "h100", 67e12, 494.5e12, 3.35e12, 64e9, 700.0),
     ("a100-sxm4-80gb", "a100", 19.5e12, 156e12, 2.039e12, 32e9, 400.0)],
)
def test_datasheet_gpu_profiles(name, alias, fp32, tf32, bw, host_bw, watts):
    p = devices.get(name)
    assert name in devices.available() and devices.get(alias) is p
    assert p.flops_per_s == fp32
    assert p.matmul_flops_per_s == p.conv_flops_per_s == tf32
    assert p.memory_bandwidth == bw and p.ram_bytes == 80 * 1024**3
    assert p.storage_read_bw == p.storage_write_bw == host_bw
    assert p.compute_watts == watts and p.launch_s == 5e-6
    assert "datasheet" in p.source and "TF32" in p.source
    s = p.summary()
    assert s.startswith(f"{name}:") and "launch 5 us" in s and "matmul" in s
    # an 8192^3 f32 matmul is compute-bound at the TF32 rate, plus one launch
    g = _graph([2.0 * 8192**3], [4 * 8192**2], params=[8 * 8192**2], prims=[("dot_general",)])
    t, _ = p.node_costs(g)
    assert t[0] == pytest.approx(2.0 * 8192**3 / tf32 + 5e-6, rel=1e-12)


# ---------------------------------------------------------------------------- for_backend
def test_for_backend_is_host_on_the_cpu():
    with pinned_host_profile():
        host = devices.get("host")
        assert devices.for_backend("cpu") is host
        if PLATFORM == "cpu":
            assert devices.for_backend() is host
