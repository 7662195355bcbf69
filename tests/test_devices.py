"""Tests of remat.devices: profile numbers, the roofline/POET compute model, paging costs
against POET's formula written out independently, and the host calibration."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import remat
from remat import devices
from remat.core.errors import RematError, UnknownNameError
from remat.devices import DeviceProfile, DeviceProfileError

REQUIRED = {"cortex-m0", "cortex-m4", "cortex-a72", "jetson-tx2", "pixel-4", "host"}
STATIC = [n for n in devices.available() if n != "host"]


def test_registry_names_aliases_and_unknown():
    assert REQUIRED <= set(devices.available())
    # POET's platform names (poet/solve.py --platform) are aliases
    for alias, name in [("m0", "cortex-m0"), ("m4", "cortex-m4"), ("a72", "cortex-a72"),
                        ("a72nocache", "cortex-a72-nocache"), ("jetsontx2", "jetson-tx2"),
                        ("phone", "pixel-4"), ("Cortex_A72", "cortex-a72")]:
        assert devices.get(alias).name == name
    p = devices.get("cortex-m4")
    assert devices.get(p) is p
    with pytest.raises(UnknownNameError) as info:
        devices.get("cortex-m7")
    assert isinstance(info.value, RematError) and "cortex-m0" in str(info.value)
    assert remat.devices is devices


@pytest.mark.parametrize("name", STATIC)
def test_profile_numbers_are_sane(name):
    p = devices.get(name)
    for f in ("flops_per_s", "compute_watts", "memory_bandwidth", "ram_bytes", "storage_read_bw",
              "storage_write_bw", "energy_per_byte_read", "energy_per_byte_write"):
        v = getattr(p, f)
        assert math.isfinite(v) and v > 0, f
    assert p.storage_latency_s > 0 and p.write_latency_s > 0
    assert p.storage_read_bw < p.memory_bandwidth  # paging is slower than RAM
    assert p.source and len(p.source) > 40
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.flops_per_s = 1.0  # type: ignore[misc]


def test_ordering_of_the_embedded_to_host_ladder():
    m0, m4, a72, host = (devices.get(n) for n in ("cortex-m0", "cortex-m4", "cortex-a72", "host"))
    assert m0.flops_per_s < m4.flops_per_s < a72.flops_per_s < host.flops_per_s
    assert m0.ram_bytes == 32 * 1024 and m4.ram_bytes == 256 * 1024  # POET Table 2
    assert m0.ram_bytes < m4.ram_bytes < a72.ram_bytes


def test_poet_chipset_constants():
    """Numbers as printed in shared/notes/seeds-poet-olla.md A.7 (rounded there)."""
    rel = dict(rel=2e-3)
    m0, m4, a72 = (devices.get(n) for n in ("m0", "m4", "a72"))
    assert m0.flops_per_s == pytest.approx(1.667e5, **rel)
    assert m0.flops_per_joule == pytest.approx(2.525e6, **rel)
    assert m4.flops_per_s == pytest.approx(6.37e6, **rel)
    assert m4.flops_per_joule == pytest.approx(5.80e8, **rel)
    assert a72.flops_per_s == pytest.approx(2.0e9, **rel)
    assert a72.flops_per_joule == pytest.approx(4.012e7, **rel)
    assert a72.compute_watts == pytest.approx(3.0) and m0.compute_watts == pytest.approx(0.066)
    assert a72.storage_latency_s == pytest.approx(5.1e-6, rel=0.01)
    assert a72.storage_read_bw == pytest.approx(45.5e6)
    assert a72.write_latency_s == pytest.approx(18.5e-6, rel=0.01)
    assert a72.storage_write_bw == pytest.approx(24.5e6)
    assert devices.get("a72nocache").write_latency_s == pytest.approx(4.235e-3, rel=1e-3)
    tx2 = devices.get("jetsontx2")
    assert tx2.storage_latency_s == pytest.approx(0.54e-3)
    assert tx2.storage_write_bw == pytest.approx(94.37e6)


def _graph(flops, sizes, params=None, edges=()):
    n = len(flops)
    return remat.make_graph([f"n{i}" for i in range(n)], list(edges), out_bytes=sizes,
                            time_s=[0.0] * n, flops=flops, param_bytes=params)


def test_node_costs_scale_linearly_with_flops():
    p = devices.get("cortex-a72")
    flops = np.array([1e9, 2e9, 4e9, 3e6])
    g1 = _graph(list(flops), [16, 16, 16, 16])
    g2 = _graph(list(2 * flops), [16, 16, 16, 16])
    t1, e1 = p.node_costs(g1)
    t2, e2 = p.node_costs(g2)
    assert t1.dtype == np.float64 and t1.shape == (4,)
    np.testing.assert_allclose(t2, 2 * t1, rtol=1e-12)
    np.testing.assert_allclose(e2, 2 * e1, rtol=1e-12)
    np.testing.assert_allclose(t1, flops / 2e9, rtol=1e-12)  # compute-bound: flops / FLOP/s
    np.testing.assert_allclose(e1, t1 * 3.0, rtol=1e-12)  # energy = time * 3 W


def test_roofline_memory_bound_nodes_use_bytes_moved():
    """Hand computation: bytes moved = own output + inputs' outputs + parameters."""
    p = devices.get("pixel-4")
    sizes = [4_000_000, 8_000_000, 1_000]
    params = [0, 2_000_000, 0]
    edges = [(0, 1), (0, 2), (1, 2)]
    t, e = p.node_costs(_graph([10.0, 20.0, 1e12], sizes, params, edges))
    moved = [4e6, 8e6 + 2e6 + 4e6, 1e3 + 4e6 + 8e6]
    want = [max(f / p.flops_per_s, b / p.memory_bandwidth) for f, b in
            zip([10.0, 20.0, 1e12], moved)]
    np.testing.assert_allclose(t, want, rtol=1e-12)
    np.testing.assert_allclose(e, np.array(want) * p.compute_watts, rtol=1e-12)
    assert t[0] == pytest.approx(4e6 / 34.1e9)  # memory bound
    assert t[2] == pytest.approx(1e12 / 2e10)  # compute bound


