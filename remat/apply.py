"""Apply a plan to a real JAX function: a drop-in ``jax.value_and_grad`` with rematerialization.

``remat.value_and_grad(fn, policy)`` extracts ``fn``'s training graph (:func:`remat.extract`),
asks ``policy`` for a :class:`~remat.Plan`, and re-evaluates ``fn``'s *forward program* (the
flattened ``jax.make_jaxpr(fn)`` the extractor grouped into stages, :mod:`remat.frontend`) with
``jax.checkpoint`` segments (:mod:`remat.segments`).  Every forward-program equation belongs to
exactly the stage the extractor put it in (``graph.program.fwd_node``): no matching by name, so
plain JAX, Flax linen, Flax nnx and pytree-module code are rematerialized alike.

A stage the plan computes ``c`` times sits in ``c - 1`` nested checkpoints; the values kept
between segments are what crosses the segment boundaries.  What cannot be realised exactly
through ``jax.checkpoint`` is measured and said, never hidden (:class:`Applied`
``.predicted_residual_bytes`` / ``.residual_bytes`` / ``.notes``; a :class:`RematFidelityWarning`
when the realisation keeps more than 10% more bytes than the plan counted):

* a value read across a segment boundary from a recomputed stage (a skip connection) is kept,
  because ``jax.checkpoint`` saves the inputs of a checkpointed segment;
* paging (POET page-outs): on a backend that realises offloading (probed once, GPU), a paged
  forward value is offloaded to ``pinned_host`` where it enters a checkpointed segment
  (:mod:`remat.offload`: ``Applied.offloaded_bytes``); elsewhere (XLA:CPU) it is kept on the
  device, with a note and a warning (``remat.execute`` runs paging for real).

Budgets: ``budget`` is the compiled step's temp bytes (``"50%"`` of the compiled no-remat
step's), met by :mod:`remat.compiled_budget`'s closed loop; ``remat.modelled(spec)`` hands a
budget on the graph's modelled peak to the policy instead.

Length: the interpreter, the application of one plan and the public transforms share the
segment walk and the per-signature plan cache; the closed loop itself lives in
:mod:`remat.compiled_budget`.

Micro-batching: with ``microbatches=k`` the batch is split along axis 0 and the
per-micro-batch ``value_and_grad`` of the rematerialized function is accumulated with
``lax.scan`` (:func:`remat.microbatch.accumulate`); the plan is made on the graph extracted at
micro-batch size.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from remat import sharding
from remat.compiled_budget import (
    MAX_COMPILES,
    budget_semantics,
    compiled_notes,
    fit,
    plan_key,
    recomputes,
    step_compiled,
    step_temp_bytes,
    takes_budget,
    temp_bytes,
)
from remat.core.budget import Modelled
from remat.core.context import PolicyContext
from remat.core.errors import ExtractionError, InvalidPlanError, RematError
from remat.fidelity import (
    FIDELITY_RTOL,
    Applied,
    RematFidelityWarning,
    fidelity_notes,
    predicted_residual_bytes,
    realised_residual_bytes,
    scan_decisions,
)
from remat.flops import jaxpr_flops
from remat.interpreter import as_function, interpreter, plan_segments_of
from remat.microbatch import microbatch, microbatch_args
from remat.offload import plan_offload
from remat.planning import execute_microbatched, make_plan, planning_context, resolve_policy
from remat.segments import Segment, plan_segments
from remat.sharded_memory import predict_sharded_temp_bytes
from remat.xla_memory import predict_temp_bytes

__all__ = [
    "value_and_grad",
    "grad",
    "checkpoint",
    "checkpoint_policy",
    "resolve_policy",
    "plan_segments",
    "predicted_residual_bytes",
    "apply_plan",
    "execute_microbatched",
    "Applied",
    "Segment",
    "RematFidelityWarning",
    "FIDELITY_RTOL",
    "planning_context",
]

_CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated"})


def _abstract(args):
    """Abstract arguments; a leaf's sharding over several devices is kept
    (:func:`remat.sharding.abstract`), so the compiled figures of a sharded step are per device."""
    return sharding.abstract(args)


def _signature(args) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return (tree, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x)))) for x in leaves),
            sharding.signature(args))


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
    warn: bool = True,
    choose_microbatches: bool = True,
    max_compiles: int = MAX_COMPILES,
) -> Applied:
    """Extract, plan and build the rematerialized version of ``fn`` at ``args``' shapes.

    Args:
      fn: the loss function (returns a scalar, or ``(scalar, aux)`` with ``has_aux``).
      args: example arguments (arrays or ``jax.ShapeDtypeStruct``; only shapes are used).
      policy: a policy object, a registry name, or ``None`` (no remat).
      budget: the compiled step's temp bytes (``12e9``, ``"12GiB"``, ``"50%"`` of the compiled
        no-remat step's temp), met by the closed loop of :mod:`remat.compiled_budget`; or
        :func:`remat.core.budget.modelled` ``(spec)``, handed to the policy as a budget on the graph's
        modelled peak; ``None``: the policy's own budget option (modelled).
      graph, plan: reuse an already extracted graph / made plan (``plan`` needs ``graph``,
        extracted from ``fn`` with the same ``has_aux``).
      warn: emit a :class:`RematFidelityWarning` when the realisation is not exact.
      choose_microbatches: let the policy choose ``Plan.microbatches`` (through
        ``ctx.graph_at``); a plan of ``k`` micro-batches is then applied to the graph at
        ``1/k`` of the batch, and the caller accumulates ``k`` micro-batches.
      max_compiles: compiles of distinct plans the closed loop may spend.

    Raises:
      InfeasibleBudgetError: no plan of the policy compiles within a compiled budget
        (``min_feasible_bytes``: the smallest compiled temp it reached), or the policy refused a
        modelled budget (its smallest feasible modelled budget).
    """
    t0 = time.perf_counter()
    abstract = _abstract(tuple(args))
    pol = resolve_policy(policy, budget)
    if pol is None and plan is None:
        return Applied(None, None, frozenset(), (), fn, time.perf_counter() - t0)
    if stages == "auto" and pol is not None:  # a policy may plan at its own granularity
        stages = getattr(pol, "preferred_stages", None) or stages
    if graph is None:
        from remat.extraction import extract

        graph = extract(fn, *abstract, stages=stages, argnums=argnums, has_aux=has_aux)
    sharded = sharding.is_sharded(abstract)
    base_compiled = None
    if sharded and "sharding" not in graph.meta:
        # a sharded step is planned per device (bytes of the shards XLA propagates, the
        # gathered parameters, the collectives: remat.sharding); micro-batches are not chosen
        base_compiled = step_compiled(_realise(graph, None, abstract, has_aux=has_aux).fn,
                                      abstract, argnums=argnums, has_aux=has_aux)
        graph = sharding.per_device_graph(graph, abstract, step_hlo=base_compiled.as_text())
    ctx = None
    if plan is None and choose_microbatches and not sharded:
        ctx = planning_context(fn, abstract, graph, argnums=argnums, has_aux=has_aux,
                               stages=stages)

    def realise(p, b):
        g, a = graph, abstract
        if p.microbatches > 1:  # the policy chose micro-batches: its columns are graph_at(k)
            g = ctx.graph_at(p.microbatches) if ctx is not None else graph
            a = _abstract(microbatch_args(abstract, argnums, p.microbatches))
        return dataclasses.replace(_realise(g, p, a, has_aux=has_aux), abstract_args=a)

    def baseline_temp():  # the forward program without checkpoints: fn's own step
        if base_compiled is not None:
            return temp_bytes(base_compiled)
        return step_temp_bytes(_realise(graph, None, abstract, has_aux=has_aux).fn, abstract,
                               argnums=argnums, has_aux=has_aux)

    def step_temp(a):  # the step as it runs: k micro-batches accumulated over the full batch
        k = a.plan.microbatches if a.plan is not None else 1
        if k == 1:
            return step_temp_bytes(a.fn, a.abstract_args, argnums=argnums, has_aux=has_aux)
        vg = microbatch(jax.value_and_grad(a.fn, argnums=argnums, has_aux=has_aux), k,
                        argnums=argnums, has_aux=has_aux)
        return temp_bytes(jax.jit(vg).lower(*abstract).compile())

    @functools.cache
    def base_flops() -> float:  # the no-remat step's jaxpr FLOPs (the loop's cost of trimming)
        step = jax.value_and_grad(_realise(graph, None, abstract, has_aux=has_aux).fn,
                                  argnums=argnums, has_aux=has_aux)
        return jaxpr_flops(jax.make_jaxpr(step)(*abstract))

    semantics, target, baseline, notes = budget_semantics(budget, plan, baseline_temp)
    rounds: tuple = ()
    compiled = None
    if plan is not None:
        app = realise(plan, None)
    elif semantics == "compiled" and takes_budget(pol):
        def plan_at(b):
            # every plan is compiled and checked: the policy may go below its modelled floor;
            # each plan gets the policy's whole time limit (``started`` now)
            loop_ctx = dataclasses.replace(ctx or PolicyContext(), compiled_budget=True,
                                           started=time.perf_counter())
            return realise(make_plan(pol, graph, int(b), loop_ctx), b)

        first = int(math.ceil(target * graph.no_remat_peak() / max(baseline, 1)))
        result = fit(plan_at, step_temp,
                     target, first_budget=first, recomputes=recomputes,
                     policy_name=repr(getattr(pol, "name", type(pol).__name__)),
                     max_compiles=max_compiles,
                     predict_of=_predictor(graph, abstract, baseline, sharded),
                     cost_of=_cost_with_trimming(base_flops, argnums, has_aux),
                     ceiling_budget=graph.no_remat_peak())
        app, rounds, compiled = result.applied, result.rounds, result.compiled_temp
    else:
        spec = None if semantics == "compiled" else (
            budget.spec if isinstance(budget, Modelled) else budget)
        app = realise(make_plan(pol, graph, spec, ctx), spec)
    if semantics == "compiled":
        if not rounds:
            compiled = step_temp(app)
        notes += compiled_notes(app, compiled, target, baseline, rounds)
    if plan is None and app.plan is not None and app.plan.microbatches > 1:
        why = app.plan.meta.get("microbatch_reason")
        notes = [*notes, f"the policy chose {app.plan.microbatches} accumulated micro-batches"
                 + (f": {why}" if why else "")]
    warns = list(app.warnings)
    for n in notes:
        if n.startswith("warning: "):
            warns.append(n[len("warning: "):])
    notes = [n[len("warning: "):] if n.startswith("warning: ") else n for n in notes]
    if warns and warn:
        warnings.warn(f"remat: plan of {app.plan.meta.get('policy')!r} not realised exactly: "
                      + "; ".join(warns), RematFidelityWarning, stacklevel=3)
    return dataclasses.replace(
        app, plan_time_s=time.perf_counter() - t0, notes=app.notes + tuple(notes),
        warnings=tuple(warns), budget_semantics=semantics, budget_bytes=target,
        baseline_temp_bytes=baseline, compiled_temp_bytes=compiled, rounds=tuple(rounds))


def _modelled_cost(a) -> float:
    """The plan's modelled compute cost over the whole batch (``meta["compute_cost"]``, per
    micro-batch, times the micro-batches); ``inf`` when the policy reported none."""
    c = a.plan.meta.get("compute_cost")
    return math.inf if c is None else float(c) * int(a.plan.microbatches)


def _trimmed(a) -> bool:
    """Some level-1 checkpoint of the applied plan holds only stages the plan keeps (segment
    trimming, :func:`remat.segments.plan_segments`): JAX then recomputes inside it what the
    backward reads, work the plan's own compute counts do not hold."""
    return any(s.remat and s.saves is None and len(s.kept) == len(s.nodes) for s in a.segments)


