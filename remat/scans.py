"""Plan inside ``lax.scan``: the per-iteration saved set and the nesting of scanned layer stacks.

Deep JAX models run their layers under ``lax.scan`` (``flax.linen.scan``, ``nnx.scan``): one
compiled body, ``L`` iterations.  A scan plan has two parts (:class:`ScanDecision`):

* ``saved``: which of the body's *anchor* values each iteration keeps for the backward pass
  (an anchor is the result of an expensive body equation: a contraction, a convolution, a
  custom-derivative call; cheap elementwise work is always recomputed from anchors).  JAX's
  built-in policies are points of this space (``dots_saveable`` keeps every contraction,
  ``nothing_saveable`` none);
* ``group``: iterations per group of a nested scan (``L = groups x group``): the outer scan keeps
  only the carry entering each group, the backward pass of a group re-runs its inner scan
  (keeping ``saved`` per iteration) then differentiates it; ``group=1`` is a flat scan.

:class:`ScanBody` analyses one scan of the forward program: per body equation its FLOPs and
result bytes, which values the body's backward pass reads (from the body's own linearisation,
traced once with origin markers as in :mod:`remat.extraction`), and which equation feeds which.
:meth:`ScanBody.cost` then gives, for any decision, the bytes kept per iteration and the FLOPs
recomputed, by walking back from what the backward reads to the nearest kept anchor or body
input (exactly what ``jax.checkpoint(body, policy=save_only_these_names(...))`` does).

:func:`bind_scan` evaluates a scan equation under a decision: the body is re-evaluated with
``checkpoint_name`` tags on the kept anchors inside ``jax.checkpoint(..., policy=
save_only_these_names(...))``, and grouped into a nested scan.  A kept contraction followed by
a bias add keeps the sum (:meth:`ScanBody.save_point`: same bytes, the add not recomputed).
:func:`body_policy` / :func:`plan_policy` give the same saved set as a plain ``jax.checkpoint``
policy for users' own ``nn.scan(nn.remat(...))``; :func:`unroll_scans` is the unrolled view;
:func:`adjusted_graph` puts a decision's bytes and FLOPs into the training graph.

Length: the analysis, its cost model, the two ways of applying a decision (tags inside
``jax.checkpoint``, a JAX policy) and the graph view all read the same :class:`ScanBody`
fields; one module keeps them in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from remat._jax_compat import scan_params
from remat.core.errors import ExtractionError, InvalidPlanError
from remat.core.scan_plan import (
    ScanBody,
    ScanDecision,
    adjusted_graph,
    anchor_key,
    aval_bytes,
    default_groups,
    policy_key,
    scan_nodes,
    tag_name,
)
from remat.flops import eqn_flops
from remat.frontend import (
    INLINE_ALL,
    INLINE_FORWARD,
    ORIGIN_PREFIX,
    FlatJaxpr,
    LeafEqn,
    Lit,
    bind,
    dce,
    flatten,
    is_transpose,
    origin_of,
)
from remat.segments import cheap_leaf

__all__ = ["ScanDecision", "ScanBody", "analyse_scan", "bind_scan", "tag_name", "unroll_scans",
           "scan_nodes", "adjusted_graph", "body_policy", "plan_policy", "anchor_key",
           "default_groups"]

# ------------------------------------------------------------------------------ analysis
def analyse_scan(forward: FlatJaxpr, leaf: int, activation: Sequence[bool]) -> ScanBody:
    """Analyse the scan equation ``forward.eqns[leaf]``.

    Args:
      forward: the forward program.
      leaf: index of a ``scan`` equation in it.
      activation: per operand of the scan equation, whether it is computed from the batch.

    Raises:
      ExtractionError: ``leaf`` is not a scan.
    """
    e = forward.eqns[leaf]
    if e.name != "scan":
        raise ExtractionError(f"forward equation {leaf} is {e.name!r}, not a scan")
    closed, length, nc, ncar, _, _ = scan_params(e)
    body = flatten(closed, INLINE_FORWARD)
    E = len(body.eqns)
    n_in = len(body.arg_ids)
    in_avals = [body.avals[i] for i in body.arg_ids]
    floating = [jnp.issubdtype(a.dtype, jnp.inexact) for a in in_avals]

    # the body's own linearisation, equations marked with their origin
    def marked(*ins):
        env = body.const_env()
        env.update(zip(body.arg_ids, ins))
        for k, be in enumerate(body.eqns):
            invals = [r.val if isinstance(r, Lit) else env[r] for r in be.ins]
            env.update(zip(be.outs, bind(be, invals, scope=f"{ORIGIN_PREFIX}{k}")))
        return [r.val if isinstance(r, Lit) else env[r] for r in body.out_refs]

    fidx = [i for i in range(n_in) if floating[i]]

    def fwd_bwd(ins, cts):
        def f(*fl):
            full = list(ins)
            for i, v in zip(fidx, fl):
                full[i] = v
            return marked(*full)

        outs, pull = jax.vjp(f, *[ins[i] for i in fidx])
        return outs, pull(cts)

    out_avals = [body.avals[r] if not isinstance(r, Lit) else np.asarray(r.val)
                 for r in body.out_refs]
    ct_avals = [jax.ShapeDtypeStruct(a.shape, a.dtype if jnp.issubdtype(a.dtype, jnp.inexact)
                                     else jax.dtypes.float0) for a in out_avals]
    closed_vjp = jax.make_jaxpr(fwd_bwd)(
        [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals], ct_avals)
    vg = flatten(closed_vjp, INLINE_ALL)
    n_out = len(out_avals)
    keep = dce(vg.eqns, [r for r in vg.out_refs if isinstance(r, int)])
    eqns = [x for x, k in zip(vg.eqns, keep) if k]
    nf = next((j for j, x in enumerate(eqns) if is_transpose(x.name_stack)), len(eqns))
    primal = dce(eqns[:nf], [r for r in vg.out_refs[:n_out] if isinstance(r, int)])
    origin = np.array([origin_of(x.name_stack) for x in eqns], dtype=np.int64)
    eflops = np.array([eqn_flops(x.jaxpr_eqn) for x in eqns], dtype=np.float64)

    # producers of training-program values: primal eqn origin, or a body input
    vg_in = {v: i for i, v in enumerate(vg.arg_ids[:n_in])}
    prod_origin: dict[int, int] = {}
    for j in np.flatnonzero(primal).tolist():
        for o in eqns[j].outs:
            prod_origin[o] = int(origin[j])
    needs: set[int] = set()
    needs_inputs: set[int] = set()
    backward = list(range(nf, len(eqns))) + [j for j in range(nf) if not primal[j]]
    for j in backward:
        for r in eqns[j].ins:
            if isinstance(r, Lit):
                continue
            if r in prod_origin and prod_origin[r] >= 0:
                needs.add(prod_origin[r])
            elif r in vg_in:
                needs_inputs.add(vg_in[r])
    fwd_flops = float(eflops[np.flatnonzero(primal)].sum())
    bwd_flops = float(eflops.sum() - fwd_flops)
    flops = np.zeros(E)
    for j in np.flatnonzero(primal).tolist():
        if origin[j] >= 0:
            flops[origin[j]] += eflops[j]

    # body-level dataflow
    pos_eq = {o: k for k, be in enumerate(body.eqns) for o in be.outs}
    pos_in = {v: i for i, v in enumerate(body.arg_ids)}
    feeds = []
    for be in body.eqns:
        eqs = tuple(sorted({pos_eq[r] for r in be.ins if isinstance(r, int) and r in pos_eq}))
        ins = tuple(sorted({pos_in[r] for r in be.ins if isinstance(r, int) and r in pos_in}))
        feeds.append((eqs, ins))
    out_bytes = np.array([sum(aval_bytes(body.avals[o]) for o in be.outs) for be in body.eqns],
                         dtype=np.int64)
    anchors = tuple(k for k, be in enumerate(body.eqns)
                    if not cheap_leaf(be) and all(jnp.issubdtype(body.avals[o].dtype, jnp.inexact)
                                                  for o in be.outs))
    act = np.asarray(activation, dtype=bool)
    save_at, policy_at = _save_points(body, anchors, [bool(a) for a in act])
    carry_bytes = int(sum(aval_bytes(in_avals[i]) for i in range(nc, nc + ncar)))
    xs_param = int(sum(aval_bytes(in_avals[i]) for i in range(nc + ncar, n_in) if not act[i]))
    return ScanBody(
        leaf=leaf, length=length, body=body, num_consts=nc, num_carry=ncar,
        carry_bytes=carry_bytes, input_is_activation=act, flops=flops, out_bytes=out_bytes,
        anchors=anchors, needs=frozenset(needs), needs_inputs=frozenset(needs_inputs),
        feeds=tuple(feeds), fwd_flops=fwd_flops, bwd_flops=bwd_flops,
        names=tuple(be.scope for be in body.eqns), xs_param_bytes=xs_param, save_at=save_at,
        policy_at=policy_at,
    )


_TAIL = frozenset({"add", "sub", "add_any"})


def _save_points(body: FlatJaxpr, anchors: Sequence[int], activation: Sequence[bool]
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per anchor, the end of its bias tail, for tags and for a JAX policy (see
    :class:`ScanBody` ``save_at`` and ``policy_at``)."""
    readers: dict[int, list[int]] = {}
    for k, be in enumerate(body.eqns):
        for r in be.ins:
            if not isinstance(r, Lit):
                readers.setdefault(r, []).append(k)
    outs = {r for r in body.out_refs if not isinstance(r, Lit)}
    act_vals = {v for v, a in zip(body.arg_ids, activation) if a}
    for be in body.eqns:  # values computed from the batch (the rest: parameters, constants)
        if any(not isinstance(r, Lit) and r in act_vals for r in be.ins):
            act_vals.update(be.outs)

    def tail(j: int) -> int:
        k = j
        while len(body.eqns[k].outs) == 1:
            o = body.eqns[k].outs[0]
            rd = readers.get(o, [])
            if o in outs or len(rd) != 1:
                break
            ne = body.eqns[rd[0]]
            others = [r for r in ne.ins if isinstance(r, Lit) or r != o]
            if (ne.name not in _TAIL or len(ne.outs) != 1 or len(others) != len(ne.ins) - 1
                    or any(not isinstance(r, Lit) and r in act_vals for r in others)):
                break
            a, b = body.avals[ne.outs[0]], body.avals[o]
            if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
                break
            k = rd[0]
        return k

    pts = [tail(j) for j in anchors]
    # a JAX policy recognises an equation by primitive, operand avals and parameters: keep a
    # tail only when no other body equation looks like it
    count: dict[tuple, int] = {}
    for k in range(len(body.eqns)):
        key = anchor_key(body, k)
        count[key] = count.get(key, 0) + 1
    return tuple(pts), tuple(p if count[anchor_key(body, p)] == 1 else j
                             for j, p in zip(anchors, pts))


