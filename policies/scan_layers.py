"""ScanLayers: plan inside scanned layer stacks for a budget.

For each ``lax.scan`` of an extracted graph (:mod:`remat.scans`: ``graph.program.scans``) it
chooses a :class:`~remat.scans.ScanDecision`: which of the body's anchors (contractions and
other expensive results) every iteration keeps, and how many iterations a group of the nested
scan holds (the carry entering each group is kept; a group's backward pass re-runs its forward).
JAX's built-in policies are points of this space (``dots_saveable``: every contraction kept,
flat; ``nothing_saveable``: none); this policy searches all of it for the cheapest plan that
fits, which users otherwise do by hand, compiling each guess.

Search: anchors that a JAX policy cannot tell apart (same primitive, operand shapes, dtypes and
parameters: :func:`remat.scans.anchor_key`) form one *unit*.  Every subset of units (exhaustive
up to ``max_exhaustive`` units, else the subsets of the ``max_exhaustive`` units with the best
FLOPs-recomputed-per-byte-kept, status ``"heuristic"``) and every group size dividing the length
is costed by :meth:`remat.scans.ScanBody.cost`; per scan the Pareto front of (kept bytes,
transient bytes, FLOPs) is combined across scans, and the plan with the fewest FLOPs whose
predicted peak (:func:`remat.scans.adjusted_graph`, checkpoint-all outside the scans) fits the
budget wins (ties: the smaller peak).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from policies.base import BasePolicy, PolicyContext, checkpoint_all_plan, register
from remat.errors import InfeasibleBudgetError, NotApplicableError
from remat.graph import Graph
from remat.plan import Plan
from remat.scans import ScanBody, ScanDecision, adjusted_graph, anchor_key


def anchor_units(body: ScanBody) -> list[tuple[int, ...]]:
    """Anchors grouped by what a JAX policy sees of them (:func:`remat.scans.anchor_key`)."""
    units: dict[tuple, list[int]] = {}
    for j in body.anchors:
        units.setdefault(anchor_key(body.body, j), []).append(j)
    return [tuple(v) for v in units.values()]


def _front(body: ScanBody, units: list[tuple[int, ...]], max_exhaustive: int):
    """Pareto-optimal decisions of one scan: ``[(residual, transient, flops, decision)]``."""
    exhaustive = len(units) <= max_exhaustive
    if not exhaustive:  # keep the units that save the most recompute per byte kept
        base = body.cost((), 1)["flops"]

        def value(u):
            c = body.cost(u, 1)
            extra = max(c["iter_bytes"] - body.cost((), 1)["iter_bytes"], 1)
            return (base - c["flops"]) / extra

        units = sorted(units, key=value, reverse=True)[:max_exhaustive]
    cands = []
    for r in range(len(units) + 1):
        for combo in itertools.combinations(units, r):
            saved = frozenset(j for u in combo for j in u)
            for g in body.groups():
                c = body.cost(saved, g)
                cands.append((c["residual_bytes"], c["transient_bytes"], c["flops"],
                              ScanDecision(body.leaf, saved, g)))
    arr = np.array([c[:3] for c in cands], dtype=np.float64)
    keep = []
    order = np.lexsort((arr[:, 1], arr[:, 0], arr[:, 2]))  # by flops, then bytes
    best_bytes = np.inf
    for i in order:  # a candidate survives if no cheaper-in-FLOPs one uses fewer bytes
        tot = arr[i, 0] + arr[i, 1]
        if tot < best_bytes:
            keep.append(cands[i])
            best_bytes = tot
    return keep, exhaustive


@register("scan_layers")
@dataclasses.dataclass(frozen=True)
class ScanLayers(BasePolicy):
    """Per-layer saved set and scan nesting for scanned layer stacks, chosen for a budget.

    Args:
      budget: activation bytes or ``"60%"`` / ``"512MiB"`` (of the graph's no-remat peak);
        ``None``: the fewest FLOPs (JAX's own residuals are kept when nothing is decided).
      max_exhaustive: search every subset of up to this many anchor units (2^12 subsets).
      max_combinations: most cross-scan combinations evaluated (graphs with several scans).

    Plans carry ``meta["scans"]`` (a tuple of :class:`~remat.scans.ScanDecision`), applied by
    ``remat.value_and_grad`` and exported by ``remat.checkpoint_policy``.
    """

    budget: int | str | None = None
    max_exhaustive: int = 12
    max_combinations: int = 20000

    def check_applicable(self, graph: Graph) -> None:
        prog = graph.program
        if prog is None or not getattr(prog, "scans", ()):
            raise NotApplicableError(f"{graph.name}: no lax.scan to plan (extract with the "
                                     "default scans='compact')")

    def evaluation_graph(self, graph: Graph, plan: Plan, ctx: PolicyContext) -> Graph:
        """The graph with each scan node's bytes and FLOPs under the plan's scan decisions."""
        return adjusted_graph(graph, plan.meta.get("scans", ()))

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        bodies = graph.program.scans
        fronts, exact = [], True
        for body in bodies:
            f, ex = _front(body, anchor_units(body), self.max_exhaustive)
            fronts.append(f)
            exact &= ex
        best = None
        smallest = None
        for n, combo in enumerate(itertools.product(*fronts)):
            if n >= self.max_combinations:
                exact = False
                break
            decisions = tuple(c[3] for c in combo)
            g2 = adjusted_graph(graph, decisions)
            peak = g2.no_remat_peak()
            flops = float(g2.flops_array.sum())
            smallest = peak if smallest is None else min(smallest, peak)
            if budget_bytes is not None and peak > budget_bytes:
                continue
            key = (flops, peak)
            if best is None or key < best[0]:
                best = (key, decisions, g2)
        if best is None:
            raise InfeasibleBudgetError(budget_bytes, smallest,
                                        "ScanLayers (checkpoint-all outside the scans)")
        (flops, peak), decisions, g2 = best
        return checkpoint_all_plan(graph).with_meta(
            scans=decisions, status="optimal" if exact else "heuristic",
            objective=float(g2.costs.sum()), predicted_flops=flops,
            predicted_peak_bytes=int(peak))
