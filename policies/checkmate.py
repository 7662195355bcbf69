"""Checkmate (Jain et al., MLSys 2020): optimal rematerialization by MILP, or LP relaxation +
rounding with ``relax="lp"``.

The formulation lives in :mod:`solvers.checkmate`; this module turns a :class:`remat.Graph` into a
:class:`solvers.checkmate.CheckmateProblem`, picks a warm start (checkpoint-all when it fits,
otherwise the cheapest fitting schedule among the solver's own heuristics and, when importable,
the ``ChainDP`` and ``SqrtN`` policies' plans re-cut into frontier form), and wraps the result
in a :class:`remat.Plan`.

**Never worse than the best thing tried** (issue 18): every candidate schedule (the solver's own
heuristics, ChainDP, SqrtN, greedy_remat and pebbling plans re-cut into frontier form) is kept
with its compute cost; the returned plan is the cheapest of the candidates and the MILP (or LP
rounding) incumbent.  ``meta["tried"]`` maps each source to its cost (``None``: it did not
apply or did not fit), ``meta["best_of"]`` names the source returned, and ``lower_bound`` is
the solver's proven bound, which holds whatever schedule is returned.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from policies.base import BasePolicy, PolicyContext, checkpoint_all_plan, register
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
      solver: ``"highs"`` (highspy, direct), ``"cvxpy"`` (cvxpy's HiGHS; exact MILP only),
        ``"cpsat"`` (OR-Tools CP-SAT, the ``cpsat`` extra; exact MILP only, ``threads``
        workers) or ``"race"`` (HiGHS and CP-SAT at once, first proof wins; with
        ``lazy_memory`` the lazy HiGHS loop against CP-SAT's whole model,
        :mod:`solvers.checkmate.lazy_race`, otherwise one model, :mod:`solvers.milp.backends.race`;
        what ``remat compare`` uses up to 100 nodes).
      warm_start: start the MILP from the best available heuristic schedule.
      lazy_memory: (HiGHS and the race) build the MILP's ``U``/``FREE`` memory chain only on the steps
        whose replayed peak a relaxation without it overshoots
        (:func:`solvers.checkmate.solve.solve_checkmate`); ``meta["lazy_rounds"]`` lists the
        rounds.  100-layer random-width MLPs, 60 s: 7 of 10 proven optimal instead of 4
        (``experiments/results/milp_unseen.csv``).
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
        bound returned.  ResNet50 (published graph, m = 0.8): LP rounding 1.0056x, then LNS
        1.0030x (``experiments/results/lns_published.csv``).
      order: ``"program"`` plans in the graph's index order (Checkmate's frontier-advancing
        stages); ``"min_peak"`` first finds a low-peak topological order with OLLA's order
        phase (:func:`solvers.olla.solve_order`, ``order_share`` of the time), plans the graph
        relabelled by it and maps the plan back (:mod:`policies.reorder`).  When the program
        order is already the best found, it is planned as given.  ``lower_bound`` (and
        ``optimal``) then refer to frontier-form schedules in that order, as they refer to the
        program order otherwise; ``meta["order"]``, ``order_peak_bytes`` (no-remat peak of the
        order used) and ``program_peak_bytes`` say which.  Random layered DAG n = 250 (published
        graph) at 0.9 x its program-order peak: no frontier-form schedule found in program
        order, no recomputation needed in the new one (``published_benchmark.md``, "reorder +
        LNS").  When the MILP finds no incumbent in the new order, the general pebbling
        heuristic's plan in that order is returned (``status="time_limit"``).
      order_share: fraction of the time limit for the order search (``order="min_peak"``);
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
    order: str = "program"
    order_share: float = 0.25

    shortcut = True

    def check_applicable(self, graph: Graph) -> None:
        if self.relax not in (None, "lp"):
            raise InvalidOptionError(f"relax must be None or 'lp', got {self.relax!r}")
        if self.order not in ("program", "min_peak"):
            raise InvalidOptionError(f"order must be 'program' or 'min_peak', got {self.order!r}")
        check_backend(self.solver)
        if not 0.0 < self.order_share < 1.0:
            raise InvalidOptionError(f"order_share must be in (0, 1), got {self.order_share!r}")

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        if self.order != "program":
            return self._solve_reordered(graph, budget_bytes, ctx)
        t0 = time.perf_counter()
        b = budget_bytes
        time_limit = ctx.time_left(self.time_limit)
        problem = CheckmateProblem.from_graph(graph, b)
        warm, source, tried = None, None, {}
        if self.relax == "lp":

            def fallback():  # only computed when no rounding fits
                w, _, _ = self._warm_start(graph, problem)
                return None if isinstance(w, str) else w

            left = max(1.0, time_limit - (time.perf_counter() - t0))
            sol = solve_checkmate_lp(problem, time_limit=left, threads=self.threads,
                                     fallback=fallback if self.warm_start else None)
        else:
            warm, source, tried = (self._warm_start(graph, problem) if self.warm_start
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

    def _solve_reordered(self, graph: Graph, b: int | None, ctx: PolicyContext) -> Plan:
        """``order="min_peak"``: plan the graph relabelled by a low-peak topological order."""
        from policies.reorder import plan_in_program_order, relabel
        from solvers.olla import solve_order

        t0 = time.perf_counter()
        left = ctx.time_left(self.time_limit)
        share = 60.0 if left is None else max(1.0, self.order_share * left)
        osol = solve_order(graph.sizes, graph.edge_array, threads=self.threads, time_limit=share,
                           target_peak=b)
        program_peak = int(osol.warm_peak_bytes)  # the order search starts from 0..n-1
        # while the order still needs recomputation and its search was still improving when
        # its time ran out, give it another half share (up to 60 % of the time): on the n = 250
        # published DAG at m = 0.8, 30 s of search left the peak 4 % over the budget, 60 s
        # under it (no recomputation at all)
        while (b is not None and osol.peak_bytes > b and osol.status == "time_limit"
               and time.perf_counter() - t0 + share / 2 <= 0.6 * (left or 2 * share)):
            nxt = solve_order(graph.sizes, graph.edge_array, threads=self.threads,
                              time_limit=share / 2, warm_order=osol.order, target_peak=b)
            if nxt.peak_bytes >= osol.peak_bytes:  # no longer improving
                break
            osol = nxt
        inner = dataclasses.replace(self, order="program")
        meta = {"order": "min_peak", "order_peak_bytes": int(osol.peak_bytes),
                "program_peak_bytes": program_peak, "order_status": osol.status,
                "order_time_s": time.perf_counter() - t0}
        if osol.peak_bytes >= program_peak:  # nothing better than the program's order
            return inner.solve(graph, b, ctx).with_meta(**{**meta, "order": "program"})
        g2 = relabel(graph, osol.order)
        if b is None or b >= g2.no_remat_peak():  # the order alone fits: no recomputation
            cost = float(graph.costs.sum())
            p2 = checkpoint_all_plan(g2).with_meta(method="checkpoint_all", status="optimal",
                                                   objective=cost, lower_bound=cost, gap=0.0)
        else:
            try:
                p2 = inner.solve(g2, b, ctx)
            except SolverTimeoutError as e:  # no incumbent: the general pebbling plan, if any
                p2 = _pebbling_fallback(g2, b, e)
        return plan_in_program_order(graph, p2, osol.order, **meta)

    def _warm_start(self, graph: Graph, problem: CheckmateProblem):
        """The cheapest fitting frontier-form schedule among the solver's heuristics and other
        policies' plans (``ChainDP``, ``SqrtN``) when those exist and are frontier-form.

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
        import policies

        for name in ("chain_dp", "sqrtn"):
            try:
                other = policies.get(name, **_warm_options(graph).get(name, {})).plan(
                    graph, budget=b)
            except RematError:  # a best-effort warm start: not a chain, or nothing fits
                tried[name] = None
                continue
            tried[name] = self._candidate(problem, other.R if not other.paging
                                          and other.R.shape[1] == graph.n else None, name, cands)
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