# ------------------------------------------------------------------------------ application
def bind_scan(e: LeafEqn, invals: Sequence[Any], decision: ScanDecision, scan_id: int,
              *, body: ScanBody | FlatJaxpr | None = None) -> list:
    """Evaluate scan equation ``e`` on ``invals`` under ``decision`` (see the module docstring).

    The body runs under ``jax.checkpoint(policy=save_only_these_names(...))`` with the kept
    anchors tagged :func:`tag_name` ``(scan_id, j)`` (at :meth:`ScanBody.save_point` when
    ``body`` is the analysed :class:`ScanBody`); with ``decision.group > 1`` the scan is nested
    (the outer body checkpointed with nothing saveable).
    """
    closed, length, nc, ncar, reverse, unroll = scan_params(e)
    if isinstance(body, ScanBody):
        fb, point = body.body, body.save_point
    else:
        fb = body if body is not None else flatten(closed, INLINE_FORWARD)
        point = int
    consts, init, xs = (list(invals[:nc]), list(invals[nc:nc + ncar]), list(invals[nc + ncar:]))
    tags = {point(j): tag_name(scan_id, j) for j in decision.saved}
    names = sorted(tags.values())

    def step(carry, x):
        env = fb.const_env()
        env.update(zip(fb.arg_ids, [*consts, *carry, *x]))
        for j, be in enumerate(fb.eqns):
            vals = bind(be, [r.val if isinstance(r, Lit) else env[r] for r in be.ins],
                        relative=True)
            if j in tags:
                vals = [checkpoint_name(v, tags[j]) for v in vals]
            env.update(zip(be.outs, vals))
        outs = [r.val if isinstance(r, Lit) else env[r] for r in fb.out_refs]
        return outs[:ncar], outs[ncar:]

    inner = jax.checkpoint(step, policy=jax.checkpoint_policies.save_only_these_names(*names),
                           prevent_cse=False)
    g = int(decision.group)
    if g <= 1:
        carry, ys = jax.lax.scan(inner, init, xs, length=length, reverse=reverse, unroll=unroll)
        return [*carry, *ys]
    if length % g:
        raise InvalidPlanError(f"scan group {g} does not divide its length {length}")
    n = length // g

    # the outer scan runs over group indices and slices the stacked inputs itself, so they stay
    # the scan's inputs (a reshaped copy would be kept as a residual)
    def group(carry, i, *xs_all):
        xg = [jax.lax.dynamic_slice_in_dim(x, i * g, g) for x in xs_all]
        return jax.lax.scan(inner, carry, xg, length=g, reverse=reverse)

    outer = jax.checkpoint(group, policy=jax.checkpoint_policies.nothing_saveable,
                           prevent_cse=False)
    carry, ys = jax.lax.scan(lambda c, i: outer(c, i, *xs), init, jnp.arange(n),
                             length=n, reverse=reverse)
    return [*carry, *[y.reshape((length,) + y.shape[2:]) for y in ys]]


