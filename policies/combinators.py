"""Policies built from policies: one small wrapper per idea, as ``Olla(base=...)`` is.

* :class:`WarmStarted` ``(base, start=...)``: plan the ``start`` policies, hand their plans to
  ``base`` as warm starts (``ctx.warm_starts``), return the cheapest of base's plan and theirs.
* :class:`Reordered` ``(base)``: plan the graph relabelled by a low-peak topological order
  (OLLA's order phase, :func:`solvers.olla.solve_order`) and map the plan back
  (:mod:`policies.reorder`).
* :class:`BestOf` ``([p1, p2, ...])``: the cheapest plan of several (ties: the earlier).
* :class:`Fallback` ``(primary, then)``: ``then``'s plan when ``primary`` raises one of ``on``
  (default: :class:`~remat.core.errors.SolverTimeoutError`, no plan in time).

Each is a :class:`~policies.base.BasePolicy`: its ``plan`` resolves the budget, validates by
replay and reports :class:`~remat.core.plan.PlanStats` as any policy's does, and it composes any
policy (registered or not, combinators included)::

    Reordered(WarmStarted(CheckmateMILP(lns=True), start=("greedy_remat", "peak_shave")))
    BestOf(["chain_dp", "sqrtn", Fallback("checkmate", then="pebbling")])

"Cheapest" is the whole batch's compute: ``meta["compute_cost"] * microbatches`` (the graph's
cost units).  ``policies.Checkmate`` is built from these
(:meth:`policies.checkmate.Checkmate.composed`).
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from policies.base import BasePolicy, Policy, PolicyContext, get
from policies.reorder import plan_in_program_order, relabel
from remat.core.context import WarmStart
from remat.core.errors import (
    InfeasibleBudgetError,
    InvalidOptionError,
    NotApplicableError,
    RematError,
    SolverTimeoutError,
)
from remat.core.graph import Graph
from remat.core.plan import Plan

__all__ = ["BestOf", "Fallback", "Reordered", "WarmStarted", "cost_of", "warm_starts"]

#: what a combinator takes for a policy: a policy, a registered name (``policies.get(name)``,
#: resolved when the combinator is made), or a function ``graph -> policy`` (options that
#: depend on the graph, e.g. ChainDP's memory levels)
PolicyLike = Policy | str | Callable[[Graph], Policy]


def _resolve(p: PolicyLike, what: str) -> Policy | Callable[[Graph], Policy]:
    """A name as its policy (an unknown name fails here, not at plan time); a policy class as
    its default instance; a policy or a ``graph -> policy`` function as it is."""
    if isinstance(p, str):
        return get(p)
    if isinstance(p, type) and issubclass(p, BasePolicy):
        return p()
    if hasattr(p, "plan") or callable(p):
        return p
    raise InvalidOptionError(f"{what}: not a policy, a policy name or a graph -> policy "
                             f"function: {p!r}")


def _policy(p: Policy | Callable[[Graph], Policy], graph: Graph) -> Policy:
    """``p`` as a policy for ``graph``."""
    return p if hasattr(p, "plan") else p(graph)


def _name(p: PolicyLike) -> str:
    return str(getattr(p, "name", getattr(p, "__name__", "custom")))


def cost_of(plan: Plan) -> float:
    """The whole batch's compute of a plan returned by a policy's ``plan``: ``compute_cost``
    (the graph's cost units, per micro-batch) times ``microbatches``."""
    return float(plan.meta["compute_cost"]) * int(plan.microbatches)


def _try(policy: Policy, graph: Graph, budget: int | None, ctx: PolicyContext) -> Plan | None:
    try:
        return policy.plan(graph, budget, ctx=ctx)
    except RematError:  # a best-effort start: not applicable, nothing fits, no plan in time
        return None


def warm_starts(starts: Sequence[PolicyLike], graph: Graph, budget: int | None,
                ctx: PolicyContext) -> tuple[WarmStart, ...]:
    """``starts`` as :class:`~remat.core.context.WarmStart` entries for ``ctx.warm_starts``: each
    planned (``graph``, ``budget``, ``ctx``) when first read, ``None`` when it raises a
    :class:`~remat.core.errors.RematError`.  Repeated names get ``#2``, ``#3``, ..."""
    out, seen = [], {}
    for s in starts:
        pol = _policy(_resolve(s, "warm start"), graph)
        name = str(pol.name)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}#{seen[name]}"
        out.append(WarmStart(name, lambda pol=pol: _try(pol, graph, budget, ctx)))
    return tuple(out)


