"""RecomputeAll: keep nothing a later step can rebuild (the minimal-memory end of the trade-off).

The forward pass runs once, each output kept only until its last forward reader; every backward
node first recomputes, in its own step, the whole forward ancestry of the values it reads from
the inputs, and those are freed right after it (Checkmate's "recompute everything" baseline,
cost ``O(n²)`` forward evaluations on a chain).
"""

from __future__ import annotations

import dataclasses

from policies.base import BasePolicy, PolicyContext, register
from policies.from_checkpoints import plan_from_checkpoints
from remat.core.errors import InfeasibleBudgetError
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.schedule import replay


@register("recompute_all")
@dataclasses.dataclass(frozen=True)
class RecomputeAll(BasePolicy):
    """Recompute each backward node's forward inputs from scratch right before it runs.

    Args:
      budget: activation bytes or ``"60%"``; only checked (the plan does not depend on it): a
        budget below the plan's peak raises :class:`~remat.core.errors.InfeasibleBudgetError`.
    """

    budget: int | str | None = None

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        plan = plan_from_checkpoints(graph, (), keep_recomputed=False, status="heuristic")
        peak = replay(graph, plan).peak_bytes
        if budget_bytes is not None and peak > budget_bytes:
            raise InfeasibleBudgetError(budget_bytes, peak,
                                        "recompute-all is this policy's smallest peak")
        return plan
