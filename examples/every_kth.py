"""A policy written against the contract: keep every k-th forward stage (the example of
``docs/guide/writing_a_policy.md``).

Run it through the CLI with ``remat compare mlp --budget 60% --plugin examples/every_kth.py``.
"""

import dataclasses

from policies import BasePolicy, register
from policies.from_checkpoints import plan_from_checkpoints
from remat.core.errors import InfeasibleBudgetError
from remat.core.schedule import replay


@register("every_kth")
@dataclasses.dataclass(frozen=True)
class EveryKth(BasePolicy):
    """Keep the output of every k-th forward stage; recompute the others from the nearest kept
    one when the backward pass needs them.  ``k=None``: the largest k whose plan fits."""

    k: int | None = None
    budget: int | str | None = None

    def solve(self, graph, budget_bytes, ctx):
        fwd = [v.index for v in graph.forward_nodes]
        ks = [self.k] if self.k else range(len(fwd), 0, -1)  # fewest kept stages first
        best = None
        for k in ks:
            plan = plan_from_checkpoints(graph, fwd[k - 1::k], status="heuristic", k=k)
            peak = replay(graph, plan).peak_bytes
            if budget_bytes is None or peak <= budget_bytes:
                return plan
            best = peak if best is None else min(best, peak)
        raise InfeasibleBudgetError(budget_bytes, best, "no k fits")
