"""Shared helpers: per-step compute lists -> legal R/S plans, and retained sets -> plans.

Two building blocks used by the classic policies (RecomputeAll, JaxPolicy, SqrtN, Griewank,
ChainDP):

* :func:`plan_from_steps` turns a list of steps (the nodes each step computes) into a
  Checkmate ``R``/``S`` pair with the *tightest* retention the schedule allows (liveness): an
  output computed in step ``t`` is carried into steps ``t+1 .. u`` exactly when some step in
  that range reads it and it is not recomputed in between.  Anything else is freed right after
  its last reader (the replay in :mod:`remat.core.schedule` does the in-step freeing).
* :func:`plan_from_checkpoints` turns a set of *retained* forward nodes into a schedule: the
  forward pass runs once, node by node; before each backward node every forward input that is
  neither retained nor (with ``keep_recomputed``) already recomputed is rebuilt from its nearest
  available ancestors in the same step (Checkmate's ``solve_r_opt`` given fixed checkpoints).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from remat.core.errors import InvalidPlanError
from remat.core.graph import Graph
from remat.core.plan import Plan


def plan_from_steps(
    graph: Graph, steps: Sequence[Iterable[int]], *, policy: str = "custom", **meta: Any
) -> Plan:
    """Build a plan from per-step compute lists with liveness-based retention.

    Args:
      graph: the training graph (``n`` nodes).
      steps: ``steps[t]`` is the set of node indices run in step ``t`` (in index order).
      policy: name stored in ``meta["policy"]``.
      **meta: extra metadata (``budget``, ``status``, ``solve_time_s``, ...).

    Returns:
      A :class:`~remat.core.plan.Plan` with ``R`` (``bool[T, n]``) from ``steps`` and ``S`` minimal:
      ``S[u, i]`` iff ``i`` is read in some step ``t >= u`` without being recomputed in
      ``u .. t``, and ``i`` was computed before ``u``.

    Raises:
      InvalidPlanError: a step reads an output that was never computed before it.
    """
    T, n = len(steps), graph.n
    R = np.zeros((T, n), dtype=bool)
    cols = [np.fromiter(nodes, dtype=np.int64) for nodes in steps]
    if T:
        R[np.repeat(np.arange(T), [len(c) for c in cols]), np.concatenate(cols)] = True
    A = graph.adjacency().astype(np.int32)  # A[src, dst]
    # reads[t, i]: some node computed in step t reads i
    reads = np.asarray((A @ R.T.astype(np.int32)).T > 0)
    need = reads & ~R  # must be resident at the start of step t
    S = np.zeros((T, n), dtype=bool)
    carry = np.zeros(n, dtype=bool)
    for u in range(T - 1, -1, -1):
        carry = need[u] | (carry & ~R[u]) if u + 1 < T else need[u]
        S[u] = carry
        # what is needed at the start of step u must come from before u: propagate, unless
        # computed in step u - 1 (handled by the next iteration's ``& ~R[u-1]``)
    computed_before = np.zeros((T, n), dtype=bool)
    if T > 1:
        computed_before[1:] = np.logical_or.accumulate(R[:-1], axis=0)
    bad = S & ~computed_before
    if bad.any():
        t, i = map(int, np.argwhere(bad)[0])
        raise InvalidPlanError("step reads an output that was never computed", step=t,
                               node=graph.nodes[i].name)
    return Plan(R=R, S=S, meta={"policy": policy, **meta})


def forward_ancestry(graph: Graph, targets: Iterable[int], available: set[int] | frozenset[int]) -> list[int]:
    """Nodes to recompute so that every node in ``targets`` is resident.

    Walks predecessors from ``targets`` and stops at ``available`` nodes; returns the nodes that
    must run, in index (topological) order.  Backward nodes are never recomputed here: they are
    treated as available (they run once and are carried until their last reader).
    """
    return sorted(graph.ancestors_outside(targets, available, through_backward=False))


def checkpoint_steps(
    graph: Graph, retained: Iterable[int], *, keep_recomputed: bool = True
) -> list[list[int]]:
    """Per-step compute lists for "retain these forward nodes, recompute the rest on demand".

    Args:
      graph: the training graph.
      retained: forward node indices whose outputs are kept from the forward pass until their
        last backward reader.
      keep_recomputed: True: a value recomputed for one backward node stays resident until its
        last reader (Chen et al.'s segment recomputation, JAX ``jax.checkpoint`` with a saveable
        policy).  False: every backward node rebuilds its own forward inputs from the retained
        set and they are dropped after it (Checkmate's recompute-on-demand, minimal memory).

    Returns:
      ``steps``: one step per forward node (the forward pass, index order), then one step per
      backward node holding the recomputed ancestry followed by the node itself.
    """
    keep = set(int(i) for i in retained)
    bwd = graph.is_backward_array
    recomputed: set[int] = set()
    steps: list[list[int]] = []
    for v in range(graph.n):
        if not bwd[v]:
            steps.append([v])
            continue
        fwd_in = [u for u in graph.preds[v] if not bwd[u]]
        avail = keep | recomputed if keep_recomputed else keep
        rec = forward_ancestry(graph, fwd_in, avail)
        if keep_recomputed:
            recomputed.update(rec)
        steps.append(rec + [v])
    return steps


def plan_from_checkpoints(
    graph: Graph,
    retained: Iterable[int],
    *,
    keep_recomputed: bool = True,
    policy: str = "from_checkpoints",
    **meta: Any,
) -> Plan:
    """A legal plan that keeps the ``retained`` forward outputs and recomputes the others.

    See :func:`checkpoint_steps` for the schedule and :func:`plan_from_steps` for retention.
    ``meta["retained"]`` records the sorted retained set.
    """
    retained = sorted(set(int(i) for i in retained))
    steps = checkpoint_steps(graph, retained, keep_recomputed=keep_recomputed)
    return plan_from_steps(graph, steps, policy=policy, retained=tuple(retained), **meta)
