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
specs and estimates), ``rtx-3090`` (a desktop GPU, public specs), ``h100-sxm`` and
``a100-sxm4-80gb`` (NVIDIA datasheets) and ``host`` (this machine, calibrated by timing JAX
primitives).

Measured profiles: :func:`calibrate` times the running backend (dense matmul, convolution,
streaming bandwidth, per-kernel launch cost and, where the device has a ``pinned_host`` memory,
host<->device transfers) in a few seconds and returns ``calibrated-<platform>``;
:func:`for_backend` picks ``host`` on the CPU and the calibrated profile on an accelerator.
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
        for f in ("matmul_flops_per_s", "conv_flops_per_s"):
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
        from remat.errors import format_bytes

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
    source=(
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
    source=(
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
    "DeviceProfile", "DeviceProfileError", "HostCalibration", "available", "calibrate",
    "calibrate_host", "for_backend", "get", "host_profile",
]