def test_poet_compute_model_uses_flops_per_watt():
    a72 = devices.get("cortex-a72")
    t, e = a72.node_costs(_graph([1e9, 5e8], [4, 4]), model="poet")
    np.testing.assert_allclose(t, [0.5, 0.25])
    # POET: energy = flop / FLOPS_PER_WATT, FLOPS_PER_WATT = 16283e5 / (13.53 * 0.6 * 5)
    np.testing.assert_allclose(e, np.array([1e9, 5e8]) * (13.53 * 0.6 * 5) / 16283e5)
    with pytest.raises(DeviceProfileError):
        a72.op_costs([1.0], model="magic")
    with pytest.raises(DeviceProfileError):
        a72.op_costs([-1.0])


def test_with_costs_writes_times_and_energies_into_the_graph():
    g = remat.chain_graph(4, sizes=[1000, 2000, 3000, 4000])
    g = dataclasses.replace(g, nodes=tuple(dataclasses.replace(v, flops=1e6 * (i + 1))
                                           for i, v in enumerate(g.nodes)))
    p = devices.get("jetson-tx2")
    h = p.with_costs(g)
    t, e = p.node_costs(g)
    np.testing.assert_array_equal(h.costs, t)
    np.testing.assert_array_equal(h.energies, e)
    assert h.meta["cost_unit"] == "s" and h.meta["device"] == "jetson-tx2"
    assert h.edges == g.edges and [v.name for v in h.nodes] == [v.name for v in g.nodes]


@pytest.mark.parametrize(
    "name, lat_in, bw_in, lat_out, bw_out, mem_power",
    [  # poet/chipsets.py: (PAGEIN_LATENCY, PAGEIN_THROUGHPUT, PAGEOUT_..., MEMORY_POWER)
        ("cortex-m0", 0.109e-3, 4616.51e3, 0.113e-3, 4440e3, 0.33),
        ("cortex-m4", 0.109e-3, 4616.51e3, 0.113e-3, 4440e3, 0.33),
        ("cortex-a72", 0.00509561e-3, 45.5e6, 0.0185314e-3, 24.5e6, 0.15),
        ("jetson-tx2", 0.00054, 108.5e6, 0.002396, 94.37e6, 0.309),
    ],
)
def test_page_costs_match_poets_formula(name, lat_in, bw_in, lat_out, bw_out, mem_power):
    """POET: Phi_out = (PAGEOUT_LATENCY + bytes / PAGEOUT_THROUGHPUT) * MEMORY_POWER."""
    p = devices.get(name)
    nbytes = np.array([1, 4096, 3_000_000, 123_456_789], dtype=np.int64)
    t_in, e_in = p.page_in_cost(nbytes)
    t_out, e_out = p.page_out_cost(nbytes)
    for i, n in enumerate(nbytes.tolist()):
        assert t_in[i] == pytest.approx(lat_in + n / bw_in, rel=1e-12)
        assert e_in[i] == pytest.approx((lat_in + n / bw_in) * mem_power, rel=1e-12)
        assert t_out[i] == pytest.approx(lat_out + n / bw_out, rel=1e-12)
        assert e_out[i] == pytest.approx((lat_out + n / bw_out) * mem_power, rel=1e-12)
    t, e = p.page_costs(nbytes, nbytes[::-1])
    np.testing.assert_allclose(t, t_out + p.page_in_cost(nbytes[::-1])[0], rtol=1e-12)
    np.testing.assert_allclose(e, e_out + p.page_in_cost(nbytes[::-1])[1], rtol=1e-12)


