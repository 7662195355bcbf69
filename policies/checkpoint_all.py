"""Checkpoint-all: store every activation, recompute nothing (the no-remat baseline)."""

from __future__ import annotations

import dataclasses

from policies.base import BasePolicy, PolicyContext, checkpoint_all_plan, register
from remat.core.errors import InfeasibleBudgetError
from remat.core.graph import Graph
from remat.core.plan import Plan


@register("checkpoint_all")
@dataclasses.dataclass(frozen=True)
class CheckpointAll(BasePolicy):
    """Keep every output until its last reader; one step per node, no recomputation.

    Its peak is the graph's no-remat peak (the standard budget rule), so a budget below it
    raises :class:`~remat.core.errors.InfeasibleBudgetError`.
    """

    budget: int | str | None = None

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        peak = graph.no_remat_peak()
        if budget_bytes is not None and peak > budget_bytes:
            raise InfeasibleBudgetError(budget_bytes, peak, "checkpoint-all never recomputes")
        return checkpoint_all_plan(graph)
