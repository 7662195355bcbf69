"""The per-device temp bytes of a sharded training step: :mod:`remat.xla_memory` on the shards.

:func:`remat.xla_memory.predict_temp_bytes` models the buffers XLA:CPU allocates for the global
(unsharded) step.  A step whose arguments carry ``NamedSharding``\\ s runs as one SPMD program per
device, whose buffers are shards, plus the collectives' own.  :func:`predict_sharded_temp_bytes`
runs the same model (fusion, schedule, live ranges, buffer assignment) on the step's flattened
program with every value at its per-device shape, after three rules:

1. **Shardings** (:func:`value_specs`): each value's partition spec is propagated from the
   arguments' through the program, GSPMD-style: elementwise ops merge their operands' specs,
   broadcasts, transposes, reshapes and reductions map dimensions, a contraction keeps its
   operands' batch and free dimensions' axes; a mesh axis appears at most once in a spec
   (the first operand's claim wins).  ``sharding_constraint`` sets its spec.
2. **Partial sums**: a contraction whose contracting dimensions are sharded over the same mesh
   axis on both operands (a row-parallel matmul, a data-parallel weight gradient) writes full
   per-device partial sums, and an all-reduce writes the summed result into a buffer of its own.
   XLA:CPU combines the all-reduces that produce the step's outputs (the gradients) into one at
   the end of the backward pass, so those partial sums live until then.
3. **Gathers**: a contraction operand sharded on a contracting dimension that the other
   operand is not sharded on (an FSDP weight) is all-gathered into a buffer of its own, once
   per operand (the no-remat step's count).
4. **Combined all-reduces** (:func:`_combine_all_reduces`): XLA:CPU's all-reduce combiner
   merges all-reduces over the same mesh axes that do not depend on each other (in program
   order, a group closes at the first that depends on a member), so a group's partial sums all
   live until its last member's (the query, key and value projections' input gradients under
   tensor parallelism; a recomputed forward all-reduce and a backward one).

Accuracy: ``experiments/results/sharded_budget.csv`` (``predicted_temp`` against
``compiled_temp``).  Limits: the propagation is a rule set, not XLA's (an op it has no rule for
keeps its first same-shaped operand's spec, else is replicated); loop bodies are modelled at
their global shapes; reduce-scatter is modelled as an all-reduce; the combiner's grouping
follows the jaxpr's order, not XLA's post order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import networkx as nx
import numpy as np

from remat import _jax_compat as compat
from remat import xla_memory as xm
from remat.core.errors import ExtractionError, InvalidPlanError
from remat.frontend import Lit
from remat.mesh import axis_sizes, n_devices
from remat.mesh import leaf_sharding as _sharding

__all__ = ["value_specs", "forward_partial_sums", "predict_sharded_temp_bytes", "PARTIAL_SUM",
           "GATHER"]

PARTIAL_SUM = "all_reduce_partial_sums"
"""The op the model adds after a contraction over a sharded dimension (an all-reduce)."""
COMBINE_COUNT = 256
"""XLA:CPU's all-reduce combiner: at most this many operands per combined all-reduce."""
GATHER = "all_gather_operand"
"""The op the model adds for a contraction operand sharded on a contracting dimension."""

_ELEMENTWISE_LIKE = xm.ELEMENTWISE | {"select_n", "clamp", "convert_element_type", "integer_pow",
                                      "square", "reduce_precision", "stop_gradient", "copy",
                                      "copy_p", "pvary", "name", xm._COPY, xm._COPY_DOT}
_REDUCE = xm.REDUCTIONS | {"reduce_sum", "argmax", "argmin"}
Spec = tuple  # per dimension: a tuple of mesh axis names


def _spec_of(sharding, ndim: int) -> Spec:
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return ((),) * ndim
    out = []
    for k in range(ndim):
        e = spec[k] if k < len(spec) else None
        out.append(() if e is None else tuple(e) if isinstance(e, (tuple, list)) else (e,))
    return tuple(out)


def _merge(specs, ndim: int) -> Spec:
    """Per dimension the first operand's axes; a mesh axis is claimed once."""
    used: set = set()
    out = [()] * ndim
    for s in specs:
        for k, axes in enumerate(s):
            if not out[k] and axes and not used.intersection(axes):
                out[k] = axes
                used.update(axes)
    return tuple(out)


