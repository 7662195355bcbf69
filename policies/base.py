"""The policy protocol and registry."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from remat.budget import resolve_budget
from remat.errors import BudgetFormatError, SolverError, UnknownNameError
from remat.graph import Graph
from remat.plan import Plan

_REGISTRY: dict[str, Callable[..., Policy]] = {}


@runtime_checkable
class Policy(Protocol):
    """A rematerialization policy: ``Graph -> Plan``.

    Policies take their options (budget included) as constructor keywords;
    ``plan(graph, budget=...)`` overrides the constructor's budget when given.
    """

    name: str

    def plan(self, graph: Graph, budget: int | str | None = None) -> Plan: ...


def register(name: str) -> Callable:
    """Class decorator adding a policy to the registry under ``name``."""

    def deco(cls):
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return deco


def get(name: str, **options) -> Policy:
    """Instantiate a registered policy: ``policies.get("checkmate", budget="60%")``."""
    key = name.lower().replace("-", "_")
    if key not in _REGISTRY:
        raise UnknownNameError("policy", name, list(_REGISTRY))
    return _REGISTRY[key](**options)


def available() -> list[str]:
    """Names of the registered policies."""
    return sorted(_REGISTRY)


def budget_bytes(graph: Graph, budget, default) -> int | None:
    """The budget in bytes: ``budget`` if given, else the policy's own ``default``."""
    return resolve_budget(default if budget is None else budget, graph)


def checkpoint_all_plan(graph: Graph) -> Plan:
    """Run every node once in order, keeping each output until its last reader.

    Step ``t`` computes node ``t``; ``S[t, i] = i < t <= last_reader[i]``.  Its simulated peak is
    exactly :meth:`Graph.no_remat_peak`.
    """
    n = graph.n
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    S = (i < t) & (t <= graph.last_reader[None, :])
    return Plan(R=np.eye(n, dtype=bool), S=S, meta={"policy": "checkpoint_all", "status": "optimal"})


def choose_scores(score: str, scores: tuple[str, ...], policy: str) -> tuple[str, ...]:
    """The scores a heuristic runs: all of ``scores`` for ``"auto"``, else ``(score,)``.

    Raises:
      BudgetFormatError: ``score`` is neither ``"auto"`` nor one of ``scores``.
    """
    if score == "auto":
        return scores
    if score not in scores:
        raise BudgetFormatError(f"{policy} score must be 'auto' or one of {scores}, got {score!r}")
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
    sizes = graph.sizes
    lo = max((int(sizes[v] + sizes[list(graph.preds[v])].sum()) for v in range(graph.n)),
             default=0) - 1
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
