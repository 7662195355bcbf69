"""Apply a plan to a real JAX function: a drop-in ``jax.value_and_grad`` with rematerialization.

``remat.value_and_grad(fn, policy)`` extracts ``fn``'s training graph (:func:`remat.extract`),
asks ``policy`` for a :class:`~remat.Plan`, and re-evaluates ``jax.make_jaxpr(fn)(*args)`` with
an interpreter that turns the plan's *saved forward set* ``plan.saved_forward(graph)`` into
``jax.checkpoint`` annotations:

* every forward equation is mapped to the forward graph node (stage) that covers it, through the
  module scope keys the extractor records (``graph.program.forward_scopes[i]`` and
  ``remat.extraction.scope_of(eqn)``);
* the forward equations are cut into **segments**: a segment is a maximal run of consecutive
  stages that ends at (and includes) a saved stage, or at the end of the function;
* a segment that is a single saved stage runs as is (nothing recomputed: checkpoint-all); any
  other segment is wrapped in ``jax.checkpoint(seg, policy=save_only_these_names(*tags))`` where
  every value produced by the segment's saved stage is tagged with
  ``jax.ad_checkpoint.checkpoint_name(value, "remat.n<i>")``.  In the backward pass JAX then
  recomputes the segment's unsaved stages from the segment's inputs, one segment at a time (Chen
  et al. 2016's segment recomputation; Checkmate's ``S`` restricted to forward values kept
  from their forward computation to their backward use).

Approximation (documented, tested by measurement): a plan is applied through the set of forward
stages it computes exactly once; a stage recomputed several times by the plan (nested
recomputation) is recomputed once per backward segment here, and a value read across a segment
boundary (a skip connection out of an unsaved stage) is kept, because ``jax.checkpoint`` saves the
inputs of a checkpointed segment.  Equations are matched to stages by scope key, so with
``stages="eqn"`` (several stages per scope) the plan is applied at scope granularity: all
equations of one scope go to the first stage of that scope.

Micro-batching: with ``microbatches=k`` the non-differentiated arguments are split along axis 0
(see :func:`remat.microbatch.split_args`) and the per-micro-batch ``value_and_grad`` of the
rematerialized function is accumulated with ``lax.scan``; the plan is made on the graph extracted
at micro-batch size.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore

from remat.errors import ExtractionError, InvalidPlanError, RematError

__all__ = [
    "value_and_grad",
    "grad",
    "checkpoint",
    "checkpoint_policy",
    "resolve_policy",
    "plan_segments",
    "Applied",
    "TAG_PREFIX",
]

TAG_PREFIX = "remat.n"
"""Prefix of the ``checkpoint_name`` tags the interpreter puts on saved stages' values."""

# Call-like primitives whose bodies are inlined so that stage mapping works at the same
# granularity as the extractor (which flattens them too).  custom_jvp/custom_vjp calls and the
# user's own remat2 are kept as single equations: inlining them would change differentiation.
_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}


# --------------------------------------------------------------------------- policy resolution
def resolve_policy(policy: Any, budget: Any = None):
    """A policy object from ``policy``: ``None``, a registry name, or an object with ``plan``.

    Raises:
      UnknownNameError: an unknown policy name (listing the registered ones).
      RematError: ``policy`` is neither a name nor an object with a ``plan`` method.
    """
    if policy is None:
        return None
    if isinstance(policy, str):
        import policies

        opts = {} if budget is None else {"budget": budget}
        try:
            return policies.get(policy, **opts)
        except TypeError:  # a policy without a budget option
            return policies.get(policy)
    if hasattr(policy, "plan") and callable(policy.plan):
        return policy
    raise RematError(
        f"policy must be None, a registry name or an object with .plan(graph, budget); got "
        f"{type(policy).__name__}"
    )


def _make_plan(pol, graph, budget):
    return pol.plan(graph, budget=budget) if budget is not None else pol.plan(graph)


# --------------------------------------------------------------------------- jaxpr flattening
@dataclasses.dataclass(frozen=True)
class _FlatEqn:
    """One leaf equation: ``ins`` are value ids or ``("lit", value)``; ``outs`` ids or -1."""

    eqn: Any
    ins: tuple
    outs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Flat:
    eqns: tuple[_FlatEqn, ...]
    in_ids: tuple[int, ...]
    out_refs: tuple
    consts: dict  # id -> concrete constant