def _dedup(dims) -> Spec:
    used: set = set()
    out = []
    for axes in dims:
        keep = tuple(a for a in axes if a not in used)
        used.update(keep)
        out.append(keep)
    return tuple(out)


def _shape(aval) -> tuple:
    return tuple(getattr(aval, "shape", ()))


def _reshape_spec(src: Spec, ishape, oshape, sizes) -> Spec:
    """A reshape keeps a sharded dimension's axes on the major output dimension it splits into
    (when it divides) or on the dimension a merge makes (when the sharded input dimension is
    its major one and the merged minor ones are unsharded)."""
    out = [()] * len(oshape)
    i = j = 0
    while i < len(ishape) or j < len(oshape):
        gi, gj = [i] if i < len(ishape) else [], [j] if j < len(oshape) else []
        pi = ishape[i] if gi else 1
        pj = oshape[j] if gj else 1
        i += bool(gi)
        j += bool(gj)
        while pi != pj:
            if pi < pj and i < len(ishape):
                pi *= ishape[i]
                gi.append(i)
                i += 1
            elif j < len(oshape):
                pj *= oshape[j]
                gj.append(j)
                j += 1
            else:
                break
        major_i = next((k for k in gi if ishape[k] != 1), None)
        major_j = next((k for k in gj if oshape[k] != 1), None)
        if major_i is None or major_j is None:
            continue
        axes = src[major_i]
        if axes and all(not src[k] for k in gi if k != major_i) and \
                oshape[major_j] % int(np.prod([sizes[a] for a in axes])) == 0:
            out[major_j] = axes
    return tuple(out)


def _dot_spec(op, specs, avals):
    """``(output spec, common contracting axes, [(operand position, gathered spec)])``."""
    (lc, rc), (lb, rb) = op.eqn.params["dimension_numbers"]
    lhs, rhs = (specs[i] for i in op.ins)
    lf = [k for k in range(len(lhs)) if k not in lc and k not in lb]
    rf = [k for k in range(len(rhs)) if k not in rc and k not in rb]
    common: set = set()
    gathers = []
    gl, gr = list(lhs), list(rhs)
    for a, b in zip(lc, rc):
        la, ra = set(lhs[a]), set(rhs[b])
        common |= la & ra
        if la - ra:
            gl[a] = tuple(x for x in lhs[a] if x in ra)
        if ra - la:
            gr[b] = tuple(x for x in rhs[b] if x in la)
    # a mesh axis on free dimensions of both operands can shard only one output dimension:
    # the smaller operand is gathered on its dimension (XLA all-gathers an FSDP weight for
    # the data gradient of a batch-sharded cotangent)
    lsz, rsz = (int(np.prod(_shape(avals[i]))) for i in op.ins)
    (big, bf), (small, sf) = ((gl, lf), (gr, rf)) if lsz >= rsz else ((gr, rf), (gl, lf))
    taken = {x for k in bf for x in big[k]}
    for k in sf:
        small[k] = tuple(x for x in small[k] if x not in taken)
    if tuple(gl) != lhs:
        gathers.append((0, tuple(gl)))
    if tuple(gr) != rhs:
        gathers.append((1, tuple(gr)))
    batch = [tuple(dict.fromkeys(gl[a] + gr[b])) for a, b in zip(lb, rb)]
    dims = batch + [gl[k] for k in lf] + [gr[k] for k in rf]
    dims = [tuple(x for x in d if x not in common) for d in dims]
    return _dedup(dims), tuple(sorted(common)), gathers


