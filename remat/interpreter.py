"""The drop-in's interpreter: a forward program re-evaluated with a plan's ``jax.checkpoint``
segments (:mod:`remat.segments`), scan equations bound by their decisions
(:func:`remat.scans.bind_scan`), paged values offloaded at segment boundaries
(:mod:`remat.offload`).  Used by :mod:`remat.apply` and :mod:`remat.xla_memory`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from remat.core.errors import RematError
from remat.core.regions import check_regions
from remat.fidelity import scan_decisions
from remat.frontend import Lit, bind
from remat.offload import policy as offload_policy
from remat.offload import tag, tag_name
from remat.scans import bind_scan
from remat.segments import Segment, plan_segments, region_segments, walk

__all__ = ["segment_io", "interpreter", "as_function", "plan_function", "plan_segments_of",
           "saved_name"]


def segment_io(eqns, segs: Sequence[Segment], out_refs, consts: set) -> dict:
    """Per checkpointed segment: (input value ids read from before it, output ids read after
    it)."""
    last: dict[int, int] = {}
    for k, e in enumerate(eqns):
        for r in e.ins:
            if not isinstance(r, Lit):
                last[r] = k
    for r in out_refs:
        if not isinstance(r, Lit):
            last[r] = len(eqns)
    io = {}
    for s in walk(segs):
        if not s.remat:
            continue
        produced, needed = set(), []
        for e in eqns[s.start:s.stop]:
            for r in e.ins:
                if not isinstance(r, Lit) and r not in produced and r not in consts \
                        and r not in needed:
                    needed.append(r)
            produced.update(e.outs)
        outs = sorted(o for o in produced if last.get(o, -1) >= s.stop)
        io[(s.start, s.stop, s.level)] = (tuple(needed), tuple(outs))
    return io


def interpreter(forward, segs: Sequence[Segment], *, scans: dict | None = None,
                prevent_cse: bool = True,
                offload: Mapping[tuple[int, int, int], Sequence[int]] | None = None) -> Callable:
    """``fun(*flat_args) -> flat outputs`` evaluating the forward program with ``segs``; scan
    equations with a decision in ``scans`` (leaf -> ``(ScanDecision, ScanBody)``) are bound
    by :func:`remat.scans.bind_scan`.  ``offload`` (:attr:`remat.offload.Offload.tags`): per
    checkpointed segment ``(start, stop, level)``, the input value ids its body tags on entry;
    its policy then offloads them to host memory and recomputes the rest
    (:func:`remat.offload.policy`)."""
    scans = scans or {}
    offload = offload or {}
    eqns = forward.eqns
    consts = forward.const_env()
    io = segment_io(eqns, segs, forward.out_refs, set(consts))
    nothing = jax.checkpoint_policies.nothing_saveable

    def run(seg_list, env, tagged=frozenset()):
        for s in seg_list:
            if s.remat:
                ins, outs = io[(s.start, s.stop, s.level)]
                paged = tuple(offload.get((s.start, s.stop, s.level), ()))
                saves = frozenset(s.saves or ())

                def body(*vals, _s=s, _ins=ins, _outs=outs, _paged=paged, _saves=saves):
                    senv = dict(consts)
                    senv.update(zip(_ins, vals))
                    senv.update((v, tag(senv[v], v)) for v in _paged)
                    run(_s.children, senv, _saves)
                    return tuple(senv[o] for o in _outs)

                if s.saves is not None:  # a plan's region: save exactly these leaves' outputs
                    pol = jax.checkpoint_policies.save_only_these_names(
                        *(saved_name(k) for k in sorted(saves)))
                else:
                    pol = offload_policy(tag_name(v) for v in paged) if paged else nothing
                res = jax.checkpoint(body, policy=pol, prevent_cse=prevent_cse)(
                    *(env[i] for i in ins))
                env.update(zip(outs, res))
                continue
            for k in range(s.start, s.stop):
                e = eqns[k]
                ins = [r.val if isinstance(r, Lit) else env[r] for r in e.ins]
                if k in scans:
                    dec, body = scans[k]
                    vals = bind_scan(e, ins, dec, k, body=body)
                else:
                    vals = bind(e, ins, relative=True)
                if k in tagged:
                    vals = [_name(v, saved_name(k)) for v in vals]
                env.update(zip(e.outs, vals))

    def fun(*flat_args):
        env = dict(consts)
        env.update(zip(forward.arg_ids, flat_args))
        run(segs, env)
        return [r.val if isinstance(r, Lit) else env[r] for r in forward.out_refs]

    return fun


def saved_name(leaf: int) -> str:
    """The ``checkpoint_name`` of forward-program equation ``leaf``'s outputs in a region that
    saves them (:attr:`remat.segments.Segment.saves`)."""
    return f"remat_leaf{leaf}"


def _name(v, name: str):
    """``checkpoint_name(v, name)`` for a traced non-scalar array (constants, scalars and PRNG
    keys stay as they are: nothing worth saving, and jax 0.8's ``saved_residuals`` fails on a
    name given to a scalar the trace inlined as a literal)."""
    dt = getattr(v, "dtype", None)
    if not isinstance(v, jax.core.Tracer) or dt is None or not np.shape(v) \
            or jax.dtypes.issubdtype(dt, jax.dtypes.extended):
        return v
    return checkpoint_name(v, name)


def as_function(interp, abstract, out_tree) -> Callable:
    """The interpreter as a function of ``abstract``'s pytree structure."""
    in_tree = jax.tree_util.tree_structure(tuple(abstract))

    def remat_fn(*a):
        leaves, tree = jax.tree_util.tree_flatten(tuple(a))
        if tree != in_tree:
            raise RematError(f"argument structure changed: {tree} vs {in_tree}")
        return jax.tree_util.tree_unflatten(out_tree, interp(*leaves))

    return remat_fn


