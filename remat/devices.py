"""Device profiles: the cost model that turns FLOPs and bytes into seconds and joules.

A :class:`DeviceProfile` gives every graph node a compute time and energy (:meth:`node_costs`)
and every tensor a paging time and energy (:meth:`page_in_cost`, :meth:`page_out_cost`,
:meth:`page_costs`), the per-node arrays that the POET MILP (Patil et al., ICML 2022, eq. 1:
objective ``sum R*Phi_compute + M_in*Phi_pagein + M_out*Phi_pageout`` under a runtime budget
on ``Psi``) and the simulator consume.

Length: one module holds the profile dataclass, its three cost models and the table of named
profiles (with each constant's source), so that a profile is read in one place.

Models (all vectorised over numpy arrays):

* compute, ``model="roofline"`` (default): ``time = max(flops / flops_per_s,
  bytes_moved / memory_bandwidth)``, ``energy = time * compute_watts``.
* compute, ``model="poet"``: POET's FLOP model (``poet/power_computation.py``):
  ``time = flops / FLOPS``, ``energy = flops / FLOPS_PER_WATT`` (``flops_per_joule``; when a
  profile has none, ``time * compute_watts``).
* paging (POET's ``Phi_out = (PAGEOUT_LATENCY + bytes / PAGEOUT_THROUGHPUT) * MEMORY_POWER``,
  generalised): ``time = latency + bytes / bandwidth``,
  ``energy = latency * storage_watts + bytes * energy_per_byte``. With
  ``energy_per_byte = storage_watts / bandwidth`` (as in the POET-derived profiles) this is POET's
  formula exactly. A transfer of 0 bytes costs nothing (no transfer happens).

Profiles (``get(name)``; see each ``source``): ``cortex-m0``, ``cortex-m4``, ``cortex-a72``,
``cortex-a72-nocache`` (POET's chipset constants, ``poet/chipsets.py``, summarised in
``shared/notes/anchors.md`` section 2 and ``seeds-poet-olla.md`` A.7), ``jetson-tx2`` (POET's
measured paging and power constants plus public specs), ``pixel-4`` (Snapdragon 855 phone, public
specs and estimates), ``rtx-3090`` (a desktop GPU, public specs) and ``host`` (this machine,
calibrated by timing JAX primitives).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any

import numpy as np

from remat.errors import RematError, UnknownNameError

ArrayLike = Any


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Hardware constants of one training device.

    Attributes:
      name: profile name (``"cortex-a72"``).
      flops_per_s: sustained floating-point throughput, FLOP/s.
      compute_watts: power drawn while computing (active minus idle where measured), W.
      memory_bandwidth: RAM bandwidth, bytes/s (the roofline's memory roof).
      ram_bytes: RAM capacity, bytes.
      storage_read_bw: paging-target read bandwidth (page-in), bytes/s.
      storage_write_bw: paging-target write bandwidth (page-out), bytes/s.
      storage_latency_s: per-transfer latency of a page-in (and of a page-out unless
        ``storage_write_latency_s`` is given), s.
      energy_per_byte_read: page-in energy per byte, J/B.
      energy_per_byte_write: page-out energy per byte, J/B.
      source: where the numbers come from; which are estimates.
      storage_write_latency_s: per-transfer page-out latency, s (``None``: same as read).
      storage_watts: power of the storage path during a transfer, charged over the latency, W.
      flops_per_joule: POET's ``FLOPS_PER_WATT`` (FLOP/J) for ``model="poet"``; ``None``:
        ``compute_watts / flops_per_s`` joules per FLOP.
      calibration: ``(key, value)`` pairs measured on this machine (``host`` only).
    """

    name: str
    flops_per_s: float
    compute_watts: float
    memory_bandwidth: float
    ram_bytes: int
    storage_read_bw: float
    storage_write_bw: float
    storage_latency_s: float
    energy_per_byte_read: float
    energy_per_byte_write: float
    source: str = ""
    storage_write_latency_s: float | None = None
    storage_watts: float = 0.0
    flops_per_joule: float | None = None
    calibration: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        positive = ("flops_per_s", "compute_watts", "memory_bandwidth", "ram_bytes",
                    "storage_read_bw", "storage_write_bw")
        nonneg = ("storage_latency_s", "energy_per_byte_read", "energy_per_byte_write",
                  "storage_watts")
        for f in positive:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise DeviceProfileError(f"device {self.name!r}: {f}={v!r} must be positive")
        for f in nonneg:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise DeviceProfileError(f"device {self.name!r}: {f}={v!r} must be >= 0")
        w, fpj = self.storage_write_latency_s, self.flops_per_joule
        if w is not None and not (math.isfinite(w) and w >= 0):
            raise DeviceProfileError(f"device {self.name!r}: storage_write_latency_s={w!r} < 0")
        if fpj is not None and not (math.isfinite(fpj) and fpj > 0):
            raise DeviceProfileError(f"device {self.name!r}: flops_per_joule={fpj!r} <= 0")

    # ------------------------------------------------------------------ compute
    @property
    def write_latency_s(self) -> float:
        """Page-out latency, s."""
        w = self.storage_write_latency_s
        return self.storage_latency_s if w is None else w

    @property
    def joules_per_flop(self) -> float:
        """Energy of one FLOP under ``model="poet"``, J."""
        if self.flops_per_joule is not None:
            return 1.0 / self.flops_per_joule
        return self.compute_watts / self.flops_per_s

    def op_costs(
        self, flops: ArrayLike, bytes_moved: ArrayLike = 0.0, *, model: str = "roofline"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Time (s) and energy (J) of operations, vectorised.

        Args:
          flops: ``float64[n]`` (or scalar) FLOPs per operation.
          bytes_moved: ``float64[n]`` bytes read + written per operation (roofline only).
          model: ``"roofline"`` (``max(flops/flops_per_s, bytes/memory_bandwidth)``,
            energy ``time * compute_watts``) or ``"poet"`` (``flops/flops_per_s``, energy
            ``flops * joules_per_flop``).

        Returns:
          ``(times_s, energies_j)``, ``float64`` arrays of the broadcast shape.
        """
        f = np.asarray(flops, dtype=np.float64)
        b = np.asarray(bytes_moved, dtype=np.float64)
        if np.any(f < 0) or np.any(b < 0):
            raise DeviceProfileError("flops and bytes must be non-negative")
        if model == "roofline":
            t = np.maximum(f / self.flops_per_s, b / self.memory_bandwidth)
            return t, t * self.compute_watts
        if model == "poet":
            t = f / self.flops_per_s + 0.0 * b
            return t, f * self.joules_per_flop + 0.0 * b
        raise DeviceProfileError(f"unknown cost model {model!r}; use 'roofline' or 'poet'")

    def node_costs(self, graph: Any, *, model: str = "roofline",
                   extra_bytes: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per-node compute time and energy of a :class:`remat.Graph`.

        ``bytes_moved[i] = out_bytes[i] + sum of out_bytes of i's predecessors (its inputs)
        + param_bytes[i]``: each node reads its inputs and parameters and writes its output;
        plus ``extra_bytes[i]`` (``float64[n]``, bytes moved inside the node, e.g. by equations
        :func:`remat.flops.fallback_bytes` costs), when given.

        Returns:
          ``(times_s float64[n], energies_j float64[n])`` from :meth:`op_costs` over
          ``graph.flops_array``. Loaded graphs without FLOPs get memory-bound times only.
        """
        sizes = np.asarray(graph.sizes, dtype=np.float64)
        moved = sizes + np.fromiter((v.param_bytes for v in graph.nodes), np.float64, graph.n)
        e = np.asarray(graph.edge_array)
        if len(e):
            moved += np.bincount(e[:, 1], weights=sizes[e[:, 0]], minlength=graph.n)
        if extra_bytes is not None:
            moved += np.asarray(extra_bytes, dtype=np.float64)
        return self.op_costs(graph.flops_array, moved, model=model)

    def with_costs(self, graph: Any, *, model: str = "roofline") -> Any:
        """A copy of ``graph`` whose nodes carry this device's ``time_s`` and ``energy_j``
        (``graph.meta["cost_unit"] = "s"``, ``graph.meta["device"] = name``)."""
        t, en = self.node_costs(graph, model=model)
        nodes = tuple(
            dataclasses.replace(v, time_s=float(t[i]), energy_j=float(en[i]))
            for i, v in enumerate(graph.nodes)
        )
        meta = {**dict(graph.meta), "cost_unit": "s", "device": self.name, "cost_model": model}
        return dataclasses.replace(graph, nodes=nodes, meta=meta)

    # ------------------------------------------------------------------- paging
    def page_in_cost(self, nbytes: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Time (s) and energy (J) to read ``nbytes`` back from storage (page-in), vectorised:
        ``t = latency + n / storage_read_bw``, ``E = latency * storage_watts +
        n * energy_per_byte_read``; 0 where ``n == 0``."""
        return self._transfer(nbytes, self.storage_latency_s, self.storage_read_bw,
                              self.energy_per_byte_read)

    def page_out_cost(self, nbytes: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Time (s) and energy (J) to write ``nbytes`` to storage (page-out), vectorised:
        ``t = write_latency + n / storage_write_bw``, ``E = write_latency * storage_watts +
        n * energy_per_byte_write``; 0 where ``n == 0``."""
        return self._transfer(nbytes, self.write_latency_s, self.storage_write_bw,
                              self.energy_per_byte_write)

    def page_costs(
        self, bytes_out: ArrayLike, bytes_in: ArrayLike
    ) -> tuple[np.ndarray, np.ndarray]:
        """Total time (s) and energy (J) of paging ``bytes_out`` out and ``bytes_in`` back in
        (elementwise sums of :meth:`page_out_cost` and :meth:`page_in_cost`; POET's per-node
        ``Phi_pageout + Phi_pagein`` when both are a node's output size)."""
        to, eo = self.page_out_cost(bytes_out)
        ti, ei = self.page_in_cost(bytes_in)
        return to + ti, eo + ei

    def _transfer(self, nbytes, latency, bw, epb):
        n = np.asarray(nbytes, dtype=np.float64)
        if np.any(n < 0):
            raise DeviceProfileError("byte counts must be non-negative")
        active = n > 0
        t = np.where(active, latency + n / bw, 0.0)
        e = np.where(active, latency * self.storage_watts + n * epb, 0.0)
        return t, e

    def summary(self) -> str:
        """One line: throughput, power, RAM and paging bandwidths."""
        from remat.errors import format_bytes

        return (
            f"{self.name}: {self.flops_per_s / 1e9:.4g} GFLOP/s at {self.compute_watts:.3g} W, "
            f"RAM {format_bytes(self.ram_bytes)} @ {self.memory_bandwidth / 1e9:.3g} GB/s, "
            f"storage read {self.storage_read_bw / 1e6:.4g} MB/s / write "
            f"{self.storage_write_bw / 1e6:.4g} MB/s"
        )


class DeviceProfileError(RematError, ValueError):
    """A device profile or a cost query has invalid numbers (negative bytes, zero bandwidth)."""


# --------------------------------------------------------------------- profiles
def _poet_paging(lat_in, bw_in, lat_out, bw_out, mem_power) -> dict:
    """POET's paging constants as profile fields (energy per byte = MEMORY_POWER / throughput)."""
    return dict(
        storage_read_bw=bw_in, storage_write_bw=bw_out, storage_latency_s=lat_in,
        storage_write_latency_s=lat_out, storage_watts=mem_power,
        energy_per_byte_read=mem_power / bw_in, energy_per_byte_write=mem_power / bw_out,
    )


_SD_SPI = _poet_paging(0.109e-3, 4616.51e3, 0.113e-3, 4440e3, 100e-3 * 3.3)
_RPI_SD = dict(lat_in=0.00509561e-3, bw_in=45.5e6, mem_power=30e-3 * 5)

CORTEX_M0 = DeviceProfile(
    name="cortex-m0",
    flops_per_s=2000 / 0.012,
    compute_watts=20e-3 * 3.3,
    memory_bandwidth=48e6 * 4,
    ram_bytes=32 * 1024,
    flops_per_joule=2000 / (0.012 * 0.020 * 3.3),
    source=(
        "POET poet/chipsets.py MKR1000 (Arduino MKR1000, SAMD21 Cortex-M0+ 48 MHz, software "
        "float): FLOPS=2000/0.012 (0.167 MFLOP/s), POWER=20 mA*3.3 V, FLOPS_PER_WATT, SD card "
        "over SPI page-in 0.109 ms + 4.617 MB/s, page-out 0.113 ms + 4.44 MB/s, MEMORY_POWER="
        "100 mA*3.3 V; RAM 32 KB (POET Table 2). Estimate: memory_bandwidth = one 32-bit SRAM "
        "access per 48 MHz cycle."
    ),
    **_SD_SPI,
)

CORTEX_M4 = DeviceProfile(
    name="cortex-m4",
    flops_per_s=(16283 * 100 * 1000) / 255.6237,
    compute_watts=3.328e-3 * 3.3,
    memory_bandwidth=64e6 * 4,
    ram_bytes=256 * 1024,
    flops_per_joule=(16283 * 100 * 1000) / (255.6237 * 0.003328 * 3.3),
    source=(
        "POET poet/chipsets.py M4F (nRF52840 Cortex-M4F 64 MHz): FLOPS 6.37 MFLOP/s, POWER="
        "3.328 mA*3.3 V, FLOPS_PER_WATT; SD card as the M0 (POET: 'the SD card costs are same "
        "as MKR1000'); RAM 256 KB (POET Table 2). Estimate: memory_bandwidth = one 32-bit SRAM "
        "access per 64 MHz cycle."
    ),
    **_SD_SPI,
)

CORTEX_A72 = DeviceProfile(
    name="cortex-a72",
    flops_per_s=2e9,
    compute_watts=0.6 * 5,
    memory_bandwidth=4e9,
    ram_bytes=2 * 1024**3,
    flops_per_joule=(16283 * 100 * 1000) / (13.53 * 0.6 * 5),
    source=(
        "POET poet/chipsets.py RPi (Raspberry Pi 4B, 4x Cortex-A72 1.5 GHz, SD caching on): "
        "FLOPS=2e9, POWER=600 mA*5 V, FLOPS_PER_WATT=4.01e7 FLOP/J (POET's own constants "
        "disagree: 4.01e7 FLOP/J at 3 W is 120 MFLOP/s, the '120.34 MFLOPS' of its comment; "
        "model='poet' reproduces POET, model='roofline' uses 2e9 FLOP/s * 3 W), page-in "
        "5.1 us + 45.5 MB/s, page-out 18.5 us + 24.5 MB/s, MEMORY_POWER=30 mA*5 V; RAM 2 GB "
        "(POET Table 2). Estimate: memory_bandwidth 4 GB/s (sustained copy on LPDDR4-3200 x32, "
        "12.8 GB/s peak)."
    ),
    **_poet_paging(_RPI_SD["lat_in"], _RPI_SD["bw_in"], 0.0185314e-3, 24.5e6,
                   _RPI_SD["mem_power"]),
)

CORTEX_A72_NOCACHE = dataclasses.replace(
    CORTEX_A72,
    name="cortex-a72-nocache",
    flops_per_s=(16283 * 100 * 1000) / 13.53,
    source=(
        "POET poet/chipsets.py RPiNoCache: as cortex-a72 but FLOPS=120.34 MFLOP/s and SD "
        "write caching off: page-out 4.235 ms + 17.1 MB/s."
    ),
    **{k: v for k, v in _poet_paging(_RPI_SD["lat_in"], _RPI_SD["bw_in"], 4.23532e-3, 17.1e6,
                                     _RPI_SD["mem_power"]).items()},
)

JETSON_TX2 = DeviceProfile(
    name="jetson-tx2",
    flops_per_s=1.6e10,
    compute_watts=2.753 - 0.229,
    memory_bandwidth=59.7e9,
    ram_bytes=8 * 1024**3,
    source=(
        "Paging and power: POET poet/chipsets.py JetsonTX2 (measured): page-in 0.54 ms + "
        "108.5 MB/s, page-out 2.396 ms + 94.37 MB/s, MEMORY_POWER 0.309 W; compute power = "
        "its comment's 4-CPU stress 2753 mW minus 229 mW idle (POET's POWER constant, 0.766 W, "
        "is one core). POET has no FLOPS constant for the TX2. Public specs (NVIDIA Jetson TX2 "
        "module data sheet): 8 GB 128-bit LPDDR4, 59.7 GB/s; CPU 4x Cortex-A57 2 GHz + 2x "
        "Denver2; GPU 256-core Pascal. Estimate: flops_per_s 16 GFLOP/s = 25% of the A57 "
        "cluster's NEON peak (4 cores x 2 GHz x 8 FLOP/cycle), matching the CPU power figure."
    ),
    **_poet_paging(0.00054, 108.5e6, 0.002396, 94.37e6, 309e-3),
)

_UFS_WATTS = 1.0
PIXEL_4 = DeviceProfile(
    name="pixel-4",
    flops_per_s=2.0e10,
    compute_watts=5.0,
    memory_bandwidth=34.1e9,
    ram_bytes=6 * 1024**3,
    storage_read_bw=800e6,
    storage_write_bw=200e6,
    storage_latency_s=1e-4,
    storage_watts=_UFS_WATTS,
    energy_per_byte_read=_UFS_WATTS / 800e6,
    energy_per_byte_write=_UFS_WATTS / 200e6,
    source=(
        "Google Pixel 4 (Qualcomm Snapdragon 855, the SoC of Melon's Samsung Note10), public "
        "specs: CPU 1x A76 2.84 GHz + 3x A76 2.42 GHz + 4x A55 1.78 GHz (about 220 GFLOP/s "
        "FP32 NEON peak), 6 GB LPDDR4X-4266 4x16-bit (34.1 GB/s), UFS 2.1 flash. Estimates: "
        "flops_per_s 20 GFLOP/s sustained training throughput (about 10% of peak, CPU "
        "frameworks), compute_watts 5 W (SoC under sustained all-core load), flash read "
        "800 MB/s, write 200 MB/s (Melon measured 100-300 MB/s disk writes on its phones), "
        "latency 0.1 ms, flash active power 1 W (energy per byte = 1 W / bandwidth)."
    ),
)

RTX_3090 = DeviceProfile(
    name="rtx-3090",
    flops_per_s=1.78e13,
    compute_watts=350.0,
    memory_bandwidth=936e9,
    ram_bytes=24 * 1024**3,
    storage_read_bw=25e9,
    storage_write_bw=25e9,
    storage_latency_s=1e-5,
    storage_watts=10.0,
    energy_per_byte_read=10.0 / 25e9,
    energy_per_byte_write=10.0 / 25e9,
    source=(
        "NVIDIA GeForce RTX 3090 (the desktop GPU of Sage's evaluation), public specs: 35.6 "
        "TFLOP/s FP32 peak, 24 GB GDDR6X at 936 GB/s, 350 W board power.  Estimates: "
        "flops_per_s 17.8 TFLOP/s sustained (50% of peak), paging = host copies over PCIe 4.0 "
        "x16 (25 GB/s, 10 us, 10 W)."
    ),
)

_PROFILES: dict[str, DeviceProfile] = {
    p.name: p for p in (CORTEX_M0, CORTEX_M4, CORTEX_A72, CORTEX_A72_NOCACHE, JETSON_TX2, PIXEL_4,
                        RTX_3090)
}
_ALIASES = {
    "m0": "cortex-m0", "mkr1000": "cortex-m0", "m4": "cortex-m4", "m4f": "cortex-m4",
    "nrf52840": "cortex-m4", "a72": "cortex-a72", "rpi": "cortex-a72", "rpi4": "cortex-a72",
    "a72nocache": "cortex-a72-nocache", "jetsontx2": "jetson-tx2", "tx2": "jetson-tx2",
    "phone": "pixel-4", "pixel4": "pixel-4", "snapdragon-855": "pixel-4",
    "rtx3090": "rtx-3090", "gpu": "rtx-3090", "desktop-gpu": "rtx-3090",
}


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


@functools.lru_cache(maxsize=1)
def host_profile() -> DeviceProfile:
    """The ``host`` profile from :func:`calibrate_host` (cached for the process).

    ``flops_per_s`` = geometric mean of the dot and conv rates; ``memory_bandwidth`` = the
    elementwise rate; ``ram_bytes`` from ``sysconf``. Assumed (not measured):
    ``compute_watts = 5 W x os.cpu_count()`` (a TDP share), storage (a local NVMe disk or the
    page cache as the paging target) read 2 GB/s, write 1 GB/s, latency 0.1 ms, 5 W while
    transferring.
    """
    cal = calibrate_host()
    cpus = os.cpu_count() or 1
    watts = 5.0  # assumed storage power
    return DeviceProfile(
        name="host",
        flops_per_s=math.sqrt(cal.dot_flops_per_s * cal.conv_flops_per_s),
        compute_watts=HOST_WATTS_PER_CPU * cpus,
        memory_bandwidth=cal.elementwise_bytes_per_s,
        ram_bytes=_ram_bytes(),
        storage_read_bw=2e9,
        storage_write_bw=1e9,
        storage_latency_s=1e-4,
        storage_watts=watts,
        energy_per_byte_read=watts / 2e9,
        energy_per_byte_write=watts / 1e9,
        calibration=tuple(
            (f.name, float(getattr(cal, f.name))) for f in dataclasses.fields(cal)
        ),
        source=(
            f"Calibrated on this machine with JAX ({cpus} CPUs): dot "
            f"{cal.dot_flops_per_s / 1e9:.3g} GFLOP/s, conv {cal.conv_flops_per_s / 1e9:.3g} "
            f"GFLOP/s (flops_per_s = their geometric mean), elementwise "
            f"{cal.elementwise_bytes_per_s / 1e9:.3g} GB/s (memory_bandwidth). Assumed: "
            f"compute_watts = {HOST_WATTS_PER_CPU} W per CPU (TDP share); storage 2 GB/s read, "
            "1 GB/s write, 0.1 ms latency, 5 W."
        ),
    )


# ---------------------------------------------------------------------- registry
def available() -> list[str]:
    """Names of the device profiles (aliases such as POET's ``m0``/``a72`` also work)."""
    return sorted([*_PROFILES, "host"])


def get(name: str | DeviceProfile) -> DeviceProfile:
    """The profile called ``name`` (case-insensitive; POET's platform names are aliases).

    ``"host"`` is calibrated on first use (under 3 s, then cached). A :class:`DeviceProfile`
    is returned unchanged.

    Raises:
      UnknownNameError: no such profile.
    """
    if isinstance(name, DeviceProfile):
        return name
    key = str(name).lower().replace("_", "-")
    key = _ALIASES.get(key, _ALIASES.get(key.replace("-", ""), key))
    if key == "host":
        return host_profile()
    if key not in _PROFILES:
        raise UnknownNameError("device profile", str(name), available())
    return _PROFILES[key]


__all__ = [
    "DeviceProfile", "DeviceProfileError", "HostCalibration", "available", "calibrate_host",
    "get", "host_profile",
]