def _flatten(closed) -> _Flat:
    """Inline call-like primitives of a ClosedJaxpr into one list of leaf equations.

    Name stacks of inlined equations are prefixed with their caller's, so the scope of every leaf
    equation is absolute (as in the extractor).
    """
    counter = [0]
    consts: dict[int, Any] = {}
    eqns: list[_FlatEqn] = []

    def new() -> int:
        counter[0] += 1
        return counter[0] - 1

    def read(env, v):
        if isinstance(v, jcore.Literal):
            return ("lit", v.val)
        return env[v]

    def run(jaxpr, env, prefix):
        for e in jaxpr.eqns:
            key = _INLINE.get(e.primitive.name)
            sub = e.params.get(key) if key else None
            if sub is not None:
                sj = getattr(sub, "jaxpr", sub)
                senv = {}
                for cv, c in zip(sj.constvars, getattr(sub, "consts", ())):
                    i = new()
                    consts[i] = c
                    senv[cv] = i
                senv.update({iv: read(env, ov) for iv, ov in zip(sj.invars, e.invars)})
                run(sj, senv, prefix + e.source_info.name_stack)
                for o, io in zip(e.outvars, sj.outvars):
                    if not isinstance(o, jcore.DropVar):
                        env[o] = read(senv, io)
                continue
            if len(prefix):
                e = e.replace(source_info=e.source_info.replace(name_stack=prefix + e.source_info.name_stack))
            ins = tuple(read(env, v) for v in e.invars)
            outs = []
            for o in e.outvars:
                if isinstance(o, jcore.DropVar):
                    outs.append(-1)
                else:
                    i = new()
                    env[o] = i
                    outs.append(i)
            eqns.append(_FlatEqn(e, ins, tuple(outs)))

    from jax._src import source_info_util

    env: dict = {}
    for cv, c in zip(closed.jaxpr.constvars, closed.consts):
        i = new()
        consts[i] = c
        env[cv] = i
    in_ids = []
    for v in closed.jaxpr.invars:
        i = new()
        env[v] = i
        in_ids.append(i)
    run(closed.jaxpr, env, source_info_util.new_name_stack())
    out_refs = tuple(read(env, v) for v in closed.jaxpr.outvars)
    return _Flat(tuple(eqns), tuple(in_ids), out_refs, consts)


def _bind(eqn, invals):
    """Evaluate one equation on ``invals`` (as ``jax.core.eval_jaxpr`` does), keeping its
    source info so name stacks survive into the transformed program."""
    from jax._src import source_info_util

    params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
        ans = eqn.primitive.bind(*invals, **params)
    return list(ans) if eqn.primitive.multiple_results else [ans]


