"""Predict what a plan costs: peak memory (live bytes, and the arena a layout needs), compute
time, energy, overhead, memory timeline."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from remat.core import layout
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.schedule import fold


@dataclasses.dataclass(frozen=True)
class Report:
    """Simulated cost of a plan on a graph.

    Attributes:
      peak_bytes: peak resident activation bytes (stage outputs; parameters excluded), the sum
        of live allocations: what an allocator without fragmentation needs.
      arena_bytes: bytes of the one arena that holds every allocation at its offset: the plan's
        ``offsets`` when it has them, else a layout by ``placement`` (best fit by default);
        ``>= peak_bytes``.  ``None`` when ``simulate(..., placement=None)``.
      fragmentation: ``arena_bytes / peak_bytes - 1`` (0.0 = no fragmentation), or ``None``.
      compute_time_s: sum of ``time_s`` over every (re)computation (graph cost units for loaded
        graphs).
      energy_j: compute energy plus paging energy, joules (0 when the graph has no energy model).
      overhead: ``compute_time_s`` over checkpoint-all's (running every node once); 1.0 = no
        recomputation.
      recomputations: node executions beyond the first.
      paging_time_s, paging_energy_j, bytes_paged: paging costs (POET plans), else 0.
      timeline: ``dict`` of arrays ``step``, ``node``, ``live_bytes`` (one entry per compute event).
      static_bytes: parameter plus input bytes, resident throughout (not in ``peak_bytes``).
    """

    peak_bytes: int
    compute_time_s: float
    energy_j: float
    overhead: float
    recomputations: int
    paging_time_s: float = 0.0
    paging_energy_j: float = 0.0
    bytes_paged: int = 0
    arena_bytes: int | None = None
    fragmentation: float | None = None
    timeline: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    static_bytes: int = 0
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def total_peak_bytes(self) -> int:
        """``peak_bytes + static_bytes``."""
        return self.peak_bytes + self.static_bytes


def simulate(
    graph: Graph, plan: Plan, device=None, *, placement: str | layout.Placement | None = "best_fit"
) -> Report:
    """Simulate ``plan`` on ``graph``.

    Args:
      graph: the training graph.
      plan: a plan for it (validated here; an illegal plan raises ``InvalidPlanError``).
      device: optional device profile (``remat.devices``) or its name; when given, per-node time
        and energy are re-modelled from FLOPs and bytes, and each page move of node i's output
        costs ``device.page_out_cost(out_bytes[i])`` / ``page_in_cost`` (time s, energy J),
        reported as ``paging_time_s``/``paging_energy_j`` and included in ``energy_j``.
      placement: layout used for ``arena_bytes`` when the plan has no ``offsets`` (a name from
        :data:`remat.core.layout.PLACEMENTS` or a placement function); ``None`` skips the layout.

    Returns:
      A :class:`Report`.
    """
    events = plan.validate(graph)
    rep = fold(events)
    arena = frag = None
    if plan.offsets is not None or placement is not None:
        lt = layout.lifetimes(events)
        offsets = plan.offsets
        if offsets is None:
            offsets = layout.get_placement(placement)[1](lt.intervals, lt.sizes)
        arena = layout.arena_size(offsets, lt.sizes)
        frag = arena / rep.peak_bytes - 1.0 if rep.peak_bytes > 0 else 0.0
    counts = plan.R.sum(axis=0)
    if isinstance(device, str):
        from remat.core import devices

        device = devices.get(device)
    if device is not None:
        times, energies = device.node_costs(graph)
    else:
        times, energies = graph.costs, graph.energies
    compute = float(counts @ times)
    energy = float(counts @ energies)
    base = float(times.sum())
    paged = 0
    ptime = penergy = 0.0
    if plan.page_out is not None or plan.page_in is not None:
        # POET eq. (2): each page move of node i's output costs the device's per-move time and
        # energy (latency + bytes / bandwidth); no device -> bytes only
        sizes = graph.sizes
        z = np.zeros(graph.n, dtype=np.int64)
        n_out = plan.page_out.sum(axis=0) if plan.page_out is not None else z
        n_in = plan.page_in.sum(axis=0) if plan.page_in is not None else z
        paged = int(n_out @ sizes + n_in @ sizes)
        if device is not None:
            t_out, e_out = device.page_out_cost(sizes.astype(np.float64))
            t_in, e_in = device.page_in_cost(sizes.astype(np.float64))
            ptime = float(n_out @ np.broadcast_to(t_out, sizes.shape) + n_in @ np.broadcast_to(t_in, sizes.shape))
            penergy = float(n_out @ np.broadcast_to(e_out, sizes.shape) + n_in @ np.broadcast_to(e_in, sizes.shape))
    return Report(
        peak_bytes=rep.peak_bytes,
        compute_time_s=compute,
        energy_j=energy + penergy,
        overhead=compute / base if base > 0 else 1.0,
        recomputations=int(counts.sum() - graph.n),
        paging_time_s=ptime,
        paging_energy_j=penergy,
        bytes_paged=paged,
        arena_bytes=arena,
        fragmentation=frag,
        timeline={"step": rep.step, "node": rep.node, "live_bytes": rep.live_bytes},
        static_bytes=int(graph.param_bytes + graph.input_bytes),
        meta={"policy": plan.meta.get("policy"), "status": plan.meta.get("status")},
    )
