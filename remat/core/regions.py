"""Checkpoint regions: how a plan over an equation-granularity graph asks to be applied.

A plan states *what* each step computes (``Plan.R``).  A policy that planned nested
checkpoints with chosen saved values (:class:`policies.Hierarchical`) can also say *how* the
drop-in realises it, as a tree of regions over forward node ids: region ``[start, stop)`` runs
under one ``jax.checkpoint`` whose policy saves exactly the outputs of ``saves`` (tagged with
``checkpoint_name``) and recomputes the rest of the region in its backward; ``children`` are
regions nested inside it, re-run with their own policies when the outer region is recomputed
(rotor's recursive checkpointing).  Plans carry them as ``plan.meta["regions"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from remat.core.errors import InvalidGraphError, InvalidPlanError
from remat.core.graph import Graph

__all__ = ["CheckpointRegion", "check_regions", "loss_ancestors", "region_saved_graph"]


@dataclasses.dataclass(frozen=True)
class CheckpointRegion:
    """Forward nodes ``[start, stop)`` under one ``jax.checkpoint``.

    Attributes:
      start, stop: forward node ids (forward nodes are ``0 .. n_fwd - 1`` in program order).
      saves: node ids in ``[start, stop)`` whose outputs the checkpoint saves; every other
        value of the region is recomputed in its backward from its inputs and these.
      children: disjoint, ordered regions inside ``[start, stop)``.
    """

    start: int
    stop: int
    saves: tuple[int, ...] = ()
    children: tuple[CheckpointRegion, ...] = ()


def check_regions(regions: Sequence[CheckpointRegion], n_fwd: int, lo: int = 0,
                  hi: int | None = None) -> None:
    """Raise :class:`InvalidPlanError` unless ``regions`` are ordered, disjoint, inside
    ``[lo, hi)`` (``hi`` defaults to ``n_fwd``), save only their own nodes and nest properly."""
    hi = n_fwd if hi is None else hi
    prev = lo
    for r in regions:
        if not (prev <= r.start < r.stop <= hi):
            raise InvalidPlanError(f"checkpoint region [{r.start}, {r.stop}) is not ordered, "
                                   f"disjoint and inside [{lo}, {hi})")
        bad = [s for s in r.saves if not r.start <= s < r.stop]
        if bad:
            raise InvalidPlanError(f"checkpoint region [{r.start}, {r.stop}) saves nodes "
                                   f"outside it: {bad[:5]}")
        check_regions(r.children, n_fwd, r.start, r.stop)
        prev = r.stop


def loss_ancestors(graph) -> set[int]:
    """The forward nodes the loss depends on, the loss (the last forward node) included; the
    other forward nodes are residuals of the linearization, read only by the backward."""
    bwd = graph.is_backward_array
    fwd = np.flatnonzero(~bwd)
    live: set[int] = set()
    todo = [int(fwd[-1])] if len(fwd) else []
    while todo:
        v = todo.pop()
        if v not in live:
            live.add(v)
            todo.extend(p for p in graph.preds[v] if not bwd[p])
    return live


def region_saved_graph(graph):
    """``graph`` with each forward node the loss does not depend on sized as what a checkpoint
    region saves to keep it (at least its own bytes).

    Such a node is a residual of the original linearization (a ReLU's ``bool`` mask, ``2 * z``
    of a square); replayed under ``jax.checkpoint`` JAX derives it again from its forward
    predecessors, so a region keeps it by saving those, up to values the loss depends on
    (``remat.interpreter.replay_saves``): a mask kept costs its ``float32`` operand's bytes.
    The loss is the last forward node (extracted graphs).  Graphs without a program (no
    regions are applied to them) are returned unchanged.

    Raises:
      InvalidGraphError: ``graph`` is not a :class:`~remat.core.graph.Graph`.
    """
    if not isinstance(graph, Graph):
        raise InvalidGraphError(f"region_saved_graph needs a Graph, got {type(graph).__name__}")
    if graph.program is None:
        return graph
    bwd = graph.is_backward_array
    fwd = np.flatnonzero(~bwd)
    if not len(fwd):
        return graph
    preds, sizes = graph.preds, graph.sizes
    live = loss_ancestors(graph)
    swap: dict[int, frozenset] = {}
    nodes = list(graph.nodes)
    for v in (int(u) for u in fwd):  # topological: a node's preds are swapped first
        if v in live:
            continue
        swap[v] = frozenset().union(*([frozenset((p,)) if p in live else swap[p]
                                       for p in preds[v] if not bwd[p]] or [frozenset()]))
        b = int(sum(int(sizes[p]) for p in swap[v]))
        if b > nodes[v].out_bytes:
            nodes[v] = dataclasses.replace(nodes[v], out_bytes=b)
    return dataclasses.replace(graph, nodes=tuple(nodes))