# --------------------------------------------------------------------------- segmentation
@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of forward equations ``[start, stop)`` (flat equation indices).

    Attributes:
      nodes: forward graph nodes covered, in order.
      remat: wrap in ``jax.checkpoint`` (False: a single saved stage, run as is).
      saved_nodes: nodes whose values are tagged and saved (``save_only_these_names``).
    """

    start: int
    stop: int
    nodes: tuple[int, ...]
    remat: bool
    saved_nodes: tuple[int, ...]


def plan_segments(eqn_node: Sequence[int], saved: frozenset[int] | set[int]) -> tuple[Segment, ...]:
    """Cut equations (mapped to forward nodes, non-decreasing) into checkpoint segments.

    A segment closes after the last equation of a saved node.  A segment holding only one saved
    node is not rematerialized; every other segment is, saving only its saved nodes' values.

    Args:
      eqn_node: ``int[E]`` forward node of each flat equation (non-decreasing).
      saved: the plan's saved forward nodes.
    """
    eqn_node = np.asarray(eqn_node, dtype=np.int64)
    E = len(eqn_node)
    segs: list[Segment] = []
    if E == 0:
        return ()
    # run boundaries of equal node ids
    change = np.flatnonzero(np.diff(eqn_node)) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [E]])
    seg_start = 0
    nodes: list[int] = []
    for a, b in zip(starts, stops):
        node = int(eqn_node[a])
        nodes.append(node)
        if node in saved or b == E:
            savedn = tuple(n for n in nodes if n in saved)
            remat = not (len(nodes) == 1 and node in saved)
            segs.append(Segment(seg_start, int(b), tuple(nodes), remat, savedn))
            seg_start, nodes = int(b), []
    return tuple(segs)


def _tag(node: int) -> str:
    return f"{TAG_PREFIX}{node}"


def _interpret(flat: _Flat, eqn_node: Sequence[int], saved, *, prevent_cse: bool = True) -> Callable:
    """A function of the flat inputs that evaluates ``flat`` with the plan's segments."""
    segs = plan_segments(eqn_node, saved)
    eqn_node = list(eqn_node)
    E = len(flat.eqns)
    # last reader (eqn index) of every value id; outputs of the program read "at E"
    last = {}
    for k, fe in enumerate(flat.eqns):
        for r in fe.ins:
            if not isinstance(r, tuple):
                last[r] = k
    for r in flat.out_refs:
        if not isinstance(r, tuple):
            last[r] = E
    seg_io = []
    for s in segs:
        produced, needed = set(), []
        for fe in flat.eqns[s.start : s.stop]:
            for r in fe.ins:
                if not isinstance(r, tuple) and r not in produced and r not in flat.consts and r not in needed:
                    needed.append(r)
            produced.update(o for o in fe.outs if o >= 0)
        outs = sorted(o for o in produced if last.get(o, -1) >= s.stop)
        seg_io.append((tuple(needed), tuple(outs)))

    def run_eqns(seg: Segment, env: dict, tag: bool):
        for k in range(seg.start, seg.stop):
            fe = flat.eqns[k]
            invals = [r[1] if isinstance(r, tuple) else env[r] for r in fe.ins]
            outvals = _bind(fe.eqn, invals)
            if tag and eqn_node[k] in seg.saved_nodes:
                name = _tag(eqn_node[k])
                outvals = [_name(v, name) for v in outvals]
            for o, v in zip(fe.outs, outvals):
                if o >= 0:
                    env[o] = v

    def fun(*flat_args):
        env = dict(flat.consts)
        env.update(zip(flat.in_ids, flat_args))
        for seg, (ins, outs) in zip(segs, seg_io):
            if not seg.remat:
                run_eqns(seg, env, tag=False)
                continue

            def seg_fn(*vals, _seg=seg, _ins=ins, _outs=outs):
                senv = dict(flat.consts)
                senv.update(zip(_ins, vals))
                run_eqns(_seg, senv, tag=True)
                return tuple(senv[o] for o in _outs)

            pol = jax.checkpoint_policies.save_only_these_names(*(_tag(n) for n in seg.saved_nodes))
            res = jax.checkpoint(seg_fn, policy=pol, prevent_cse=prevent_cse)(*(env[i] for i in ins))
            env.update(zip(outs, res))
        return [r[1] if isinstance(r, tuple) else env[r] for r in flat.out_refs]

    return fun


def _name(v, name):
    dt = getattr(v, "dtype", None)
    if dt is None or jax.dtypes.issubdtype(dt, jax.dtypes.prng_key):
        return v
    return checkpoint_name(v, name)


# --------------------------------------------------------------------------- eqn -> node map
def _scope_fn():
    from remat.extraction import scope_of

    return scope_of


def map_eqns_to_nodes(flat_eqns: Sequence[Any], forward_scopes: Sequence[Sequence[str]], scope_of=None) -> np.ndarray:
    """Forward node index of each equation (non-decreasing), from scope keys.

    Node ``i`` covers the scope keys ``forward_scopes[i]``.  Each equation goes to the first node
    at or after the current one that covers its scope; an equation whose scope no later node
    covers (glue code between modules) stays with the current node.

    Args:
      flat_eqns: the equations of the forward-only jaxpr, in order (``JaxprEqn`` objects).
      forward_scopes: per forward node, the scope keys it covers.
      scope_of: ``eqn -> str`` (default ``remat.extraction.scope_of``).
    """
    if scope_of is None:
        scope_of = _scope_fn()
    where: dict[str, list[int]] = {}
    for i, keys in enumerate(forward_scopes):
        for key in keys:
            where.setdefault(key, []).append(i)
    cur = 0
    out = np.zeros(len(flat_eqns), dtype=np.int64)
    for k, e in enumerate(flat_eqns):
        cands = where.get(scope_of(e), ())
        nxt = [i for i in cands if i >= cur]
        if nxt:
            cur = nxt[0]
        out[k] = cur
    return out


