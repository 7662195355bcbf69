"""The policy contract: authors write the decision, one wrapper does everything else.

A policy is a frozen dataclass of options (budget included) that subclasses :class:`BasePolicy`
and implements one method::

    @register("every_kth")
    @dataclasses.dataclass(frozen=True)
    class EveryKth(BasePolicy):
        k: int = 2
        budget: int | str | None = None

        def solve(self, graph, budget_bytes, ctx):  # -> Plan
            keep = graph.forward_indices()[:: self.k]
            return plan_from_checkpoints(graph, keep, status="heuristic")

:meth:`BasePolicy.plan` (never overridden) resolves the budget (``"60%"``, ``"512MiB"``, bytes),
asks :meth:`BasePolicy.check_applicable`, short-cuts to checkpoint-all when the budget needs no
recomputation (policies that opt in), times the solve, validates the plan by replay (on the graph
at the plan's micro-batch size), refuses a plan over budget, and fills the same typed statistics
for every policy (:class:`remat.core.plan.PlanStats`: status, objective, lower bound, gap, solve time,
peak; ``plan.stats``).  A ``solve`` that finds no plan may raise
:class:`~remat.core.errors.InfeasibleBudgetError` without a minimum: the wrapper asks
:meth:`BasePolicy.min_feasible_budget`, the one method for a policy's smallest budget.  The
:class:`PolicyContext` carries what a decision may need besides the graph: the time limit, the
device profile, the graph at another micro-batch count (``ctx.graph_at(k)``) so a policy can
choose ``Plan.microbatches``, and other policies' plans as warm starts (``ctx.warm_starts``).
Policies compose through :mod:`policies.combinators` (``WarmStarted``, ``Reordered``,
``BestOf``, ``Fallback``), not by looking each other up in the registry.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable
from typing import ClassVar, Protocol, runtime_checkable

from remat.core.budget import resolve_budget
from remat.core.context import PolicyContext
from remat.core.errors import (
    InfeasibleBudgetError,
    InvalidOptionError,
    InvalidPlanError,
    RematError,
    SolverError,
    UnknownNameError,
)
from remat.core.graph import Graph
from remat.core.plan import Plan, PlanStats, checkpoint_all_plan
from solvers.bounds import frontier_lower_bound

_REGISTRY: dict[str, type] = {}

#: statuses a policy may report (``"optimal"``: proven; ``"feasible"``: a solver's plan without
#: proof; ``"time_limit"``: a solver's incumbent at its time limit; ``"heuristic"``: no solver).
STATUSES = ("optimal", "feasible", "time_limit", "heuristic")


@runtime_checkable
class Policy(Protocol):
    """A rematerialization policy: ``Graph -> Plan``.

    Policies take their options (budget included) as constructor keywords;
    ``plan(graph, budget=...)`` overrides the constructor's budget when given.
    """

    name: str

    def plan(self, graph: Graph, budget: int | str | None = None) -> Plan: ...


class BasePolicy(abc.ABC):
    """Base class of every registered policy (see the module docstring for the contract).

    Class attributes a policy may set:
      shortcut: when the budget is ``None`` or at least the no-remat peak, return checkpoint-all
        (status ``"optimal"``) without calling :meth:`solve`.  For policies that minimise
        recomputation under a budget; not for fixed-shape baselines (``SqrtN``, ``RecomputeAll``).
      objective_unit: the unit of ``meta["objective"]`` (``"cost"``: the graph's compute-cost
        units, ``"J"`` for energy objectives).
      budget_kind: what the budget caps: ``"live_bytes"`` (the replayed peak, the default) or
        ``"arena_bytes"`` (the plan's pool layout, which fragmentation makes at least the live
        peak: Melon).
    """

    name: ClassVar[str] = "custom"
    shortcut: ClassVar[bool] = False
    objective_unit: ClassVar[str] = "cost"
    budget_kind: ClassVar[str] = "live_bytes"

    # -- what authors write
    def check_applicable(self, graph: Graph) -> None:  # noqa: B027 - optional hook, no-op
        """Raise :class:`~remat.core.errors.NotApplicableError` if this policy cannot plan ``graph``
        (default: every graph)."""

    @abc.abstractmethod
    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        """The decision: a plan for ``graph`` whose replayed peak is at most ``budget_bytes``
        (``None``: no limit), or a typed :mod:`remat.core.errors` exception.  Abstract: a policy
        class without it cannot be instantiated."""

    def evaluation_graph(self, graph: Graph, plan: Plan, ctx: PolicyContext) -> Graph:
        """The graph whose replay gives ``plan``'s memory: ``graph``, or ``ctx.graph_at(k)``
        for a plan of ``k`` micro-batches.  Policies that change node sizes (scan decisions)
        override it."""
        k = int(plan.microbatches)
        if k == 1:
            return graph
        if ctx.graph_at is None:
            raise InvalidPlanError(f"{self.name}: a plan of {k} micro-batches needs "
                                   "ctx.graph_at to be checked")
        return ctx.graph_at(k)

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int | None:
        """The smallest budget (bytes) under which this policy plans ``graph``, or ``None`` when
        it does not know one (the default).

        :meth:`plan` calls it when :meth:`solve` raises
        :class:`~remat.core.errors.InfeasibleBudgetError` without a minimum
        (``min_feasible_bytes=None``), so a policy writes its search once, here.
        """
        return None

    # -- the one wrapper
    def resolve(self, graph: Graph, budget: int | str | None = None) -> int | None:
        """The budget in bytes: ``budget`` if given, else the policy's own ``budget`` option."""
        return resolve_budget(getattr(self, "budget", None) if budget is None else budget, graph)

    def plan(self, graph: Graph, budget: int | str | None = None, *,
             ctx: PolicyContext | None = None) -> Plan:
        """Plan ``graph`` under ``budget`` (default: the constructor's); see the module docstring.

        Returns:
          A validated :class:`~remat.Plan` whose ``meta`` holds the
          :class:`~remat.core.plan.PlanStats` fields (``plan.stats``): ``policy``, ``budget``
          (bytes), ``status``, ``objective`` (and ``objective_unit``), ``lower_bound``, ``gap``,
          ``peak_bytes`` (replayed), ``compute_cost`` and ``solve_time_s``.

        Raises:
          InfeasibleBudgetError: with the policy's smallest feasible budget
            (:meth:`min_feasible_budget` when :meth:`solve` did not give one).
          NotApplicableError: the policy does not apply to ``graph``.
          SolverError: the policy produced a plan over budget (a bug, never returned), unless
            ``ctx.compiled_budget`` and the plan says so (``meta["over_modelled_budget"]``).
        """
        ctx = ctx or PolicyContext()
        t0 = time.perf_counter()
        b = self.resolve(graph, budget)
        self.check_applicable(graph)
        if self.shortcut and (b is None or b >= graph.no_remat_peak()):
            cost = float(graph.costs.sum())
            p = checkpoint_all_plan(graph).with_meta(method="checkpoint_all", objective=cost,
                                                     lower_bound=cost, gap=0.0)
        else:
            try:
                p = self.solve(graph, b, ctx)
            except InfeasibleBudgetError as e:
                if e.min_feasible_bytes is not None:
                    raise
                mf = self.min_feasible_budget(graph, ctx)
                raise InfeasibleBudgetError(e.budget, mf, e.reason) from None
        return self._finish(graph, p, b, ctx, time.perf_counter() - t0)

    def _finish(self, graph: Graph, p: Plan, b: int | None, ctx: PolicyContext,
                elapsed: float) -> Plan:
        from remat.core.schedule import replay

        g = self.evaluation_graph(graph, p, ctx)
        p.validate(g)
        peak = replay(g, p).peak_bytes
        over = b is not None and peak > b
        if over and not (ctx.compiled_budget and "over_modelled_budget" in p.meta):
            raise SolverError(f"{self.name}: plan peaks at {peak} bytes, over the budget {b} "
                              "(a bug in the policy)")
        status = p.meta.get("status", "unknown")
        if status not in STATUSES:
            status = "heuristic"
        compute = float(p.compute_counts() @ g.costs)
        objective = p.meta.get("objective")
        objective = compute if objective is None else float(objective)
        lb = p.meta.get("lower_bound")
        if lb is None and status == "optimal":
            lb = objective
        gap = p.meta.get("gap")
        if gap is None and lb is not None:
            gap = max(0.0, (objective - lb) / objective) if objective > 0 else 0.0
        stats = PlanStats(policy=self.name, budget=b, status=status, objective=objective,
                          objective_unit=self.objective_unit, lower_bound=lb, gap=gap,
                          peak_bytes=int(peak), compute_cost=compute,
                          solve_time_s=float(elapsed))
        if "over_modelled_budget" in p.meta:  # a compiled-budget loop's plan below the floor
            p = p.with_meta(over_modelled_budget=int(max(peak - b, 0)))
        return p.with_meta(**stats.as_meta())


