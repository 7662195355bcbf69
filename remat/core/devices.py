"""Device profiles: the cost model that turns FLOPs and bytes into seconds and joules.

A :class:`DeviceProfile` gives every graph node a compute time and energy (:meth:`node_costs`)
and every tensor a paging time and energy (:meth:`page_in_cost`, :meth:`page_out_cost`,
:meth:`page_costs`), the per-node arrays that the POET MILP (Patil et al., ICML 2022, eq. 1:
objective ``sum R*Phi_compute + M_in*Phi_pagein + M_out*Phi_pageout`` under a runtime budget
on ``Psi``) and the simulator consume.

Length: one module holds the profile dataclass, its three cost models and the table of named
profiles (with each constant's source), so that a profile is read in one place.

Models (all vectorised over numpy arrays):

* compute, ``model="roofline"`` (default): ``time = max(flops / rate, bytes_moved /
  memory_bandwidth) + launch_s`` (``launch_s`` only for a node that does any work),
  ``energy = time * compute_watts``. ``rate`` is ``flops_per_s``, or, for a node of an extracted
  graph whose equations hold a convolution / a matrix product (``graph.meta["node_primitives"]``),
  ``conv_flops_per_s`` / ``matmul_flops_per_s`` when the profile has them. A node is a stage
  that XLA runs as fused kernels: its bytes are its boundary traffic (inputs and parameters
  read once, output written once), so a fused elementwise chain inside it costs one pass over
  its bytes, not one per equation; a value kept for the backward pass costs the write of its
  producer and one read per consumer, each counted in the node that does it.
* compute, ``model="poet"``: POET's FLOP model (``poet/power_computation.py`` of the
  authors' POET code, Patil et al., ICML 2022):
  ``time = flops / FLOPS``, ``energy = flops / FLOPS_PER_WATT`` (``flops_per_joule``; when a
  profile has none, ``time * compute_watts``).
* paging (POET's ``Phi_out = (PAGEOUT_LATENCY + bytes / PAGEOUT_THROUGHPUT) * MEMORY_POWER``,
  generalised): ``time = latency + bytes / bandwidth``,
  ``energy = latency * storage_watts + bytes * energy_per_byte``. With
  ``energy_per_byte = storage_watts / bandwidth`` (as in the POET-derived profiles) this is POET's
  formula exactly. A transfer of 0 bytes costs nothing (no transfer happens).

Profiles (``get(name)``; see each ``source``): ``cortex-m0``, ``cortex-m4``, ``cortex-a72``,
``cortex-a72-nocache`` (POET's chipset constants, ``poet/chipsets.py`` of the authors' POET
repository; Patil et al., ICML 2022, and ``docs/seeds/poet.md``), ``jetson-tx2`` (POET's
measured paging and power constants plus public specs), ``pixel-4`` (Snapdragon 855 phone, public
specs and estimates), ``rtx-3090`` (a desktop GPU, public specs), ``h100-sxm`` and
``a100-sxm4-80gb`` (NVIDIA datasheets) and ``host`` (this machine, measured by :mod:`remat.devices`).

Measured profiles (``host``, ``calibrated-<platform>``) are made by the JAX side,
:mod:`remat.devices`, which registers ``host`` here (:func:`register_measured`) when it is
imported; this module imports no JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from remat.core.errors import RematError, UnknownNameError

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
      storage_read_bw: paging-target read bandwidth (page-in), bytes/s. On an accelerator the
        paging target is host memory (``pinned_host``), so ``storage_*`` describe the
        host->device (read, page-in) and device->host (write, page-out) link: no separate
        host-link fields, so POET and the simulator page over it unchanged.
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
      calibration: ``(key, value)`` pairs measured on this machine (``host`` and
        :func:`calibrate`'s profiles).
      launch_s: per-kernel launch/dispatch cost, s, added to the roofline time of each node
        that does any work (FLOPs or bytes > 0) under ``model="roofline"``; one launch per node
        (a node is a stage XLA fuses into few kernels). ``0``: the roofline alone (every
        profile before it existed).
      matmul_flops_per_s: FLOP/s of a node holding a ``dot_general`` (``None``:
        ``flops_per_s``), roofline only.
      conv_flops_per_s: FLOP/s of a node holding a ``conv_general_dilated`` (``None``:
        ``matmul_flops_per_s``, else ``flops_per_s``), roofline only. A node with both is
        costed at the slower of the two. Graphs without ``meta["node_primitives"]`` (loaded,
        synthetic) use ``flops_per_s`` throughout, as does ``model="poet"``.
      interconnect_bw: device-to-device bandwidth per device and direction, bytes/s, for the
        collectives of a sharded step (:mod:`remat.sharding`); ``None``: ``memory_bandwidth``
        (devices sharing one host's memory, as XLA:CPU's host devices do).
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
    launch_s: float = 0.0
    matmul_flops_per_s: float | None = None
    conv_flops_per_s: float | None = None
    interconnect_bw: float | None = None

    @property
    def link_bw(self) -> float:
        """Bandwidth of a collective's transfers, bytes/s (``interconnect_bw`` or
        ``memory_bandwidth``)."""
        return float(self.interconnect_bw or self.memory_bandwidth)

    def __post_init__(self) -> None:
        positive = ("flops_per_s", "compute_watts", "memory_bandwidth", "ram_bytes",
                    "storage_read_bw", "storage_write_bw")
        nonneg = ("storage_latency_s", "energy_per_byte_read", "energy_per_byte_write",
                  "storage_watts", "launch_s")
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
        for f in ("matmul_flops_per_s", "conv_flops_per_s", "interconnect_bw"):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise DeviceProfileError(f"device {self.name!r}: {f}={v!r} must be positive")

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
        self, flops: ArrayLike, bytes_moved: ArrayLike = 0.0, *, model: str = "roofline",
        flops_per_s: ArrayLike | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Time (s) and energy (J) of operations, vectorised.

        Args:
          flops: ``float64[n]`` (or scalar) FLOPs per operation.
          bytes_moved: ``float64[n]`` bytes read + written per operation (roofline only).
          model: ``"roofline"`` (``max(flops/rate, bytes/memory_bandwidth) + launch_s`` where
            the operation does any work, energy ``time * compute_watts``) or ``"poet"``
            (``flops/flops_per_s``, energy ``flops * joules_per_flop``).
          flops_per_s: ``float64[n]`` (or scalar) FLOP/s per operation for the roofline
            (``None``: the profile's ``flops_per_s``; :meth:`flop_rates` gives a graph's).

        Returns:
          ``(times_s, energies_j)``, ``float64`` arrays of the broadcast shape.
        """
        f = np.asarray(flops, dtype=np.float64)
        b = np.asarray(bytes_moved, dtype=np.float64)
        if np.any(f < 0) or np.any(b < 0):
            raise DeviceProfileError("flops and bytes must be non-negative")
        if model == "roofline":
            rate = self.flops_per_s if flops_per_s is None else np.asarray(flops_per_s,
                                                                            dtype=np.float64)
            t = np.maximum(f / rate, b / self.memory_bandwidth)
            if self.launch_s > 0:
                t = t + np.where((f > 0) | (b > 0), self.launch_s, 0.0)
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
          ``graph.flops_array`` at :meth:`flop_rates`. Loaded graphs without FLOPs get
          memory-bound times only.
        """
        sizes = np.asarray(graph.sizes, dtype=np.float64)
        moved = sizes + np.fromiter((v.param_bytes for v in graph.nodes), np.float64, graph.n)
        e = np.asarray(graph.edge_array)
        if len(e):
            moved += np.bincount(e[:, 1], weights=sizes[e[:, 0]], minlength=graph.n)
        if extra_bytes is not None:
            moved += np.asarray(extra_bytes, dtype=np.float64)
        rates = self.flop_rates(graph) if model == "roofline" else None
        return self.op_costs(graph.flops_array, moved, model=model, flops_per_s=rates)

    def flop_rates(self, graph: Any) -> np.ndarray | None:
        """``float64[n]`` FLOP/s of each node under the roofline, or ``None`` when every node
        runs at ``flops_per_s`` (the profile has no ``matmul_flops_per_s``/``conv_flops_per_s``,
        or the graph has no ``meta["node_primitives"]``). A node holding a
        ``conv_general_dilated`` runs at the conv rate, one holding a ``dot_general`` at the
        matmul rate (both: the slower), any other at ``flops_per_s``. Primitives inside a
        ``scan``/``while`` body are not seen (the node runs at ``flops_per_s``)."""
        if self.matmul_flops_per_s is None and self.conv_flops_per_s is None:
            return None
        prims = dict(getattr(graph, "meta", None) or {}).get("node_primitives")
        if prims is None or len(prims) != graph.n:
            return None
        mm = self.matmul_flops_per_s or self.flops_per_s
        cv = self.conv_flops_per_s or mm
        has_conv = np.fromiter(("conv_general_dilated" in p for p in prims), bool, graph.n)
        has_dot = np.fromiter(("dot_general" in p for p in prims), bool, graph.n)
        rates = np.full(graph.n, float(self.flops_per_s))
        rates[has_dot] = mm
        rates[has_conv] = cv
        rates[has_conv & has_dot] = min(mm, cv)
        return rates

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
        from remat.core.errors import format_bytes

        extra = ""
        if self.matmul_flops_per_s is not None:
            extra += f", matmul {self.matmul_flops_per_s / 1e9:.4g} GFLOP/s"
        if self.conv_flops_per_s is not None:
            extra += f", conv {self.conv_flops_per_s / 1e9:.4g} GFLOP/s"
        if self.launch_s > 0:
            extra += f", launch {self.launch_s * 1e6:.3g} us"
        return (
            f"{self.name}: {self.flops_per_s / 1e9:.4g} GFLOP/s at {self.compute_watts:.3g} W, "
            f"RAM {format_bytes(self.ram_bytes)} @ {self.memory_bandwidth / 1e9:.3g} GB/s, "
            f"storage read {self.storage_read_bw / 1e6:.4g} MB/s / write "
            f"{self.storage_write_bw / 1e6:.4g} MB/s{extra}"
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

# NVIDIA data-centre GPUs from their datasheets. flops_per_s is the FP32 (CUDA-core) rate, for
# FLOPs outside contractions; matmul_flops_per_s and conv_flops_per_s are the dense TF32
# tensor-core rate, because JAX's default precision for float32 dots and convolutions on GPU is
# TF32 on Ampere and later (docs.jax.dev "Matmul precision": "float32 dot products may be
# computed with reduced-precision arithmetic internally (... TF32 on recent GPUs)"). Peak rates,
# not derated: a measured profile (calibrate()) is the one to trust for absolute times.
_LAUNCH_GPU_S = 5e-6  # estimate, not on a datasheet: a CUDA kernel launch plus the gap between
#                       kernels is a few microseconds (policies/sage.py LAUNCH_S uses the same)
_PCIE_WATTS = 10.0  # estimate: power of the host link and DMA engines during a transfer
_PCIE_LATENCY_S = 1e-5  # estimate: per-transfer latency of a pinned-host copy

H100_SXM = DeviceProfile(
    name="h100-sxm",
    flops_per_s=67e12,
    matmul_flops_per_s=494.5e12,
    conv_flops_per_s=494.5e12,
    compute_watts=700.0,
    memory_bandwidth=3.35e12,
    ram_bytes=80 * 1024**3,
    storage_read_bw=64e9,
    storage_write_bw=64e9,
    storage_latency_s=_PCIE_LATENCY_S,
    storage_watts=_PCIE_WATTS,
    energy_per_byte_read=_PCIE_WATTS / 64e9,
    energy_per_byte_write=_PCIE_WATTS / 64e9,
    launch_s=_LAUNCH_GPU_S,
    interconnect_bw=450e9,
    source=(
        "NVLink 4: 900 GB/s per GPU, 450 GB/s per direction (interconnect_bw). "
        "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), H100 SXM "
        "column: FP32 67 TFLOPS (flops_per_s); TF32 Tensor Core 989 TFLOPS with sparsity, "
        "494.5 dense (matmul_flops_per_s = conv_flops_per_s: JAX's default float32 "
        "dot/conv precision on Ampere+ GPUs is TF32); BF16 Tensor Core 1,979 with sparsity, "
        "989 dense (not used: the model costs float32 graphs); GPU memory 80 GB HBM3 "
        "(80 GiB), 3.35 TB/s; max TDP up to 700 W (configurable; compute_watts); PCIe Gen5 "
        "128 GB/s, i.e. x16 at 64 GB/s per direction nominal (storage_read_bw/write_bw: the "
        "paging target is pinned host memory). Estimates: launch_s 5 us per kernel; host "
        "link latency 10 us and 10 W."
    ),
)

A100_SXM4_80GB = DeviceProfile(
    name="a100-sxm4-80gb",
    flops_per_s=19.5e12,
    matmul_flops_per_s=156e12,
    conv_flops_per_s=156e12,
    compute_watts=400.0,
    memory_bandwidth=2.039e12,
    ram_bytes=80 * 1024**3,
    storage_read_bw=32e9,
    storage_write_bw=32e9,
    storage_latency_s=_PCIE_LATENCY_S,
    storage_watts=_PCIE_WATTS,
    energy_per_byte_read=_PCIE_WATTS / 32e9,
    energy_per_byte_write=_PCIE_WATTS / 32e9,
    launch_s=_LAUNCH_GPU_S,
    interconnect_bw=300e9,
    source=(
        "NVLink 3: 600 GB/s per GPU, 300 GB/s per direction (interconnect_bw). "
        "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), A100 80GB "
        "SXM column: FP32 19.5 TFLOPS (flops_per_s); TF32 Tensor Core 156 TFLOPS dense, 312 "
        "with sparsity (matmul_flops_per_s = conv_flops_per_s: JAX's default float32 "
        "dot/conv precision on Ampere+ GPUs is TF32); BF16 Tensor Core 312 dense (not used); "
        "GPU memory 80 GB HBM2e (80 GiB), 2,039 GB/s; max TDP 400 W (compute_watts); PCIe "
        "Gen4 64 GB/s, i.e. x16 at 32 GB/s per direction nominal (storage_read_bw/write_bw). "
        "Estimates: launch_s 5 us per kernel; host link latency 10 us and 10 W."
    ),
)

_PROFILES: dict[str, DeviceProfile] = {
    p.name: p for p in (CORTEX_M0, CORTEX_M4, CORTEX_A72, CORTEX_A72_NOCACHE, JETSON_TX2, PIXEL_4,
                        RTX_3090, H100_SXM, A100_SXM4_80GB)
}
_ALIASES = {
    "m0": "cortex-m0", "mkr1000": "cortex-m0", "m4": "cortex-m4", "m4f": "cortex-m4",
    "nrf52840": "cortex-m4", "a72": "cortex-a72", "rpi": "cortex-a72", "rpi4": "cortex-a72",
    "a72nocache": "cortex-a72-nocache", "jetsontx2": "jetson-tx2", "tx2": "jetson-tx2",
    "phone": "pixel-4", "pixel4": "pixel-4", "snapdragon-855": "pixel-4",
    "rtx3090": "rtx-3090", "gpu": "rtx-3090", "desktop-gpu": "rtx-3090",
    "h100": "h100-sxm", "h100sxm": "h100-sxm", "h100sxm5": "h100-sxm",
    "a100": "a100-sxm4-80gb", "a100sxm4": "a100-sxm4-80gb", "a100sxm480gb": "a100-sxm4-80gb",
}


# ---------------------------------------------------------------------- registry
#: profiles measured on first use, by name (``host``: registered by :mod:`remat.devices`)
_MEASURED: dict[str, Any] = {}


def register_measured(name: str, factory) -> None:
    """Make ``get(name)`` return ``factory()`` (a measured profile, e.g. ``host``)."""
    _MEASURED[name] = factory


def available() -> list[str]:
    """Names of the device profiles (aliases such as POET's ``m0``/``a72`` also work)."""
    return sorted({*_PROFILES, *_MEASURED, "host"})


def get(name: str | DeviceProfile) -> DeviceProfile:
    """The profile called ``name`` (case-insensitive; POET's platform names are aliases).

    A measured profile (``"host"``) comes from its registered factory (:mod:`remat.devices`
    registers ``host``, calibrated on first use in under 3 s). A :class:`DeviceProfile` is
    returned unchanged.

    Raises:
      UnknownNameError: no such profile.
    """
    if isinstance(name, DeviceProfile):
        return name
    key = str(name).lower().replace("_", "-")
    key = _ALIASES.get(key, _ALIASES.get(key.replace("-", ""), key))
    if key in _MEASURED:
        return _MEASURED[key]()
    if key == "host":
        raise UnknownNameError("device profile", "host (measured: import remat.devices first)",
                               available())
    if key not in _PROFILES:
        raise UnknownNameError("device profile", str(name), available())
    return _PROFILES[key]


__all__ = ["DeviceProfile", "DeviceProfileError", "available", "get", "register_measured"]
