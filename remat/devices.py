"""Measured device profiles: :func:`calibrate` times the running backend (dense matmul,
convolution, streaming bandwidth, per-kernel launch cost and, where the device has a
``pinned_host`` memory, host<->device transfers) in a few seconds and returns
``calibrated-<platform>``; :func:`host_profile` is the ``host`` profile of this machine
(:func:`fixed_host`: fixed rates for a block, for reproducible plans); :func:`for_backend`
picks ``host`` on the CPU and the calibrated profile on an accelerator.

The profile type, the named datasheet profiles and :func:`get` live in the numpy core,
:mod:`remat.core.devices`, and are re-exported here; importing this module registers ``host``
there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import time
from typing import Any

import numpy as np

from remat.core.devices import (
    DeviceProfile,
    DeviceProfileError,
    available,
    get,
    register_measured,
)


# ------------------------------------------------------------------------- host
@dataclasses.dataclass(frozen=True)
class HostCalibration:
    """Median rates of three JAX primitives timed on this machine.

    Attributes:
      dot_flops_per_s: ``float32[n, n] @ float32[n, n]`` (``2 n^3`` FLOPs), FLOP/s.
      conv_flops_per_s: 3x3 same-padded NHWC convolution (``2 * B*H*W*Cout * 9*Cin``), FLOP/s.
      elementwise_bytes_per_s: ``x * a + b`` over a large array, (read + write bytes) / s.
      wall_s: seconds the calibration took (compiles included).
    """

    dot_flops_per_s: float
    conv_flops_per_s: float
    elementwise_bytes_per_s: float
    wall_s: float


def _median_time(fn, *args, repeats: int) -> float:
    fn(*args).block_until_ready()  # compile + warm up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args).block_until_ready()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


@functools.lru_cache(maxsize=1)
def calibrate_host(repeats: int = 5) -> HostCalibration:
    """Time a dot, a conv and an elementwise op with JAX (median of ``repeats`` runs after a
    warm-up); cached for the process. Sizes are chosen to take well under 3 s in total on a
    2-core CPU: dot 768^3 (0.9 GFLOP), conv 8x32x32x64 -> 64 (0.6 GFLOP), elementwise on 16M
    float32 (128 MB moved, beyond the caches)."""
    import jax
    import jax.numpy as jnp

    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    n = 768
    a = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    t_dot = _median_time(jax.jit(jnp.dot), a, b, repeats=repeats)

    bsz, hw, cin, cout = 8, 32, 64, 64
    x = jnp.asarray(rng.standard_normal((bsz, hw, hw, cin), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((3, 3, cin, cout), dtype=np.float32))
    conv = jax.jit(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    t_conv = _median_time(conv, x, w, repeats=repeats)

    # elementwise y <- 0.5 y + 0.25 on 64 MB (beyond a 32 MB L3), the input buffer donated so
    # that no run pays for page faults on a freshly allocated output
    m = 16 * 1024 * 1024
    step = jax.jit(lambda y: y * 0.5 + 0.25, donate_argnums=0)
    y = step(jnp.ones(m, jnp.float32))
    y.block_until_ready()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        y = step(y)
        y.block_until_ready()
        ts.append(time.perf_counter() - t0)
    t_ew = float(np.median(ts))
    return HostCalibration(
        dot_flops_per_s=2.0 * n**3 / t_dot,
        conv_flops_per_s=2.0 * bsz * hw * hw * cout * 9 * cin / t_conv,
        elementwise_bytes_per_s=2.0 * 4 * m / t_ew,
        wall_s=time.perf_counter() - t_start,
    )


HOST_WATTS_PER_CPU = 5.0  # assumed: a ~250 W, 48-thread server CPU, per logical CPU in use


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 1024**3


def host_profile() -> DeviceProfile:
    """The ``host`` profile: this machine's, from :func:`calibrate_host` (cached for the
    process), or the one :func:`fixed_host` sets for its block.

    ``flops_per_s`` = geometric mean of the dot and conv rates; ``memory_bandwidth`` = the
    elementwise rate; ``ram_bytes`` from ``sysconf``. Assumed (not measured):
    ``compute_watts = 5 W x os.cpu_count()`` (a TDP share), storage (a local NVMe disk or the
    page cache as the paging target) read 2 GB/s, write 1 GB/s, latency 0.1 ms, 5 W while
    transferring.
    """
    return _FIXED[-1] if _FIXED else _measured_host()


_FIXED: list[DeviceProfile] = []  # the profiles of the open fixed_host blocks, innermost last


@contextlib.contextmanager
def fixed_host(flops_per_s: float, memory_bandwidth: float):
    """A block in which the ``host`` profile has the given rates (FLOP/s, bytes/s) instead of
    measured ones, the rest as :func:`host_profile` assumes; nothing is timed, so stage costs,
    plans and modelled times depend on the program alone, not on the machine or its load."""
    try:
        flops_per_s, memory_bandwidth = float(flops_per_s), float(memory_bandwidth)
    except (TypeError, ValueError) as e:
        raise DeviceProfileError(f"fixed_host needs numeric rates, got {e}") from None
    _FIXED.append(_host(flops_per_s, memory_bandwidth, (),
                        f"Fixed rates (remat.devices.fixed_host): {flops_per_s / 1e9:.3g} "
                        f"GFLOP/s, {memory_bandwidth / 1e9:.3g} GB/s; not measured."))
    try:
        yield _FIXED[-1]
    finally:
        _FIXED.pop()


@functools.lru_cache(maxsize=1)
def _measured_host() -> DeviceProfile:
    cal = calibrate_host()
    return _host(
        math.sqrt(cal.dot_flops_per_s * cal.conv_flops_per_s), cal.elementwise_bytes_per_s,
        tuple((f.name, float(getattr(cal, f.name))) for f in dataclasses.fields(cal)),
        f"Calibrated on this machine with JAX: dot {cal.dot_flops_per_s / 1e9:.3g} GFLOP/s, "
        f"conv {cal.conv_flops_per_s / 1e9:.3g} GFLOP/s (flops_per_s = their geometric mean), "
        f"elementwise {cal.elementwise_bytes_per_s / 1e9:.3g} GB/s (memory_bandwidth).")


def _host(flops: float, bandwidth: float, calibration: tuple, source: str) -> DeviceProfile:
    cpus, watts = os.cpu_count() or 1, 5.0  # watts: assumed storage power
    return DeviceProfile(
        name="host", flops_per_s=flops, compute_watts=HOST_WATTS_PER_CPU * cpus,
        memory_bandwidth=bandwidth, ram_bytes=_ram_bytes(), storage_read_bw=2e9,
        storage_write_bw=1e9, storage_latency_s=1e-4, storage_watts=watts,
        energy_per_byte_read=watts / 2e9, energy_per_byte_write=watts / 1e9,
        calibration=calibration,
        source=f"{source} Assumed ({cpus} CPUs): compute_watts = {HOST_WATTS_PER_CPU} W per "
               "CPU (TDP share); storage 2 GB/s read, 1 GB/s write, 0.1 ms latency, 5 W.")


# ------------------------------------------------------------------- calibrate
#: what :func:`calibrate` times, per platform (``"default"``: any accelerator). CPU: the
#: matmul and conv of :func:`calibrate_host`, a 128 MiB stream (beyond a 32 MiB L3 at both of
#: its sizes); a few seconds in all on a 2-core CPU. Accelerators: each timed op takes
#: milliseconds on an H100 (8192^3 matmul 1.1 TFLOP, conv 0.12 TFLOP, a 4 GiB stream, or an
#: eighth of a smaller device's memory, 256 MiB each way over the host link). ``passes``: matmul/conv passes of the longer call; ``chain``:
#: tiny matmuls of the launch measurement, timed as the mean of ``chain_calls`` calls.
CALIBRATION_SIZES: dict[str, dict[str, Any]] = {
    "cpu": dict(matmul_n=768, conv=(8, 32, 64, 64), stream_elems=32 * 1024**2, passes=3,
                chain=64, chain_calls=20, transfer_bytes=0),
    "default": dict(matmul_n=8192, conv=(32, 56, 256, 256), stream_elems=1024**3,
                    passes=5, chain=64, chain_calls=20, transfer_bytes=256 * 1024**2),
}
#: assumed board power (W) of an accelerator whose ``device_kind`` contains the key (datasheet
#: max TDP); others: :data:`DEFAULT_ACCELERATOR_WATTS`
ACCELERATOR_WATTS = {"H100": 700.0, "H200": 700.0, "A100": 400.0}
DEFAULT_ACCELERATOR_WATTS = 300.0  # assumed
_CALIBRATED: dict[tuple[str, int], DeviceProfile] = {}


def _min_call_times(fns, args, *, samples: int, calls: int) -> list[float]:
    """For each of ``fns``: the smallest, over ``samples`` samples, mean wall time of ``calls``
    back-to-back calls ``fn(*args)`` (each waited for), after two warm-up calls. The samples of
    the functions are interleaved and the minimum taken, because load from other processes
    only adds time (a loaded 2-core CPU gave a one-product call a median above that of a
    64-product call)."""
    for fn in fns:
        for _ in range(2):
            fn(*args).block_until_ready()
    best = [math.inf] * len(fns)
    for _ in range(samples):
        for j, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args).block_until_ready()
            best[j] = min(best[j], (time.perf_counter() - t0) / calls)
    return best


def _passes(op, k: int, donate: bool = False):
    """``jax.jit`` of ``k`` dependent applications of ``op(x, *rest)`` to its first argument,
    each behind an ``optimization_barrier`` (for matrix products and convolutions, ``k``
    kernels on jax 0.8 and 0.12; elementwise passes may still fuse into one)."""
    import jax

    def f(x, *rest):
        for _ in range(k):
            x = jax.lax.optimization_barrier(op(x, *rest))
        return x

    return jax.jit(f, donate_argnums=(0,) if donate else ())


def _call_time(f, args, *, repeats: int, donate: bool = False) -> float:
    """Median wall time of one call ``f(*args)`` (waited for) over ``repeats`` calls after two
    warm-up calls; ``donate``: ``f`` donates its first argument, replaced by each output."""
    x, rest = args[0], tuple(args[1:])
    samples = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        out = f(x, *rest)
        out.block_until_ready()
        if i >= 2:
            samples.append(time.perf_counter() - t0)
        if donate:
            x = out
        del out
    return float(np.median(samples))


def _slope_rate(work_1: float, t_1: float, work_2: float, t_2: float) -> float:
    """Work per second from two calls doing ``work_1 < work_2``: the slope
    ``(work_2 - work_1) / (t_2 - t_1)``, in which the per-call dispatch and wait cancel (about
    0.1 ms on a GPU: a fifth of a 2 GiB stream on an H200); where timing noise makes the
    slope's time per unit of work below half the larger call's mean ``t_2 / work_2`` (a
    loaded CPU), that mean."""
    per = (t_2 - t_1) / (work_2 - work_1)
    mean = t_2 / work_2
    return 1.0 / (per if per >= 0.5 * mean else mean)


def calibrate(*, backend: str | None = None, repeats: int = 5) -> DeviceProfile:
    """Measure the JAX backend ``backend`` (``None``: the default backend's first device) and
    return its profile, ``calibrated-<platform>``; cached per (platform, ``repeats``) for the
    process (a second call returns the same object).

    Timed with ``jax.jit`` and ``block_until_ready``, medians of ``repeats`` after two
    warm-ups, sizes from :data:`CALIBRATION_SIZES`. Each throughput is a slope between two
    calls that do different amounts of the same work (:func:`_slope_rate`), so that the
    per-call dispatch and wait, about 0.1 ms on a GPU, is not charged to the op:

    * ``matmul_flops_per_s``: dense ``float32[n, n] @ float32[n, n]`` (``2 n^3`` FLOPs; on a
      GPU at JAX's default precision, TF32 on Ampere+), a call of one product against a call
      of ``passes`` dependent ones (``x <- x @ b``); also ``flops_per_s`` (the rate of nodes
      without a contraction, which are memory-bound in practice);
    * ``conv_flops_per_s``: a 3x3 same-padded NHWC convolution (``2 B H W Cout 9 Cin``), one
      against ``passes`` dependent ones;
    * ``memory_bandwidth``: one pass of ``y <- 0.5 y + 0.25`` over ``stream_elems / 2`` and
      over ``stream_elems`` ``float32`` values, the input donated (read + write bytes per
      second). Not passes: XLA fuses elementwise passes into one, on the CPU of jax 0.8 even
      across an ``optimization_barrier``;
    * ``launch_s``: per-kernel cost inside a compiled program: the slope between a call of
      ``chain`` dependent ``8x8`` matrix products (one kernel each: products do not fuse with
      each other) and a call of one, ``(t_chain - t_1) / (chain - 1)`` (Python dispatch, the
      same in both, cancels; clipped at 0), each the smallest of interleaved samples
      (:func:`_min_call_times`: load only adds time); the per-call time of the
      one-product function is recorded as ``dispatch_s`` (not in the node model: it is paid
      once per step, whatever the plan);
    * host link, only where the device's ``addressable_memories()`` include ``pinned_host``
      and the platform is not the CPU (there the device's memory *is* host memory):
      ``jax.device_put`` of ``transfer_bytes`` to a ``pinned_host`` sharding (page-out,
      ``storage_write_bw``) and back (page-in, ``storage_read_bw``), and of 4 KiB for the
      latencies (which include ``device_put``'s dispatch: upper bounds). Not measured (CPU,
      no ``pinned_host``, or a failure): ``host_link_measured = 0`` and the defaults, on the
      CPU :func:`host_profile`'s assumed disk (2 GB/s read, 1 GB/s write, 0.1 ms, 5 W), on an
      accelerator a PCIe 4.0 x16 link (25 GB/s each way, 10 us, 10 W).

    Not measured: ``compute_watts`` (CPU: 5 W per CPU as :func:`host_profile`; accelerator:
    :data:`ACCELERATOR_WATTS` by ``device_kind``, else 300 W); ``ram_bytes`` (the device's
    ``memory_stats()["bytes_limit"]``, else the machine's RAM). Every measured number, the
    sizes and ``wall_s`` (the whole calibration, compiles included) are in ``calibration``.
    On a 2-core CPU it takes a few seconds (``experiments/calibrate_report.py``).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    dev = jax.devices(backend)[0] if backend else jax.devices()[0]
    platform = str(dev.platform)
    key = (platform, int(repeats))
    if key in _CALIBRATED:
        return _CALIBRATED[key]
    t_start = time.perf_counter()
    sz = CALIBRATION_SIZES.get(platform, CALIBRATION_SIZES["default"])
    on_dev = SingleDeviceSharding(dev)

    rng = np.random.default_rng(0)

    def randn(shape: tuple[int, ...]):  # uniform in [-0.5, 0.5): cheap on the host
        return jax.device_put(rng.random(shape, dtype=np.float32) - np.float32(0.5), on_dev)

    passes = int(sz["passes"])
    n = int(sz["matmul_n"])
    a, b = randn((n, n)), randn((n, n))
    mm_1 = _call_time(_passes(jnp.dot, 1), (a, b), repeats=repeats)
    mm_k = _call_time(_passes(jnp.dot, passes), (a, b), repeats=repeats)
    mm_rate = _slope_rate(2.0 * n**3, mm_1, 2.0 * n**3 * passes, mm_k)
    del a, b

    bsz, hw, cin, cout = sz["conv"]  # cin == cout: a pass's output feeds the next
    x, w = randn((bsz, hw, hw, cin)), randn((3, 3, cin, cout))

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    conv_flops = 2.0 * bsz * hw * hw * cout * 9 * cin
    conv_1 = _call_time(_passes(conv, 1), (x, w), repeats=repeats)
    conv_k = _call_time(_passes(conv, passes), (x, w), repeats=repeats)
    conv_rate = _slope_rate(conv_flops, conv_1, conv_flops * passes, conv_k)
    del x, w

    # one pass over m / 2 and over m elements (XLA fuses elementwise passes, even across an
    # optimization_barrier on the CPU of jax 0.8, so the slope is over sizes, not passes)
    m = int(sz["stream_elems"])
    if platform != "cpu":  # at most an eighth of the device's memory per array
        m = max(1024**2, min(m, _device_ram(dev) // 32))
    step = jax.jit(lambda y: y * 0.5 + 0.25, donate_argnums=0)
    st = {}
    for mm in (m // 2, m):
        y = jax.jit(lambda mm=mm: jnp.ones(mm, jnp.float32), out_shardings=on_dev)()
        st[mm] = _call_time(step, (y,), repeats=repeats, donate=True)
        del y
    st_1, st_k = st[m // 2], st[m]
    stream_bw = _slope_rate(8.0 * (m // 2), st_1, 8.0 * m, st_k)

    k, calls = int(sz["chain"]), int(sz["chain_calls"])
    tiny = jax.device_put(np.ones((8, 8), np.float32), on_dev)
    eye = jax.device_put(np.eye(8, dtype=np.float32), on_dev)
    t_one, t_k = _min_call_times([_passes(jnp.dot, 1), _passes(jnp.dot, k)], (tiny, eye),
                                 samples=max(2 * repeats, 10), calls=calls)
    launch = max(0.0, (t_k - t_one) / (k - 1))

    link = _time_host_link(dev, int(sz["transfer_bytes"]), repeats) if platform != "cpu" else None

    cal = {
        "matmul_flops_per_s": mm_rate, "conv_flops_per_s": conv_rate,
        "elementwise_bytes_per_s": stream_bw, "launch_s": launch, "dispatch_s": t_one,
        "chain_call_s": t_k, "host_link_measured": 0.0 if link is None else 1.0,
        "matmul_call_1_s": mm_1, "matmul_call_k_s": mm_k, "conv_call_1_s": conv_1,
        "conv_call_k_s": conv_k, "stream_call_1_s": st_1, "stream_call_k_s": st_k,
    }
    if link is not None:
        cal.update(link)
    cal.update({"matmul_n": float(n), "conv_flops": conv_flops,
                "stream_bytes": 2.0 * 4 * m, "passes": float(passes), "chain": float(k),
                "transfer_bytes": float(sz["transfer_bytes"]) if link else 0.0,
                "repeats": float(repeats)})

    kind = str(getattr(dev, "device_kind", platform))
    if platform == "cpu":
        cpus = os.cpu_count() or 1
        watts, watts_note = HOST_WATTS_PER_CPU * cpus, f"{HOST_WATTS_PER_CPU} W x {cpus} CPUs"
    else:
        watts = next((v for k_, v in ACCELERATOR_WATTS.items() if k_ in kind.upper()),
                     DEFAULT_ACCELERATOR_WATTS)
        watts_note = f"{watts:g} W for {kind!r}"
    if link is not None:
        rd, wr = link["host_to_device_bytes_per_s"], link["device_to_host_bytes_per_s"]
        lat_in, lat_out, sw = link["host_to_device_latency_s"], link["device_to_host_latency_s"], 10.0
        link_note = (f"host link measured (pinned_host): page-in {rd / 1e9:.3g} GB/s, page-out "
                     f"{wr / 1e9:.3g} GB/s; assumed 10 W while transferring")
    elif platform == "cpu":
        rd, wr, lat_in, lat_out, sw = 2e9, 1e9, 1e-4, 1e-4, 5.0
        link_note = ("host link not measured (CPU: device memory is host memory); paging "
                     "target assumed as host_profile: 2 GB/s read, 1 GB/s write, 0.1 ms, 5 W")
    else:
        rd, wr, lat_in, lat_out, sw = 25e9, 25e9, 1e-5, 1e-5, 10.0
        link_note = ("host link not measured (no pinned_host memory); assumed PCIe 4.0 x16: "
                     "25 GB/s each way, 10 us, 10 W")
    ram = _device_ram(dev)
    cal["wall_s"] = time.perf_counter() - t_start
    prof = DeviceProfile(
        name=f"calibrated-{platform}",
        flops_per_s=mm_rate,
        matmul_flops_per_s=mm_rate,
        conv_flops_per_s=conv_rate,
        compute_watts=watts,
        memory_bandwidth=stream_bw,
        ram_bytes=ram,
        storage_read_bw=rd,
        storage_write_bw=wr,
        storage_latency_s=lat_in,
        storage_write_latency_s=lat_out,
        storage_watts=sw,
        energy_per_byte_read=sw / rd,
        energy_per_byte_write=sw / wr,
        launch_s=launch,
        calibration=tuple((k_, float(v)) for k_, v in cal.items()),
        source=(
            f"calibrate() on {kind} ({platform}, jax {jax.__version__}): matmul {n}^3 "
            f"{mm_rate / 1e9:.4g} GFLOP/s (flops_per_s and matmul_flops_per_s), conv "
            f"{conv_rate / 1e9:.4g} GFLOP/s, stream {stream_bw / 1e9:.3g} GB/s "
            f"(memory_bandwidth), launch {launch * 1e6:.3g} us per kernel, dispatch "
            f"{t_one * 1e6:.3g} us per call; {link_note}. Assumed: compute_watts {watts_note}."
        ),
    )
    _CALIBRATED[key] = prof
    return prof


def _device_ram(dev) -> int:
    """The device's memory limit in bytes (``memory_stats()["bytes_limit"]``), else the
    machine's RAM (the CPU reports no stats)."""
    try:
        stats = dev.memory_stats() or {}
        lim = int(stats.get("bytes_limit", 0))
    except Exception:  # noqa: BLE001 - a backend without memory stats
        lim = 0
    return lim if lim > 0 else _ram_bytes()


def _time_host_link(dev, nbytes: int, repeats: int) -> dict[str, float] | None:
    """Host<->device bandwidths and latencies through ``pinned_host`` (see :func:`calibrate`),
    or ``None`` when the device has no such memory, ``nbytes`` is 0 or a transfer fails."""
    import jax
    from jax.sharding import SingleDeviceSharding

    try:
        kinds = {m.kind for m in dev.addressable_memories()}
    except Exception:  # noqa: BLE001 - a backend without memory kinds
        return None
    if nbytes <= 0 or "pinned_host" not in kinds:
        return None
    try:
        host = SingleDeviceSharding(dev, memory_kind="pinned_host")
        on_dev = SingleDeviceSharding(dev, memory_kind="device")

        def rate(src, dst_sharding):
            ts = []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                out = jax.device_put(src, dst_sharding)
                out.block_until_ready()
                if i:  # the first is the warm-up (allocator, pinning)
                    ts.append(time.perf_counter() - t0)
                del out
            return float(np.median(ts))

        big = jax.device_put(np.ones(nbytes // 4, np.float32), on_dev)
        t_out = rate(big, host)
        big_host = jax.device_put(big, host)
        t_in = rate(big_host, on_dev)
        del big, big_host
        small = jax.device_put(np.ones(1024, np.float32), on_dev)
        lat_out = rate(small, host)
        lat_in = rate(jax.device_put(small, host), on_dev)
    except Exception:  # noqa: BLE001 - memory kinds unsupported by this backend or version
        return None
    return {
        "device_to_host_bytes_per_s": nbytes / t_out,
        "host_to_device_bytes_per_s": nbytes / t_in,
        "device_to_host_latency_s": lat_out,
        "host_to_device_latency_s": lat_in,
    }


def for_backend(platform: str | None = None) -> DeviceProfile:
    """The profile of the device a step runs on: ``get("host")`` on the CPU (unchanged, so
    CPU extraction costs stay as before) and :func:`calibrate` on any other platform
    (``platform`` a JAX backend name, ``"gpu"``/``"cuda"``/``"tpu"``; ``None``: JAX's default
    backend)."""
    import jax

    name = platform or jax.default_backend()
    if str(name).lower() == "cpu":
        return get("host")
    return calibrate(backend=platform)



register_measured("host", host_profile)

__all__ = [
    "DeviceProfile", "DeviceProfileError", "HostCalibration", "available", "calibrate",
    "calibrate_host", "fixed_host", "for_backend", "get", "host_profile",
]