def register(name: str) -> Callable:
    """Class decorator adding a policy to the registry under ``name`` (its ``name``)."""

    def deco(cls):
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return deco


def get(name: str, **options) -> Policy:
    """Instantiate a registered policy: ``policies.get("checkmate", budget="60%")``.

    Raises:
      UnknownNameError: no policy of that name (the message lists the registered ones).
      UnknownNameError: an option the policy does not take (the message lists its options).
    """
    cls = _REGISTRY.get(str(name).lower().replace("-", "_"))
    if cls is None:
        raise UnknownNameError("policy", name, list(_REGISTRY))
    known = option_names(name)
    bad = sorted(set(options) - set(known))
    if bad:
        raise UnknownNameError(f"option of policy {name!r}", bad[0], list(known))
    return cls(**options)


def option_names(name: str) -> tuple[str, ...]:
    """The constructor options of a registered policy, e.g. ``("budget", "time_limit", ...)``."""
    cls = _REGISTRY.get(str(name).lower().replace("-", "_"))
    if cls is None:
        raise UnknownNameError("policy", name, list(_REGISTRY))
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def available() -> list[str]:
    """Names of the registered policies."""
    return sorted(_REGISTRY)


def budget_bytes(graph: Graph, budget, default) -> int | None:
    """The budget in bytes: ``budget`` if given, else the policy's own ``default``."""
    return resolve_budget(default if budget is None else budget, graph)


