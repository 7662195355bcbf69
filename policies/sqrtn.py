"""SqrtN: Chen et al. 2016, "Training deep nets with sublinear memory cost".

Checkpoints may only sit on *articulation points* of the forward graph (nodes whose removal
disconnects it, on the undirected graph of forward nodes; on a chain, every interior node), as
Checkmate generalises Chen et al. to non-chain graphs.  Between checkpoints a segment's values
are recomputed once, when the backward pass first needs them, and kept until their last reader
(:func:`policies.from_checkpoints.plan_from_checkpoints`).

* ``mode="sqrtn"``: ``segments`` (default ``round(sqrt(n))`` for ``n`` forward nodes) segments,
  checkpoints at evenly spaced candidates.
* ``mode="greedy"``: Chen et al. §4.1, the memory-planning pass with segment budget ``b``: walk
  the forward nodes in order accumulating output bytes; at a candidate whose running total
  exceeds ``b``, checkpoint it and restart the total.  ``b`` is searched over the running-sum
  breakpoints (at most ``max_trials`` values).

With a memory budget, both modes keep the cheapest variant (segment count or ``b``) whose
simulated peak fits; without one, ``sqrtn`` uses its default and ``greedy`` the ``b`` with the
smallest peak.  Nothing fits: :class:`~remat.core.errors.InfeasibleBudgetError` with the smallest
peak the search saw.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from policies.base import BasePolicy, PolicyContext, register
from policies.from_checkpoints import plan_from_checkpoints
from remat.core.errors import InfeasibleBudgetError, InvalidOptionError
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.schedule import replay


def articulation_points(graph: Graph) -> list[int]:
    """Forward nodes whose removal disconnects the undirected forward graph, in index order."""
    import networkx as nx

    fwd = [v.index for v in graph.nodes if not v.is_backward]
    fs = set(fwd)
    g = nx.Graph()
    g.add_nodes_from(fwd)
    g.add_edges_from((s, d) for s, d in graph.edges if s in fs and d in fs)
    return sorted(int(v) for v in nx.articulation_points(g))


def sqrtn_checkpoints(candidates: list[int], segments: int) -> list[int]:
    """``segments - 1`` evenly spaced candidates (the segment boundaries)."""
    m = len(candidates)
    if segments <= 1 or m == 0:
        return []
    pos = sorted({min(m - 1, max(0, int(round(i * m / segments)) - 1)) for i in range(1, segments)})
    return [candidates[p] for p in pos]


def greedy_checkpoints(graph: Graph, candidates: list[int], b: float) -> list[int]:
    """Chen et al. §4.1 with segment budget ``b`` bytes."""
    cand = set(candidates)
    temp, out = 0, []
    for v in graph.nodes:
        if v.is_backward:
            continue
        temp += v.out_bytes
        if v.index in cand and temp > b:
            out.append(v.index)
            temp = 0
    return out


@register("sqrtn")
@dataclasses.dataclass(frozen=True)
class SqrtN(BasePolicy):
    """Chen et al. 2016 checkpointing on articulation points.

    Args:
      segments: number of segments for ``mode="sqrtn"`` (``None``: ``round(sqrt(n))``, or
        searched when a budget is given).
      budget: activation bytes or ``"60%"`` / ``"512MiB"``.
      mode: ``"sqrtn"`` or ``"greedy"``.
      max_trials: most variants simulated in a search.
    """

    segments: int | None = None
    budget: int | str | None = None
    mode: str = "sqrtn"
    max_trials: int = 64

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        if self.mode not in ("sqrtn", "greedy"):
            raise InvalidOptionError(f"SqrtN mode must be 'sqrtn' or 'greedy', got {self.mode!r}")
        b = budget_bytes
        cand = articulation_points(graph)
        n_fwd = len(graph.forward_nodes)

        def make(ckpts, **meta) -> tuple[Plan, int, float]:
            p = plan_from_checkpoints(graph, ckpts, keep_recomputed=True, mode=self.mode,
                                      status="heuristic", **meta)
            return p, replay(graph, p).peak_bytes, float(p.compute_counts() @ graph.costs)

        if self.mode == "sqrtn":
            if self.segments is not None or b is None:
                k = self.segments or max(1, int(round(math.sqrt(n_fwd))))
                variants = [(k, sqrtn_checkpoints(cand, k))]
            else:
                ks = range(1, len(cand) + 2)
                if len(ks) > self.max_trials:
                    ks = np.unique(np.linspace(1, len(cand) + 1, self.max_trials).astype(int))
                variants = [(int(k), sqrtn_checkpoints(cand, int(k))) for k in ks]
            tried = [make(c, segments=k) for k, c in variants]
        else:
            sizes = np.array([v.out_bytes for v in graph.nodes if not v.is_backward], dtype=float)
            bs = np.unique(np.concatenate([[0.0], np.cumsum(sizes)]))
            if len(bs) > self.max_trials:
                bs = np.unique(np.quantile(bs, np.linspace(0, 1, self.max_trials)))
            tried = [make(greedy_checkpoints(graph, cand, float(x)), segment_budget=float(x))
                     for x in bs]
        fits = [t for t in tried if b is None or t[1] <= b]
        if not fits:
            raise InfeasibleBudgetError(b, min(t[1] for t in tried), f"SqrtN ({self.mode})")
        if b is None and self.mode == "greedy":
            best = min(fits, key=lambda t: (t[1], t[2]))
        else:
            best = min(fits, key=lambda t: (t[2], t[1]))
        return best[0]