class _Combinator(BasePolicy):
    """What combinators share: the budget semantics of the policies they wrap, and the graph
    a returned plan is checked on (that of the policy whose plan it is)."""

    @abc.abstractmethod
    def _members(self) -> tuple[Policy, ...]:
        """The policies this combinator wraps."""

    def _policies(self) -> list[Policy]:
        """The members that are policies already (not ``graph -> policy`` functions)."""
        return [m for m in self._members() if hasattr(m, "plan")]

    @property
    def shortcut(self) -> bool:  # checkpoint-all when every member would return it anyway
        ms = self._policies()
        return len(ms) == len(self._members()) and all(getattr(m, "shortcut", False) for m in ms)

    @property
    def objective_unit(self) -> str:
        ms = self._policies()
        return str(getattr(ms[0], "objective_unit", "cost")) if ms else "cost"

    @property
    def budget_kind(self) -> str:
        ms = self._policies()
        return str(getattr(ms[0], "budget_kind", "live_bytes")) if ms else "live_bytes"

    def resolve(self, graph: Graph, budget: int | str | None = None) -> int | None:
        """The budget in bytes: ``budget``, else this combinator's ``budget`` option, else the
        first member's (``WarmStarted(GreedyRemat(budget="60%"))`` plans at 60 %)."""
        if budget is None and getattr(self, "budget", None) is None:
            for m in self._policies():
                if getattr(m, "budget", None) is not None:
                    return m.resolve(graph)
        return super().resolve(graph, budget)

    def evaluation_graph(self, graph: Graph, plan: Plan, ctx: PolicyContext) -> Graph:
        for m in self._policies():
            if getattr(m, "name", None) == plan.meta.get("policy"):
                return m.evaluation_graph(graph, plan, ctx)
        return super().evaluation_graph(graph, plan, ctx)


@dataclasses.dataclass(frozen=True)
class WarmStarted(_Combinator):
    """``base`` started from other policies' plans, and never worse than them.

    The ``start`` policies are handed to ``base`` as ``ctx.warm_starts`` (each planned at the
    same budget when first read: :class:`~remat.core.context.WarmStart`); Checkmate's MILP
    re-cuts them into its frontier form and starts from the cheapest that fits.  The result is
    the cheapest (:func:`cost_of`) of base's plan and every start's plan (ties: base's), so a
    base that ignores warm starts still returns no worse than its starts.

    Args:
      base: the policy to start (a policy, a registered name, or ``graph -> policy``).
      start: the policies whose plans are the starts (same forms as ``base``).
      compare: ``False`` returns base's plan as it is and plans a start only if base reads it:
        Checkmate's LP rounding reads them only when no rounding fits, and its plan stays the
        rounding's.
      budget: bytes or a string (``"60%"``); ``None`` = no limit.

    ``meta``: ``warm_starts`` maps each planned start to its cost (``None``: no plan); when a
    start is returned, ``best_of`` names it.
    """

    base: PolicyLike
    start: tuple[PolicyLike, ...] = ()
    compare: bool = True
    budget: int | str | None = None

    def __post_init__(self) -> None:
        start = self.start
        if isinstance(start, str) or not isinstance(start, Sequence):
            start = (start,)
        object.__setattr__(self, "base", _resolve(self.base, "WarmStarted"))
        object.__setattr__(self, "start", tuple(_resolve(s, "WarmStarted") for s in start))

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"warm_started({_name(self.base)})"

    def _members(self) -> tuple:
        return (self.base,)

    def check_applicable(self, graph: Graph) -> None:
        _policy(self.base, graph).check_applicable(graph)

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int | None:
        return _policy(self.base, graph).min_feasible_budget(graph, ctx)

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        base = _policy(self.base, graph)
        starts = warm_starts(self.start, graph, budget_bytes, ctx)
        p = base.plan(graph, budget_bytes, ctx=dataclasses.replace(
            ctx, warm_starts=tuple(ctx.warm_starts) + starts))
        if self.compare:
            best, best_cost = None, cost_of(p)
            for s in starts:
                if s.plan is not None and cost_of(s.plan) < best_cost * (1 - 1e-12):
                    best, best_cost = s, cost_of(s.plan)
            if best is not None:
                p = best.plan.with_meta(best_of=best.name, note=(
                    f"{base.name}'s plan cost {cost_of(p):.6g} > warm start {best.name}'s "
                    f"{best_cost:.6g}; the warm start is returned"))
        return p.with_meta(warm_starts={s.name: None if s.plan is None else cost_of(s.plan)
                                        for s in starts if s.planned})