def value_specs(program, in_specs: dict, sizes: dict) -> tuple[dict, dict, dict]:
    """Propagate partition specs through a flattened step (``remat.xla_memory``'s program).

    Args:
      program: the flattened program.
      in_specs: value id -> spec of the arguments (unlisted static values are replicated).
      sizes: mesh axis name -> devices.

    Returns:
      ``(specs, partial, gathers)``: value id -> spec; contraction op index -> the mesh axes
      its partial sums are all-reduced over; contraction op index -> ``[(operand position,
      gathered spec)]``.
    """
    avals = program.avals
    specs: dict[int, Spec] = {}
    partial: dict[int, tuple] = {}
    gathers: dict[int, list] = {}

    def get(v):
        if v is None:
            return None
        s = specs.get(v)
        if s is None:
            s = in_specs.get(v, ((),) * len(_shape(avals[v])))
            specs[v] = s
        return s

    for j, op in enumerate(program.ops):
        ins = [get(i) for i in op.ins]
        name = op.name
        params = op.eqn.params if op.eqn is not None else {}
        outs_shape = [_shape(avals[o]) for o in op.outs]
        res: list[Spec] | None = None
        if name == "optimization_barrier":
            res = [s for s in ins if s is not None]
        elif name == "dot_general" and op.eqn is not None and None not in op.ins:
            s, common, g = _dot_spec(op, specs, avals)
            res = [s]
            if common:
                partial[j] = common
            if g:
                gathers[j] = g
        elif name == "transpose" or (name == xm._FOLDED and op.eqn is not None
                                     and op.eqn.primitive.name == "transpose"):
            res = [tuple(ins[0][p] for p in params["permutation"])]
        elif name == "broadcast_in_dim" and ins and ins[0] is not None:
            out = [()] * len(outs_shape[0])
            ish = _shape(avals[op.ins[0]])
            for k, d in enumerate(params["broadcast_dimensions"]):
                if ish[k] == outs_shape[0][d]:
                    out[d] = ins[0][k]
            res = [_dedup(out)]
        elif name == "reshape" and ins and ins[0] is not None:
            res = [_reshape_spec(ins[0], _shape(avals[op.ins[0]]), outs_shape[0], sizes)]
        elif name in _REDUCE and ins and ins[0] is not None:
            axes = set(params.get("axes", ()))
            res = [tuple(a for k, a in enumerate(ins[0]) if k not in axes)] * len(op.outs)
        elif name == "squeeze" and ins and ins[0] is not None:
            dims = {d % len(ins[0]) for d in params.get("dimensions", ())}
            res = [tuple(a for k, a in enumerate(ins[0]) if k not in dims)]
        elif name == "expand_dims" and ins and ins[0] is not None:
            out = list(ins[0])
            for d in sorted(params.get("dimensions", ())):
                out.insert(d, ())
            res = [tuple(out)]
        elif name in ("sharding_constraint", "reshard", "mesh_cast") and "sharding" in params:
            res = [_spec_of(params["sharding"], len(outs_shape[0]))]
        elif name in _ELEMENTWISE_LIKE or name == xm._FOLDED:
            nd = len(outs_shape[0]) if outs_shape else 0
            res = [_merge([s for v, s in zip(op.ins, ins) if s is not None
                           and _shape(avals[v]) == outs_shape[0]], nd)] * len(op.outs)
        if res is None:  # no rule: a same-shaped operand's spec per dimension, else replicated
            res = []
            for sh in outs_shape:
                same = [s for v, s in zip(op.ins, ins) if s is not None and _shape(avals[v]) == sh]
                if same:
                    res.append(same[0])
                    continue
                first = next((s for v, s in zip(op.ins, ins) if s is not None
                              and len(_shape(avals[v])) == len(sh)), None)
                ish = _shape(avals[op.ins[0]]) if first is not None else ()
                res.append(tuple(a if ish[k] == sh[k] else () for k, a in enumerate(first))
                           if first is not None else ((),) * len(sh))
        for o, s in zip(op.outs, res):
            specs[o] = s
    return specs, partial, gathers


