"""Graph-level passes of Sage (Gim and Ko, MobiSys 2022, §3.2, Fig. 6): operator fusion and
subgraph reduction, on the training graph :func:`remat.extract` produces.

Operator classes (§3.2.1, by JAX primitive name, :func:`op_class`):

* **symmetrical**: element-wise ops (arithmetic, activations, comparisons, casts) and the
  layout ops Sage folds into the consuming kernel by index translation (§3.3: ``reshape``,
  ``broadcast_in_dim``, ``transpose``, ``squeeze``, ``expand_dims``);
* **opaque**: ``sort``, ``argmax``/``argmin``, cumulative ops and control flow (``scan``,
  ``while``, ``cond``, custom calls): never fused;
* **asymmetrical**: everything else (``dot_general``, ``conv_general_dilated``, reductions,
  gathers, pads, slices, pooling windows).

**Fusion** comes in two forms.  :func:`fusion_labels` cuts a sequence of equations into
contiguous groups of the form ``symmetrical* [asymmetrical] symmetrical*``: a symmetrical op
joins the current group, an asymmetrical op joins it only when the group holds no asymmetrical
op yet (matmul/conv fuse with neighbouring element-wise ops, never with each other), an opaque op
is a group of its own.  (a) ``remat.extract(fn, ..., stages="sage")`` uses it to group the
forward program into stages (executable: every policy, the executor and ``value_and_grad`` run
it; backward nodes are the extractor's mirrors of the forward groups).  (b) :func:`fuse` applies
the rule to the unified per-equation graph (``stages="eqn"``, forward and backward alike) with
the neighbour condition (a node joins the previous group only if it reads from it) and the
residency rule (a node with several consumers ends its group), and sets the
``out_bytes`` of values read only inside their group to 0: they never reach memory.  Sage's
residency rule (outputs with several dependents, gradients, are materialised) holds by
construction.  (b) is a memory/FLOP model (no ``program``): a node keeps its exact lifetime,
whereas a stage of (a) holds all its inputs and outputs at once, which can cost more than the
intermediates fusion saves.

**Subgraph reduction** (§3.2.2, :func:`reducible_groups`, :func:`reduce_subgraphs`): a fused
group read by two or more other groups is recomputed inline in each consumer instead of being
materialised iff it is symmetrical, it has fewer than ``K_w`` inputs (variadic fused ops) and it
fuses fewer than ``K_h`` ops (monadic fused ops); ``K_w = K_h = 5`` as in the paper.  Modelled on
:func:`fuse`'s graph: the group's values are not stored, its consumers read its inputs, and each
consumer group pays its FLOPs.

Operator classes of an extracted graph's equations come with its program
(``graph.program.eqn_classes``, classified on the JAX side by :func:`remat.stages.eqn_class`);
this module imports no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from remat.core.errors import InvalidGraphError, NotApplicableError
from remat.core.graph import Graph

__all__ = ["SYMMETRICAL", "OPAQUE", "K_W", "K_H", "op_class", "fusion_labels", "NodeInfo",
           "node_info", "fuse", "reducible_groups", "reduce_subgraphs"]

#: Sage's thresholds (§3.2.2): inputs of a variadic fused op, fused-op count of a monadic one.
K_W = 5
K_H = 5

SYMMETRICAL = frozenset({
    # arithmetic and element-wise math
    "add", "add_any", "sub", "mul", "div", "rem", "neg", "max", "min", "abs", "sign", "pow",
    "integer_pow", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "atan2", "erf", "erfc", "erf_inv", "floor", "ceil",
    "round", "square", "reciprocal", "clamp", "select_n", "nextafter", "is_finite",
    "one_minus_square", "polynomial",
    "not", "and", "or", "xor", "eq", "ne", "lt", "le", "gt", "ge", "copy", "copy_p",
    "stop_gradient", "convert_element_type", "real", "imag", "conj", "name",
    # layout changes done by index translation in the consuming kernel (§3.3)
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims",
})
OPAQUE = frozenset({
    "sort", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp",
    "top_k", "scan", "while", "cond", "pure_callback", "io_callback", "random_bits", "random_seed",
    "random_wrap", "random_unwrap", "threefry2x32",
})


def op_class(name: str) -> str:
    """Sage's class of a primitive: ``"symmetrical"``, ``"asymmetrical"`` or ``"opaque"``."""
    if name in SYMMETRICAL:
        return "symmetrical"
    if name in OPAQUE:
        return "opaque"
    return "asymmetrical"


