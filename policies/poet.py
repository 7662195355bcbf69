"""POET: energy-optimal rematerialization plus paging under a memory budget and a deadline.

Patil, Jain, Dutta, Stoica, Gonzalez, "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022: Algorithm 1 / eq. (1) with the energy
objective of eq. (2) and the runtime constraint of eq. (3), restated self-consistently in
:mod:`solvers.poet` and solved by :func:`solvers.poet.solve_poet` on the Checkmate core.
Costs come from a :mod:`remat.core.devices` profile: per-node compute time/energy
(``node_costs``) and per-node page-in/page-out time/energy from the output bytes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from policies.base import BasePolicy, PolicyContext, checkpoint_all_plan, register
from remat.core.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from remat.core.graph import Graph
from remat.core.plan import Plan
from solvers.milp import check_backend
from solvers.poet import PoetProblem, PoetSolution, schedule_costs, solve_poet


def device_costs(graph: Graph, device, cost_model: str | None = None) -> dict[str, np.ndarray]:
    """Per-node costs for POET from a device profile (name or ``DeviceProfile``).

    Returns ``float64[n]`` arrays ``compute_time`` (s), ``compute_energy`` (J), ``page_in_time``,
    ``page_in_energy``, ``page_out_time``, ``page_out_energy`` (per move of the node's output,
    latency + bytes / bandwidth, POET's ``Phi_pagein``/``Phi_pageout``).  ``device=None`` uses the
    graph's own ``time_s``/``energy_j`` and free paging (tests only).  ``cost_model`` is passed
    to ``DeviceProfile.node_costs`` (``"roofline"``, the profile's default, or ``"poet"``: POET's
    FLOP-based ``flops / FLOPS_PER_WATT`` energy).
    """
    n = graph.n
    if device is None:
        z = np.zeros(n)
        return {"compute_time": graph.costs.copy(), "compute_energy": graph.energies.copy(),
                "page_in_time": z, "page_in_energy": z, "page_out_time": z, "page_out_energy": z}
    if isinstance(device, str):
        from remat.core import devices

        dev = devices.get(device)
    else:
        dev = device
    if cost_model is None:
        times, energies = dev.node_costs(graph)
    else:
        times, energies = dev.node_costs(graph, model=cost_model)
    sizes = graph.sizes.astype(np.float64)
    ti, ei = dev.page_in_cost(sizes)
    to, eo = dev.page_out_cost(sizes)
    f = lambda a: np.broadcast_to(np.asarray(a, dtype=np.float64), (n,)).copy()  # noqa: E731
    return {"compute_time": f(times), "compute_energy": f(energies), "page_in_time": f(ti),
            "page_in_energy": f(ei), "page_out_time": f(to), "page_out_energy": f(eo)}


@register("poet")
@dataclasses.dataclass(frozen=True)
class Poet(BasePolicy):
    """POET's MILP as a policy (``policies.get("poet", device="cortex-a72", budget="50%")``).

    Attributes:
      device: a :mod:`remat.core.devices` profile name or object (compute and paging costs), or
        ``None`` to use the graph's own ``time_s``/``energy_j`` with free paging.
      budget: device-memory budget for activations (bytes or ``"60%"``/``"512KiB"``); ``None``
        means the checkpoint-all peak.
      deadline: runtime limit as a multiple of the checkpoint-all compute time (POET's API:
        ``runtime_budget``); ``None`` = no limit.
      paging, remat: ablations (``paging=False`` is remat only, ``remat=False`` paging only).
      time_limit: MILP wall-clock limit, seconds; mip_gap: relative gap to stop at.
      warm_start: ``True``: start HiGHS from the cheapest paging-free heuristic schedule that
        fits (checkpoint-all, or Checkmate's keep-every-c schedules), when one exists; or a
        :class:`remat.Plan` (e.g. an ablation's or Checkmate's plan) to start from; ``False``.
      count_paging_time: add page-in/out time to the deadline row (POET's eq. 3 does not: it
        assumes DMA hides paging).
      eps: tie-breaking cost per recompute and page move (relative).
      threads: HiGHS threads (CP-SAT workers with ``solver="cpsat"``).
      solver: ``"highs"`` or ``"cpsat"`` (OR-Tools, the ``cpsat`` extra; no ``deadline``).
      cost_model: ``None`` (the device's default, what ``remat.simulate(..., device=)`` uses),
        ``"roofline"`` or ``"poet"`` (POET's FLOP-per-joule energy).
    """

    device: Any = "cortex-m4"
    budget: int | str | None = None
    deadline: float | None = None
    paging: bool = True
    remat: bool = True
    time_limit: float = 60.0
    mip_gap: float = 1e-4
    warm_start: bool | Plan = True
    count_paging_time: bool = False
    eps: float = 1e-5
    threads: int | None = None
    cost_model: str | None = None
    solver: str = "highs"

    objective_unit = "J"

    # ------------------------------------------------------------------ helpers
    def problem(self, graph: Graph, budget: int | str | None = None) -> PoetProblem:
        """The :class:`~solvers.poet.PoetProblem` this policy solves for ``graph``."""
        b = self.resolve(graph, budget)
        if b is None:
            b = graph.no_remat_peak()
        c = device_costs(graph, self.device, self.cost_model)
        dl = None if self.deadline is None else float(self.deadline) * float(c["compute_time"].sum())
        return PoetProblem(
            n=graph.n, edges=graph.edge_array, sizes=graph.sizes,
            compute_energy=c["compute_energy"], compute_time=c["compute_time"],
            page_in_energy=c["page_in_energy"], page_out_energy=c["page_out_energy"],
            page_in_time=c["page_in_time"], page_out_time=c["page_out_time"],
            budget=int(b), deadline=dl, paging=self.paging, remat=self.remat,
            count_paging_time=self.count_paging_time, eps=self.eps,
        )

    def _warm(self, prob: PoetProblem):
        """Cheapest paging-free schedule meeting budget and deadline (or ``None``)."""
        from solvers.checkmate import CheckmateProblem, heuristic_schedules, schedule_memory

        cm = CheckmateProblem(prob.n, prob.edges, prob.compute_energy, prob.sizes, prob.budget)
        z = np.zeros((prob.n, prob.n), bool)
        best = None
        for _, R, S in heuristic_schedules(cm):
            if not self.remat and R.sum() != prob.n:
                continue
            peak, _ = schedule_memory(cm, R, S)
            if peak > prob.budget:
                continue
            c = schedule_costs(prob, R, z, z)
            if prob.deadline is not None and c["runtime_s"] > prob.deadline * (1 + 1e-9):
                continue
            if best is None or c["energy_j"] < best[0]:
                best = (c["energy_j"], R, S)
        return None if best is None else (best[1], best[2])

    # --------------------------------------------------------------------- plan
    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        """Solve POET for ``graph``; returns a :class:`remat.Plan` with ``R``, ``S``, ``S_aux``,
        ``page_in`` and ``page_out``.

        ``meta``: ``policy``, ``budget``, ``status`` (``optimal`` / ``time_limit``), ``gap``,
        ``solve_time_s``, ``build_time_s``, ``energy_j`` (= ``objective``), ``compute_energy_j``,
        ``page_in_energy_j``, ``page_out_energy_j``, ``lower_bound_j``, ``runtime_s``,
        ``deadline_s``, ``baseline_energy_j``/``baseline_time_s`` (checkpoint-all),
        ``bytes_paged``, ``device``, ``paging``, ``remat``.

        Raises:
          InfeasibleBudgetError: no schedule meets the budget (and deadline).
          SolverTimeoutError: the time limit hit with no schedule found.
        """
        t0 = time.perf_counter()
        check_backend(self.solver)
        time_limit = ctx.time_left(self.time_limit)
        prob = self.problem(graph, budget_bytes)
        base_e = float(prob.compute_energy.sum())
        base_t = float(prob.compute_time.sum())
        dev = self.device if isinstance(self.device, str) or self.device is None else getattr(
            self.device, "name", str(self.device))
        common = {"device": dev,
                  "deadline_s": prob.deadline, "baseline_energy_j": base_e,
                  "baseline_time_s": base_t, "paging": self.paging, "remat": self.remat}
        fits_all = prob.budget >= graph.no_remat_peak()
        meets_all = prob.deadline is None or prob.deadline >= base_t * (1 - 1e-12)
        if fits_all and meets_all:
            # every node runs at least once and paging costs >= 0: checkpoint-all is optimal
            p = checkpoint_all_plan(graph)
            z = np.zeros_like(p.R)
            return dataclasses.replace(p, page_in=z, page_out=z, S_aux=z).with_meta(
                **common, status="optimal", gap=0.0, build_time_s=0.0, lower_bound=base_e, energy_j=base_e, objective=base_e, compute_energy_j=base_e,
                page_in_energy_j=0.0, page_out_energy_j=0.0, lower_bound_j=base_e,
                runtime_s=base_t, bytes_paged=0, method="checkpoint_all")
        if prob.deadline is not None and prob.deadline < base_t * (1 - 1e-12):
            raise SolverError(f"deadline {self.deadline}x is below 1x: every node runs at least "
                              "once, so no schedule meets it")
        lb = _frontier_lower_bound(graph)
        if prob.budget < lb:
            raise InfeasibleBudgetError(prob.budget, lb, "a node and its inputs must be resident "
                                        "while it runs (this bound is exact only if attained)")
        if isinstance(self.warm_start, Plan):
            w = self.warm_start
            z = np.zeros_like(w.R)
            warm = (w.R, w.S, z if w.page_in is None else w.page_in,
                    z if w.page_out is None else w.page_out)
        else:
            warm = self._warm(prob) if self.warm_start else None
        try:
            sol = solve_poet(prob, time_limit=time_limit, mip_gap=self.mip_gap,
                             threads=self.threads, warm_start=warm, backend=self.solver)
        except SolverTimeoutError as e:
            raise SolverTimeoutError(f"POET: {e}", bound=None if e.bound is None else
                                     e.bound * base_e) from None
        if sol.status == "infeasible":
            mf, exact = self._min_feasible(graph, prob, time_limit)
            raise InfeasibleBudgetError(
                prob.budget, mf, ("" if prob.deadline is None else "under the deadline; ")
                + ("exact" if exact else "min_feasible_bytes is an upper estimate"))
        plan = _to_plan(sol)
        paged = int(plan.page_in.sum(0) @ graph.sizes + plan.page_out.sum(0) @ graph.sizes)
        return plan.with_meta(
            **common, status=sol.status, gap=sol.gap, solver_time_s=sol.solve_time_s,
            build_time_s=sol.build_time_s, lower_bound=sol.bound_j, energy_j=sol.energy_j, objective=sol.energy_j,
            compute_energy_j=sol.compute_energy_j, page_in_energy_j=sol.page_in_energy_j,
            page_out_energy_j=sol.page_out_energy_j, lower_bound_j=sol.bound_j,
            runtime_s=sol.runtime_s, bytes_paged=paged, method="milp",
            warm_start=None if warm is None else (float(schedule_costs(
                prob, warm[0], *(warm[2:] if len(warm) > 2 else (np.zeros_like(warm[0]),) * 2)
            )["energy_j"]) if sol.warm_started else "rejected"),
            wall_s=time.perf_counter() - t0)

    def _min_feasible(self, graph: Graph, prob: PoetProblem,
                      time_limit: float) -> tuple[int, bool]:
        """Smallest budget with a POET schedule (meeting the deadline), by bisection on MILP
        feasibility between the frontier lower bound and the checkpoint-all peak, to within 1/256
        of that range.  ``exact`` is False when a feasibility solve timed out or the bracket is
        wider than one byte (the result is then an upper estimate: a schedule fits it)."""
        lo, hi = _frontier_lower_bound(graph) - 1, graph.no_remat_peak()
        z = np.zeros_like(prob.sizes, dtype=float)
        feas_prob = dataclasses.replace(prob, compute_energy=z + 0.0, page_in_energy=z,
                                        page_out_energy=z, eps=0.0)
        exact = True
        per = max(1.0, time_limit / 8)
        tol = max(1, (hi - lo) // 256)  # at most ~8 feasibility solves
        while hi - lo > tol:
            mid = (lo + hi) // 2
            try:
                s = solve_poet(dataclasses.replace(feas_prob, budget=int(mid)), time_limit=per,
                               mip_gap=1.0)
                ok = s.status != "infeasible"
            except SolverTimeoutError:
                ok, exact = False, False
            if ok:
                hi = mid
            else:
                lo = mid
        return int(hi), exact and hi - lo <= 1


def _frontier_lower_bound(graph: Graph) -> int:
    """``max_t (M_t + sum_{p in preds(t)} M_p)`` bytes: live while node t runs, any schedule."""
    from solvers.bounds import frontier_lower_bound

    return frontier_lower_bound(graph.sizes, graph.edge_array)


def _to_plan(sol: PoetSolution) -> Plan:
    return Plan(R=sol.R, S=sol.S, page_out=sol.M_out, page_in=sol.M_in, S_aux=sol.S_aux)


__all__ = ["Poet", "device_costs"]