def plan_segments_of(graph, plan) -> tuple[Segment, ...]:
    """The segment tree of ``plan`` on ``graph``: its checkpoint regions when it carries them
    (``plan.meta["regions"]``, :func:`remat.segments.region_segments`), else the segments of
    its compute counts (:func:`remat.segments.plan_segments`)."""
    prog = graph.program
    nfwd = int((~graph.is_backward_array).sum())
    counts = np.asarray(plan.R).sum(axis=0)[:nfwd]
    regions = plan.meta.get("regions")
    if regions:
        check_regions(regions, nfwd)
        return region_segments(prog.fwd_node, replay_saves(graph, regions), counts)
    decisions = scan_decisions(prog, plan)
    # a scan planner's plan runs the rest without trimming kept segments (its model counts
    # JAX's own residuals there)
    trim = bool(plan.meta.get("trim_segments", not decisions))
    return plan_segments(prog.forward, prog.fwd_node, counts, trim=trim)


def replay_saves(graph, regions) -> tuple:
    """``regions`` with saves the replayed forward program can honour.

    An equation of the forward program is several graph nodes: its primal output and the
    residuals the original linearization computed from its operands or output (``2 * x`` of
    ``square(x)``, the mask of a ``relu``); ``fwd_node`` maps it to the last.  Replayed under
    ``jax.checkpoint``, JAX derives those residuals again, unnamed, from the operands, so a
    saved residual is honoured by saving what it is computed from: each saved node that is
    not an ancestor of the loss is replaced by its forward predecessors (until ancestors of
    the loss), and each node by its equation's last node (the name of the equation's output).
    Nodes before a region are its inputs, which ``jax.checkpoint`` keeps."""
    prog = graph.program
    lab = np.asarray(prog.fwd_node, dtype=np.int64)
    eqns = prog.forward.eqns
    producer = {o: k for k, e in enumerate(eqns) for o in e.outs}
    bwd = graph.is_backward_array
    todo = [int(lab[producer[r]]) for r in prog.forward.out_refs
            if not isinstance(r, Lit) and r in producer]
    live: set[int] = set()
    while todo:
        v = todo.pop()
        if v in live:
            continue
        live.add(v)
        todo.extend(p for p in graph.preds[v] if not bwd[p] and p not in live)

    def swap(saves):
        out, stack, seen = set(), [int(v) for v in saves], set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in live:
                k = int(np.searchsorted(lab, v, side="left"))
                if k < len(lab):
                    out.add(int(lab[k]))
            else:
                stack.extend(p for p in graph.preds[v] if not bwd[p])
        return out

    def walk_regions(rs):
        return tuple(dataclasses.replace(
            r, saves=tuple(sorted(v for v in swap(r.saves) if r.start <= v < r.stop)),
            children=walk_regions(r.children)) for r in rs)

    return walk_regions(tuple(regions))


def plan_function(graph, plan) -> Callable:
    """The forward function the drop-in runs for ``plan`` on ``graph`` (extracted): the forward
    program with the plan's segments, a function of the extraction's argument structure."""
    prog = graph.program
    decisions = scan_decisions(prog, plan)
    segs = plan_segments_of(graph, plan)
    return as_function(interpreter(prog.forward, segs, scans=decisions), prog.arg_shapes,
                       prog.fwd_out_tree)