def forward_partial_sums(forward, args) -> dict[int, tuple[tuple, int, int]]:
    """The contractions of a forward program whose per-device results are partial sums.

    A contraction over a dimension sharded on both operands over the same mesh axes (a
    row-parallel matmul under tensor parallelism) writes per-device partial sums that an
    all-reduce over those axes completes; recomputing it runs the all-reduce again.

    Args:
      forward: the forward program (``Program.forward`` of :func:`remat.extract`,
        a :class:`remat.frontend.FlatJaxpr`).
      args: the abstract arguments with their shardings (:func:`remat.sharding.abstract`).

    Returns:
      forward-equation index -> ``(mesh axes, devices in one group, per-device bytes of the
      all-reduced result)``.

    Raises:
      ExtractionError: ``forward`` is not a flattened program, or ``args`` has another number
        of leaves than its arguments.
    """
    if not all(hasattr(forward, k) for k in ("eqns", "avals", "arg_ids", "out_refs")):
        raise ExtractionError("forward_partial_sums needs a flattened forward program "
                              f"(Program.forward of remat.extract), got {type(forward).__name__}")
    leaves = jax.tree_util.tree_leaves(args)
    if len(leaves) != len(forward.arg_ids):
        raise ExtractionError(f"args has {len(leaves)} leaves, the forward program takes "
                              f"{len(forward.arg_ids)} arguments")
    sizes = axis_sizes(args)
    if not sizes:
        return {}
    ops = tuple(xm._Op(e.primitive.name, tuple(None if isinstance(i, Lit) else i for i in e.ins),
                       tuple(e.outs), e.jaxpr_eqn) for e in forward.eqns)
    program = xm._Program(ops, tuple(forward.avals),
                          frozenset(forward.arg_ids) | frozenset(forward.const_ids),
                          tuple(o for o in forward.out_refs if isinstance(o, int)))
    in_specs = {v: _spec_of(_sharding(x), len(np.shape(x)))
                for v, x in zip(forward.arg_ids, leaves)}
    specs, partial, _ = value_specs(program, in_specs, sizes)
    out = {}
    for j, axes in partial.items():
        o = ops[j].outs[0]
        local = _local(forward.avals[o], specs[o], sizes)
        out[j] = (tuple(axes), int(np.prod([sizes[a] for a in axes])),
                  int(np.prod(_shape(local))) * np.dtype(local.dtype).itemsize)
    return out


def _local(aval, spec: Spec, sizes) -> Any:
    shape = _shape(aval)
    if not shape or not any(spec):
        return aval
    local = tuple(int(math.ceil(d / int(np.prod([sizes[a] for a in axes]))))
                  for d, axes in zip(shape, spec))
    return jax.core.ShapedArray(local, aval.dtype)


def _per_device(p, in_specs: dict, sizes: dict):
    """``p`` with per-device avals and the collectives' buffers (module docstring)."""
    specs, partial, gathers = value_specs(p, in_specs, sizes)
    avals = list(p.avals)
    ops: list = []
    outs = set(p.outs)
    gathered: dict[tuple, int] = {}
    combined: list[tuple[int, int]] = []  # (partial sums, output) summed at the end
    keys: dict[int, tuple] = {}  # op index in ``ops`` -> mesh axes of its all-reduce
    # a gradient XLA writes transposed (a folded transpose is its only reader) is an output's
    # partial sum: XLA combines it with the outputs', which the model does not (the one such
    # case measured, a data-parallel MLP's weight gradients, is predicted within 0.1 % as is)
    readers: dict[int, list] = {}
    for op in p.ops:
        for i in op.ins:
            readers.setdefault(i, []).append(op)
    to_out = {v for v, rs in readers.items()
              if rs and all(r.name == xm._FOLDED and set(r.outs) <= outs for r in rs)}
    for j, op in enumerate(p.ops):
        if j in gathers:
            ins = list(op.ins)
            for pos, spec in gathers[j]:
                v = op.ins[pos]
                key = (v, spec)
                if key not in gathered:
                    avals.append(avals[v])
                    gathered[key] = g = len(avals) - 1
                    specs[g] = spec
                    ops.append(xm._Op(GATHER, (v,), (g,), None))
                ins[pos] = gathered[key]
            op = dataclasses.replace(op, ins=tuple(ins))
        if j in partial:
            o = op.outs[0]
            avals.append(avals[o])
            ps = len(avals) - 1
            specs[ps] = specs[o]
            ops.append(dataclasses.replace(op, outs=(ps,)))
            if o in outs:
                combined.append((ps, o))
            else:
                if o not in to_out:
                    keys[len(ops)] = partial[j]
                ops.append(xm._Op(PARTIAL_SUM, (ps,), (o,), None))
            continue
        ops.append(op)
    if combined:  # one combined all-reduce of the gradients at the end of the backward pass
        ops.append(xm._Op(PARTIAL_SUM, tuple(ps for ps, _ in combined),
                          tuple(o for _, o in combined), None))
    ops = _combine_all_reduces(ops, keys)
    avals = [_local(a, specs.get(v, ((),) * len(_shape(a))), sizes) for v, a in enumerate(avals)]
    return dataclasses.replace(p, ops=tuple(ops), avals=tuple(avals))


