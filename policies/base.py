"""The policy protocol and registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from remat.budget import resolve_budget
from remat.errors import UnknownNameError
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
