"""Planning for the JAX side: resolve a policy, give it its context, run plans per micro-batch.

:func:`resolve_policy` turns ``None``, a registry name or an object into a policy;
:func:`planning_context` builds the :class:`~remat.core.context.PolicyContext` whose ``graph_at(k)``
re-extracts the function at ``1/k`` of the batch, so a policy may choose micro-batches;
:func:`execute_microbatched` runs a plan op by op on each micro-batch.  Used by
:mod:`remat.apply`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import policies
from policies.base import BasePolicy
from remat import microbatch
from remat.core.context import PolicyContext
from remat.core.errors import MicrobatchError, RematError
from remat.core.plan import checkpoint_all_plan
from remat.extraction import extract
from remat.microbatch import microbatch_args

__all__ = ["resolve_policy", "make_plan", "planning_context", "execute_microbatched"]


def resolve_policy(policy: Any, budget: Any = None):
    """A policy object from ``policy``: ``None``, a registry name, or an object with ``plan``.

    Raises:
      UnknownNameError: an unknown policy name (listing the registered ones).
      RematError: ``policy`` is neither a name nor an object with a ``plan`` method.
    """
    if policy is None:
        return None
    if isinstance(policy, str):
        takes_budget = budget is not None and "budget" in policies.option_names(policy)
        return policies.get(policy, **({"budget": budget} if takes_budget else {}))
    if hasattr(policy, "plan") and callable(policy.plan):
        return policy
    raise RematError(
        f"policy must be None, a registry name or an object with .plan(graph, budget); got "
        f"{type(policy).__name__}"
    )


def make_plan(pol, graph, budget, ctx=None):
    """``pol.plan(graph, budget)``, handing ``ctx`` to policies of the contract
    (:class:`policies.base.BasePolicy`); other objects with a ``plan`` method get the graph and
    budget only."""
    kw = {} if budget is None else {"budget": budget}
    if ctx is not None and isinstance(pol, BasePolicy):
        kw["ctx"] = ctx
    return pol.plan(graph, **kw)


def planning_context(fn: Callable, args: Sequence[Any], graph: Any, *,
                     argnums: int | Sequence[int] = 0, has_aux: bool = False,
                     stages: Any = "auto", time_limit: float | None = None) -> PolicyContext:
    """The :class:`~remat.core.context.PolicyContext` for planning ``fn`` at ``args``: its
    ``graph_at(k)`` re-extracts ``fn`` at ``1/k`` of the batch (cached), so a policy may choose
    ``Plan.microbatches``.

    Raises (from ``graph_at``):
      MicrobatchError: ``k`` does not divide the batch, or ``fn`` has no batch to split.
    """

    cache = {1: graph}
    B = graph.meta.get("batch_size")

    def graph_at(k: int):
        k = int(k)
        if k not in cache:
            if not B or B % k:
                raise MicrobatchError(f"{k} micro-batches do not divide the batch size {B}")
            cache[k] = extract(fn, *microbatch_args(tuple(args), argnums, k), stages=stages,
                               argnums=argnums, has_aux=has_aux)
        return cache[k]

    return PolicyContext(time_limit=time_limit, graph_at=graph_at, batch_size=B,
                         batch_coupled=bool(graph.meta.get("batch_coupled", False)))


def execute_microbatched(
    fn: Callable,
    *args,
    policy: Any = None,
    budget: Any = None,
    microbatches: int = 1,
    argnums: int | Sequence[int] = 0,
    stages: Any = "auto",
    reduction: str = "mean",
):
    """Extract ``fn`` at micro-batch size, plan with ``policy`` (``None``: checkpoint-all), and
    run the plan op by op on each micro-batch (:func:`remat.microbatch.execute`).

    Returns:
      ``(value, grads, MicrobatchStats, graph, plan)``.
    """

    k = int(microbatches)
    margs = microbatch.microbatch_args(args, argnums, k) if k > 1 else args
    graph = extract(fn, *margs, stages=stages, argnums=argnums)
    pol = resolve_policy(policy, budget)
    if pol is None:

        plan = checkpoint_all_plan(graph)
    else:
        plan = make_plan(pol, graph, budget)
    plan = dataclasses.replace(plan, microbatches=k)
    v, g, st = microbatch.execute(graph, plan, *args, argnums=argnums, reduction=reduction)
    return v, g, st, graph, plan