@dataclasses.dataclass(frozen=True)
class BestOf(_Combinator):
    """The cheapest plan (:func:`cost_of`) of several policies; ties: the earlier policy.

    Every policy plans the same graph and budget.  When none returns a plan, an
    :class:`~remat.core.errors.InfeasibleBudgetError` with the smallest of their minimums
    (``None`` when one of them does not know its own) if every failure was infeasibility or
    non-applicability, else the first other error.

    Args:
      policies: the policies (policies, registered names, or ``graph -> policy``).
      budget: bytes or a string (``"60%"``); ``None`` = no limit.

    ``meta``: ``best_of`` names the policy returned; ``candidates`` maps each to its cost
    (``None``: no plan).
    """

    policies: tuple[PolicyLike, ...]
    budget: int | str | None = None

    def __post_init__(self) -> None:
        if not self.policies:
            raise InvalidOptionError("BestOf needs at least one policy")
        object.__setattr__(self, "policies",
                           tuple(_resolve(p, "BestOf") for p in self.policies))

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"best_of({','.join(_name(p) for p in self.policies)})"

    def _members(self) -> tuple:
        return self.policies

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int | None:
        mins = []
        for p in self.policies:
            pol = _policy(p, graph)
            try:
                pol.check_applicable(graph)
            except NotApplicableError:
                continue
            mins.append(pol.min_feasible_budget(graph, ctx))
        return None if not mins or None in mins else int(min(mins))

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        best, names, costs, errors = None, [], {}, []
        for p in self.policies:
            pol = _policy(p, graph)
            name = str(pol.name)
            if name in names:
                name = f"{name}#{names.count(name) + 1}"
            names.append(name)
            try:
                plan = pol.plan(graph, budget_bytes, ctx=ctx)
            except RematError as e:
                costs[name] = None
                errors.append(e)
                continue
            costs[name] = cost_of(plan)
            if best is None or costs[name] < best[0]:
                best = (costs[name], plan, name)
        if best is None:
            raise _combined(budget_bytes, errors, self.name)
        return best[1].with_meta(best_of=best[2], candidates=costs)


def _combined(budget: int | None, errors: list[RematError], name: str) -> RematError:
    """The error of a :class:`BestOf` none of whose policies planned."""
    other = [e for e in errors if not isinstance(e, (InfeasibleBudgetError, NotApplicableError))]
    if other:
        return other[0]
    infeasible = [e for e in errors if isinstance(e, InfeasibleBudgetError)]
    if not infeasible:
        return errors[0]
    mins = [e.min_feasible_bytes for e in infeasible]
    mf = None if None in mins else min(mins)
    return InfeasibleBudgetError(budget, mf, f"{name}: no policy fits; "
                                 + "; ".join(str(e) for e in infeasible))