def unroll_scans(closed, *, max_length: int = 256):
    """``closed`` (a ``ClosedJaxpr``) with every ``scan`` of at most ``max_length`` iterations
    unrolled: the body evaluated once per iteration under an extra name scope ``iter<i>`` (so
    stages keep iterations apart), inputs sliced and outputs stacked.  Returns a
    ``ClosedJaxpr`` with the same signature (the unrolled view: every policy applies)."""
    fwd = flatten(closed, INLINE_FORWARD)

    def run_body(fb, ins, prefix):
        env = fb.const_env()
        env.update(zip(fb.arg_ids, ins))
        for be in fb.eqns:
            invals = [r.val if isinstance(r, Lit) else env[r] for r in be.ins]
            env.update(zip(be.outs, bind(be, invals, prefix=prefix)))
        return [r.val if isinstance(r, Lit) else env[r] for r in fb.out_refs]

    def interp(*args):
        env = fwd.const_env()
        env.update(zip(fwd.arg_ids, args))
        for e in fwd.eqns:
            invals = [r.val if isinstance(r, Lit) else env[r] for r in e.ins]
            sp = scan_params(e) if e.name == "scan" else None
            if sp is not None and sp.length <= max_length:
                body_closed, L, nc, ncar, reverse, _ = sp
                fb = flatten(body_closed, INLINE_FORWARD)
                consts, carry, xs = invals[:nc], invals[nc:nc + ncar], invals[nc + ncar:]
                order = range(L - 1, -1, -1) if reverse else range(L)
                ys_all = [None] * L
                for i in order:
                    out = run_body(fb, [*consts, *carry, *[x[i] for x in xs]],
                                   e.name_stack.extend(f"iter{i}"))
                    carry, ys_all[i] = out[:ncar], out[ncar:]
                n_ys = len(fb.out_refs) - ncar
                ys = [jnp.stack([ys_all[i][j] for i in range(L)]) for j in range(n_ys)]
                vals = [*carry, *ys]
            else:
                vals = bind(e, invals)
            env.update(zip(e.outs, vals))
        return [r.val if isinstance(r, Lit) else env[r] for r in fwd.out_refs]

    avals = [fwd.avals[i] for i in fwd.arg_ids]
    return jax.make_jaxpr(interp)(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals])