def _cost_with_trimming(base_flops: Callable[[], float], argnums, has_aux) -> Callable:
    """The loop's cost of an applied plan: :func:`_modelled_cost` times
    ``max(1, F_applied / F_planned)`` where the plan trims kept stages (:func:`_trimmed`), else
    the modelled cost.

    ``F_applied`` is the applied step's jaxpr FLOPs over the no-remat step's
    (:func:`remat.flops.jaxpr_flops`, ``k`` micro-batches counted ``k`` times) and
    ``F_planned = sum_i runs_i flops_i / sum_i flops_i`` over the plan's graph, so the
    recomputation the trimmed checkpoints add is charged at the plan's own cost per FLOP (on a
    plain-JAX transformer the plan that keeps every stage runs 1.22x the FLOPs it plans).
    ``base_flops()``: the no-remat step's jaxpr FLOPs at the full batch."""
    seen: dict[bytes, float] = {}

    def cost(a) -> float:
        c = _modelled_cost(a)
        if not math.isfinite(c) or not _trimmed(a):
            return c
        key = plan_key(a)
        if key not in seen:
            flops = np.asarray(a.graph.flops_array, dtype=np.float64)
            runs = np.asarray(a.plan.R).sum(axis=0)
            planned = float((runs * flops).sum()) / max(float(flops.sum()), 1e-30)
            step = jax.value_and_grad(a.fn, argnums=argnums, has_aux=has_aux)
            applied = (jaxpr_flops(jax.make_jaxpr(step)(*a.abstract_args))
                       * int(a.plan.microbatches) / max(base_flops(), 1e-30))
            seen[key] = max(1.0, applied / planned) if planned > 0 else 1.0
        return c * seen[key]

    return cost