def _warm_options(graph: Graph) -> dict[str, dict]:
    """Options of the policies whose plans warm-start the MILP.  ChainDP gets finer memory
    levels than its own fast-mode default (256) while its table stays near ``4e7`` entries
    (``(n/2)^2`` states per level): on the 100-layer random-width MLPs (202 nodes) 256 levels
    left 1.12391x at 50 % (seed 0), 3921 levels give 1.12294x in ~1.6 s, within 0.024 % of the
    MILP's bound after 60 s (1.12267x)."""
    k = max(1, graph.n // 2)
    return {"chain_dp": {"max_levels": int(min(4096, max(256, 4e7 / (k * k))))}}


def _pebbling_fallback(graph: Graph, budget: int, err: SolverTimeoutError) -> Plan:
    """The pebbling heuristic's plan (any schedule, not only frontier form) when the MILP found
    no incumbent in time: returned with ``status="time_limit"`` and the solver's bound; ``err``
    is re-raised when pebbling finds nothing either."""
    import policies

    try:
        p = policies.get("pebbling").plan(graph, budget=budget)
    except RematError:
        raise err from None
    cost = float(p.compute_counts() @ graph.costs)
    bound = getattr(err, "bound", None)
    lb = float(graph.costs.sum()) if bound is None or not np.isfinite(bound) else float(bound)
    return p.with_meta(status="time_limit", objective=cost, lower_bound=min(lb, cost),
                       gap=max(0.0, (cost - lb) / cost) if cost > 0 else 0.0,
                       best_of="pebbling", note=f"no MILP incumbent in time ({err}); the "
                       "pebbling heuristic's plan is returned")


def _dag_heuristic_plans(graph: Graph, budget: int):
    """``(name, R)`` of the general-DAG heuristics' plans under ``budget`` (greedy_remat, and
    pebbling in frontier mode, each score; peak shaving in the graph's order): cheap candidates
    for a warm start on graphs where the chain policies do not apply."""
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
    from solvers.peak_shave import shave_peak

    r = shave_peak(graph.sizes, graph.costs, graph.edge_array, budget, time_limit=10.0)
    if r.status == "fits":  # frontier form: step t ends with node t
        R = np.zeros((graph.n, graph.n), dtype=bool)
        for t, step in enumerate(r.steps):
            R[t, step] = True
        yield "peak_shave", R
