"""A scan plan as data: which anchors each iteration of a ``lax.scan`` keeps, how iterations
nest, and what that costs (:class:`ScanBody`, :class:`ScanDecision`); the graph a decision gives
(:func:`adjusted_graph`). The analysis that builds a :class:`ScanBody` from a jaxpr and the two
ways of applying a decision are JAX-side (:mod:`remat.scans`); this module imports no JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from remat.core.errors import InvalidPlanError

__all__ = ["ScanDecision", "ScanBody", "TAG_PREFIX", "tag_name", "scan_nodes", "adjusted_graph",
           "anchor_key", "policy_key", "default_groups", "aval_bytes"]


def aval_bytes(aval) -> int:
    """Bytes of an abstract value (``prod(shape) * itemsize``; PRNG keys by their key data)."""
    shape = getattr(aval, "shape", ())
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        return 0
    try:
        item = int(dtype.itemsize)
    except Exception:  # pragma: no cover - exotic extended dtypes
        item = 8
    return int(math.prod(shape)) * item


TAG_PREFIX = "remat.scan"


def tag_name(scan: int, leaf: int) -> str:
    """The ``checkpoint_name`` of body equation ``leaf``'s results in scan ``scan``."""
    return f"{TAG_PREFIX}{scan}.{leaf}"


@dataclasses.dataclass(frozen=True)
class ScanDecision:
    """What one scan keeps.

    Attributes:
      leaf: the scan equation's index in the forward program.
      saved: body equations (anchors) whose results each iteration keeps.
      group: iterations per group of the nested scan (divides the length; 1 = flat).
    """

    leaf: int
    saved: frozenset[int] = frozenset()
    group: int = 1