# --------------------------------------------------------------------------- the applied object
@dataclasses.dataclass(frozen=True, eq=False)
class Applied:
    """A plan applied to a function at one input signature.

    Attributes:
      graph: the extracted training graph (at micro-batch size when micro-batching).
      plan: the policy's plan (``None`` for ``policy=None``).
      saved: ``plan.saved_forward(graph)``.
      segments: the checkpoint segments (see :func:`plan_segments`).
      fn: the rematerialized function, same signature and outputs as the original.
      plan_time_s: extraction + planning + interpretation set-up time, seconds.
      recompute_dots: dot_general/conv equations the backward pass recomputes (equations of
        rematerialized segments outside their saved stages); :func:`remat.measure` uses it to
        check that compilation kept the recomputation.
    """

    graph: Any
    plan: Any
    saved: frozenset
    segments: tuple[Segment, ...]
    fn: Callable
    plan_time_s: float
    recompute_dots: int = 0


def _abstract(args):
    def f(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, a.dtype)

    return jax.tree_util.tree_map(f, args)


def _signature(args) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return (tree, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x)))) for x in leaves))


def _loss_only(fn, has_aux):
    if not has_aux:
        return fn

    def loss(*a):
        return fn(*a)[0]

    return loss


def apply_plan(
    fn: Callable,
    args: Sequence[Any],
    policy: Any,
    *,
    budget: Any = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    stages: Any = "auto",
    graph: Any = None,
    plan: Any = None,
) -> Applied:
    """Extract, plan and build the rematerialized version of ``fn`` at ``args``' shapes.

    Args:
      fn: the loss function (returns a scalar, or ``(scalar, aux)`` with ``has_aux``).
      args: example arguments (arrays or ``jax.ShapeDtypeStruct``; only shapes are used).
      policy: a policy object, a registry name, or ``None`` (no remat).
      graph, plan: reuse an already extracted graph / made plan (``plan`` needs ``graph``).
    """
    import time

    t0 = time.perf_counter()
    abstract = _abstract(tuple(args))
    pol = resolve_policy(policy, budget)
    if pol is None and plan is None:
        return Applied(None, None, frozenset(), (), fn, time.perf_counter() - t0)
    loss = _loss_only(fn, has_aux)
    if graph is None:
        import remat

        graph = remat.extract(loss, *abstract, stages=stages, argnums=argnums)
    if plan is None:
        plan = _make_plan(pol, graph, budget)
    if plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    saved = plan.saved_forward(graph)
    closed = jax.make_jaxpr(fn)(*abstract)
    flat = _flatten(closed)
    fscopes = graph.program.forward_scopes
    eqn_node = map_eqns_to_nodes([fe.eqn for fe in flat.eqns], fscopes)
    interp = _interpret(flat, eqn_node, saved)
    in_tree = jax.tree_util.tree_structure(tuple(abstract))
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *abstract))

    def remat_fn(*a):
        leaves, tree = jax.tree_util.tree_flatten(tuple(a))
        if tree != in_tree:
            raise RematError(f"argument structure changed: {tree} vs {in_tree}")
        return jax.tree_util.tree_unflatten(out_tree, interp(*leaves))

    segs = plan_segments(eqn_node, saved)
    dots = 0
    for sg in segs:
        if sg.remat:
            dots += sum(
                1
                for k in range(sg.start, sg.stop)
                if eqn_node[k] not in sg.saved_nodes
                and flat.eqns[k].eqn.primitive.name in ("dot_general", "conv_general_dilated")
            )
    return Applied(graph, plan, saved, segs, remat_fn, time.perf_counter() - t0, dots)


