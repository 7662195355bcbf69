"""Griewank: binomial checkpointing (revolve) for chains, computed from its recurrence.

Griewank 1992, "Achieving logarithmic growth of temporal and spatial complexity in reverse
automatic differentiation"; Griewank & Walther 2000 (revolve).  The schedule and the count
``t(l, c) = r l - β(c+1, r-1)`` come from :mod:`solvers.revolve`; the chain is recognised by
:func:`policies.chain_dp.chain_problem` (non-chain graphs raise
:class:`~remat.core.errors.NotApplicableError`).  Revolve counts checkpoint *slots*, not bytes: with a
budget, the policy keeps the cheapest slot count whose simulated peak fits.
"""

from __future__ import annotations

import dataclasses
import math

from policies.base import BasePolicy, PolicyContext, register
from policies.chain_dp import chain_problem, ops_to_steps
from policies.from_checkpoints import plan_from_steps
from remat.core.errors import InfeasibleBudgetError
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.schedule import replay
from solvers.revolve import assign_steps, revolve_cost, revolve_evals, revolve_ops


@register("griewank")
@dataclasses.dataclass(frozen=True)
class Griewank(BasePolicy):
    """Revolve / binomial checkpointing on a chain.

    Args:
      slots: stored activations besides the input; ``None``: from the budget (the most slots
        whose plan fits, i.e. the fewest recomputations), or ``ceil(log2 K)`` without a budget
        (Checkmate's "Griewank log n" baseline).
      budget: activation bytes or ``"60%"`` / ``"512MiB"``.

    ``meta`` records ``slots`` and ``forward_evals`` (Griewank's count in remat's model,
    :func:`solvers.revolve.revolve_evals`).
    """

    slots: int | None = None
    budget: int | str | None = None

    def check_applicable(self, graph: Graph) -> None:
        chain_problem(graph)

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        b = budget_bytes
        prob, fwd, bwd, iso = chain_problem(graph)
        K = prob.K
        step, tape = assign_steps(prob.bwd_hi, prob.bwd_lo, K)

        def make(s: int) -> Plan:
            ops = revolve_ops(step, tape, K, s)
            return plan_from_steps(graph, ops_to_steps(ops, fwd, bwd, iso),
                                   status="heuristic", slots=s,
                                   forward_evals=revolve_evals(K, s, tape, step))

        if self.slots is not None:
            plan = make(int(self.slots))
            peak = replay(graph, plan).peak_bytes
            if b is not None and peak > b:
                raise InfeasibleBudgetError(b, peak, f"revolve with {self.slots} slots")
        elif b is None:
            plan = make(max(1, math.ceil(math.log2(max(K, 2)))))
        else:
            best, best_key, min_peak = None, None, None
            for s in range(0, K):
                p = make(s)
                peak = replay(graph, p).peak_bytes
                min_peak = peak if min_peak is None else min(min_peak, peak)
                if peak <= b:
                    key = (float(p.compute_counts() @ graph.costs), peak)
                    if best_key is None or key < best_key:
                        best, best_key = p, key
                if revolve_cost(K + 1, s + 1) == K:
                    break  # every value stored once: more slots cannot help
            if best is None:
                raise InfeasibleBudgetError(b, min_peak, "no revolve slot count fits")
            plan = best
        return plan
