"""Peak shaving in low-peak orders: a fast general-DAG heuristic for budgets a little below the
no-recomputation peak (see :mod:`solvers.peak_shave` for the search).

The policy shaves the program's order and the ``orders`` lowest-peak distinct orders of
:func:`solvers.order_search.greedy_orders` (each relabelled with :func:`policies.reorder.relabel`
and mapped back with :func:`policies.reorder.plan_in_program_order`), and keeps the cheapest
plan that fits.  On the published random layered DAGs it fits every budget from 0.9 down to 0.6
of the no-remat peak at n = 500 and 1000 (1.005-1.55x) in seconds, where the other heuristics
needed 2.5-145x or nothing fitted (``experiments/results/published_benchmark.md``).

When no order fits, :class:`~remat.core.errors.InfeasibleBudgetError` carries the lowest peak the
search reached: this heuristic's own minimum, not a proven bound.
"""

from __future__ import annotations

import dataclasses
import time

from policies.base import BasePolicy, PolicyContext, register
from policies.from_checkpoints import plan_from_steps
from policies.reorder import plan_in_program_order, relabel
from remat.core.errors import InfeasibleBudgetError, InvalidOptionError
from remat.core.graph import Graph
from remat.core.plan import Plan
from solvers.order_search import greedy_orders
from solvers.peak_shave import shave_peak


@register("peak_shave")
@dataclasses.dataclass(frozen=True)
class PeakShave(BasePolicy):
    """Insert recomputations where they lower the peak, in the program's and low-peak orders.

    Args:
      budget: activation bytes or ``"60%"`` / ``"512MiB"`` (``None``: nothing recomputed).
      orders: greedy low-peak orders tried besides the program's (``0``: the program's only,
        which keeps the plan in Checkmate's frontier form).
      time_limit: seconds for all orders together (each order gets an equal share of what is
        left).
    """

    budget: int | str | None = None
    orders: int = 3
    time_limit: float = 30.0

    shortcut = True

    def __post_init__(self):
        if self.orders < 0 or self.time_limit <= 0:
            raise InvalidOptionError(f"PeakShave needs orders >= 0 and time_limit > 0, got "
                             f"{self.orders}, {self.time_limit}")

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        t0 = time.perf_counter()
        b = int(budget_bytes)
        left = ctx.time_left(self.time_limit)
        limit = self.time_limit if left is None else min(self.time_limit, left)
        cands: list = [None]
        if self.orders:
            cands += [o for o, _ in greedy_orders(graph.sizes, graph.edge_array, restarts=32,
                                                  time_limit=0.1 * limit)[:self.orders]]
        best, lowest, tried = None, None, []
        for i, order in enumerate(cands):
            share = (limit - (time.perf_counter() - t0)) / (len(cands) - i)
            if share <= 0:
                break
            g2 = graph if order is None else relabel(graph, order)
            r = shave_peak(g2.sizes, g2.costs, g2.edge_array, b, time_limit=share)
            tried.append({"order": "program" if order is None else f"greedy{i}",
                          "status": r.status, "peak_bytes": r.peak_bytes,
                          "overhead": r.cost / float(g2.costs.sum() or 1.0), "moves": r.moves})
            lowest = r.peak_bytes if lowest is None else min(lowest, r.peak_bytes)
            if r.status != "fits" or (best is not None and r.cost >= best[0]):
                continue
            p2 = plan_from_steps(g2, r.steps)
            plan = p2 if order is None else plan_in_program_order(graph, p2, order)
            best = (r.cost, plan, tried[-1]["order"])
        if best is None:
            raise InfeasibleBudgetError(
                b, max(int(lowest or 0), b + 1),
                "peak_shave heuristic's own minimum (lowest peak reached), not a proven bound")
        return best[1].with_meta(status="heuristic", order=best[2], tried=tried)