# --------------------------------------------------------------------------- public API
class _Transform:
    """Callable returned by :func:`value_and_grad` / :func:`grad` / :func:`checkpoint`."""

    def __init__(self, fn, policy, *, budget, microbatches, argnums, has_aux, stages, reduction,
                 mode, microbatch_aux="stack"):
        if reduction not in ("mean", "sum"):
            raise RematError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if microbatch_aux not in ("stack", "last"):
            raise RematError(f"microbatch_aux must be 'stack' or 'last', got {microbatch_aux!r}")
        if microbatches is not None and (int(microbatches) != microbatches or microbatches < 1):
            from remat.microbatch import MicrobatchError

            raise MicrobatchError(f"microbatches must be a positive integer, got {microbatches!r}")
        self.fn = fn
        self.policy = resolve_policy(policy, budget)  # fail fast on unknown names
        self.budget = budget
        self.microbatches = int(microbatches or 1)
        self.argnums = argnums
        self.has_aux = has_aux
        self.stages = stages
        self.reduction = reduction
        self.mode = mode
        self.microbatch_aux = microbatch_aux
        self._cache: dict = {}
        self._lock = threading.Lock()
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__doc__ = getattr(fn, "__doc__", None)

    # -- the plan at these arguments (cached per shapes/dtypes/treedef)
    def applied(self, *args) -> Applied:
        """The :class:`Applied` plan for ``args`` (micro-batch sized when micro-batching)."""
        from remat.microbatch import microbatch_args

        k = self.microbatches
        margs = microbatch_args(args, self.argnums, k) if k > 1 else _abstract(tuple(args))
        key = _signature(margs)
        with self._lock:
            hit = self._cache.get(key)
        if hit is None:
            if self.mode != "checkpoint":
                _check_scalar(self.fn, margs, self.has_aux)
            # planning runs real computations (device calibration, solvers): never stage them
            # into an enclosing jit trace
            from jax._src.core import eval_context

            with eval_context():
                hit = apply_plan(
                    self.fn, margs, self.policy, budget=self.budget, argnums=self.argnums,
                    has_aux=self.has_aux, stages=self.stages,
                )
            if k > 1 and hit.plan is not None:
                hit = dataclasses.replace(hit, plan=dataclasses.replace(hit.plan, microbatches=k))
            with self._lock:
                self._cache[key] = hit
        return hit

    def __call__(self, *args):
        app = self.applied(*args)
        if self.mode == "checkpoint":
            return app.fn(*args)
        vg = jax.value_and_grad(app.fn, argnums=self.argnums, has_aux=self.has_aux)
        if self.microbatches > 1:
            from remat.microbatch import accumulate

            out = accumulate(
                vg, args, self.argnums, self.microbatches, reduction=self.reduction,
                has_aux=self.has_aux, aux_mode=self.microbatch_aux,
            )
        else:
            out = vg(*args)
        return out[1] if self.mode == "grad" else out


def _check_scalar(fn, args, has_aux):
    out = jax.eval_shape(fn, *args)
    loss = out[0] if has_aux else out
    shape = getattr(loss, "shape", None)
    if shape != ():
        raise ExtractionError(f"the loss must be a scalar, got shape {shape}")
    if not jax.dtypes.issubdtype(loss.dtype, np.floating):
        raise ExtractionError(f"the loss must be a float scalar, got dtype {loss.dtype}")


def value_and_grad(
    fn: Callable,
    policy: Any = None,
    *,
    budget: int | str | None = None,
    microbatches: int | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    stages: Any = "auto",
    reduction: str = "mean",
    microbatch_aux: str = "stack",
) -> Callable:
    """Drop-in for ``jax.value_and_grad`` that applies a rematerialization plan.

    Args:
      fn: ``fn(*args)`` returning a float scalar loss (or ``(loss, aux)`` with ``has_aux``).
      policy: ``None`` (no remat), a policy object (``policies.SqrtN()``) or a registry name
        (``"sqrtn"``, ``"checkmate"``).
      budget: activation-memory budget in bytes or a string (``"60%"``, ``"512MiB"``), passed to
        ``policy.plan``.
      microbatches: split the non-differentiated arguments into this many micro-batches along
        axis 0 and accumulate with ``lax.scan``; ``None``/1 = no split.
      argnums, has_aux: as in ``jax.value_and_grad``.
      stages: the extractor's stage grouping (``"auto"``, ``"module"``, ``"eqn"`` or an int).
      reduction: ``"mean"`` (the loss is a mean over the batch: value and grads are the mean of
        the micro-batch ones) or ``"sum"`` (summed).
      microbatch_aux: with ``has_aux`` and micro-batches: ``"stack"`` returns the aux of every
        micro-batch stacked on a new leading axis of size k; ``"last"`` the last micro-batch's
        (for BatchNorm-style ``(loss, new_state)`` losses: the state updated by the last
        micro-batch, each micro-batch starting from the given state).

    Returns:
      A jit-able function returning what ``jax.value_and_grad(fn, argnums, has_aux)`` returns
      (with micro-batches: the reduction of the per-micro-batch results).  Plans are cached per
      argument shapes/dtypes/tree structure; ``f.applied(*args)`` gives the graph, plan and
      segments used.

    Raises:
      UnknownNameError: unknown policy name.
      MicrobatchError: ``microbatches`` does not divide the batch.
      ExtractionError: the loss is not a float scalar.
    """
    return _Transform(fn, policy, budget=budget, microbatches=microbatches, argnums=argnums,
                      has_aux=has_aux, stages=stages, reduction=reduction, mode="value_and_grad",
                      microbatch_aux=microbatch_aux)


