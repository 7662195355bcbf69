"""Checkmate (Jain et al., MLSys 2020): optimal rematerialization by MILP, or LP relaxation +
rounding with ``relax="lp"``.

The formulation lives in :mod:`solvers.checkmate`; this module turns a :class:`remat.Graph` into a
:class:`solvers.checkmate.CheckmateProblem`, picks a warm start (checkpoint-all when it fits,
otherwise the cheapest fitting schedule among the solver's own heuristics and, when importable,
the ``ChainDP`` and ``SqrtN`` policies' plans re-cut into frontier form), and wraps the result
in a :class:`remat.Plan`.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from policies.base import BasePolicy, PolicyContext, register
from remat.errors import RematError
from remat.graph import Graph
from remat.plan import Plan
from solvers.checkmate import (
    CheckmateProblem,
    best_heuristic,
    normalize,
    schedule_memory,
    solve_checkmate,
    solve_checkmate_lp,
    to_frontier_form,
)


@register("checkmate")
@dataclasses.dataclass(frozen=True)
class Checkmate(BasePolicy):
    """Optimal (MILP) or approximate (LP + rounding) rematerialization under a memory budget.

    Args:
      budget: bytes or a string (``"60%"`` of the no-remat peak, ``"512MiB"``); ``None`` = no limit.
      time_limit: wall-clock seconds for ``plan()``; the warm start's time (ChainDP's included)
        is deducted from the solver's share.  On expiry the best schedule found is returned with
        ``meta["status"] == "time_limit"`` and its gap.
      mip_gap: relative optimality gap at which the MILP stops.
      threads: HiGHS threads (``None``: HiGHS default).
      relax: ``None`` for the exact MILP, ``"lp"`` for LP relaxation + rounding.
      solver: ``"highs"`` (highspy, direct) or ``"cvxpy"`` (cvxpy's HiGHS; exact MILP only).
      warm_start: start the MILP from the best available heuristic schedule.

    ``plan(graph, budget=None)`` returns a :class:`remat.Plan` whose ``meta`` holds ``policy``,
    ``budget``, ``status``, ``solve_time_s``, ``gap``, ``objective`` (compute cost of the plan, the
    graph's ``time_s`` units), ``lower_bound`` (proven bound on the optimal cost), and ``peak_bytes``.

    Raises:
      InfeasibleBudgetError: with the computed ``min_feasible_bytes``.
      SolverTimeoutError: no schedule found in time (possible only when no warm-start schedule
        fits the budget, or with ``warm_start=False``).
    """

    budget: int | str | None = None
    time_limit: float = 60.0
    mip_gap: float = 1e-4
    threads: int | None = None
    relax: str | None = None
    solver: str = "highs"
    warm_start: bool = True

    shortcut = True

    def check_applicable(self, graph: Graph) -> None:
        if self.relax not in (None, "lp"):
            raise RematError(f"relax must be None or 'lp', got {self.relax!r}")

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        t0 = time.perf_counter()
        b = budget_bytes
        time_limit = ctx.time_left(self.time_limit)
        problem = CheckmateProblem.from_graph(graph, b)
        if self.relax == "lp":

            def fallback():  # only computed when no rounding fits
                w, _ = self._warm_start(graph, problem)
                return None if isinstance(w, str) else w

            left = max(1.0, time_limit - (time.perf_counter() - t0))
            sol = solve_checkmate_lp(problem, time_limit=left, threads=self.threads,
                                     fallback=fallback if self.warm_start else None)
        else:
            warm, source = self._warm_start(graph, problem) if self.warm_start else (None, None)
            warm_s = time.perf_counter() - t0
            left = max(1.0, time_limit - warm_s)  # warm start counts
            sol = solve_checkmate(problem, time_limit=left, mip_gap=self.mip_gap,
                                  threads=self.threads, backend=self.solver, warm_start=warm)
        meta = dict(sol.meta)
        if self.relax is None:
            meta["warm_start_time_s"] = warm_s
            if meta.get("warm_start") == "given":
                meta["warm_start"] = source
        meta.update(status=sol.status, gap=sol.gap, objective=sol.objective,
                    lower_bound=sol.lower_bound, solver_time_s=sol.solve_time_s, build_time_s=sol.build_time_s,
                    node_count=sol.node_count)
        return Plan(R=sol.R, S=sol.S, meta=meta)

    def _warm_start(self, graph: Graph, problem: CheckmateProblem):
        """The cheapest fitting frontier-form schedule among the solver's heuristics and other
        policies' plans (``ChainDP``, ``SqrtN``) when those exist and are frontier-form."""
        b = problem.budget
        cands = []
        h = best_heuristic(problem, b)
        if h is not None and h[3] <= b:
            cands.append((h[4], h[1], h[2], h[0]))
        import policies

        for name in ("chain_dp", "sqrtn"):
            try:
                other = policies.get(name).plan(graph, budget=b)
            except RematError:  # a best-effort warm start: not a chain, or nothing fits
                continue
            if other.paging or other.R.shape[1] != graph.n:
                continue
            ff = to_frontier_form(problem, other.R)
            if ff is None:
                continue
            R, S = normalize(problem, *ff)
            if schedule_memory(problem, R, S)[0] <= b:
                cands.append((float(problem.costs @ R.sum(0)), R, S, name))
        for name, R in _dag_heuristic_plans(graph, b):
            ff = to_frontier_form(problem, R)
            if ff is None:
                continue
            R, S = normalize(problem, *ff)
            if schedule_memory(problem, R, S)[0] <= b:
                cands.append((float(problem.costs @ R.sum(0)), R, S, name))
        if not cands:
            return "auto", "auto"
        cands.sort(key=lambda c: c[0])
        return (cands[0][1], cands[0][2]), cands[0][3]


def _dag_heuristic_plans(graph: Graph, budget: int):
    """``(name, R)`` of the general-DAG heuristics' plans under ``budget`` (greedy_remat, and
    pebbling in frontier mode, each score): cheap candidates for a warm start on graphs where the
    chain policies do not apply."""
    from policies.greedy_remat import SCORES as GREEDY_SCORES
    from policies.greedy_remat import greedy_steps
    from policies.pebbling import SCORES as PEBBLE_SCORES
    from policies.pebbling import _plan, pebbling_steps

    for sc in GREEDY_SCORES:
        r = greedy_steps(graph, budget, sc)
        if r is not None:
            R = np.zeros((graph.n, graph.n), dtype=bool)
            for t, step in enumerate(r[0]):
                R[t, step] = True
            yield f"greedy_remat({sc})", R
    for sc in PEBBLE_SCORES:
        r = pebbling_steps(graph, budget, sc, frontier=True)
        if r is not None:
            yield f"pebbling({sc}, frontier)", _plan(graph, r[0], r[1]).R