def _predictor(graph, abstract, baseline: int, sharded: bool):
    """An applied plan's predicted compiled temp (:mod:`remat.xla_memory`, per device for a
    sharded step: :mod:`remat.sharded_memory`) times the no-remat step's compiled over
    predicted temp; ``None`` where the model does not predict this program, or where tracing
    the user's function again fails (a Flax nnx module's function mutates its batch statistics:
    ``TraceContextError``); the loop then compiles from its ratio's first budget."""
    def raw(g, plan, fn=None, args=None):
        if sharded:
            return predict_sharded_temp_bytes(g, plan, args, fn=fn)
        return predict_temp_bytes(g, plan, fn=fn)

    try:
        base = int(raw(graph, None, args=abstract))
    except Exception:  # noqa: BLE001 - predictions only choose where the compiles start
        return None
    if base <= 0:
        return None
    ratio = baseline / base

    def predict_of(a) -> int:
        return int(ratio * raw(a.graph, a.plan, fn=a.fn, args=a.abstract_args))

    return predict_of


def _realise(graph, plan, abstract, *, has_aux) -> Applied:
    """The :class:`Applied` of ``plan`` on ``graph`` (no compile): segments, the interpreter,
    predicted vs realised residual bytes."""
    t0 = time.perf_counter()
    prog = graph.program
    if prog is None or prog.forward is None:
        raise ExtractionError("the graph carries no forward program (it was not extracted)")
    if plan is None:  # no checkpoints: the forward program as extracted
        nfwd = int((~graph.is_backward_array).sum())
        segs = plan_segments(prog.forward, prog.fwd_node, np.ones(nfwd, np.int64), trim=False)
        return Applied(graph, None, frozenset(), segs,
                       as_function(interpreter(prog.forward, segs), abstract, prog.fwd_out_tree), 0.0)
    if plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    decisions = scan_decisions(prog, plan)
    segs = plan_segments_of(graph, plan)
    off = plan_offload(graph, plan, segs, jax.default_backend())
    remat_fn = as_function(interpreter(prog.forward, segs, scans=decisions, offload=off.tags),
                           abstract, prog.fwd_out_tree)
    dots = sum(
        1
        for sg in segs if sg.remat
        for k in range(sg.start, sg.stop)
        if int(prog.fwd_node[k]) not in sg.kept
        and prog.forward.eqns[k].name in _CONTRACTIONS
    )
    loss_only = remat_fn if not has_aux else (lambda *a: remat_fn(*a)[0])
    realised = realised_residual_bytes(loss_only, abstract)
    predicted = predicted_residual_bytes(graph, plan, segs)
    notes, warns = fidelity_notes(graph, plan, segs, predicted, realised)
    decided = [d for d, _ in decisions.values()]
    if decided:
        from remat.scans import adjusted_graph

        flops_graph = adjusted_graph(graph, decided)
    else:
        flops_graph = graph
    return Applied(graph, plan, plan.saved_forward(graph), segs, remat_fn,
                   time.perf_counter() - t0, dots, predicted, realised,
                   (*off.notes, *notes), (*off.warnings, *warns),
                   float(plan.R.sum(axis=0) @ flops_graph.flops_array),
                   offloaded_bytes=off.offloaded_bytes)