# ------------------------------------------------------------------------------ the graph view
def body_policy(body: ScanBody, saved: Sequence[int]):
    """A plain ``jax.checkpoint`` policy keeping ``saved`` anchors of ``body``, for users who
    write ``nn.scan(nn.remat(Block, policy=...))`` or ``jax.checkpoint(step, policy=...)``
    themselves: an anchor is recognised by its primitive, operand shapes and dtypes and
    parameters (JAX calls policies with those), so no ``checkpoint_name`` is needed.  Anchors
    that look alike are kept together (:func:`anchor_key`)."""
    keys = frozenset(anchor_key(body.body, body.policy_point(j)) for j in saved)

    def policy(prim, *avals, **params):
        return policy_key(prim.name, avals, params) in keys

    policy.keys = keys  # type: ignore[attr-defined]
    return policy


def plan_policy(graph, decisions: Sequence[ScanDecision]):
    """The plain ``jax.checkpoint`` policy of a scan plan (``remat.checkpoint_policy`` of a
    :class:`policies.ScanLayers` plan): :func:`body_policy` of each decided scan, their
    recognised keys united (one policy for every scan body; ``.keys``).  No decision (the plan
    leaves the scans as JAX differentiates them): every value saveable.  A nested decision
    (``group > 1``) is not a policy's to express: the policy keeps its per-iteration saved set
    and a :class:`UserWarning` says so (plan with ``ScanLayers(nested=False)`` instead)."""
    import warnings

    bodies = {b.leaf: b for b in graph.program.scans}
    missing = [d.leaf for d in decisions if d.leaf not in bodies]
    if missing:
        raise InvalidPlanError(f"scan decisions for forward equations {missing}, which are not "
                               "scans the graph analysed")
    if not decisions:
        return jax.checkpoint_policies.everything_saveable
    nested = [d for d in decisions if d.group > 1]
    if nested:
        warnings.warn(f"the plan nests {len(nested)} scan(s) in groups of "
                      f"{sorted({d.group for d in nested})} iterations; a jax.checkpoint policy "
                      "only keeps the per-iteration saved set (plan with "
                      "ScanLayers(nested=False) for a plan a policy expresses)", stacklevel=3)
    keys = frozenset().union(*(body_policy(bodies[d.leaf], d.saved).keys for d in decisions))

    def policy(prim, *avals, **params):
        return policy_key(prim.name, avals, params) in keys

    policy.keys = keys  # type: ignore[attr-defined]
    return policy


