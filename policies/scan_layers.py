"""ScanLayers: plan inside scanned layer stacks for a budget.

For each ``lax.scan`` of an extracted graph (:mod:`remat.scans`: ``graph.program.scans``) it
chooses a :class:`~remat.core.scan_plan.ScanDecision`: which of the body's anchors (contractions and
other expensive results) every iteration keeps, and how many iterations a group of the nested
scan holds (the carry entering each group is kept; a group's backward pass re-runs its forward).
JAX's built-in policies are points of this space (``dots_saveable``: every contraction kept,
flat; ``nothing_saveable``: none); this policy searches all of it for the cheapest plan that
fits, which users otherwise do by hand, compiling each guess.

Search: anchors that a JAX policy cannot tell apart (same primitive, operand shapes, dtypes and
parameters: :func:`remat.core.scan_plan.anchor_key`) form one *unit*.  Every subset of units (exhaustive
up to ``max_exhaustive`` units, else the subsets of the ``max_exhaustive`` units with the best
FLOPs-recomputed-per-byte-kept, status ``"heuristic"``) and every group size dividing the length
is costed by :meth:`remat.core.scan_plan.ScanBody.cost`, next to leaving the scan as JAX
differentiates it (its own residuals, no recomputation); per scan the Pareto front of (kept
bytes, transient bytes, FLOPs) is combined across scans, and the plan with the fewest FLOPs
whose predicted peak (:func:`remat.core.scan_plan.adjusted_graph`, checkpoint-all outside the scans)
fits the budget wins (ties: the smaller peak).  A kept contraction followed by a bias add keeps
the sum (:meth:`remat.core.scan_plan.ScanBody.save_point`), as MaxText-style names do.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from policies.base import BasePolicy, PolicyContext, checkpoint_all_plan, register
from remat.core.errors import InfeasibleBudgetError, NotApplicableError
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.scan_plan import ScanBody, ScanDecision, adjusted_graph, anchor_key, scan_nodes


def anchor_units(body: ScanBody) -> list[tuple[int, ...]]:
    """Anchors grouped by what a JAX policy sees of what they keep
    (:func:`remat.core.scan_plan.anchor_key` of :meth:`~remat.core.scan_plan.ScanBody.policy_point`), so that
    every plan is one a plain JAX policy expresses (``remat.checkpoint_policy``)."""
    units: dict[tuple, list[int]] = {}
    for j in body.anchors:
        units.setdefault(anchor_key(body.body, body.policy_point(j)), []).append(j)
    return [tuple(v) for v in units.values()]


def _pareto(cands: list[tuple]) -> list[tuple]:
    """The candidates ``(residual, transient, flops, decision)`` no other one beats in all
    three costs (ties: the first)."""
    arr = np.array([c[:3] for c in cands], dtype=np.float64).reshape(-1, 3)
    keep = []
    for i in np.lexsort((arr[:, 1], arr[:, 0], arr[:, 2])):  # by flops, then bytes
        if not any((arr[k] <= arr[i]).all() for k in keep):
            keep.append(int(i))
    return [cands[i] for i in keep]


def scan_front(graph: Graph, body: ScanBody, units: list[tuple[int, ...]], max_exhaustive: int,
               nested: bool):
    """Pareto-optimal decisions of one scan and whether every unit subset was searched:
    ``([(residual, transient, flops, decision)], exhaustive)``;
    ``decision`` ``None`` leaves the scan as JAX differentiates it (its own residuals, no
    recomputation: the fewest FLOPs)."""
    exhaustive = len(units) <= max_exhaustive
    if not exhaustive:  # keep the units that save the most recompute per byte kept
        empty = body.cost((), 1)

        def value(u):
            c = body.cost(u, 1)
            extra = max(c["iter_bytes"] - empty["iter_bytes"], 1)
            return (empty["flops"] - c["flops"]) / extra

        units = sorted(units, key=value, reverse=True)[:max_exhaustive]
    f, bw, res = scan_nodes(graph, body)
    jax_flops = float(graph.flops_array[[f, *bw]].sum())
    cands: list[tuple] = [(res, 0, jax_flops, None)]
    for r in range(len(units) + 1):
        for combo in itertools.combinations(units, r):
            saved = frozenset(j for u in combo for j in u)
            for g in (body.groups() if nested else [1]):
                c = body.cost(saved, g)
                cands.append((c["residual_bytes"], c["transient_bytes"], c["flops"],
                              ScanDecision(body.leaf, saved, g)))
    return _pareto(cands), exhaustive


@register("scan_layers")
@dataclasses.dataclass(frozen=True)
class ScanLayers(BasePolicy):
    """Per-layer saved set and scan nesting for scanned layer stacks, chosen for a budget.

    Args:
      budget: activation bytes or ``"60%"`` / ``"512MiB"`` (of the graph's no-remat peak);
        ``None``: the fewest FLOPs (JAX's own residuals are kept when nothing is decided).
      max_exhaustive: search every subset of up to this many anchor units (2^12 subsets).
      max_combinations: most cross-scan combinations evaluated (graphs with several scans).
      nested: also consider nested scans (groups of iterations); ``False``: flat scans only,
        whose plan a single ``jax.checkpoint`` policy expresses (``remat.checkpoint_policy``
        for ``nn.scan(nn.remat(Block, policy=...))``).

    Plans carry ``meta["scans"]`` (a tuple of :class:`~remat.core.scan_plan.ScanDecision`; a scan
    without one stays as JAX differentiates it), applied by ``remat.value_and_grad`` and
    exported by ``remat.checkpoint_policy``.  The stages outside the scans run as written
    (``meta["trim_segments"] = False``: the applier keeps JAX's own residuals there, as the
    plan's model counts them).
    """

    budget: int | str | None = None
    max_exhaustive: int = 12
    max_combinations: int = 20000
    nested: bool = True

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
            f, ex = scan_front(graph, body, anchor_units(body), self.max_exhaustive, self.nested)
            fronts.append(f)
            exact &= ex
        best = None
        smallest = None
        for n, combo in enumerate(itertools.product(*fronts)):
            if n >= self.max_combinations:
                exact = False
                break
            decisions = tuple(c[3] for c in combo if c[3] is not None)
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
            scans=decisions, trim_segments=False, status="optimal" if exact else "heuristic",
            objective=float(g2.costs.sum()), predicted_flops=flops,
            predicted_peak_bytes=int(peak))


def frontier(graph: Graph, **options) -> list[tuple[int | None, Plan]]:
    """Every distinct plan :class:`ScanLayers` returns as the budget falls: ``[(budget,
    plan)]`` from no budget (the fewest FLOPs) down to its smallest feasible budget, each
    budget one byte under the previous plan's predicted peak (so no plan is skipped, and each
    is asked for at a budget it was made for).  ``options``: other :class:`ScanLayers`
    options (``nested=False``, ...)."""
    out: list[tuple[int | None, Plan]] = []
    budget = None
    while True:
        try:
            plan = ScanLayers(budget=budget, **options).plan(graph)
        except InfeasibleBudgetError:
            return out
        out.append((budget, plan))
        budget = int(plan.meta["peak_bytes"]) - 1