@dataclasses.dataclass(frozen=True)
class Fallback(_Combinator):
    """``primary``'s plan, or ``then``'s when ``primary`` raises one of ``on``.

    When ``then`` finds nothing either, ``primary``'s error is raised.  After a
    :class:`~remat.core.errors.SolverTimeoutError` (no incumbent in time) the plan is reported
    as ``status="time_limit"`` with the primary's bound (``err.bound``; else the sum of the
    node costs, which every plan pays) as ``lower_bound``.

    Args:
      primary, then: policies (policies, registered names, or ``graph -> policy``).
      on: the exception types that hand over to ``then``.
      budget: bytes or a string (``"60%"``); ``None`` = no limit.

    ``meta``: ``best_of`` names ``then`` when its plan is returned, ``note`` says why.
    """

    primary: PolicyLike
    then: PolicyLike = "pebbling"
    on: tuple[type[BaseException], ...] = (SolverTimeoutError,)
    budget: int | str | None = None

    def __post_init__(self) -> None:
        on = (self.on,) if isinstance(self.on, type) else tuple(self.on)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in on):
            raise InvalidOptionError(f"Fallback on must be exception types, got {self.on!r}")
        object.__setattr__(self, "on", on)
        object.__setattr__(self, "primary", _resolve(self.primary, "Fallback"))
        object.__setattr__(self, "then", _resolve(self.then, "Fallback"))

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"fallback({_name(self.primary)},{_name(self.then)})"

    def _members(self) -> tuple:
        return (self.primary, self.then)

    @property
    def shortcut(self) -> bool:  # the primary's answer: checkpoint-all needs no fallback
        return bool(getattr(self.primary, "shortcut", False))

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int | None:
        return _policy(self.primary, graph).min_feasible_budget(graph, ctx)

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        primary = _policy(self.primary, graph)
        try:
            return primary.plan(graph, budget_bytes, ctx=ctx)
        except self.on as e:
            err = e
        then = _policy(self.then, graph)
        try:
            p = then.plan(graph, budget_bytes, ctx=ctx)
        except RematError:
            raise err from None
        meta: dict[str, Any] = dict(best_of=then.name, note=(
            f"{primary.name}: {err}; {then.name}'s plan is returned"))
        if isinstance(err, SolverTimeoutError):  # primary's incumbent at its limit: none
            cost = float(p.meta["compute_cost"])
            g = then.evaluation_graph(graph, p, ctx)
            bound = err.bound
            lb = float(g.costs.sum()) if bound is None or not np.isfinite(bound) else float(bound)
            meta.update(status="time_limit", objective=cost, lower_bound=min(lb, cost),
                        gap=max(0.0, (cost - lb) / cost) if cost > 0 else 0.0)
        return p.with_meta(**meta)


@dataclasses.dataclass(frozen=True)
class Reordered(_Combinator):
    """``base`` planning the graph in a low-peak topological order, its plan mapped back.

    OLLA's order phase (:func:`solvers.olla.solve_order`, Steiner et al. eq. 14; ``share`` of the
    time) finds the order; ``base`` plans the graph relabelled by it
    (:func:`policies.reorder.relabel`) and :func:`policies.reorder.plan_in_program_order` maps
    the plan back.  While the order still peaks over the budget, its search ended at its time
    limit and the last extension lowered the peak, the search gets another half share, up to
    60 % of the time.  When the program's order is already the best found, ``base`` plans the
    graph as given.  In the new order ``base`` gets no ``ctx.graph_at`` (no micro-batching)
    and no warm starts (they are plans of the original order).

    Args:
      base: the policy (a policy, a registered name, or ``graph -> policy``).
      time_limit: seconds for the whole ``plan()`` (``None``: the context's, else base's
        ``time_limit`` option; neither: the order search gets 60 s).
      share: fraction of the time for the order search, in ``(0, 1)``.
      threads: HiGHS threads of the order search.
      budget: bytes or a string (``"60%"``); ``None`` = no limit.

    ``meta``: ``order`` (``"min_peak"``, or ``"program"`` when the order search found nothing
    better), ``order_peak_bytes`` (no-remat peak of the order found), ``program_peak_bytes``,
    ``order_status``, ``order_time_s``.  A bound (and ``optimal``) of ``base`` refers to plans in
    the order used.
    """

    base: PolicyLike
    time_limit: float | None = None
    share: float = 0.25
    threads: int | None = None
    budget: int | str | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise InvalidOptionError(f"Reordered share must be in (0, 1), got {self.share!r}")
        object.__setattr__(self, "base", _resolve(self.base, "Reordered"))

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"reordered({_name(self.base)})"

    def _members(self) -> tuple:
        return (self.base,)

    def check_applicable(self, graph: Graph) -> None:
        _policy(self.base, graph).check_applicable(graph)

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        from solvers.olla import solve_order

        b = budget_bytes
        base = _policy(self.base, graph)
        t0 = time.perf_counter()
        limit = self.time_limit if self.time_limit is not None else getattr(base, "time_limit", None)
        left = ctx.time_left(limit)
        share = 60.0 if left is None else max(1.0, self.share * left)
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
        meta = {"order": "min_peak", "order_peak_bytes": int(osol.peak_bytes),
                "program_peak_bytes": program_peak, "order_status": osol.status,
                "order_time_s": time.perf_counter() - t0}
        if osol.peak_bytes >= program_peak:  # nothing better than the program's order
            return base.plan(graph, b, ctx=ctx).with_meta(**{**meta, "order": "program"})
        g2 = relabel(graph, osol.order)
        p2 = base.plan(g2, b, ctx=dataclasses.replace(ctx, graph_at=None, warm_starts=()))
        return plan_in_program_order(graph, p2, osol.order, **meta)