def grad(fn: Callable, policy: Any = None, **kwargs: Any) -> Callable:
    """Drop-in for ``jax.grad``: :func:`value_and_grad` returning only the gradients
    (``(grads, aux)`` with ``has_aux``, as ``jax.grad``)."""
    t = value_and_grad(fn, policy, **kwargs)
    t.mode = "grad"
    if t.has_aux:
        t.mode = "grad_aux"

        def g(*args):
            (_, aux), grads = _Transform.__call__(_as_vg(t), *args)
            return grads, aux

        g.applied = t.applied  # type: ignore[attr-defined]
        return g
    return t


def _as_vg(t: _Transform) -> _Transform:
    t2 = object.__new__(_Transform)
    t2.__dict__.update(t.__dict__)
    t2.mode = "value_and_grad"
    return t2


def checkpoint(
    fn: Callable,
    policy: Any = None,
    *,
    budget: int | str | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    stages: Any = "auto",
) -> Callable:
    """``fn`` with the plan's ``jax.checkpoint`` segments applied: same signature and outputs;
    differentiate it yourself (``jax.grad(remat.checkpoint(loss, "sqrtn"))``).  ``argnums`` names
    the differentiated (parameter) arguments for extraction."""
    return _Transform(fn, policy, budget=budget, microbatches=None, argnums=argnums,
                      has_aux=has_aux, stages=stages, reduction="mean", mode="checkpoint")


def checkpoint_policy(plan_or_policy: Any, graph: Any, *, budget: Any = None) -> Callable:
    """A plain ``jax.checkpoint`` policy saving the plan's saved forward stages by name.

    The returned callable is ``jax.checkpoint_policies.save_only_these_names(*names)`` where
    ``names`` are the scope keys of the plan's saved forward stages
    (``graph.program.forward_scopes``; node names without the ``fwd/`` prefix for loaded graphs).
    It saves a value when the user tagged it with ``checkpoint_name(value, <scope key>)`` and that
    stage is saved: use it with ``jax.checkpoint(f, policy=...)``, ``flax.linen.remat(Module,
    policy=...)`` (also under ``nn.scan``) or ``flax.nnx.remat(..., policy=...)``.  The names are
    ``policy.saveable_names`` (a frozenset).

    Args:
      plan_or_policy: a :class:`~remat.Plan` for ``graph``, or a policy object / registry name
        (planned on ``graph`` with ``budget``).
      graph: the training graph the plan refers to.
    """
    from remat.plan import Plan

    if isinstance(plan_or_policy, Plan):
        plan = plan_or_policy
    else:
        pol = resolve_policy(plan_or_policy, budget)
        if pol is None:
            raise RematError("checkpoint_policy needs a plan or a policy, got None")
        plan = _make_plan(pol, graph, budget)
    if plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    saved = sorted(plan.saved_forward(graph))
    names: set[str] = set()
    prog = getattr(graph, "program", None)
    fscopes = getattr(prog, "forward_scopes", None) if prog is not None else None
    for i in saved:
        if fscopes is not None and i < len(fscopes):
            names.update(str(s) for s in fscopes[i])
        else:
            nm = graph.nodes[i].name
            names.add(nm[4:] if nm.startswith("fwd/") else nm)
    return jax.checkpoint_policies.save_only_these_names(*sorted(names))


