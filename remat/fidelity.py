"""Did the drop-in realise the plan?  Predicted against realised saved bytes, and the object that
reports it (:class:`Applied`).

The plan's prediction (:func:`predicted_residual_bytes`) counts, in the graph's model, the outputs
of stages computed once that a backward or a recomputed stage reads; the realised figure is
``saved_residuals`` of the transformed function (arguments excluded).  Every difference is a note;
those that cost memory the plan did not count are also a :class:`RematFidelityWarning`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from remat._jax_compat import saved_residuals
from remat.core.errors import InvalidPlanError, RematWarning, format_bytes
from remat.core.regions import loss_ancestors
from remat.core.scan_plan import aval_bytes
from remat.frontend import Lit
from remat.scans import scan_nodes
from remat.segments import Segment

__all__ = ["FIDELITY_RTOL", "RematFidelityWarning", "Applied", "predicted_residual_bytes",
           "realised_residual_bytes", "fidelity_notes", "scan_decisions"]

FIDELITY_RTOL = 0.10
"""Realised saved bytes above the prediction by more than this fraction raise a warning (below it
by more than this fraction: a note)."""

class RematFidelityWarning(RematWarning):
    """The drop-in could not realise the plan exactly (saved bytes differ from the plan's)."""


def scan_decisions(prog, plan) -> dict:
    """leaf -> ``(ScanDecision, ScanBody)`` for the plan's scan decisions."""
    decisions = getattr(plan, "scans", None) or plan.meta.get("scans") or ()
    bodies = {b.leaf: b for b in prog.scans}
    out = {}
    for d in decisions:
        if d.leaf not in bodies:
            raise InvalidPlanError(f"scan decision for forward equation {d.leaf}, which is not a "
                                   "scan the graph analysed")
        out[d.leaf] = (d, bodies[d.leaf])
    return out


def predicted_residual_bytes(graph, plan, segs: tuple[Segment, ...] | None = None) -> int:
    """Bytes the plan keeps from the forward pass for later use: outputs of forward nodes the
    plan computes once that a backward node or a recomputed forward node reads (the saved
    residuals of the rematerialized function, in the graph's model).  A scan with a decision
    keeps :meth:`remat.scans.ScanBody.cost` ``residual_bytes`` instead of JAX's stacked
    residuals.  A plan with checkpoint regions (``segs`` from them) keeps the inputs of its
    top-level regions and the values they save that a backward node reads."""

    prog = graph.program
    if segs is not None and plan.meta.get("regions"):
        return _region_residual_bytes(graph, segs)
    counts = plan.R.sum(axis=0)
    is_bwd = graph.is_backward_array
    later = is_bwd | (counts >= 2)
    keep = (~is_bwd) & (counts == 1)
    total = 0
    seen: set[int] = set()
    decided = scan_decisions(prog, plan)
    for dec, body in decided.values():
        f, bw, _ = scan_nodes(graph, body)
        seen.update(v for b in bw for v in prog.node_inputs[b] if prog.producer[v][0] == f)
        total += body.cost(dec.saved, dec.group)["residual_bytes"]
    for d in np.flatnonzero(later).tolist():
        for v in prog.node_inputs[d]:
            p = prog.producer[v][0]
            if keep[p] and v not in seen:
                seen.add(v)
                total += aval_bytes(prog.avals[v])
    return total


def _residual_only(graph) -> set[int]:
    """Forward nodes the loss does not depend on: residuals of the linearization, derived again
    in a region's backward from what it saves."""
    fwd = np.flatnonzero(~graph.is_backward_array)
    return {int(v) for v in fwd} - loss_ancestors(graph)


def _region_residual_bytes(graph, segs) -> int:
    prog = graph.program
    eqns = prog.forward.eqns
    made = {o: k for k, e in enumerate(eqns) for o in e.outs}
    is_bwd = graph.is_backward_array
    succs = graph.succs
    residual = _residual_only(graph)
    read_memo: dict[int, bool] = {}

    def read_by_backward(v: int) -> bool:  # directly, or through residuals derived from it
        if v not in read_memo:
            read_memo[v] = any(is_bwd[d] or (d in residual and read_by_backward(d))
                               for d in succs[v])
        return read_memo[v]

    kept: set[int] = set()
    for s in segs:
        if not s.remat:
            continue
        for e in eqns[s.start:s.stop]:
            kept.update(r for r in e.ins if not isinstance(r, Lit) and made.get(r, s.start) < s.start)
        for k in s.saves or ():
            if read_by_backward(int(prog.fwd_node[k])):
                kept.update(eqns[k].outs)
    return int(sum(aval_bytes(prog.avals[v]) for v in kept))


def realised_residual_bytes(fn, args) -> int:

    res = saved_residuals(fn, *args)
    return int(sum(aval_bytes(a) for a, d in res if "argument" not in d))


# --------------------------------------------------------------------------- the applied object
@dataclasses.dataclass(frozen=True, eq=False)
class Applied:
    """A plan applied to a function at one input signature.

    Attributes:
      graph: the extracted training graph (at micro-batch size when micro-batching).
      plan: the policy's plan (``None`` for ``policy=None``).
      saved: ``plan.saved_forward(graph)`` (forward nodes computed once).
      segments: the top-level checkpoint segments (see :func:`plan_segments`).
      fn: the rematerialized function, same signature and outputs as the original.
      plan_time_s: extraction + planning + set-up time, seconds.
      recompute_dots: dot/conv equations of checkpointed segments outside their kept stages
        (:func:`remat.measure` checks that compilation kept the recomputation).
      predicted_residual_bytes: bytes the plan keeps from the forward pass
        (:func:`predicted_residual_bytes`), per micro-batch; ``None`` without a plan.
      residual_bytes: bytes the transformed function really saves for its backward pass
        (``saved_residuals``, arguments excluded), per micro-batch; ``None`` without a plan.
      notes: what differs between the plan and its realisation (empty when exact).
      warnings: the notes that cost memory the plan did not count (also raised as a
        :class:`RematFidelityWarning`).
      predicted_flops: FLOPs of one step as the plan runs it (every node's FLOPs times how
        often the plan computes it), per micro-batch; compare with ``remat.measure``'s
        ``flops`` (XLA ``cost_analysis``).
      budget_semantics: what the budget capped: ``"compiled"`` (the compiled step's temp bytes,
        :mod:`remat.compiled_budget`), ``"modelled"`` (the graph's peak), ``"modelled-fallback"``
        (a compiled budget on a compiler that undoes ``jax.checkpoint``: applied to the model,
        with a warning) or ``"none"``.
      budget_bytes: the compiled budget, bytes (``None`` unless compiled).
      baseline_temp_bytes: the compiled no-remat step's temp bytes (compiled budgets only).
      compiled_temp_bytes: this plan's compiled step's temp bytes (per micro-batch).
      rounds: the closed loop's rounds (:class:`remat.compiled_budget.Round`), planned and
        compiled figures of each.
      abstract_args: the ``jax.ShapeDtypeStruct`` arguments ``fn`` was applied at (micro-batch
        sized when micro-batching).
      offloaded_bytes: bytes of the plan's paged values that ``fn`` offloads to host memory
        (:mod:`remat.offload`; ``residual_bytes`` counts them too), per micro-batch; 0 where the
        backend does not realise offloading (the page-outs then stay on the device, noted).
    """

    graph: Any
    plan: Any
    saved: frozenset
    segments: tuple[Segment, ...]
    fn: Callable
    plan_time_s: float
    recompute_dots: int = 0
    predicted_residual_bytes: int | None = None
    residual_bytes: int | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    predicted_flops: float | None = None
    budget_semantics: str = "none"
    budget_bytes: int | None = None
    baseline_temp_bytes: int | None = None
    compiled_temp_bytes: int | None = None
    rounds: tuple = ()
    abstract_args: tuple = ()
    offloaded_bytes: int = 0

    @property
    def exact(self) -> bool:
        """Nothing to note: the realised saved bytes are not below the prediction nor more than
        :data:`FIDELITY_RTOL` above it, and no part of the plan was approximated."""
        return not self.notes

    def report(self) -> str:
        """One paragraph: predicted vs realised saved bytes and the notes."""

        if self.plan is None:
            return "no plan: plain jax.value_and_grad"
        s = (f"{self.plan.meta.get('policy')}: predicted saved {format_bytes(self.predicted_residual_bytes)}"
             f", realised {format_bytes(self.residual_bytes)}")
        return s + ("" if not self.notes else "; " + "; ".join(self.notes))


def fidelity_notes(graph, plan, segs, predicted: int, realised: int) -> tuple[list[str], list[str]]:
    """``(notes, warnings)``: every difference between the plan and its realisation (saved bytes
    below the prediction included), and those that cost memory the plan did not count (realised
    saved bytes above the prediction by more than :data:`FIDELITY_RTOL`, kept skip values).
    Paging is noted by :func:`remat.offload.plan_offload`."""
    notes, warn = [], []
    counts = plan.R.sum(axis=0)
    prog = graph.program
    fwd = ~graph.is_backward_array
    seg_of = {}
    for j, s in enumerate(segs):
        for node in s.nodes:
            seg_of.setdefault(node, j)
    crossing = 0
    for d in ([] if plan.meta.get("regions") else np.flatnonzero(fwd).tolist()):
        for v in prog.node_inputs[d]:
            p = prog.producer[v][0]
            if fwd[p] and counts[p] >= 2 and seg_of.get(d, -1) > seg_of.get(p, 1 << 30) \
                    and p != d - 1:
                crossing += 1
    if crossing:
        notes.append(f"{crossing} value(s) of recomputed stages read across a checkpoint "
                     "boundary are kept (jax.checkpoint saves segment inputs)")
    if predicted or realised:
        rel = (realised - predicted) / max(predicted, 1)
        if rel > FIDELITY_RTOL:
            msg = (f"realised saved bytes {realised} exceed the plan's {predicted} by "
                   f"{100 * rel:.0f}%")
            notes.append(msg)
            warn.append(msg)
        elif realised < predicted:  # less memory than planned: a note, never a warning
            notes.append(f"realised saved bytes {realised} are {100 * -rel:.0f}% below the plan's "
                         f"{predicted} (XLA recomputes some values the plan keeps, e.g. cheap "
                         "elementwise tails of kept stages)")
    return notes, warn