def _combine_all_reduces(ops: list, keys: dict[int, tuple]) -> list:
    """XLA:CPU's all-reduce combiner (no byte limit, at most ``COMBINE_COUNT`` operands) on the
    all-reduces ``keys`` names (op index -> the mesh axes summed over): repeatedly, from the
    first not yet combined, the following ones over the same axes in program order join its
    group until one depends on a member.  A group becomes one all-reduce at its last member's
    place, so every member's partial sums live until then; the ops are then reordered
    topologically, stably."""
    if len(keys) < 2:
        return ops
    prod = {o: j for j, op in enumerate(ops) for o in op.outs}
    dep: list[int] = []  # op -> bitset of the keyed all-reduces it depends on (transitively)
    for op in ops:
        m = 0
        for i in op.ins:
            q = prod.get(i)
            if q is not None:
                m |= dep[q] | ((1 << q) if q in keys else 0)
        dep.append(m)
    left = sorted(keys)
    groups = []
    while left:
        group, rest = [left[0]], []
        for k, j in enumerate(left[1:], 1):
            if keys[j] != keys[group[0]]:
                rest.append(j)
                continue
            if any(dep[j] >> g & 1 for g in group) or len(group) >= COMBINE_COUNT:
                rest.extend(left[k:])
                break
            group.append(j)
        groups.append(group)
        left = sorted(rest)
    into = {}
    for group in groups:
        if len(group) > 1:
            for j in group:
                into[j] = group[-1]
    if not into:
        return ops
    merged = {}
    for j, last in into.items():
        ins, outs = merged.get(last, ((), ()))
        merged[last] = (ins + ops[j].ins, outs + ops[j].outs)
    new = [xm._Op(PARTIAL_SUM, *merged[j], None) if j in merged else op
           for j, op in enumerate(ops) if j not in into or j in merged]
    return _stable_topological(new)


def _stable_topological(ops: list) -> list:
    """``ops`` in dependency order, each as early in the given order as its operands allow."""
    prod = {o: j for j, op in enumerate(ops) for o in op.outs}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(ops)))
    dag.add_edges_from((prod[i], j) for j, op in enumerate(ops) for i in op.ins
                       if i is not None and i in prod and prod[i] != j)
    return [ops[j] for j in nx.lexicographical_topological_sort(dag)]


def predict_sharded_temp_bytes(graph, plan=None, args=None, *, fn: Callable | None = None,
                               rules: xm.Rules = xm.RULES, detail: bool = False):
    """Predicted per-device ``memory_analysis().temp_size_in_bytes`` of the compiled sharded
    training step when ``plan`` is applied to ``graph``'s loss by the drop-in (XLA:CPU,
    ``cse_barrier_expander`` off; module docstring).  Nothing compiles.

    Args:
      graph: a graph from :func:`remat.extract` (it carries the program).
      plan: a plan for ``graph``; ``None``: no rematerialization.
      args: the abstract arguments with their shardings (:func:`remat.sharding.abstract`);
        ``None`` or unsharded: :func:`remat.xla_memory.predict_temp_bytes`.
      fn: the rematerialized forward function (``Applied.fn``); by default rebuilt from the plan.
      rules: :mod:`remat.xla_memory`'s switches.
      detail: return a :class:`remat.xla_memory.TempReport`.

    Returns:
      Bytes per device (``int``), or a :class:`~remat.xla_memory.TempReport`.
    """
    from remat.interpreter import plan_function

    prog = getattr(graph, "program", None)
    if prog is None or getattr(prog, "forward", None) is None:
        raise ExtractionError("predict_sharded_temp_bytes needs a graph from remat.extract")
    if plan is not None and plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    if args is None or n_devices(args) <= 1:
        f = xm.temp_breakdown if detail else xm.predict_temp_bytes
        return f(graph, plan, fn=fn, rules=rules)
    if plan is not None and int(plan.microbatches) > 1:
        raise InvalidPlanError("a sharded step is planned without micro-batches")
    if fn is None:
        fn = prog.fn if plan is None else plan_function(graph, plan)
    closed = jax.make_jaxpr(jax.value_and_grad(fn, argnums=prog.argnums,
                                               has_aux=prog.has_aux))(*args)
    p = xm._flatten(closed)
    leaves = jax.tree_util.tree_leaves(args)
    top = compat.open_jaxpr(closed)
    sizes = axis_sizes(args)
    # the flattened program numbers the top-level arguments 0..n-1 in order
    in_specs = {k: _spec_of(_sharding(x), len(np.shape(x)))
                for k, x in zip(range(len(top.invars)), leaves)}
    return xm._run(_per_device(p, in_specs, sizes), rules, want_detail=detail)