def choose_scores(score: str, scores: tuple[str, ...], policy: str) -> tuple[str, ...]:
    """The scores a heuristic runs: all of ``scores`` for ``"auto"``, else ``(score,)``.

    Raises:
      InvalidOptionError: ``score`` is neither ``"auto"`` nor one of ``scores``.
    """
    if score == "auto":
        return scores
    if score not in scores:
        raise InvalidOptionError(f"{policy} score must be 'auto' or one of {scores}, got {score!r}")
    return (score,)


def bisect_min_budget(
    graph: Graph,
    fits: Callable[[int], bool],
    *,
    rtol: float,
    name: str,
    failed_at: int | None = None,
    time_s: float | None = None,
) -> int:
    """Smallest budget (bytes, within ``rtol`` of it) at which a heuristic succeeds.

    Bisection between the largest single-node need (``out_bytes[v] + Σ out_bytes[preds(v)]``,
    below which nothing fits) or ``failed_at`` (a budget ``fits`` is known to reject) and
    :meth:`Graph.no_remat_peak`.  The result is always a budget ``fits`` was run at and accepted
    (so a heuristic's own minimum, not a proven bound); ``time_s`` stops the bisection early.

    Raises:
      SolverError: ``fits`` rejects the no-remat peak (where nothing needs recomputing).
    """
    lo = frontier_lower_bound(graph.sizes, graph.edge_array) - 1
    if failed_at is not None:
        lo = max(lo, int(failed_at))
    hi = graph.no_remat_peak()
    if not fits(hi):
        raise SolverError(f"{name} failed at the no-remat peak")
    t0 = time.perf_counter()
    while hi - lo > max(1, int(rtol * hi)):
        if time_s is not None and time.perf_counter() - t0 > time_s:
            break
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


__all__ = ["BasePolicy", "Policy", "PolicyContext", "RematError", "STATUSES", "available",
           "bisect_min_budget", "budget_bytes", "checkpoint_all_plan", "choose_scores", "get",
           "option_names", "register"]
