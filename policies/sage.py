"""Sage (Gim and Ko, "Memory-efficient DNN training on mobile devices", MobiSys 2022, §3.4):
a hybrid of dynamic gradient accumulation (DGA) and dynamic gradient checkpointing (DGC), run
offline on the training graph as a plan.

**Throughput model and the MTP.**  A node's modelled time on a device profile is
``max(roofline, launch_s)``: the roofline of :meth:`remat.core.devices.DeviceProfile.node_costs`
(``max(flops / flops_per_s, bytes / memory_bandwidth)``, bytes including the parameters it reads)
floored by ``launch_s`` times its number of kernels (its fusion groups, :func:`kernel_counts`):
launch latency and too little parallel work to fill the device (:data:`LAUNCH_S`, estimates).  A step of ``k`` micro-batches takes
``k * sum_i count_i * time_i`` over the plan's compute counts on ``ctx.graph_at(k)`` (seconds),
and the throughput is ``batch / step`` (samples/s).  The **minimum throughput point** (MTP,
§3.4.3; the paper gives only "≤ 6 for ResNet-50") is measured from this model: the smallest
micro-batch size ``m`` (a divisor of the batch) whose no-remat throughput is at least
``(1 - mtp_tol)`` of the full batch's; below it the device is under-utilised.

**Algorithm** (Algorithm 1 as a static plan; the notes' cleaned-up semantics).
``order="accumulate_first"`` (Sage): lower the micro-batch size (raise ``k``) while the
micro-batch stays at or above the MTP and the no-remat peak of ``graph_at(k)`` exceeds the
budget; if the smallest micro-batch at or above the MTP still does not fit, checkpoint it (DGC).
``order="checkpoint_first"``: at each ``k`` from 1 up, checkpoint first and lower the micro-batch
only when checkpointing alone cannot fit.  Both continue below the MTP (throughput drops, the
plan is marked ``meta["below_mtp"]``) when nothing at or above it fits: Sage's Algorithm 1 would
stop there, a plan that runs slower is more useful than an error.

**DGC** (§3.4.1, :func:`sage_steps`): nodes run in index order; a step first recomputes the
evicted ancestry of its node (recursively, index order), then the node; before a value is
produced, while resident bytes plus its size exceed the budget, the resident value with the
smallest ``time / out_bytes`` (recompute latency per byte, its own compute time only, no
staleness: Sage's ``h(c)``) that no remaining computation of the step reads (the lock set ``D``)
is evicted; values of size 0 are never evicted.

**BatchNorm.**  When ``ctx.batch_coupled`` (BatchNorm statistics couple the samples),
``coupled="checkpoint_only"`` (default) plans at the full batch with checkpointing only, so the
gradients are exactly the full batch's; ``coupled="accumulate"`` micro-batches anyway, as Sage
and Melon do on phones: each micro-batch normalises with its own statistics (ghost batch norm),
so the gradients are the mean of the per-micro-batch gradients, not the full batch's.
``meta["batch_coupled"]`` says which happened.

**Dynamic budget** (§3.4, Fig. 12): :func:`plans_for_trace` re-plans at each change of a budget
trace ``[(step, bytes), ...]`` (between training steps; Sage's own runtime shrinks the
micro-batch inside an iteration, which a static plan does not model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from policies.base import (
    BasePolicy,
    PolicyContext,
    bisect_min_budget,
    checkpoint_all_plan,
    register,
)
from policies.from_checkpoints import plan_from_steps
from policies.greedy_remat import evict_steps
from remat.core.errors import BudgetFormatError, InfeasibleBudgetError, InvalidOptionError
from remat.core.graph import Graph
from remat.core.passes import fusion_labels
from remat.core.plan import Plan

#: per-kernel minimum time (s): launch latency and under-filled parallel units.  Estimates:
#: a mobile GPU/CPU OpenCL kernel launch ~20 us, a desktop CUDA kernel ~5 us.
LAUNCH_S = {"pixel-4": 2e-5, "rtx-3090": 5e-6, "jetson-tx2": 1e-5}
DEFAULT_LAUNCH_S = 1e-5
ORDERS = ("accumulate_first", "checkpoint_first")


def kernel_counts(graph: Graph) -> np.ndarray:
    """``int64[n]`` kernels per node: its fusion groups (:func:`remat.core.passes.fusion_labels`
    over the operator classes of the node's equations) for an extracted graph, 1 per node
    otherwise."""
    prog = graph.program
    if prog is None:
        return np.ones(graph.n, dtype=np.int64)
    out = np.ones(graph.n, dtype=np.int64)
    for i in range(graph.n):
        js = prog.node_eqns[i]
        if js:
            out[i] = int(fusion_labels([prog.eqn_classes[j] for j in js]).max()) + 1
    return out


def node_times(graph: Graph, device, launch_s: float | None = None) -> np.ndarray:
    """``float64[n]`` modelled time of one execution of each node (s): the device's roofline
    floored by ``launch_s`` (default :data:`LAUNCH_S` of the profile) per kernel of the node
    (:func:`kernel_counts`)."""
    from remat.core import devices

    prof = devices.get(device)
    t, _ = prof.node_costs(graph)
    lat = LAUNCH_S.get(prof.name, DEFAULT_LAUNCH_S) if launch_s is None else float(launch_s)
    return np.maximum(t, lat * kernel_counts(graph))


def sage_steps(graph: Graph, budget: int, costs: np.ndarray) -> tuple[list[list[int]], int] | None:
    """Sage's DGC under ``budget`` bytes of resident node outputs (module docstring).

    Args:
      graph: the graph (index order is topological).
      budget: bytes.
      costs: ``float64[n]`` recompute latency per node (s), the numerator of ``h(c)``.

    Returns:
      ``(steps, evictions)`` (``steps[t]``: sorted nodes run in step ``t``, node ``t`` last), or
      ``None`` when the locked values plus a new output exceed ``budget``.
    """
    sizes = [int(x) for x in graph.sizes]

    def pick(res, need, t, clock, stamp) -> int:  # smallest h(c), ties to the lowest index
        best, best_h = -1, float("inf")
        for u in res:
            if u in need or sizes[u] == 0:
                continue
            h = costs[u] / sizes[u]
            if h < best_h or (h == best_h and u < best):
                best, best_h = u, h
        return best

    r = evict_steps(graph, budget, pick)
    return None if r is None else (r[0], r[2])


@register("sage")
@dataclasses.dataclass(frozen=True)
class Sage(BasePolicy):
    """Sage's hybrid of gradient accumulation and checkpointing (module docstring).

    Args:
      budget: activation bytes, ``"60%"`` (of the full-batch no-remat peak) or ``"512MiB"``.
      order: ``"accumulate_first"`` (Sage) or ``"checkpoint_first"``.
      mtp: the minimum throughput point as a micro-batch size, or ``"auto"`` (measured on the
        device profile, :meth:`min_throughput_point`).
      device: profile name for the throughput model and recompute latencies (``None``:
        ``ctx.device``, else ``"pixel-4"``).
      launch_s: per-kernel minimum time, s (``None``: :data:`LAUNCH_S`).
      mtp_tol: relative throughput loss that defines the MTP.
      accumulate, checkpoint: allow each method (``False`` gives the DGC-only / DGA-only
        baselines).
      coupled: with batch-coupled layers: ``"checkpoint_only"`` or ``"accumulate"``.
      search_rtol: precision of the minimum feasible budget reported on infeasibility.
    """

    budget: int | str | None = None
    order: str = "accumulate_first"
    mtp: int | str = "auto"
    device: str | None = None
    launch_s: float | None = None
    mtp_tol: float = 0.05
    accumulate: bool = True
    checkpoint: bool = True
    coupled: str = "checkpoint_only"
    search_rtol: float = 1e-2

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise InvalidOptionError(f"Sage order must be one of {ORDERS}, got {self.order!r}")
        if self.coupled not in ("checkpoint_only", "accumulate"):
            raise InvalidOptionError("Sage coupled must be 'checkpoint_only' or 'accumulate', "
                                    f"got {self.coupled!r}")
        if not (self.mtp == "auto" or (isinstance(self.mtp, int) and self.mtp >= 1)):
            raise InvalidOptionError(f"Sage mtp must be 'auto' or a positive int, got {self.mtp!r}")

    # ------------------------------------------------------------------ the model
    def _device(self, ctx: PolicyContext):
        return self.device or ctx.device or "pixel-4"

    def times(self, graph: Graph, ctx: PolicyContext) -> np.ndarray:
        """Modelled node times of ``graph`` on this policy's device (s)."""
        return node_times(graph, self._device(ctx), self.launch_s)

    def _counts(self, ctx: PolicyContext) -> tuple[list[int], str]:
        """Micro-batch counts allowed (ascending, 1 first) and why."""
        if not self.accumulate:
            return [1], "accumulation disabled"
        if ctx.batch_coupled and self.coupled == "checkpoint_only":
            return [1], ("BatchNorm (batch-coupled): checkpointing only, gradients are the full "
                         "batch's")
        ks = ctx.microbatch_counts()
        if not ks:
            return [1], "no micro-batch count available (no graph_at or batch size)"
        why = "micro-batches allowed"
        if ctx.batch_coupled:
            why = ("BatchNorm (batch-coupled) with coupled='accumulate': each micro-batch uses "
                   "its own statistics (ghost batch norm), gradients differ from the full batch")
        return [1] + ks, why

    def step_time(self, plan: Plan, graph: Graph, ctx: PolicyContext) -> float:
        """Modelled seconds of one training step of ``plan`` (``graph``: the full-batch graph;
        the plan's columns are ``ctx.graph_at(plan.microbatches)``)."""
        k = int(plan.microbatches)
        g = graph if k == 1 else ctx.graph_at(k)
        return float(k * (plan.compute_counts() @ self.times(g, ctx)))

    def throughput_curve(self, graph: Graph, ctx: PolicyContext) -> list[tuple[int, int, float]]:
        """``[(micro-batch size, k, samples/s), ...]`` of no-remat plans at every allowed ``k``."""
        ks, _ = self._counts(ctx)
        B = ctx.batch_size or 1
        out = []
        for k in ks:
            g = graph if k == 1 else ctx.graph_at(k)
            t = float(k * self.times(g, ctx).sum())
            out.append((B // k, k, B / t if t > 0 else float("inf")))
        return out

    def min_throughput_point(self, graph: Graph, ctx: PolicyContext) -> int:
        """The MTP as a micro-batch size: the option, or the smallest micro-batch size whose
        modelled throughput is at least ``(1 - mtp_tol)`` of the full batch's."""
        if self.mtp != "auto":
            return int(self.mtp)
        curve = self.throughput_curve(graph, ctx)
        full = curve[0][2]
        ok = [m for m, _, thr in curve if thr >= (1.0 - self.mtp_tol) * full]
        return min(ok) if ok else curve[0][0]

    # ------------------------------------------------------------------ planning
    def _dgc(self, g: Graph, b: int, ctx: PolicyContext) -> Plan | None:
        found = sage_steps(g, int(b), self.times(g, ctx))
        if found is None:
            return None
        steps, ev = found
        return plan_from_steps(g, steps, status="heuristic", evictions=ev)

    def _at(self, g: Graph, b: int, ctx: PolicyContext, k: int, ckpt: bool) -> Plan | None:
        if g.no_remat_peak() <= b:
            p = checkpoint_all_plan(g).with_meta(status="heuristic", evictions=0)
        elif ckpt and self.checkpoint:
            p = self._dgc(g, b, ctx)
            if p is None:
                return None
        else:
            return None
        return dataclasses.replace(p, microbatches=k)

    def _search(self, graph: Graph, b: int, ctx: PolicyContext) -> tuple[Plan | None, int, list]:
        ks, _ = self._counts(ctx)
        B = ctx.batch_size or 1
        mtp = self.min_throughput_point(graph, ctx) if len(ks) > 1 else B

        def G(k):
            return graph if k == 1 else ctx.graph_at(k)

        if self.order == "accumulate_first":
            above = [k for k in ks if B // k >= mtp] or [1]
            below = [k for k in ks if k not in above]
            for k in above:
                p = self._at(G(k), b, ctx, k, ckpt=k == above[-1])
                if p is not None:
                    return p, mtp, ks
            for k in below:
                p = self._at(G(k), b, ctx, k, ckpt=True)
                if p is not None:
                    return p, mtp, ks
            return None, mtp, ks
        for k in ks:
            p = self._at(G(k), b, ctx, k, ckpt=True)
            if p is not None:
                return p, mtp, ks
        return None, mtp, ks

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int:
        """Smallest budget (bytes, within ``search_rtol``) this policy fits: its plan at the
        largest allowed micro-batch count (DGC's bisected minimum there, or the no-remat peak
        when checkpointing is off)."""
        ctx = ctx or PolicyContext()
        ks, _ = self._counts(ctx)
        g = graph if ks[-1] == 1 else ctx.graph_at(ks[-1])
        if not self.checkpoint:
            return int(g.no_remat_peak())
        costs = self.times(g, ctx)
        return bisect_min_budget(g, lambda b: sage_steps(g, b, costs) is not None,
                                 rtol=self.search_rtol, name="sage")

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        b = graph.no_remat_peak() if budget_bytes is None else int(budget_bytes)
        p, mtp, ks = self._search(graph, b, ctx)
        if p is None:  # the wrapper adds min_feasible_budget
            raise InfeasibleBudgetError(b, None, "sage heuristic's own minimum (bisection), not a "
                                        "proven bound")
        k = int(p.microbatches)
        B = ctx.batch_size or 1
        recomputed = bool((p.compute_counts() > 1).any())
        method = {(False, False): "none", (True, False): "accumulate",
                  (False, True): "checkpoint", (True, True): "hybrid"}[(k > 1, recomputed)]
        step_s = self.step_time(p, graph, ctx)
        _, why = self._counts(ctx)
        return p.with_meta(
            method=method, order=self.order, mtp=int(mtp), microbatch_size=B // k,
            below_mtp=bool(B // k < mtp), device=str(self._device(ctx)), modelled_step_s=step_s,
            throughput_samples_per_s=B / step_s if step_s > 0 else float("inf"),
            batch_coupled=why)


def budget_at(trace: Sequence[tuple[int, int | str]], step: int):
    """The budget in force at training ``step`` under ``trace`` (``[(step, budget), ...]``,
    sorted by step; before the first entry: ``None``, no limit)."""
    cur = None
    for s, b in trace:
        if s <= step:
            cur = b
        else:
            break
    return cur


def plans_for_trace(policy: BasePolicy, graph: Graph, trace: Sequence[tuple[int, int | str]],
                    n_steps: int, ctx: PolicyContext) -> list[tuple[int, object, Plan]]:
    """Replay a budget trace over ``n_steps`` training steps, re-planning only when the budget
    changes (Fig. 12).

    Returns:
      ``[(step, budget, plan), ...]`` per step (the same plan object until the budget changes;
      ``plan.meta["replanned"]`` is True at the steps where planning ran).

    Raises:
      BudgetFormatError: the trace is not sorted by step.
      InfeasibleBudgetError: a budget of the trace fits no plan.
    """
    steps = [int(s) for s, _ in trace]
    if steps != sorted(steps):
        raise BudgetFormatError(f"budget trace steps must be sorted, got {steps}")
    out: list[tuple[int, object, Plan]] = []
    last_b, plan = object(), None
    for s in range(int(n_steps)):
        b = budget_at(trace, s)
        if plan is None or b != last_b:
            plan = policy.plan(graph, budget=b, ctx=ctx).with_meta(replanned=True)
            last_b = b
            out.append((s, b, plan))
        else:
            out.append((s, b, plan.with_meta(replanned=False)))
    return out


__all__ = ["LAUNCH_S", "ORDERS", "Sage", "budget_at", "kernel_counts", "node_times",
           "plans_for_trace", "sage_steps"]
