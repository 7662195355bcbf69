"""NNTrainer (Moon et al., ICSE-SEIP 2024): no recomputation, a planned arena, optional swap.

On a :class:`remat.Graph` (a stage graph from :func:`remat.extract`: a node is a layer's forward
or backward) the execution order is the graph's node order, one node per step (the
checkpoint-all schedule), and every output lives from its computation to its last reader.  The
plan's allocations (:func:`remat.core.layout.lifetimes`: a paged-in value is a new allocation from its
page-in to its free) are laid out by one of NNTrainer's planners into ``Plan.offsets``:
``placement="auto"`` (default) takes NNTrainer's default ``OptimizedV1Planner``
(:func:`solvers.nntrainer_plan.optimized_v1`) without swap and its ``OptimizedV3Planner``
(:func:`solvers.nntrainer_plan.optimized_v3`) with swap; any :data:`remat.core.layout.PLACEMENTS` name
or function overrides it.

Why not V1 under swap: V1 is a stack allocator that frees only expired slots on the *top* of the
stack and otherwise reuses an expired slot of *exactly* the request's size.  Swapping cuts the
long lives of forward activations into a short first allocation and a late page-in allocation;
the first allocations expire at the bottom of the stack under still-live ones, so they are never
popped, and the only exact-size match a page-in finds is its own pre-swap slot.  The layout is
then the no-swap layout (vgg16 batch 64: 317.3 MB arena with or without swap while the peak drops
from 228.4 to 101.5 MB; V3 gives 231.7 and 105.6 MB).  NNTrainer itself never needed V1 to shrink:
with swap its planned offsets are offsets in the swap *file*, and device memory is one ``calloc``
per resident tensor, so its device footprint is the resident bytes, which V3's
first-gap layout approximates within a few percent.

With ``swap`` the idle stretches of each value are paged out to storage, in POET's plan
representation (``page_out``/``page_in``/``S_aux``; semantics in :mod:`remat.core.schedule`), so
:func:`remat.simulate` and :func:`remat.execute` run it.  For a value ``i`` read at steps
``a < b`` and not in between, with ``g = b - a - 1`` idle steps:

* its first swapped gap pages it out at the start of step ``a + 1`` (it is then freed in that
  step); storage keeps the copy (values never change), so later gaps only page in;
* it is paged in at the end of step ``p = b - 1 - k``, resident again from step ``b - k``:
  ``k = lookahead`` for ``"proactive"`` (NNTrainer's prefetch of EO ``n + lookahead``),
  ``k = 0`` for ``"on_demand"`` (loaded just before use);
* a gap is swapped when ``p`` leaves at least one step off the device (``g >= k + 2`` for a
  first gap, ``g >= k + 1`` after).

Under a budget the fewest largest values are swapped (peak bytes are monotone in the swapped
set: a swap only removes residency); ``budget=None`` swaps every eligible gap.

Latency (``meta["latency_s"]``) is :func:`solvers.nntrainer_plan.swap_latency`: per-node compute
time from the device profile, transfers on one read and one write stream of the profile's
storage (``page_in_cost``/``page_out_cost``).  On-demand transfers are synchronous (issued when
due); proactive reads are issued ``k`` steps early and writes right after the value is
computed, due when the plan frees the device copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from policies.base import BasePolicy, PolicyContext, checkpoint_all_plan, register
from remat.core.errors import InfeasibleBudgetError, InvalidPlanError
from remat.core.graph import Graph
from remat.core.layout import allocate
from remat.core.plan import Plan
from remat.core.schedule import replay
from solvers.nntrainer_plan import swap_latency

__all__ = ["NNTrainer", "swap_plan", "Gap"]

MODES = ("proactive", "on_demand")


@dataclasses.dataclass(frozen=True)
class Gap:
    """One swapped idle stretch of node ``node``'s output: read at step ``a``, next at ``b``;
    paged out at the start of ``a + 1`` when ``first``, paged in at the end of ``p``."""

    node: int
    a: int
    b: int
    p: int
    first: bool


def _gaps(graph: Graph, k: int) -> list[list[Gap]]:
    """Swappable gaps per node (checkpoint-all schedule, step t computes node t)."""
    out: list[list[Gap]] = []
    for i in range(graph.n):
        uses = [i] + sorted(set(graph.succs[i]))
        gs: list[Gap] = []
        for a, b in zip(uses, uses[1:]):
            p = b - 1 - k
            first = not gs
            if p >= a + (2 if first else 1):
                gs.append(Gap(i, a, b, p, first))
        out.append(gs)
    return out


def swap_plan(graph: Graph, gaps: list[Gap]) -> Plan:
    """The checkpoint-all plan with ``gaps`` paged out and back in (POET matrices)."""
    base = checkpoint_all_plan(graph)
    S = base.S.copy()
    n = graph.n
    page_out = np.zeros_like(S)
    page_in = np.zeros_like(S)
    S_aux = np.zeros_like(S)
    for g in gaps:
        i = g.node
        if g.first:
            page_out[g.a + 1, i] = True
            S_aux[g.a + 2:, i] = True
            S[g.a + 2:g.p + 1, i] = False
        else:
            S[g.a + 1:g.p + 1, i] = False
        page_in[g.p, i] = True
    if n == 0 or not len(gaps):
        z = np.zeros_like(S)
        return Plan(R=base.R, S=S, page_out=z, page_in=z, S_aux=z)
    return Plan(R=base.R, S=S, page_out=page_out, page_in=page_in, S_aux=S_aux)


def _device(device: Any):
    from remat.core import devices

    return devices.get(device) if isinstance(device, str) else device


@register("nntrainer")
@dataclasses.dataclass(frozen=True)
class NNTrainer(BasePolicy):
    """NNTrainer's planner and swap as a policy (``policies.get("nntrainer", swap=True)``).

    Attributes:
      budget: device-memory budget (bytes, ``"60%"``, ``"512MiB"``); ``None``: no limit.
      swap: ``False`` (no swap), ``True`` or ``"proactive"`` (prefetch ``lookahead`` steps
        ahead), ``"on_demand"`` (page in just before use).
      lookahead: proactive prefetch distance ``k`` (steps, >= 1).
      device: :mod:`remat.core.devices` profile (name or object) for compute and storage times;
        ``None``: ``"pixel-4"`` (a phone with UFS flash).
      placement: layout of ``Plan.offsets``: ``"auto"`` (``"nntrainer_v1"`` without swap,
        ``"nntrainer_v3"`` with swap; see the module docstring), or a
        :data:`remat.core.layout.PLACEMENTS` name or function.
    """

    budget: int | str | None = None
    swap: bool | str = False
    lookahead: int = 2
    device: Any = None
    placement: Any = "auto"

    def mode(self) -> str | None:
        """``None`` (no swap), ``"proactive"`` or ``"on_demand"``."""
        if self.swap is False or self.swap is None:
            return None
        m = "proactive" if self.swap is True else str(self.swap).lower().replace("-", "_")
        if m not in MODES:
            raise InvalidPlanError(f"nntrainer: swap must be False, True or one of {MODES}, "
                                   f"got {self.swap!r}")
        return m

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        """See the module docstring.  ``meta``: ``swap``, ``lookahead``, ``device``,
        ``latency_s``, ``baseline_latency_s`` (no swap), ``latency_overhead``, ``bytes_paged``,
        ``no_swap_peak_bytes``, ``arena_bytes``, ``layout``.

        Raises:
          InfeasibleBudgetError: the budget is below the peak with every eligible gap swapped
            (or, without swap, below the no-recomputation peak).
        """
        mode = self.mode()
        if int(self.lookahead) < 1:
            raise InvalidPlanError(f"nntrainer: lookahead must be >= 1, got {self.lookahead}")
        k = 0 if mode == "on_demand" else int(self.lookahead)
        no_swap = graph.no_remat_peak()
        cand = [g for gs in _gaps(graph, k) for g in gs] if mode else []
        # swap whole values, largest first (all of a value's gaps together)
        by_node: dict[int, list[Gap]] = {}
        for g in cand:
            by_node.setdefault(g.node, []).append(g)
        nodes = sorted(by_node, key=lambda i: (-int(graph.sizes[i]), i))

        def build(m: int) -> tuple[Plan, int]:
            chosen = [g for i in nodes[:m] for g in by_node[i]]
            p = swap_plan(graph, chosen)
            return p, replay(graph, p).peak_bytes

        plan, peak = build(len(nodes))
        if budget_bytes is not None and peak > budget_bytes:
            why = "no swap" if not mode else f"{mode} swap of every idle stretch"
            raise InfeasibleBudgetError(budget_bytes, peak, f"nntrainer ({why}, no recompute)")
        if budget_bytes is not None and no_swap > budget_bytes:
            lo, hi = 0, len(nodes)  # the fewest values whose swap fits (peak is monotone)
            while lo < hi:
                mid = (lo + hi) // 2
                if build(mid)[1] <= budget_bytes:
                    hi = mid
                else:
                    lo = mid + 1
            plan, peak = build(lo)
        elif budget_bytes is not None:
            plan, peak = build(0)
        placement = self.placement
        if isinstance(placement, str) and placement == "auto":
            placement = "nntrainer_v3" if plan.paging else "nntrainer_v1"
        plan = allocate(graph, plan, placement=placement)
        dev = _device(self.device if self.device is not None else "pixel-4")
        lat = latency(graph, plan, dev, mode or "proactive")
        base = latency(graph, swap_plan(graph, []), dev, "proactive")
        name = dev.name if hasattr(dev, "name") else str(dev)
        return plan.with_meta(
            status="heuristic", swap=mode or False, lookahead=k, device=name,
            latency_s=lat, baseline_latency_s=base,
            latency_overhead=lat / base - 1.0 if base > 0 else 0.0,
            bytes_paged=int(plan.page_out.sum(0) @ graph.sizes + plan.page_in.sum(0) @ graph.sizes),
            no_swap_peak_bytes=int(no_swap), method="swap" if plan.paging else "no_swap")


def latency(graph: Graph, plan: Plan, device: Any, mode: str = "proactive") -> float:
    """Modelled time (s) of a checkpoint-all-shaped swap plan (one node per step) on ``device``:
    see the module docstring and :func:`solvers.nntrainer_plan.swap_latency`."""
    dev = _device(device)
    times = np.asarray(dev.node_costs(graph)[0], dtype=np.float64)
    compute = plan.R.astype(np.float64) @ times
    sizes = graph.sizes.astype(np.float64)
    t_in = np.asarray(dev.page_in_cost(sizes)[0], dtype=np.float64)
    t_out = np.asarray(dev.page_out_cost(sizes)[0], dtype=np.float64)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    if plan.page_in is None or not plan.paging:
        return swap_latency(compute, empty, empty)
    ps, pi = np.nonzero(plan.page_in)  # page-in at the end of step ps: due at ps + 1
    os_, oi = np.nonzero(plan.page_out)  # page-out at the start of step os_: due there
    if mode == "on_demand":
        r_issue, w_issue = ps + 1, os_
    else:
        r_issue = ps + 1
        computed = np.argmax(plan.R, axis=0)  # first step computing each node
        w_issue = np.minimum(computed[oi] + 1, os_)
    reads = (r_issue, ps + 1, t_in[pi])
    writes = (w_issue, os_, t_out[oi])
    return swap_latency(compute, reads, writes)