def test_page_costs_general_formula_and_edge_cases():
    p = DeviceProfile(
        name="toy", flops_per_s=1e9, compute_watts=2.0, memory_bandwidth=1e10, ram_bytes=2**20,
        storage_read_bw=1e6, storage_write_bw=5e5, storage_latency_s=1e-3,
        energy_per_byte_read=2e-9, energy_per_byte_write=3e-9, storage_watts=0.5,
    )
    t, e = p.page_costs(np.array([0, 1000, 0]), np.array([0, 0, 2000]))
    np.testing.assert_allclose(t, [0.0, 1e-3 + 1000 / 5e5, 1e-3 + 2000 / 1e6])
    np.testing.assert_allclose(e, [0.0, 1e-3 * 0.5 + 1000 * 3e-9, 1e-3 * 0.5 + 2000 * 2e-9])
    ts, es = p.page_out_cost(10_000)
    assert np.ndim(ts) == 0 and float(ts) == pytest.approx(1e-3 + 10_000 / 5e5)
    with pytest.raises(DeviceProfileError):
        p.page_in_cost([-1])
    with pytest.raises(DeviceProfileError):
        dataclasses.replace(p, storage_read_bw=0.0)
    with pytest.raises(DeviceProfileError):
        dataclasses.replace(p, flops_per_s=float("nan"))


def test_host_calibration_is_plausible_and_cached():
    """The measured rates are in the right units whatever the machine's speed: each op's
    median time (its work over its rate; the dot is 2 x 768^3 FLOPs, the conv 2 x 8 x 32 x 32
    x 64 x 9 x 64, the elementwise step 2 x 4 x 16M bytes) fits three times into the wall time
    of the calibration that timed it five times; the second call is the cached object (a cache
    hit, not a second measurement).  How long the calibration takes is a benchmark's question,
    not this test's."""
    cal = devices.calibrate_host()
    assert 0 < cal.wall_s < math.inf
    t_dot = 2.0 * 768**3 / cal.dot_flops_per_s
    t_conv = 2.0 * 8 * 32 * 32 * 64 * 9 * 64 / cal.conv_flops_per_s
    t_ew = 2.0 * 4 * 16 * 1024 * 1024 / cal.elementwise_bytes_per_s
    assert 3 * (t_dot + t_conv + t_ew) <= cal.wall_s  # five runs each, medians: >= 3 x median
    for rate in (cal.dot_flops_per_s, cal.conv_flops_per_s, cal.elementwise_bytes_per_s):
        assert 1e6 < rate < 1e16  # a unit slip (ms for s, bits) is off by 1e3 or more
    host = devices.get("host")
    assert host.flops_per_s == pytest.approx(math.sqrt(cal.dot_flops_per_s * cal.conv_flops_per_s))
    assert host.memory_bandwidth == cal.elementwise_bytes_per_s
    hits = devices.calibrate_host.cache_info().hits
    assert devices.calibrate_host() is cal and devices.get("host") is host
    assert devices.calibrate_host.cache_info().hits == hits + 1
    assert dict(host.calibration)["dot_flops_per_s"] == cal.dot_flops_per_s


def test_fixed_host_pins_the_host_profile_for_a_block_and_nests():
    """Inside ``fixed_host`` the ``host`` profile has the given rates and times nothing, so an
    extracted graph's stage costs are the same in two blocks; blocks nest and restore."""
    import jax.numpy as jnp

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    with devices.fixed_host(1e9, 2e9) as prof:
        assert devices.get("host") == prof
        assert (prof.name, prof.flops_per_s, prof.memory_bandwidth) == ("host", 1e9, 2e9)
        assert prof.calibration == ()
        with devices.fixed_host(4e9, 2e9):
            assert devices.get("host").flops_per_s == 4e9
            fast = remat.extract(loss, w, x).costs
        assert devices.get("host").flops_per_s == 1e9
        slow = remat.extract(loss, w, x).costs
        again = remat.extract(loss, w, x).costs
    assert (slow == again).all() and (slow >= fast).all() and (slow > fast).any()
    with pytest.raises(DeviceProfileError, match="flops_per_s"), devices.fixed_host(0, 2e9):
        pass  # pragma: no cover - the block is not entered
    with pytest.raises(DeviceProfileError, match="numeric"), devices.fixed_host("fast", 2e9):
        pass  # pragma: no cover - the block is not entered
    assert not devices._FIXED