def fusion_labels(names: Sequence[str]) -> np.ndarray:
    """Contiguous fusion groups of a sequence of primitives in program order.

    Args:
      names: Sage class (or primitive name) of each leaf equation (``E`` of them).

    Returns:
      ``int64[E]`` non-decreasing group labels from 0: groups are
      ``symmetrical* [asymmetrical] symmetrical*``, opaque ops alone (module docstring).
    """
    labels = np.zeros(len(names), dtype=np.int64)
    g, has_asym, opaque = -1, False, False
    for j, nm in enumerate(names):
        k = nm if nm in ("symmetrical", "asymmetrical", "opaque") else op_class(nm)
        new = g < 0 or opaque or k == "opaque" or (k == "asymmetrical" and has_asym)
        if new:
            g += 1
            has_asym = False
        opaque = k == "opaque"
        has_asym = has_asym or k == "asymmetrical"
        labels[j] = g
    return labels


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """Per node of an extracted graph, what subgraph reduction reads.

    Attributes:
      kind: ``str[n]``: ``"symmetrical"`` (every equation of the node is), ``"opaque"`` (some
        equation is), else ``"asymmetrical"``.
      n_ops: ``int64[n]`` equations fused in the node (the paper's fusion count).
      n_inputs: ``int64[n]`` tensor inputs of the node (values of other nodes and arguments).
    """

    kind: tuple[str, ...]
    n_ops: np.ndarray
    n_inputs: np.ndarray


def node_info(graph: Graph) -> NodeInfo:
    """:class:`NodeInfo` of an extracted graph (it needs ``graph.program``); a graph made by
    :func:`fuse` carries its own in ``graph.meta["node_info"]``.

    Raises:
      NotApplicableError: a graph without a program (loaded from JSON): op classes unknown.
    """
    if "node_info" in graph.meta:
        return graph.meta["node_info"]
    prog = graph.program
    if prog is None:
        raise NotApplicableError("Sage's graph passes need an extracted graph (op classes)")
    kinds, n_ops, n_in = [], [], []
    for i in range(graph.n):
        cls = {prog.eqn_classes[j] for j in prog.node_eqns[i]}
        kinds.append("opaque" if "opaque" in cls else
                     "asymmetrical" if "asymmetrical" in cls else "symmetrical")
        n_ops.append(len(prog.node_eqns[i]))
        n_in.append(len(prog.node_inputs[i]) + len(prog.node_args[i]))
    return NodeInfo(tuple(kinds), np.asarray(n_ops, np.int64), np.asarray(n_in, np.int64))


def _groups(labels: np.ndarray) -> list[np.ndarray]:
    return [np.flatnonzero(labels == g) for g in range(int(labels.max()) + 1 if len(labels) else 0)]


def fuse(graph: Graph) -> Graph:
    """Sage's operator fusion on a per-equation graph (``remat.extract(..., stages="eqn")``,
    forward and backward alike: Sage fuses the unified graph).

    In node order, node ``i`` joins the group of node ``i - 1`` when it reads a value of that
    group (a neighbour), node ``i - 1`` has at most one consumer (Sage's residency rule: an
    output with several dependents is placed last in its fused operator) and
    :func:`fusion_labels`'s class rule allows it; otherwise it starts a group.  Nodes are kept (each value keeps its exact lifetime); a value read only inside its
    group never reaches memory, so its ``out_bytes`` become 0.  A memory/FLOP model: the result
    has no ``program``.

    Returns:
      The fused :class:`Graph` (FLOPs unchanged); ``meta["fusion_labels"]`` is the group of each
      node and ``meta["node_info"]`` a :class:`NodeInfo` per *group*.
    """
    info = node_info(graph)
    labels = np.zeros(graph.n, dtype=np.int64)
    g, has_asym, opaque = -1, False, False
    preds, succs = graph.preds, graph.succs
    for i in range(graph.n):
        k = info.kind[i]
        reads = g >= 0 and any(labels[p] == g for p in preds[i])
        resident = i > 0 and len(succs[i - 1]) >= 2  # residency rule: it ends its group
        new = (g < 0 or not reads or resident or opaque or k == "opaque"
               or (k == "asymmetrical" and has_asym))
        if new:
            g += 1
            has_asym = False
        opaque = k == "opaque"
        has_asym = has_asym or k == "asymmetrical"
        labels[i] = g
    kinds, n_ops, n_in = [], [], []
    for h, mem in enumerate(_groups(labels)):
        ks = {info.kind[m] for m in mem}
        kinds.append("opaque" if "opaque" in ks else
                     "asymmetrical" if "asymmetrical" in ks else "symmetrical")
        n_ops.append(int(info.n_ops[mem].sum()))
        n_in.append(len({p for m in mem for p in preds[m] if labels[p] != h})
                    + int(sum(graph.nodes[m].param_bytes > 0 for m in mem)))
    internal = [bool(succs[i]) and all(labels[c] == labels[i] for c in succs[i])
                for i in range(graph.n)]
    nodes = tuple(dataclasses.replace(v, out_bytes=0) if internal[v.index] else v
                  for v in graph.nodes)
    fi = NodeInfo(tuple(kinds), np.asarray(n_ops, np.int64), np.asarray(n_in, np.int64))
    return Graph(nodes=nodes, edges=graph.edges, param_bytes=graph.param_bytes,
                 input_bytes=graph.input_bytes, name=f"{graph.name}+fused",
                 meta={**dict(graph.meta), "node_info": fi, "fusion_labels": labels})