@dataclasses.dataclass(frozen=True, eq=False)
class ScanBody:
    """One scan of the forward program, analysed (see the module docstring).

    Attributes:
      leaf: index of the scan equation in the forward program.
      length: iterations ``L``.
      body: the body's forward program (``(consts, carry, xs) -> (carry, ys)``).
      num_consts, num_carry: how the body's inputs split.
      carry_bytes: bytes of the carry (one iteration).
      input_is_activation: ``bool[n_in]``: the body input is computed from the batch (its value
        kept per iteration costs memory); consts and stacked parameters are not.
      flops: ``float64[E]`` FLOPs of each body equation (one iteration, forward).
      out_bytes: ``int64[E]`` result bytes of each body equation (one iteration).
      anchors: body equations whose results may be kept (expensive, floating results).
      needs: body equations whose results the backward pass reads (through cheap
        recomputation: the producers of what it reads).
      needs_inputs: body inputs the backward pass reads.
      feeds: per body equation, the body equations and inputs its operands come from
        (``(eqns, inputs)``).
      fwd_flops, bwd_flops: one iteration's forward and backward FLOPs (no recomputation).
      names: per body equation, its scope key (for readable names).
      xs_param_bytes: bytes of one iteration's slice of the stacked inputs that are not
        activations (a layer's parameters).
      save_at: per anchor (same order as ``anchors``), the body equation whose result is kept
        when the anchor is saved: the anchor itself, or the end of its bias tail (an ``add``
        or ``sub`` of a value computed from parameters only, the anchor's sole reader, same
        shape), so a kept ``x @ w + b`` is not re-added in the backward pass: what
        MaxText-style ``checkpoint_name`` tags (after the bias) keep, at the same bytes.
      policy_at: the same for a plain JAX policy (:func:`body_policy`), which recognises an
        equation by primitive, operand avals and parameters only (:func:`anchor_key`): the
        anchor itself where the tail looks like another body equation (a LayerNorm's bias
        add): same bytes kept, the bias add recomputed.
    """

    leaf: int
    length: int
    body: Any
    num_consts: int
    num_carry: int
    carry_bytes: int
    input_is_activation: np.ndarray
    flops: np.ndarray
    out_bytes: np.ndarray
    anchors: tuple[int, ...]
    needs: frozenset[int]
    needs_inputs: frozenset[int]
    feeds: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    fwd_flops: float
    bwd_flops: float
    names: tuple[str, ...] = ()
    xs_param_bytes: int = 0
    save_at: tuple[int, ...] = ()
    policy_at: tuple[int, ...] = ()

    def save_point(self, j: int) -> int:
        """The body equation whose result is kept when anchor ``j`` is saved."""
        if self.save_at:
            return self.save_at[self.anchors.index(j)]
        return j

    def policy_point(self, j: int) -> int:
        """The body equation a plain JAX policy keeps for anchor ``j`` (same bytes)."""
        if self.policy_at:
            return self.policy_at[self.anchors.index(j)]
        return j

    def groups(self) -> list[int]:
        """Valid group sizes: the divisors of the length."""
        return [g for g in range(1, self.length + 1) if self.length % g == 0]

    def cost(self, saved: Sequence[int] | frozenset[int], group: int = 1) -> dict:
        """Bytes and FLOPs of a decision (one scan, whole step).

        Returns a dict: ``iter_bytes`` (kept per iteration: saved anchors reached plus the
        activation inputs, i.e. the carry), ``residual_bytes`` (kept from the forward pass to
        the backward pass: ``L * iter_bytes`` flat, ``L / group * carry_bytes`` nested),
        ``transient_bytes`` (during a group's backward pass: its inner residuals, and, measured on
        XLA, a copy of the group's parameter slices and of their gradients when ``1 < group <
        L``; 0 flat),
        ``recompute_flops`` (FLOPs recomputed per step, nested re-runs included) and
        ``flops`` (forward + backward + recomputation, whole scan).
        """
        S = set(saved)
        bad = S - set(self.anchors)
        if bad:
            raise InvalidPlanError(f"scan {self.leaf}: saved equations {sorted(bad)} are not "
                                   f"anchors {list(self.anchors)}")
        if group < 1 or self.length % group:
            raise InvalidPlanError(f"scan {self.leaf}: group {group} does not divide the length "
                                   f"{self.length}")
        S = {self.save_point(j) for j in S}
        kept: set[int] = set()
        recompute: set[int] = set()
        inputs: set[int] = set(self.needs_inputs)
        stack = list(self.needs)
        while stack:
            j = stack.pop()
            if j in kept or j in recompute:
                continue
            if j in S:
                kept.add(j)
                continue
            recompute.add(j)
            eqs, ins = self.feeds[j]
            stack.extend(eqs)
            inputs.update(ins)
        act_in = int(sum(aval_bytes(self.body.avals[self.body.arg_ids[i]])
                         for i in inputs if self.input_is_activation[i]))
        iter_bytes = int(self.out_bytes[sorted(kept)].sum()) + act_in if kept or act_in else 0
        rec = float(self.flops[sorted(recompute)].sum()) * self.length
        L = self.length
        if group == 1:
            residual, transient = L * iter_bytes, 0
        else:
            residual = (L // group) * self.carry_bytes
            transient = group * iter_bytes
            if group < L:  # XLA copies the group's parameter slices and their gradients
                transient += 2 * group * self.xs_param_bytes
            rec += float(self.fwd_flops) * L  # every group re-runs its forward once
        return dict(iter_bytes=iter_bytes, residual_bytes=int(residual),
                    transient_bytes=int(transient), recompute_flops=rec,
                    flops=L * (self.fwd_flops + self.bwd_flops) + rec,
                    kept=frozenset(kept), recomputed=frozenset(recompute))

    def anchor_name(self, j: int) -> str:
        """Readable name of anchor ``j``: scope and primitive."""
        e = self.body.eqns[j]
        k = self.save_point(j) if j in self.anchors else j
        tail = f"+{self.body.eqns[k].name}#{k}" if k != j else ""
        return f"{self.names[j] + ':' if self.names and self.names[j] else ''}{e.name}#{j}{tail}"


def scan_nodes(graph, body: ScanBody) -> tuple[int, list[int], int]:
    """``(forward node, backward nodes, residual bytes)`` of ``body``'s scan in an extracted
    graph: the scan's own forward stage, the backward stages differentiating it (at equation
    granularity, the backward scans reading its outputs), and the bytes of the forward stage's
    outputs that those read (JAX's stacked residuals)."""
    prog = graph.program
    f = int(prog.fwd_node[body.leaf])
    bw = [v.index for v in graph.nodes if v.is_backward and v.forward_index == f]
    outs = set(prog.node_outputs[f])
    prims = graph.meta.get("node_primitives")
    if not bw and prims is not None:  # one node per equation: the transposed scans reading f
        bw = [v.index for v in graph.nodes if v.is_backward and "scan" in prims[v.index]
              and outs & set(prog.node_inputs[v.index])]
    read = {v for b in bw for v in prog.node_inputs[b]} & outs
    nbytes = int(sum(aval_bytes(prog.avals[v]) for v in read))
    return f, bw, nbytes


def adjusted_graph(graph, decisions: Sequence[ScanDecision]):
    """``graph`` with each decided scan's stages resized to the decision: the forward stage
    keeps :meth:`ScanBody.cost` ``residual_bytes`` instead of JAX's stacked residuals, its first
    backward stage also holds a nested group's inner residuals (``transient_bytes``), and FLOPs
    include the recomputation.  Times and energies scale with FLOPs.  The checkpoint-all peak
    of the result (:meth:`Graph.no_remat_peak`) is the plan's predicted peak."""
    bodies = {b.leaf: b for b in graph.program.scans}
    nodes = list(graph.nodes)
    for d in decisions:
        body = bodies.get(d.leaf)
        if body is None:
            raise InvalidPlanError(f"no analysed scan at forward equation {d.leaf}")
        f, bw, res = scan_nodes(graph, body)
        c = body.cost(d.saved, d.group)
        v = nodes[f]
        nodes[f] = dataclasses.replace(v, out_bytes=int(v.out_bytes - res + c["residual_bytes"]))
        if bw:
            b0 = nodes[bw[0]]
            old = sum(nodes[b].flops for b in bw) + v.flops
            scale = c["flops"] / old if old > 0 else 1.0
            nodes[bw[0]] = dataclasses.replace(
                b0, out_bytes=int(b0.out_bytes + c["transient_bytes"]),
                flops=b0.flops + (c["flops"] - old),
                time_s=b0.time_s * scale if b0.time_s else b0.time_s,
                energy_j=b0.energy_j * scale if b0.energy_j else b0.energy_j)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def policy_key(name, avals, params) -> tuple:
    """What a ``jax.checkpoint`` policy sees of an equation: primitive name, operand shapes and
    dtypes, the parameters that tell contractions and convolutions apart."""
    shapes = tuple((tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for a in avals)
    simple = tuple(sorted((k, repr(v)) for k, v in params.items()
                          if k in ("dimension_numbers", "window_strides", "padding",
                                   "feature_group_count", "batch_group_count")))
    return (name, shapes, simple)


def anchor_key(body: Any, j: int) -> tuple:
    """What a JAX policy sees of body equation ``j``: primitive, operand avals, parameters."""
    e = body.eqns[j]
    avals = [body.avals[r] if isinstance(r, int) else np.asarray(r.val) for r in e.ins]
    return policy_key(e.name, avals, e.params)


def default_groups(length: int) -> int:
    """``round(sqrt(L))`` rounded to a divisor of ``L`` (the classic sqrt(n) nesting)."""
    divs = [g for g in range(1, length + 1) if length % g == 0]
    return min(divs, key=lambda g: abs(g - math.sqrt(length)))
