"""Greedy rematerialization on general DAGs: Dynamic Tensor Rematerialization, run offline.

Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021, adapted to a static graph whose
whole future is known (a first version: on Moccasin's random layered DAGs it fits 0.9x the no-remat peak at
n = 100, 500, 1000 but not at n = 250, and 0.8x only at n = 100).  Nodes are processed in index (topological) order; step ``t`` computes
node ``t``, preceded (same step, index order) by recomputations of every input that was evicted,
recursively through their evicted inputs.  A resident set and its bytes are tracked; before any
node runs, while ``resident + out_bytes[v] > budget`` a resident value that no remaining node of
the step reads is evicted, the one with the smallest score

* ``"dtr"``: DTR's heuristic ``h(u) = c(u) / (m(u) · s(u))`` (Kirisame et al. §4, Eq. for
  ``h_DTR``) with the equivalence-class cost approximated one level deep:
  ``c(u) = cost[u] + Σ cost[p]`` over evicted inputs ``p`` of ``u``; ``m(u) = out_bytes[u]``;
  staleness ``s(u)`` = events since ``u`` was last computed or read;
* ``"belady"``: the same ``c(u) / m(u)`` divided by the distance (in nodes) to ``u``'s next
  reader instead of staleness (offline: the future is known);
* ``"size"``: ``1 / m(u)`` (largest first).

Values with no later reader are freed at once.  The default ``score="auto"`` runs all three and
keeps the cheapest schedule that fits.

The plan is :func:`policies.from_checkpoints.plan_from_steps` of the simulated steps.  That
retention (liveness) never holds a value longer than this simulation does (an evicted value is
freed at its last read before the eviction, a dead one after its last reader), so the replayed
peak (:func:`remat.simulate`) is at most the simulated one; the policy checks it is
``<= budget`` and raises :class:`~remat.core.errors.SolverError` otherwise.

When no eviction makes room, :class:`~remat.core.errors.InfeasibleBudgetError` carries the smallest
budget at which *this heuristic* succeeds, found by bisection between the largest single-node
need (``out_bytes[v] + Σ out_bytes[inputs]``) and the no-remat peak, to a relative tolerance
``search_rtol``: a heuristic's minimum, not a proven lower bound.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable

from policies.base import BasePolicy, PolicyContext, bisect_min_budget, choose_scores, register
from policies.from_checkpoints import plan_from_steps
from remat.core.errors import InfeasibleBudgetError, InvalidOptionError
from remat.core.graph import Graph
from remat.core.plan import Plan

SCORES = ("dtr", "belady", "size")


def greedy_steps(
    graph: Graph, budget: int, score: str = "dtr"
) -> tuple[list[list[int]], int] | None:
    """Simulate DTR-style greedy eviction under ``budget`` bytes.

    Step ``t`` runs the evicted ancestry of node ``t`` (the closure over non-resident inputs,
    index order) and then node ``t``.  Before each node, while ``resident + out_bytes[v] >
    budget``, the resident value with the smallest ``score`` among those no remaining node of
    the step reads is evicted.  A value is freed once no remaining node of the step and no node
    ``> t`` reads it.

    Args:
      graph: the graph (``n`` nodes, index order is topological).
      budget: device bytes for stage outputs.
      score: ``"dtr"``, ``"belady"`` or ``"size"`` (see the module docstring).

    Returns:
      ``(steps, peak)``: ``steps[t]`` the sorted node indices run in step ``t`` (node ``t``
      last) and ``peak`` the simulated peak bytes (an upper bound of the replayed peak); or
      ``None`` when the values a step still needs plus a new output exceed ``budget``.
    """
    if score not in SCORES:
        raise InvalidOptionError(f"GreedyRemat score must be one of {SCORES}, got {score!r}")
    n = graph.n
    preds, succs = graph.preds, graph.succs
    sizes = [int(x) for x in graph.sizes]
    costs = [float(x) + 1e-9 for x in graph.costs]  # zero-cost nodes still rank by size

    def pick(res, need, t, clock, stamp) -> int:
        best, best_h = -1, float("inf")
        for u in res:
            if u in need:
                continue
            c = costs[u]
            for p in preds[u]:
                if p not in res:
                    c += costs[p]
            if score == "dtr":
                h = c / ((sizes[u] + 1) * (clock - stamp[u]))
            elif score == "belady":
                s = succs[u]
                j = bisect.bisect_right(s, t)  # resident, not dead: a reader > t
                nxt = s[j] if j < len(s) else n
                h = c / ((sizes[u] + 1) * (nxt - t + 1))
            else:
                h = 1.0 / (sizes[u] + 1)
            if h < best_h:
                best, best_h = u, h
        return best

    r = evict_steps(graph, budget, pick)
    return None if r is None else (r[0], r[1])


def evict_steps(
    graph: Graph, budget: int, pick: Callable[[set, dict, int, int, list], int]
) -> tuple[list[list[int]], int, int] | None:
    """The eviction simulation shared by :func:`greedy_steps` and Sage's DGC
    (:func:`policies.sage.sage_steps`): nodes in index order, step ``t`` recomputes the
    evicted ancestry of node ``t`` then runs it; before each node, while ``resident +
    out_bytes[v] > budget``, ``pick(resident, need, t, clock, stamp)`` names the value to
    evict (``-1``: none can go).  ``need`` holds the values a remaining node of the step reads
    (never to be picked), ``stamp[u]`` the clock of ``u``'s last use, ``clock`` counts node
    executions.

    Returns:
      ``(steps, peak bytes, evictions)``, or ``None`` when nothing can be evicted.
    """
    n = graph.n
    preds = graph.preds
    sizes = [int(x) for x in graph.sizes]
    last = [int(x) for x in graph.last_reader]
    res: set[int] = set()
    cur = 0
    peak = 0
    evictions = 0
    stamp = [0] * n
    clock = 1
    steps: list[list[int]] = []
    for t in range(n):
        step = sorted(graph.ancestors_outside(preds[t], res))
        step.append(t)
        need: dict[int, int] = {}  # remaining in-step readers of each value
        for v in step:
            for p in preds[v]:
                need[p] = need.get(p, 0) + 1
        for v in step:
            while cur + sizes[v] > budget:
                best = pick(res, need, t, clock, stamp)
                if best < 0:
                    return None
                res.discard(best)
                cur -= sizes[best]
                evictions += 1
            res.add(v)
            cur += sizes[v]
            peak = max(peak, cur)
            stamp[v] = clock
            for p in preds[v]:
                stamp[p] = clock
                k = need[p] - 1
                if k:
                    need[p] = k
                else:
                    del need[p]
                    if last[p] <= t and p in res:
                        res.discard(p)
                        cur -= sizes[p]
            if last[v] <= t and v not in need:
                res.discard(v)
                cur -= sizes[v]
            clock += 1
        steps.append(step)
    return steps, peak, evictions


def _cost(graph: Graph, steps: list[list[int]]) -> float:
    costs = graph.costs
    return float(sum(costs[s].sum() for s in steps))


@register("greedy_remat")
@dataclasses.dataclass(frozen=True)
class GreedyRemat(BasePolicy):
    """DTR-style greedy eviction with recompute-on-demand, for any DAG.

    Args:
      budget: activation bytes or ``"60%"`` / ``"512MiB"`` (``None``: the no-remat peak, so
        nothing is recomputed).
      score: ``"auto"`` (try every score, keep the cheapest fit) or one of
        ``"dtr"``, ``"belady"``, ``"size"``.
      search_rtol: relative precision of the heuristic's minimum feasible budget reported on
        infeasibility.
    """

    budget: int | str | None = None
    score: str = "auto"
    search_rtol: float = 1e-3

    def _scores(self) -> tuple[str, ...]:
        return choose_scores(self.score, SCORES, "GreedyRemat")

    def _best(self, graph: Graph, budget: int) -> tuple[list[list[int]], str] | None:
        best = None
        for sc in self._scores():
            r = greedy_steps(graph, budget, sc)
            if r is not None:
                c = _cost(graph, r[0])
                if best is None or c < best[0]:
                    best = (c, r[0], sc)
        return None if best is None else (best[1], best[2])

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int:
        """Smallest budget (bytes, within ``search_rtol``) at which this heuristic succeeds.

        Bisection between the largest single-node need and :meth:`Graph.no_remat_peak`; the
        returned budget is one the heuristic was run at and succeeded.
        """
        return bisect_min_budget(graph, lambda b: self._best(graph, b) is not None,
                                 rtol=self.search_rtol, name="greedy_remat")

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        b = budget_bytes
        if b is None:
            b = graph.no_remat_peak()
        found = self._best(graph, int(b))
        if found is None:  # the wrapper adds min_feasible_budget
            raise InfeasibleBudgetError(
                b, None, "greedy_remat heuristic's own minimum (bisection), not a proven bound")
        steps, sc = found
        return plan_from_steps(graph, steps, status="heuristic", score=sc)
