"""OLLA (Steiner et al.): reorder the nodes and place every tensor at a fixed arena offset.

No recomputation: the order phase (the lifetime ILP, paper eq. 14, :func:`solvers.olla.solve_order`)
picks the topological order with the smallest peak of resident bytes (eq. 13), realised as a plan
whose step ``t`` computes the ``t``-th node of that order (:func:`plan_from_steps`, outputs kept
exactly until their last reader); the address phase (eq. 15, :func:`solvers.olla.solve_addresses`)
then lays the plan's allocations out in one arena (:func:`remat.core.layout.allocate` with
:func:`olla_placement`), warm-started from the better of best fit and greedy-by-size.

Any other policy's plan goes through the same two phases with :func:`olla_layout` (or
``Olla(base=...)``): the address phase always, the order phase when the plan computes every node
exactly once without paging (a plan that recomputes keeps its own schedule)::

    plan = policies.Olla(base=policies.Checkmate(budget="60%")).plan(graph)
    plan.meta["arena_bytes"], plan.offsets

Sizes, peaks, arenas and bounds are bytes; times are seconds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from policies.base import BasePolicy, Policy, PolicyContext, register
from policies.from_checkpoints import plan_from_steps
from remat.core import layout
from remat.core.errors import InfeasibleBudgetError
from remat.core.graph import Graph
from remat.core.plan import Plan
from solvers.olla import AddressSolution, OrderSolution, solve_addresses, solve_order

__all__ = ["Olla", "OllaPlacement", "olla_placement", "olla_order", "olla_layout"]


class OllaPlacement:
    """A :data:`remat.core.layout.Placement` running OLLA's address ILP (eq. 15).

    Call it as ``placement(intervals, sizes) -> offsets`` (bytes); the last call's
    :class:`solvers.olla.AddressSolution` (status, gap, bound, times) is kept in ``last`` and the
    warm start's name in ``warm_name``.  The warm start is the smallest arena among the named
    placements of ``warm``, longest-lifetime-first (first fit; Melon's order), and up to
    ``restarts`` greedy-by-size layouts with sizes jittered by +-30% (seeded), stopping at the
    max-live bound or after ``warm_share`` of the time limit.

    Args:
      time_limit: seconds per call (warm start included).
      mip_gap: relative gap at which HiGHS stops.
      threads: HiGHS threads.
      max_pairs: overlapping pairs above which the ILP is not built (the warm start is returned
        with status ``"heuristic"`` and its gap).
      warm: names of :data:`remat.core.layout.PLACEMENTS` tried as warm starts.
      restarts: jittered greedy-by-size layouts tried (0: none).
      warm_share: fraction of ``time_limit`` the warm start may use.
      seed: seed of the jitter.
    """

    __name__ = "olla"

    def __init__(self, time_limit: float = 60.0, *, mip_gap: float = 1e-4,
                 threads: int | None = None, max_pairs: int | None = 300_000,
                 warm: tuple[str, ...] = ("best_fit", "greedy_by_size"), restarts: int = 200,
                 warm_share: float = 0.1, seed: int = 0) -> None:
        self.time_limit, self.mip_gap, self.threads = time_limit, mip_gap, threads
        self.max_pairs, self.warm, self.restarts = max_pairs, warm, restarts
        self.warm_share, self.seed = warm_share, seed
        self.last: AddressSolution | None = None
        self.warm_name = ""

    def warm_start(self, intervals: np.ndarray, sizes: np.ndarray,
                   bound: int) -> tuple[np.ndarray, str]:
        """The best greedy layout (offsets in bytes) and its name."""
        t0 = time.perf_counter()
        iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
        s = np.asarray(sizes, dtype=np.int64).reshape(-1)
        length = iv[:, 1] - iv[:, 0]
        cands = [(name, lambda name=name: layout.get_placement(name)[1](iv, s))
                 for name in self.warm]
        cands.append(("longest_lifetime", lambda: layout.place(iv, s, np.lexsort((-s, -length)))))
        best: tuple[int, np.ndarray, str] | None = None
        for name, make in cands:
            off = np.asarray(make(), dtype=np.int64)
            arena = layout.arena_size(off, s)
            if best is None or arena < best[0]:
                best = (arena, off, name)
        rng = np.random.default_rng(self.seed)
        for _ in range(self.restarts):
            if best[0] <= bound or time.perf_counter() - t0 > self.warm_share * self.time_limit:
                break
            key = -s * rng.uniform(0.7, 1.3, len(s))
            off = layout.place(iv, s, np.argsort(key, kind="stable"))
            arena = layout.arena_size(off, s)
            if arena < best[0]:
                best = (arena, off, "jittered_greedy_by_size")
        return best[1], best[2]

    def __call__(self, intervals: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        bound = layout.max_live_lower_bound(intervals, sizes)
        warm, self.warm_name = self.warm_start(intervals, sizes, bound)
        left = max(0.1, self.time_limit - (time.perf_counter() - t0))
        self.last = solve_addresses(intervals, sizes, warm_offsets=warm, lower_bound=bound,
                                    time_limit=left, mip_gap=self.mip_gap, threads=self.threads,
                                    max_pairs=self.max_pairs)
        return self.last.offsets


def olla_placement(time_limit: float = 60.0, **options: Any) -> OllaPlacement:
    """OLLA's address ILP as a placement for :func:`remat.core.layout.allocate` /
    :func:`remat.simulate` (options: see :class:`OllaPlacement`)."""
    return OllaPlacement(time_limit, **options)


def _order_of(plan: Plan) -> np.ndarray | None:
    """The node order of a plan that computes every node exactly once without paging."""
    if plan.paging or not (plan.R.sum(axis=0) == 1).all():
        return None
    t, v = np.nonzero(plan.R)  # row-major: steps in order, nodes of a step in index order
    return v.astype(np.int64)


def olla_order(graph: Graph, warm_order: np.ndarray | None = None, *, time_limit: float = 60.0,
               mip_gap: float = 1e-4, threads: int | None = None, method: str = "auto",
               max_binaries: int = 3000) -> tuple[Plan, OrderSolution]:
    """The order phase: the peak-minimising topological order (eq. 14) as a one-node-per-step
    plan, warm-started from ``warm_order`` (default: the program's order ``0..n-1``); ``method``
    and ``max_binaries`` as in :func:`solvers.olla.solve_order`."""
    sol = solve_order(graph.sizes, graph.edge_array, warm_order=warm_order,
                      time_limit=time_limit, mip_gap=mip_gap, threads=threads, method=method,
                      max_binaries=max_binaries)
    plan = plan_from_steps(graph, [[int(v)] for v in sol.order], policy="olla")
    return plan, sol


def olla_layout(graph: Graph, plan: Plan, *, order: bool = True, addresses: bool = True,
                time_limit: float = 60.0, mip_gap: float = 1e-4, threads: int | None = None,
                method: str = "auto", max_binaries: int = 3000,
                max_pairs: int | None = 300_000, budget: int | None = None) -> Plan:
    """Pass ``plan`` through OLLA: reorder it when it leaves the freedom (every node computed
    once, no paging; ``order=True``), then place its allocations (``addresses=True``).

    Args:
      graph: the graph the plan's columns refer to.
      plan: any legal plan (e.g. Checkmate's); returned re-timed and with ``offsets``.
      order, addresses: run the phases.
      time_limit: seconds for both phases (the order phase may use half when both run).
      mip_gap, threads: HiGHS options.
      method, max_binaries: order-phase search (see :func:`solvers.olla.solve_order`).
      max_pairs: address-phase size limit (see :class:`OllaPlacement`).
      budget: bytes the reordered plan's peak must fit.

    Returns:
      The plan with ``meta`` entries ``order_*`` (status, gap, peak, lower bound, solve time,
      model size; ``order_status="skipped"`` when not reordered), ``program_peak_bytes``,
      ``address_*``, ``arena_bytes``, ``max_live_bytes``, ``warm_arena_bytes``, ``warm_layout``,
      and ``status``/``gap``/``objective``/``lower_bound`` for the whole (objective: the arena
      with addresses, else the peak; bound: the order phase's bound over all orders when it
      ran, else the max-live bound).

    Raises:
      InfeasibleBudgetError: the best order found peaks above ``budget`` (``min_feasible_bytes``
        is that peak; the message says whether it is proven optimal).
    """
    t0 = time.perf_counter()
    meta: dict[str, Any] = {}
    warm = _order_of(plan) if order else None
    statuses = []
    lower = None
    if warm is not None:
        share = time_limit / 2 if addresses else time_limit
        new, sol = olla_order(graph, warm, time_limit=share, mip_gap=mip_gap, threads=threads,
                              method=method, max_binaries=max_binaries)
        plan = dataclasses.replace(plan, R=new.R, S=new.S, offsets=None)
        statuses.append(sol.status)
        lower = sol.lower_bound
        meta.update(order_status=sol.status, order_gap=sol.gap, order_peak_bytes=sol.peak_bytes,
                    program_peak_bytes=sol.warm_peak_bytes, order_lower_bound=sol.lower_bound,
                    order_solve_time_s=sol.solve_time_s, order_build_time_s=sol.build_time_s,
                    order_vars=sol.num_vars, order_binaries=sol.num_binaries,
                    order_rows=sol.num_rows, order_message=sol.message)
        if budget is not None and sol.peak_bytes > budget:
            proven = sol.lower_bound > budget
            why = ("proven: the order ILP's bound is above the budget" if proven else
                   f"not proven ({sol.status}, bound {sol.lower_bound} bytes)")
            raise InfeasibleBudgetError(budget, sol.peak_bytes,
                                        f"no node order fits without recomputation; {why}")
    else:
        meta.update(order_status="skipped")
    events = plan.validate(graph)
    peak = int(events.peak_bytes)
    if budget is not None and peak > budget:  # the order was kept: nothing else can fit
        raise InfeasibleBudgetError(budget, peak, "the plan's order is kept (order phase off or "
                                    "the plan recomputes) and peaks above the budget")
    objective = peak
    if addresses:
        left = max(0.1, time_limit - (time.perf_counter() - t0))
        pl = olla_placement(left, mip_gap=mip_gap, threads=threads, max_pairs=max_pairs)
        plan = layout.allocate(graph, dataclasses.replace(plan, offsets=None), placement=pl)
        a = pl.last
        statuses.append(a.status)
        objective = a.arena_bytes
        if lower is None:
            lower = a.lower_bound
        meta.update(address_status=a.status, address_gap=a.gap, arena_bytes=a.arena_bytes,
                    max_live_bytes=peak, warm_arena_bytes=a.warm_arena_bytes,
                    warm_layout=pl.warm_name, address_pairs=a.num_pairs,
                    address_solve_time_s=a.solve_time_s, address_build_time_s=a.build_time_s,
                    address_message=a.message)
    if lower is None:
        lower = peak
    if "time_limit" in statuses:
        status = "time_limit"
    elif all(s == "optimal" for s in statuses) and statuses:
        status = "optimal"
    else:
        status = "feasible" if statuses else plan.meta.get("status", "heuristic")
    gap = (objective - lower) / objective if objective > 0 else 0.0
    meta.update(status=status, gap=float(gap), objective=float(objective),
                lower_bound=float(lower), olla_time_s=time.perf_counter() - t0)
    return plan.with_meta(**meta)


@register("olla")
@dataclasses.dataclass(frozen=True)
class Olla(BasePolicy):
    """OLLA: the peak-minimising node order and an arena layout, no recomputation.

    Args:
      budget: bytes or a string (``"60%"``, ``"512MiB"``): the reordered peak must fit (else
        :class:`~remat.core.errors.InfeasibleBudgetError` with the best peak found); ``None``: no limit.
      time_limit: seconds for the whole ``plan()`` call (both phases, and the base policy).
      order: run the order phase (eq. 14); ``False`` keeps the program's order.
      addresses: run the address phase (eq. 15) and fill ``Plan.offsets``.
      base: another policy whose plan is passed through OLLA (its order phase only when the plan
        recomputes nothing), e.g. ``Olla(base=Checkmate(budget="60%"))``.
      mip_gap, threads: HiGHS options.
      method: order-phase search: ``"exact"`` (one ILP), ``"lns"`` (neighbourhood ILPs, for
        equation-level graphs), ``"auto"`` (exact up to ``max_binaries`` binaries); see
        :func:`solvers.olla.solve_order`.
      max_binaries: see ``method``.
      max_pairs: address-phase size limit (see :class:`OllaPlacement`).

    ``meta``: ``objective`` is the arena (bytes) with addresses, else the peak;
    ``lower_bound`` the order phase's bound; plus the ``order_*``/``address_*`` entries of
    :func:`olla_layout`.
    """

    budget: int | str | None = None
    time_limit: float = 60.0
    order: bool = True
    addresses: bool = True
    base: Policy | None = None
    mip_gap: float = 1e-4
    threads: int | None = None
    method: str = "auto"
    max_binaries: int = 3000
    max_pairs: int | None = 300_000

    objective_unit = "bytes"

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        t0 = time.perf_counter()
        limit = ctx.time_left(self.time_limit)
        g = graph
        if self.base is None:
            start = plan_from_steps(graph, [[v] for v in range(graph.n)], policy="olla")
        else:
            start = self.base.plan(graph, budget=budget_bytes, ctx=ctx)
            g = self.evaluation_graph(graph, start, ctx)
        left = max(0.1, limit - (time.perf_counter() - t0))
        out = olla_layout(g, start, order=self.order, addresses=self.addresses, time_limit=left,
                          mip_gap=self.mip_gap, threads=self.threads, method=self.method,
                          max_binaries=self.max_binaries, max_pairs=self.max_pairs, budget=budget_bytes)
        if self.base is not None:
            out = out.with_meta(base_policy=self.base.name, base_status=start.meta.get("status"),
                                base_peak_bytes=start.meta.get("peak_bytes"))
        return out
