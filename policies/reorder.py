"""Plan in another topological order: relabel a graph by an order, map the plan back.

Checkmate's MILP (and every frontier-form heuristic) plans in the graph's own index order: step
``t`` ends with node ``t``'s first computation and a step's nodes run in index order.  That order
is a choice of the program (or of whoever numbered a published graph), and it decides how much
memory any schedule needs: on the random layered DAGs of the Checkmate/Moccasin benchmark the
peak-minimising order of OLLA's order phase (:func:`solvers.olla.solve_order`, Steiner et al.
eq. 14, 15-60 s) needs 17-23 % less memory than the given order without any recomputation at
n = 100 and 250 (2-8 % at n = 500 and 1000): the "reorder + LNS" column of
``experiments/results/published_benchmark.md``.

:func:`relabel` gives the graph whose index order is ``order``; a policy plans that graph and
:func:`plan_in_program_order` turns its plan back into a plan of the original graph with the
same sequence of computations: each step becomes one step per maximal run of increasing original
index (a step of the original graph runs its nodes in index order), and the retention ``S`` is
rebuilt by liveness (:func:`policies.from_checkpoints.plan_from_steps`), which holds no value the
relabelled plan did not hold at the same point.  The replayed peak is therefore at most the
relabelled plan's; :meth:`policies.base.BasePolicy.plan` checks it by replay anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from policies.from_checkpoints import plan_from_steps
from remat.core.errors import InvalidGraphError, InvalidPlanError
from remat.core.graph import Graph
from remat.core.plan import Plan

__all__ = ["relabel", "plan_in_program_order", "check_order"]


def check_order(graph: Graph, order: Sequence[int]) -> np.ndarray:
    """``int64[n]`` ``order`` after checking that it is a topological order of ``graph``.

    Raises:
      InvalidGraphError: not a permutation of ``0..n-1``, or an edge runs against it.
    """
    order = np.asarray(order, dtype=np.int64).reshape(-1)
    n = graph.n
    if len(order) != n or not np.array_equal(np.sort(order), np.arange(n)):
        raise InvalidGraphError(f"order is not a permutation of the {n} nodes")
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    e = graph.edge_array
    if len(e):
        bad = np.flatnonzero(pos[e[:, 0]] >= pos[e[:, 1]])
        if len(bad):
            s, d = map(int, e[bad[0]])
            raise InvalidGraphError(f"order runs {graph.nodes[d].name} before its input "
                                    f"{graph.nodes[s].name}", node=graph.nodes[d].name)
    return order


def relabel(graph: Graph, order: Sequence[int]) -> Graph:
    """The graph whose node ``k`` is ``graph``'s node ``order[k]`` (edges, sizes, costs kept).

    Args:
      graph: a training graph (``n`` nodes).
      order: ``int[n]``, a topological order of ``graph`` (see :func:`check_order`).

    Returns:
      A :class:`~remat.core.graph.Graph` without ``program`` (it is for planning only: plans are
      mapped back with :func:`plan_in_program_order` before they are applied); ``meta`` gains
      ``"relabelled_from"`` (the original name).
    """
    order = check_order(graph, order)
    pos = np.empty(graph.n, dtype=np.int64)
    pos[order] = np.arange(graph.n)
    nodes = tuple(
        dataclasses.replace(
            graph.nodes[int(o)], index=k,
            forward_index=(None if graph.nodes[int(o)].forward_index is None
                           else int(pos[graph.nodes[int(o)].forward_index])))
        for k, o in enumerate(order))
    e = graph.edge_array
    edges = tuple(sorted((int(pos[s]), int(pos[d])) for s, d in e))
    return Graph(nodes=nodes, edges=edges, param_bytes=graph.param_bytes,
                 input_bytes=graph.input_bytes, name=graph.name,
                 meta={**dict(graph.meta), "relabelled_from": graph.name})


def plan_in_program_order(graph: Graph, plan: Plan, order: Sequence[int], /, **meta: Any) -> Plan:
    """``plan`` (of ``relabel(graph, order)``) as a plan of ``graph`` with the same computations.

    Args:
      graph: the original graph.
      plan: a plan of the relabelled graph (``bool[T, n]``), without paging.
      order: the order the graph was relabelled with.
      **meta: merged over ``plan.meta``.

    Returns:
      A plan of ``graph`` with ``T' >= T`` steps (a step whose nodes are not in increasing
      original index is split into runs that are) and liveness-minimal ``S``.

    Raises:
      InvalidPlanError: ``plan`` pages (POET plans keep their order) or has the wrong width.
    """
    order = check_order(graph, order)
    if plan.paging:
        raise InvalidPlanError("a paging plan cannot be mapped to another order")
    if plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph {graph.n} nodes")
    steps: list[list[int]] = []
    for row in plan.R:
        old = order[np.flatnonzero(row)]
        if not len(old):
            continue
        cut = np.flatnonzero(np.diff(old) <= 0) + 1
        steps.extend(run.tolist() for run in np.split(old, cut))
    out = plan_from_steps(graph, steps, policy=str(plan.meta.get("policy", "custom")))
    return Plan(R=out.R, S=out.S, microbatches=plan.microbatches,
                meta={**dict(plan.meta), **meta})