def _check_reduction_args(fused: Graph, k_w: Any, k_h: Any) -> None:
    """Typed errors for :func:`reducible_groups` / :func:`reduce_subgraphs` input."""
    for name, k in (("k_w", k_w), ("k_h", k_h)):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InvalidGraphError(f"subgraph reduction {name} must be a positive int, got {k!r}")
    if "fusion_labels" not in fused.meta or "node_info" not in fused.meta:
        raise NotApplicableError("subgraph reduction needs the graph made by remat.core.passes.fuse")


def reducible_groups(fused: Graph, *, k_w: int = K_W, k_h: int = K_H) -> frozenset[int]:
    """Fusion groups of :func:`fuse`'s graph that subgraph reduction recomputes inline in each
    consumer (§3.2.2): read by at least two other groups, symmetrical, fewer than ``k_w``
    inputs and fewer than ``k_h`` fused ops.

    Raises:
      NotApplicableError: ``fused`` is not a graph made by :func:`fuse`.
      InvalidGraphError: ``k_w`` or ``k_h`` is not a positive integer.
    """
    _check_reduction_args(fused, k_w, k_h)
    labels = fused.meta["fusion_labels"]
    info = fused.meta["node_info"]
    out = set()
    for h, mem in enumerate(_groups(labels)):
        consumers = {int(labels[c]) for m in mem for c in fused.succs[m] if labels[c] != h}
        if (len(consumers) >= 2 and info.kind[h] == "symmetrical" and info.n_inputs[h] < k_w
                and info.n_ops[h] < k_h):
            out.add(h)
    return frozenset(out)


def reduce_subgraphs(fused: Graph, *, k_w: int = K_W, k_h: int = K_H) -> tuple[Graph, int]:
    """The graph-level model of subgraph reduction on :func:`fuse`'s graph: a reducible group
    is not materialised (its members' ``out_bytes`` become 0); each consumer node reads the
    group's external inputs instead (new edges, which extend those inputs' lifetimes) and each
    consumer group pays the group's FLOPs, ``time_s`` and ``energy_j`` once (added to its first
    consumer node; the members' own costs become 0).

    Returns:
      ``(reduced, groups_removed)``: a :class:`Graph` without ``program``.
    """
    _check_reduction_args(fused, k_w, k_h)
    labels = fused.meta["fusion_labels"]
    red = reducible_groups(fused, k_w=k_w, k_h=k_h)
    groups = _groups(labels)
    fl = fused.flops_array.copy()
    tm = fused.costs.copy()
    en = fused.energies.copy()
    size = fused.sizes.copy()
    edges = set(fused.edges)
    for h in sorted(red, reverse=True):
        mem = set(groups[h].tolist())
        ext = {p for m in mem for p in fused.preds[m] if p not in mem}
        cons = sorted({c for m in mem for c in fused.succs[m] if c not in mem})
        gf, gt, ge = fl[list(mem)].sum(), tm[list(mem)].sum(), en[list(mem)].sum()
        seen = set()
        for c in cons:
            edges.update((p, c) for p in ext)
            if labels[c] not in seen:
                seen.add(int(labels[c]))
                fl[c] += gf
                tm[c] += gt
                en[c] += ge
        for m in mem:
            fl[m] = tm[m] = en[m] = 0.0
            size[m] = 0
    nodes = tuple(dataclasses.replace(v, flops=float(fl[i]), time_s=float(tm[i]),
                                      energy_j=float(en[i]), out_bytes=int(size[i]))
                  for i, v in enumerate(fused.nodes))
    meta = {**dict(fused.meta), "subgraph_reduction": {"groups": len(red), "k_w": k_w,
                                                       "k_h": k_h}}
    return Graph(nodes=nodes, edges=tuple(sorted(edges)), param_bytes=fused.param_bytes,
                 input_bytes=fused.input_bytes, name=f"{fused.name}+reduced",
                 meta=meta), len(red)