# --------------------------------------------------------------------------- public API
class _Transform:
    """Callable returned by :func:`value_and_grad` / :func:`grad` / :func:`checkpoint`."""

    def __init__(self, fn, policy, *, budget, microbatches, argnums, has_aux, stages, reduction,
                 mode, microbatch_aux="stack"):
        from remat.core.errors import MicrobatchError

        if reduction not in ("mean", "sum"):
            raise RematError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if microbatch_aux not in ("stack", "last"):
            raise RematError(f"microbatch_aux must be 'stack' or 'last', got {microbatch_aux!r}")
        if microbatches is not None and (int(microbatches) != microbatches or microbatches < 1):
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
        self.choose_microbatches = True  # may the policy choose Plan.microbatches
        self._cache: dict = {}
        self._lock = threading.Lock()
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__doc__ = getattr(fn, "__doc__", None)

    # -- the plan at these arguments (cached per shapes/dtypes/treedef)
    def applied(self, *args) -> Applied:
        """The :class:`Applied` plan for ``args`` (micro-batch sized when micro-batching)."""
        k = self.microbatches
        margs = microbatch_args(args, self.argnums, k) if k > 1 else _abstract(tuple(args))
        key = _signature(margs)
        shapes_key = key[:2]
        traced_mesh = sharding.traced_mesh_size(args) if not sharding.is_sharded(margs) else 1
        with self._lock:
            hit = self._cache.get(key)
            if hit is None and traced_mesh > 1:
                # inside jax.jit the arguments' shardings are not visible: reuse the plan made
                # per device at the same shapes (``f.applied(*sharded_args)`` before jit)
                hit = self._cache.get(("sharded",) + shapes_key)
        if hit is None:
            # planning runs real computations (device calibration, solvers): never stage them
            # into an enclosing jit trace
            from remat._jax_compat import eval_context

            with eval_context():
                hit = apply_plan(
                    self.fn, margs, self.policy, budget=self.budget, argnums=self.argnums,
                    has_aux=self.has_aux, stages=self.stages,
                    choose_microbatches=k == 1 and self.choose_microbatches,
                )
            if k > 1 and hit.plan is not None:
                hit = dataclasses.replace(hit, plan=dataclasses.replace(hit.plan, microbatches=k))
            if traced_mesh > 1 and hit.plan is not None:
                msg = (f"the step is traced inside jax.jit on a mesh of {traced_mesh} devices, "
                       "where the arguments' shardings are not visible: it was planned as the "
                       "unsharded program, so its budget is not per device; call "
                       "f.applied(*args) with the sharded arrays (or ShapeDtypeStructs with "
                       "their sharding) before jax.jit to plan per device")
                warnings.warn(f"remat: {msg}", RematFidelityWarning, stacklevel=3)
                hit = dataclasses.replace(hit, notes=hit.notes + (msg,),
                                          warnings=hit.warnings + (msg,))
            with self._lock:
                self._cache[key] = hit
                if sharding.is_sharded(margs):
                    self._cache[("sharded",) + shapes_key] = hit
        return hit

    def __call__(self, *args):
        if self.mode != "checkpoint" and not self._cache:
            _check_scalar(self.fn, _abstract(tuple(args)), self.has_aux)
        app = self.applied(*args)
        if self.mode == "checkpoint":
            return app.fn(*args)
        vg = jax.value_and_grad(app.fn, argnums=self.argnums, has_aux=self.has_aux)
        k = app.plan.microbatches if app.plan is not None else self.microbatches
        out = microbatch(vg, k, argnums=self.argnums, reduction=self.reduction,
                         has_aux=self.has_aux, aux_mode=self.microbatch_aux)(*args)
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
      stages: the extractor's stage grouping (``"auto"``, ``"module"``, ``"layer"``, ``"eqn"`` or
        an int).
      reduction: ``"mean"`` (the loss is a mean over the batch: value and grads are the mean of
        the micro-batch ones) or ``"sum"`` (summed).
      microbatch_aux: with ``has_aux`` and micro-batches: ``"stack"`` returns the aux of every
        micro-batch stacked on a new leading axis of size k; ``"last"`` the last micro-batch's
        (for BatchNorm-style ``(loss, new_state)`` losses).

    Returns:
      A jit-able function returning what ``jax.value_and_grad(fn, argnums, has_aux)`` returns
      (with micro-batches: the reduction of the per-micro-batch results).  Plans are cached per
      argument shapes/dtypes/tree structure; ``f.applied(*args)`` gives the graph, plan,
      segments and the predicted vs realised saved bytes (:class:`Applied`).

    Raises:
      UnknownNameError: unknown policy name.
      MicrobatchError: ``microbatches`` does not divide the batch.
      ExtractionError: the loss is not a float scalar.

    Warns:
      RematFidelityWarning: the plan could not be realised exactly (see :class:`Applied`).
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
    ``policy.saveable_names`` (a frozenset).  For a scan planner's plan (``plan.meta["scans"]``,
    :class:`policies.ScanLayers`) it is the scan body's policy instead
    (:func:`remat.scans.plan_policy`): pass it to ``nn.scan(nn.remat(Block, policy=...))`` or
    ``jax.checkpoint(body, policy=...)``; it recognises the kept values by primitive, shapes and
    parameters, no names needed.

    Args:
      plan_or_policy: a :class:`~remat.Plan` for ``graph``, or a policy object / registry name
        (planned on ``graph`` with ``budget``).
      graph: the training graph the plan refers to.
    """
    from remat.core.plan import Plan

    if isinstance(plan_or_policy, Plan):
        plan = plan_or_policy
    else:
        pol = resolve_policy(plan_or_policy, budget)
        if pol is None:
            raise RematError("checkpoint_policy needs a plan or a policy, got None")
        plan = make_plan(pol, graph, budget)
    if plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    if "scans" in plan.meta:  # a scan planner's plan: the scan body's policy
        from remat.scans import plan_policy

        return plan_policy(graph, plan.meta["scans"])
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
    from remat._jax_compat import save_only_these_names

    return save_only_these_names(*sorted(names))


