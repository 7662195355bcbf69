"""JaxPolicy: the ``jax.checkpoint_policies`` baselines, expressed as plans.

``jax.checkpoint(f, policy=P)`` saves the outputs of the equations ``P`` accepts and recomputes
everything else in the backward pass.  On a stage graph we approximate this per stage: a forward
stage is *retained* when it contains a saveable primitive (from ``graph.meta["node_primitives"]``,
a tuple of primitive names per node, provided by :func:`remat.extract`); the other forward
stages are recomputed from the retained ones when the backward pass first needs them and kept
until their last reader (JAX recomputes a remat region's forward once per backward pass), see
:func:`policies.from_checkpoints.plan_from_checkpoints`.

Approximations (documented, not hidden):

* a stage is saved whole when any of its equations is saveable (JAX would save just that
  equation's output, which may be smaller or larger than the stage's output);
* ``dots_saveable`` accepts ``dot_general`` and ``conv_general_dilated`` (as JAX 0.10 does);
* ``dots_with_no_batch_dims_saveable`` needs each ``dot_general``'s batch dimensions: when the
  graph has ``meta["node_dot_batch_dims"]`` (per node, True if a dot in the stage has batch
  dims) a stage qualifies only through a batch-free dot; otherwise every ``dot_general`` is
  assumed batch-free (true for MLPs and convnets, false for attention score/value products);
* graphs without ``node_primitives`` (published Checkmate graphs) fall back on node names:
  ``conv``/``dense``/``fc``/``linear``/``matmul``/``dot``/``predictions``/``logits`` stand for a
  dot (convolutions count only for ``dots_saveable``).
"""

from __future__ import annotations

import dataclasses
import re

from policies.base import BasePolicy, PolicyContext, register
from policies.from_checkpoints import plan_from_checkpoints
from remat.core.errors import InfeasibleBudgetError, UnknownNameError
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.schedule import replay

WHICH = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
         "everything_saveable")
_CONV = re.compile(r"conv", re.I)
_DOT = re.compile(r"dense|(^|[^a-z])fc|linear|matmul|dot|predictions|logits|proj", re.I)


def saveable_nodes(graph: Graph, which: str) -> frozenset[int]:
    """Forward nodes whose stage contains a primitive that policy ``which`` saves."""
    if which not in WHICH:
        raise UnknownNameError("jax checkpoint policy", which, list(WHICH))
    fwd = [v.index for v in graph.nodes if not v.is_backward]
    if which == "everything_saveable":
        return frozenset(fwd)
    if which == "nothing_saveable":
        return frozenset()
    prims = graph.meta.get("node_primitives")
    batch = graph.meta.get("node_dot_batch_dims")
    keep = set()
    for i in fwd:
        if prims is not None:
            ps = set(prims[i])
            dot, conv = "dot_general" in ps, "conv_general_dilated" in ps
        else:
            name = graph.nodes[i].name
            conv = bool(_CONV.search(name))
            dot = bool(_DOT.search(name)) and not conv
        if which == "dots_saveable":
            ok = dot or conv
        else:
            ok = dot and not (batch is not None and bool(batch[i]))
        if ok:
            keep.add(i)
    return frozenset(keep)


@register("jax_policy")
@dataclasses.dataclass(frozen=True)
class JaxPolicy(BasePolicy):
    """A ``jax.checkpoint_policies`` baseline as a plan.

    Args:
      which: ``"nothing_saveable"``, ``"dots_saveable"``,
        ``"dots_with_no_batch_dims_saveable"`` or ``"everything_saveable"``.
      budget: activation bytes or ``"60%"``; only checked against the plan's peak.
    """

    which: str = "dots_saveable"
    budget: int | str | None = None

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        keep = saveable_nodes(graph, self.which)
        plan = plan_from_checkpoints(graph, keep, keep_recomputed=True, which=self.which,
                                     status="heuristic")
        peak = replay(graph, plan).peak_bytes
        if budget_bytes is not None and peak > budget_bytes:
            raise InfeasibleBudgetError(budget_bytes, peak,
                                        f"jax.checkpoint_policies.{self.which} is fixed")
        return plan
