"""Checkmate (Jain et al., MLSys 2020): optimal rematerialization by MILP, or LP relaxation +
rounding with ``relax="lp"``.

The formulation lives in :mod:`solvers.checkmate`; :class:`CheckmateMILP` turns a
:class:`remat.Graph` into a :class:`solvers.checkmate.CheckmateProblem`, picks a warm start
(checkpoint-all when it fits, otherwise the cheapest fitting schedule among the solver's own
heuristics, the general-DAG heuristics' frontier-form plans and the plans handed to it in
``ctx.warm_starts``, each re-cut into frontier form), and wraps the result in a
:class:`remat.Plan`.  :class:`Checkmate` (``policies.get("checkmate")``) is that MILP composed
with :mod:`policies.combinators` (:meth:`Checkmate.composed`): ``WarmStarted`` by ChainDP and
SqrtN, and with ``order="min_peak"`` ``Reordered`` with a pebbling ``Fallback``.

**Never worse than the best thing tried** (issue 18): every candidate schedule (the solver's own
heuristics, the warm starts, greedy_remat, pebbling and peak-shaving plans re-cut into frontier
form) is kept with its compute cost; the returned plan is the cheapest of the candidates and the
MILP (or LP rounding) incumbent.  ``meta["tried"]`` maps each source to its cost (``None``: it
did not apply or did not fit), ``meta["best_of"]`` names the source returned, and
``lower_bound`` is the solver's proven bound, which holds whatever schedule is returned.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from policies.base import BasePolicy, PolicyContext, register
from policies.chain_dp import ChainDP
from policies.combinators import Fallback, Reordered, WarmStarted, warm_starts
from policies.greedy_remat import SCORES as GREEDY_SCORES
from policies.greedy_remat import greedy_steps
from policies.pebbling import SCORES as PEBBLE_SCORES
from policies.pebbling import Pebbling, pebbling_steps, plan_from_events
from policies.sqrtn import SqrtN
from remat.core.errors import InvalidOptionError, RematError, SolverTimeoutError
from remat.core.graph import Graph
from remat.core.plan import Plan
from solvers.checkmate import (
    CheckmateProblem,
    best_heuristic,
    normalize,
    schedule_memory,
    solve_checkmate,
    solve_checkmate_lp,
    to_frontier_form,
)
from solvers.checkmate.lns import solve_checkmate_lns
from solvers.milp import check_backend
from solvers.peak_shave import shave_peak


@dataclasses.dataclass(frozen=True)
class CheckmateMILP(BasePolicy):
    """Checkmate's solver in the graph's own order: the exact MILP, LP relaxation + rounding
    (``relax="lp"``) or LNS (``lns=True``) over frontier-form schedules, started from the
    solver's heuristics, the general-DAG heuristics and the plans in ``ctx.warm_starts``.

    Not registered: :class:`Checkmate` composes it (warm starts by ChainDP and SqrtN, the
    ``order="min_peak"`` reordering); compose it yourself with :mod:`policies.combinators`.

    Args:
      budget: bytes or a string (``"60%"`` of the no-remat peak, ``"512MiB"``); ``None`` = no limit.
      time_limit: wall-clock seconds for ``plan()``; the warm start's time (the warm starts'
        plans included) is deducted from the solver's share.  On expiry the best schedule found
        is returned with ``meta["status"] == "time_limit"`` and its gap.
      mip_gap: relative optimality gap at which the MILP stops.
      threads: HiGHS threads (``None``: HiGHS default).
      relax: ``None`` for the exact MILP, ``"lp"`` for LP relaxation + rounding.
      solver: ``"highs"`` (highspy, direct), ``"cvxpy"`` (cvxpy's HiGHS; exact MILP only),
        ``"cpsat"`` (OR-Tools CP-SAT, the ``cpsat`` extra; exact MILP only, ``threads``
        workers) or ``"race"`` (HiGHS and CP-SAT at once, first proof wins; with
        ``lazy_memory`` the lazy HiGHS loop against CP-SAT's whole model,
        :mod:`solvers.checkmate.lazy_race`, otherwise one model, :mod:`solvers.milp.backends.race`;
        what ``remat compare`` uses up to 100 nodes).
      warm_start: start the MILP from the cheapest fitting heuristic schedule (the solver's, the
        general-DAG heuristics', ``ctx.warm_starts``); with ``relax="lp"`` they are the fallback
        when no rounding fits.
      lazy_memory: (HiGHS and the race) build the MILP's ``U``/``FREE`` memory chain only on the steps
        whose replayed peak a relaxation without it overshoots
        (:func:`solvers.checkmate.solve.solve_checkmate`); ``meta["lazy_rounds"]`` lists the
        rounds (measured: ``docs/design/decisions/0002-lazy-memory-chain.md``).
      path_cuts: (HiGHS and the race) strengthen the small LP solved first with path cuts
        (:mod:`solvers.checkmate.path_cuts`) and give the MILP the rows that bind there.
      portfolio: (HiGHS, lazy) lazy HiGHS searches run at once with different random seeds,
        first proof wins (:func:`solvers.checkmate.solve.solve_checkmate`); ``None``: two on a
        machine with two or more cores unless ``threads`` is set.
      lns: anytime mode for large graphs: improve the best warm start by large-neighbourhood
        search (:func:`solvers.checkmate.lns.solve_checkmate_lns`, windows of ``lns_window``
        steps re-solved by the MILP) instead of one MILP over every step; falls back to the
        MILP when no frontier-form warm start fits.
      lns_window: initial LNS window (steps).
      lns_neighbourhoods: ``("steps", "nodes")``: which LNS windows to use (windows of steps,
        windows of nodes across every step; see :mod:`solvers.checkmate.lns`).
      lns_lp_start: with ``lns``, also run LP relaxation + rounding (a third of the time left)
        and start from its schedule when it is the cheapest candidate; its LP bound is the
        bound returned (measured: ``docs/design/decisions/0006-checkmate-lns.md``).

    ``meta``: ``objective`` is the plan's compute cost (the graph's cost units), ``lower_bound``
    the solver's proven bound on frontier-form schedules in the graph's order; ``tried``,
    ``best_of``, ``warm_start``, ``warm_start_time_s``, the solver's entries.

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
    lazy_memory: bool = True
    path_cuts: bool = True
    portfolio: int | None = None
    lns: bool = False
    lns_window: int = 16
    lns_lp_start: bool = True
    lns_neighbourhoods: tuple[str, ...] = ("steps", "nodes")

    name = "checkmate_milp"
    shortcut = True

    def check_applicable(self, graph: Graph) -> None:
        if self.relax not in (None, "lp"):
            raise InvalidOptionError(f"relax must be None or 'lp', got {self.relax!r}")
        check_backend(self.solver)

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        t0 = time.perf_counter()
        b = budget_bytes
        time_limit = ctx.time_left(self.time_limit)
        problem = CheckmateProblem.from_graph(graph, b)
        warm, source, tried = None, None, {}
        if self.relax == "lp":

            def fallback():  # only computed when no rounding fits
                w, _, _ = self._warm_start(graph, problem, ctx)
                return None if isinstance(w, str) else w

            left = max(1.0, time_limit - (time.perf_counter() - t0))
            sol = solve_checkmate_lp(problem, time_limit=left, threads=self.threads,
                                     fallback=fallback if self.warm_start else None)
        else:
            warm, source, tried = (self._warm_start(graph, problem, ctx) if self.warm_start
                                   else (None, None, {}))
            warm_s = time.perf_counter() - t0
            left = max(1.0, time_limit - warm_s)  # warm start counts
            known_lb = None
            if self.lns and self.lns_lp_start:
                t_lp = time.perf_counter()
                try:  # the heuristics' schedules are candidates already: no LP fallback
                    lp = solve_checkmate_lp(problem, time_limit=max(1.0, left / 3),
                                            threads=self.threads, heuristic_fallback=False)
                except SolverTimeoutError as e:  # no rounding fits; the LP bound still holds
                    lp = None
                    if e.bound is not None and np.isfinite(e.bound):
                        known_lb = float(e.bound)
                except RematError:  # a best-effort start
                    lp = None
                cands: list = []
                tried["lp_rounding"] = (None if lp is None else
                                        self._candidate(problem, lp.R, "lp_rounding", cands))
                if cands and (not isinstance(warm, tuple)
                              or cands[0][0] < float(problem.costs @ warm[0].sum(0))):
                    warm, source = (cands[0][1], cands[0][2]), "lp_rounding"
                if lp is not None and np.isfinite(lp.lower_bound):
                    known_lb = float(lp.lower_bound)
                left = max(1.0, left - (time.perf_counter() - t_lp))
            if self.lns and isinstance(warm, tuple):
                sol = solve_checkmate_lns(problem, warm, time_limit=left, window=self.lns_window,
                                          mip_gap=self.mip_gap, threads=self.threads,
                                          lp_bound=known_lb is None, lower_bound=known_lb,
                                          neighbourhoods=tuple(self.lns_neighbourhoods))
            else:
                sol = solve_checkmate(problem, time_limit=left, mip_gap=self.mip_gap,
                                      threads=self.threads, backend=self.solver,
                                      warm_start=warm, lazy_memory=self.lazy_memory,
                                      path_cuts=self.path_cuts, portfolio=self.portfolio)
        meta = dict(sol.meta)
        R, S, status, objective, best_of = sol.R, sol.S, sol.status, sol.objective, "solver"
        if self.relax is None and isinstance(warm, tuple):
            wcost = float(problem.costs @ warm[0].sum(0))
            if wcost < objective * (1 - 1e-12):  # the incumbent lost to the start it was given
                R, S, objective, best_of = warm[0], warm[1], wcost, source
                status = "optimal" if wcost <= sol.lower_bound * (1 + self.mip_gap) else (
                    "time_limit" if sol.status == "time_limit" else "feasible")
                meta["note"] = (f"solver incumbent cost {sol.objective:.6g} > warm start "
                                f"{source} cost {wcost:.6g}; the warm start is returned")
        meta["tried"] = {**tried, "solver": float(sol.objective)}
        meta["best_of"] = best_of
        if self.relax is None:
            meta["warm_start_time_s"] = warm_s
            if meta.get("warm_start") == "given" or meta.get("method") == "lns":
                meta["warm_start"] = source
        gap = (objective - sol.lower_bound) / objective if objective > 0 else 0.0
        meta.update(status=status, gap=max(0.0, gap), objective=objective,
                    lower_bound=sol.lower_bound, solver_time_s=sol.solve_time_s, build_time_s=sol.build_time_s,
                    node_count=sol.node_count)
        return Plan(R=R, S=S, meta=meta)

    def _warm_start(self, graph: Graph, problem: CheckmateProblem, ctx: PolicyContext | None = None):
        """The cheapest fitting frontier-form schedule among the solver's heuristics, the plans
        of ``ctx.warm_starts`` and the general-DAG heuristics' plans, each re-cut into frontier
        form.

        Returns:
          ``(schedule or "auto", source name, tried)``: ``tried`` maps every candidate source to
          its compute cost (``None`` when it did not apply, was not frontier-form or did not fit).
        """
        b = problem.budget
        cands = []
        tried: dict[str, float | None] = {}
        h = best_heuristic(problem, b)
        if h is not None and h[3] <= b:
            cands.append((h[4], h[1], h[2], h[0]))
            tried[str(h[0])] = float(h[4])
        for start in (ctx.warm_starts if ctx is not None else ()):
            other = start.plan  # planned now, when first read
            frontier = (other is not None and not other.paging and other.microbatches == 1
                        and other.R.shape[1] == graph.n)
            tried[start.name] = (None if other is None else
                                 self._candidate(problem, other.R if frontier else None,
                                                 start.name, cands))
        for name, R in _dag_heuristic_plans(graph, b):
            tried[name] = self._candidate(problem, R, name, cands)
        if not cands:
            return "auto", "auto", tried
        cands.sort(key=lambda c: c[0])
        return (cands[0][1], cands[0][2]), cands[0][3], tried

    @staticmethod
    def _candidate(problem: CheckmateProblem, R, name: str, cands: list) -> float | None:
        """Append ``R`` re-cut into frontier form to ``cands`` when it fits; its cost or None."""
        if R is None:
            return None
        ff = to_frontier_form(problem, R)
        if ff is None:
            return None
        R, S = normalize(problem, *ff)
        if schedule_memory(problem, R, S)[0] > problem.budget:
            return None
        cost = float(problem.costs @ R.sum(0))
        cands.append((cost, R, S, name))
        return cost


@register("checkmate")
@dataclasses.dataclass(frozen=True)
class Checkmate(CheckmateMILP):
    """Optimal (MILP) or approximate (LP + rounding) rematerialization under a memory budget:
    :class:`CheckmateMILP` composed with :mod:`policies.combinators` (:meth:`composed`).

    The options ``budget``, ``time_limit``, ``mip_gap``, ``threads``, ``relax``, ``solver``,
    ``lazy_memory``, ``path_cuts``, ``portfolio`` and ``lns*`` are :class:`CheckmateMILP`'s.

    Args:
      warm_start: :class:`CheckmateMILP`'s, and ``WarmStarted`` by :data:`WARM_STARTS` (ChainDP
        and SqrtN plans at the same budget); with ``relax="lp"`` they are read only when no
        rounding fits (``compare=False``: the plan stays the rounding's).
      order: ``"program"`` plans in the graph's index order (Checkmate's frontier-advancing
        stages); ``"min_peak"`` is ``Reordered``: it first finds a low-peak topological order
        with OLLA's order phase (:func:`solvers.olla.solve_order`, ``order_share`` of the time),
        plans the graph relabelled by it and maps the plan back (:mod:`policies.reorder`).  When
        the program order is already the best found, it is planned as given.  ``lower_bound``
        (and ``optimal``) then refer to frontier-form schedules in that order, as they refer to
        the program order otherwise; ``meta["order"]``, ``order_peak_bytes`` (no-remat peak of
        the order used) and ``program_peak_bytes`` say which.  Random layered DAG n = 250
        (published graph) at 0.9 x its program-order peak: no frontier-form schedule found in
        program order, no recomputation needed in the new one (``published_benchmark.md``,
        "reorder + LNS").  The MILP is then a ``Fallback`` to the general pebbling heuristic:
        when it finds no incumbent in time, pebbling's plan is returned
        (``status="time_limit"``).
      order_share: ``Reordered``'s ``share``: fraction of the time limit for the order search;
        extended by half shares, up to 60 %, while the order found still needs recomputation,
        its search ended at its time limit and the last extension lowered the peak.

    ``plan(graph, budget=None)`` returns a :class:`remat.Plan` whose ``meta`` holds ``policy``,
    ``budget``, ``status``, ``solve_time_s``, ``gap``, ``objective`` (compute cost of the plan, the
    graph's ``time_s`` units), ``lower_bound`` (proven bound on the optimal cost), and ``peak_bytes``.

    Raises:
      InfeasibleBudgetError: with the computed ``min_feasible_bytes``.
      SolverTimeoutError: no schedule found in time (possible only when no warm-start schedule
        fits the budget, or with ``warm_start=False``).
    """

    order: str = "program"
    order_share: float = 0.25

    def check_applicable(self, graph: Graph) -> None:
        super().check_applicable(graph)
        if self.order not in ("program", "min_peak"):
            raise InvalidOptionError(f"order must be 'program' or 'min_peak', got {self.order!r}")
        if not 0.0 < self.order_share < 1.0:
            raise InvalidOptionError(f"order_share must be in (0, 1), got {self.order_share!r}")

    def milp(self) -> CheckmateMILP:
        """The solver part of this policy (its options but ``order``, ``order_share``)."""
        return CheckmateMILP(**{f.name: getattr(self, f.name)
                                for f in dataclasses.fields(CheckmateMILP)})

    def composed(self) -> BasePolicy:
        """This policy as combinators over :meth:`milp`: ``warm_start=True`` wraps it in
        ``WarmStarted(milp, start=WARM_STARTS, compare=relax is None)``, ``order="min_peak"``
        the result in ``Reordered(Fallback(..., then=Pebbling()), share=order_share)``."""
        p: BasePolicy = self.milp()
        if self.warm_start:
            p = WarmStarted(p, start=WARM_STARTS, compare=self.relax is None)
        if self.order == "min_peak":
            p = Reordered(Fallback(p, then=Pebbling()), time_limit=self.time_limit,
                          share=self.order_share, threads=self.threads)
        return p

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        return self.composed().solve(graph, budget_bytes, ctx)

    def _warm_start(self, graph: Graph, problem: CheckmateProblem, ctx: PolicyContext | None = None):
        """:meth:`CheckmateMILP._warm_start` with this policy's warm starts (:data:`WARM_STARTS`)
        handed in, as :meth:`solve` does (for scripts that build the MILP themselves)."""
        ctx = ctx or PolicyContext()
        ctx = dataclasses.replace(ctx, warm_starts=tuple(ctx.warm_starts) + warm_starts(
            WARM_STARTS, graph, problem.budget, ctx))
        return self.milp()._warm_start(graph, problem, ctx)


def chain_dp_start(graph: Graph) -> ChainDP:
    """ChainDP as a warm start of ``graph``: finer memory levels than its own fast-mode default
    (256, at most 4096) while its table stays near ``4e7`` entries (``(n/2)^2`` states per
    level).  Measured: ``docs/design/decisions/0001-checkmate-milp-formulation.md``."""
    k = max(1, graph.n // 2)
    return ChainDP(max_levels=int(min(4096, max(256, 4e7 / (k * k)))))


#: the policies whose plans start Checkmate's MILP (``Checkmate(warm_start=True)``)
WARM_STARTS = (chain_dp_start, SqrtN())


def _dag_heuristic_plans(graph: Graph, budget: int):
    """``(name, R)`` of the general-DAG heuristics' plans under ``budget`` (greedy_remat, and
    pebbling in frontier mode, each score; peak shaving in the graph's order): cheap candidates
    for a warm start on graphs where the chain policies do not apply."""
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
            yield f"pebbling({sc}, frontier)", plan_from_events(graph, r[0], r[1]).R
    r = shave_peak(graph.sizes, graph.costs, graph.edge_array, budget, time_limit=10.0)
    if r.status == "fits":  # frontier form: step t ends with node t
        R = np.zeros((graph.n, graph.n), dtype=bool)
        for t, step in enumerate(r.steps):
            R[t, step] = True
        yield "peak_shave", R
