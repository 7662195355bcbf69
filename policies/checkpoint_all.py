"""Checkpoint-all: store every activation, recompute nothing (the no-remat baseline)."""

from __future__ import annotations

import dataclasses
import time

from policies.base import budget_bytes, checkpoint_all_plan, register
from remat.errors import InfeasibleBudgetError
from remat.graph import Graph
from remat.plan import Plan


@register("checkpoint_all")
@dataclasses.dataclass(frozen=True)
class CheckpointAll:
    """Keep every output until its last reader; one step per node, no recomputation.

    Its peak is the graph's no-remat peak (the standard budget rule), so a budget below it
    raises :class:`~remat.errors.InfeasibleBudgetError`.
    """

    budget: int | str | None = None
    name: str = dataclasses.field(default="checkpoint_all", init=False)

    def plan(self, graph: Graph, budget: int | str | None = None) -> Plan:
        t0 = time.perf_counter()
        b = budget_bytes(graph, budget, self.budget)
        peak = graph.no_remat_peak()
        if b is not None and peak > b:
            raise InfeasibleBudgetError(b, peak, "checkpoint-all never recomputes")
        p = checkpoint_all_plan(graph)
        return p.with_meta(budget=b, solve_time_s=time.perf_counter() - t0)
