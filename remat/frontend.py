"""The one JAX front end: flatten a traced program, evaluate its equations, name its origins.

Extraction (:mod:`remat.extraction`), application (:mod:`remat.apply`) and the executor all
read jaxprs through this module, so there is one flattener, one equation evaluator and one
batch-size rule.

Two flattenings of a loss ``fn`` are used:

* the **forward program** ``flatten(jax.make_jaxpr(fn), INLINE_FORWARD)``: call wrappers
  (``jit``, ``closed_call``, ...) and ``jax.checkpoint`` regions are inlined; custom-derivative
  calls (``custom_jvp_call``, ``custom_vjp_call``) stay single *leaf* equations, because
  inlining them would change how the function is differentiated.  Stages are groups of its
  leaf equations, and the applier re-evaluates exactly these equations;
* the **training program** ``flatten(jax.make_jaxpr(value_and_grad(marked)), INLINE_ALL)``
  where ``marked`` evaluates the forward program with every leaf equation ``k`` bound under an
  extra name scope ``ORIGIN_PREFIX + str(k)``.  JAX keeps name scopes through ``jvp`` and
  ``transpose``, so every equation of the training program names the forward leaf it comes from
  (:func:`origin_of`): the identity of an equation, recorded once, instead of a guess from
  module names.

Value ids: a :class:`FlatJaxpr` numbers every value (arguments, constants, equation results)
with consecutive ints; literals are :class:`Lit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np

from remat import _jax_compat as compat

__all__ = [
    "INLINE_FORWARD",
    "INLINE_ALL",
    "ORIGIN_PREFIX",
    "Lit",
    "LeafEqn",
    "FlatJaxpr",
    "flatten",
    "bind",
    "evaluate",
    "dce",
    "origin_of",
    "scope_of",
    "scope_from_stack",
    "is_transpose",
    "batch_size",
    "is_key",
]

# call-like primitive name -> the parameter holding its body (:mod:`remat._jax_compat`)
INLINE_FORWARD: dict[str, str] = dict(compat.CALL_BODY)
"""Inlined in the forward program: call wrappers and ``jax.checkpoint`` (the plan decides what is
recomputed); custom-derivative calls stay leaves."""
INLINE_ALL: dict[str, str] = {**compat.CALL_BODY, **compat.CUSTOM_BODY}
"""Inlined in the training program (costs need the leaf primitives)."""

ORIGIN_PREFIX = "remat@"
"""Name-scope prefix marking the forward leaf an equation of the training program comes from."""

# JAX-internal scopes that are not user modules (jax.checkpoint traces its recompute under
# "rematted_computation")
_IGNORED_SCOPES = frozenset({"rematted_computation"})


@dataclasses.dataclass(frozen=True)
class Lit:
    """A literal operand (a scalar baked into the equation)."""

    val: Any


@dataclasses.dataclass(frozen=True, eq=False)
class LeafEqn:
    """One equation of a flattened program.

    Attributes:
      primitive: the JAX primitive.
      params: its parameters (sub-jaxprs kept for scan/while/cond and custom calls).
      ins: operands: an ``int`` value id or a :class:`Lit`.
      outs: value ids of the results (dropped results get ids too, never read).
      name_stack: the full name stack (outer call sites prepended).
      source_info: the equation's source info (for error messages and names).
      ctx: the equation's ``JaxprEqnContext`` or ``None``.
      effectful: the equation has effects (kept by dead-code elimination).
      jaxpr_eqn: the original ``JaxprEqn`` (FLOP rules read its avals).
    """

    primitive: Any
    params: dict
    ins: tuple
    outs: tuple[int, ...]
    name_stack: Any
    source_info: Any
    ctx: Any
    effectful: bool
    jaxpr_eqn: Any = dataclasses.field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.primitive.name

    @property
    def scope(self) -> str:
        """Module scope key of the equation (:func:`scope_from_stack`)."""
        return scope_from_stack(self.name_stack)


@dataclasses.dataclass(frozen=True, eq=False)
class FlatJaxpr:
    """A closed jaxpr flattened into leaf equations over integer value ids.

    Attributes:
      eqns: leaf equations in program (topological) order.
      avals: abstract value per value id.
      arg_ids: value ids of the flattened arguments, in ``tree_leaves(args)`` order.
      const_ids, consts: closed-over constants (value ids and arrays).
      out_refs: program outputs: value id or :class:`Lit`.
      n_inlined: how many call-like equations were inlined, by primitive name.
    """

    eqns: tuple[LeafEqn, ...]
    avals: tuple
    arg_ids: tuple[int, ...]
    const_ids: tuple[int, ...]
    consts: tuple
    out_refs: tuple
    n_inlined: dict = dataclasses.field(default_factory=dict)

    def const_env(self) -> dict:
        return dict(zip(self.const_ids, self.consts))


def _body(eqn, inline: dict[str, str]):
    key = inline.get(eqn.primitive.name)
    return None if key is None else compat.call_body(eqn, key)


def flatten(closed, inline: dict[str, str] = INLINE_ALL) -> FlatJaxpr:
    """Flatten ``closed`` (a ``ClosedJaxpr``), inlining the call-like primitives in ``inline``.

    Inlined equations get their caller's name stack prepended, so scopes are absolute.
    """
    avals: list[Any] = []
    eqns: list[LeafEqn] = []
    const_ids: list[int] = []
    const_vals: list[Any] = []
    n_inlined: dict[str, int] = {}

    def new(aval) -> int:
        avals.append(aval)
        return len(avals) - 1

    def read(env, v):
        if compat.is_literal(v):
            return Lit(v.val)
        return env[v]

    def add_consts(env, jaxpr, consts):
        for cv, c in zip(jaxpr.constvars, consts):
            i = new(cv.aval)
            const_ids.append(i)
            const_vals.append(c)
            env[cv] = i

    def run(jaxpr, env, stack):
        for e in jaxpr.eqns:
            full = stack + e.source_info.name_stack
            sub = _body(e, inline)
            if sub is not None:
                n_inlined[e.primitive.name] = n_inlined.get(e.primitive.name, 0) + 1
                sj = compat.open_jaxpr(sub)
                senv: dict = {}
                add_consts(senv, sj, compat.jaxpr_consts(sub))
                for iv, ov in zip(sj.invars, e.invars):
                    senv[iv] = read(env, ov)
                run(sj, senv, full)
                for o, io in zip(e.outvars, sj.outvars):
                    if not compat.is_dropvar(o):
                        env[o] = read(senv, io)
                continue
            ins = tuple(read(env, v) for v in e.invars)
            outs = tuple(new(o.aval) for o in e.outvars)
            for o, i in zip(e.outvars, outs):
                if not compat.is_dropvar(o):
                    env[o] = i
            eqns.append(
                LeafEqn(
                    primitive=e.primitive,
                    params=dict(e.params),
                    ins=ins,
                    outs=outs,
                    name_stack=full,
                    source_info=e.source_info,
                    ctx=getattr(e, "ctx", None),
                    effectful=bool(getattr(e, "effects", None)),
                    jaxpr_eqn=e,
                )
            )

    env: dict = {}
    top = compat.open_jaxpr(closed)
    arg_ids = [new(v.aval) for v in top.invars]
    env.update(zip(top.invars, arg_ids))
    add_consts(env, top, compat.jaxpr_consts(closed))
    run(top, env, compat.new_name_stack())
    outs = tuple(read(env, v) for v in top.outvars)
    return FlatJaxpr(tuple(eqns), tuple(avals), tuple(arg_ids), tuple(const_ids),
                     tuple(const_vals), outs, n_inlined)


def bind(eqn: LeafEqn, invals: Sequence[Any], *, scope: str | None = None,
         relative: bool = False, prefix=None) -> list:
    """Evaluate one leaf equation on ``invals`` (as ``jax.core.eval_jaxpr`` does).

    Args:
      eqn: the equation.
      invals: its operand values (literals already resolved).
      scope: an extra innermost name scope (the origin marker at extraction).
      relative: put the equation's name stack under the caller's current one (so names read
        ``outer/Module/...`` inside a user's ``jax.jit``), else use it as is.
      prefix: a name stack put before the equation's (an unrolled scan iteration's scope).

    Returns:
      The list of result values.
    """
    subfuns, bparams = compat.bind_params(eqn)
    stack = eqn.name_stack if prefix is None else prefix + eqn.name_stack
    if scope is not None:
        stack = stack.extend(scope)
    if relative:
        stack = compat.current_name_stack() + stack
    with compat.user_context(eqn.source_info.traceback, name_stack=stack):
        if eqn.ctx is not None:
            with eqn.ctx.manager:
                ans = eqn.primitive.bind(*subfuns, *invals, **bparams)
        else:
            ans = eqn.primitive.bind(*subfuns, *invals, **bparams)
    return list(ans) if eqn.primitive.multiple_results else [ans]


def evaluate(
    eqns: Iterable[LeafEqn],
    env: dict,
    *,
    scope_of_eqn: Callable[[int, LeafEqn], str | None] | None = None,
    relative: bool = False,
) -> dict:
    """Run ``eqns`` in order on ``env`` (value id -> value), adding their results; returns env."""
    for k, e in enumerate(eqns):
        invals = [r.val if isinstance(r, Lit) else env[r] for r in e.ins]
        scope = scope_of_eqn(k, e) if scope_of_eqn is not None else None
        env.update(zip(e.outs, bind(e, invals, scope=scope, relative=relative)))
    return env


def dce(eqns: Sequence[LeafEqn], needed: Iterable[int]) -> np.ndarray:
    """``bool[len(eqns)]``: equations some of whose results reach ``needed`` (value ids), plus
    effectful ones (and what they read)."""
    need = set(needed)
    keep = np.zeros(len(eqns), dtype=bool)
    for j in range(len(eqns) - 1, -1, -1):
        e = eqns[j]
        if e.effectful or any(o in need for o in e.outs):
            keep[j] = True
            need.update(r for r in e.ins if isinstance(r, int))
    return keep


# ------------------------------------------------------------------------------ name stacks
def origin_of(stack) -> int:
    """Index of the forward leaf whose origin marker is in ``stack`` (innermost), or ``-1``."""
    for name in reversed(compat.scope_names(stack)):
        if name.startswith(ORIGIN_PREFIX):
            return int(name[len(ORIGIN_PREFIX):])
    return -1


def scope_from_stack(stack) -> str:
    """``/``-joined ``Scope`` entries of a name stack, ignoring transforms (``jvp(...)``,
    ``transpose(...)``), origin markers and JAX-internal scopes."""
    names = [s for s in compat.scope_names(stack)
             if s not in _IGNORED_SCOPES and not s.startswith(ORIGIN_PREFIX)]
    # bodies JAX traces under the current (absolute) name stack, e.g. a transposed remat2, get
    # their caller's scopes twice once prefixed: collapse a repeated leading block
    for k in range(len(names) // 2, 0, -1):
        if names[:k] == names[k : 2 * k]:
            names = names[k:]
            break
    return "/".join(names)


def scope_of(eqn) -> str:
    """Module scope key of a ``JaxprEqn`` or :class:`LeafEqn`: ``jvp(MLP)/Dense_0``,
    ``transpose(jvp(MLP))/Dense_0`` and (forward only) ``MLP/Dense_0`` all give
    ``"MLP/Dense_0"``; code outside every module gives ``""``."""
    stack = eqn.name_stack if isinstance(eqn, LeafEqn) else eqn.source_info.name_stack
    return scope_from_stack(stack)


def is_transpose(stack) -> bool:
    """The name stack contains a ``transpose(...)`` transform (a backward equation)."""
    return "transpose" in compat.transform_names(stack)


# ------------------------------------------------------------------------------ values
def is_key(x) -> bool:
    """``x`` (an array or aval) holds typed PRNG keys."""
    dt = getattr(x, "dtype", None)
    return dt is not None and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key)


def batch_size(args: Sequence[Any], argnums: int | Sequence[int] = 0) -> int | None:
    """The batch size ``B``: the leading dimension of the largest (most elements) non-key leaf
    with ``ndim >= 1`` among the non-differentiated arguments (those not in ``argnums``), so a
    raw ``uint32[2]`` PRNG key next to the inputs does not decide it.  ``None`` when there is
    no such leaf.  The one rule for graphs (``Graph.meta["batch_size"]``) and micro-batching.
    """
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    best, size = None, -1
    for j, a in enumerate(args):
        if j in nums:
            continue
        for leaf in jax.tree_util.tree_leaves(a):
            shape = np.shape(leaf)
            if len(shape) >= 1 and not is_key(leaf):
                n = int(np.prod(shape))
                if n > size:
                    best, size = int(shape[0]), n
    return best


_BATCH_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                               "reduce_and", "reduce_or", "argmax", "argmin", "cumsum",
                               "cumprod", "cummax", "cummin", "sort"})


def batch_coupled(fj: FlatJaxpr, B: int | None, data_ids: Sequence[int] | None = None) -> bool:
    """Whether samples of a batch interact in ``fj`` beyond the final loss reduction.

    Dataflow rule: a value is *batch-reduced* when it comes from a reduction over axis 0 of a
    value whose leading dimension is ``B`` (``reduce_*``, ``argmax``, ``cumsum``, ``sort``), or
    from a ``dot_general`` contracting axis 0 of such a value; values computed from batch-reduced
    values stay batch-reduced.  The program is coupled when a batch-reduced value meets a value
    with leading dimension ``B`` in one equation (BatchNorm's mean subtracted from its input),
    not when it only flows to the output (a batch-mean loss).  Micro-batching such a program
    changes its math, not only its memory.  Only the leading axis is tracked: coupling through a
    transposed batch axis (an in-batch similarity ``x @ x.T``) is not detected.

    With ``data_ids`` a value has a batch axis only when it also *depends on the data*
    (dataflow from those arguments): a ``16 x 16`` weight at batch 16 is not a batch of samples.

    Args:
      fj: the forward program.
      B: the batch size (``None`` or 1: ``False``, nothing to split).
      data_ids: value ids of the data (micro-batched) arguments; ``None``: every value whose
        leading dimension is ``B`` counts as batched.
    """
    if not B or B <= 1:
        return False
    avals = fj.avals
    from_data: set[int] | None = None if data_ids is None else set(data_ids)

    def lead(v) -> bool:
        if not isinstance(v, int) or (from_data is not None and v not in from_data):
            return False
        shape = getattr(avals[v], "shape", ())
        return len(shape) >= 1 and shape[0] == B

    reduced: set[int] = set()
    for e in fj.eqns:
        ins = [v for v in e.ins if isinstance(v, int)]
        if from_data is not None and any(v in from_data for v in ins):
            from_data.update(v for v in e.outs if isinstance(v, int))
        tainted = any(v in reduced for v in ins)
        if tainted and any(lead(v) and v not in reduced for v in ins):
            return True
        name = getattr(e.primitive, "name", str(e.primitive))
        over_batch = False
        if name in _BATCH_REDUCTIONS and ins and lead(ins[0]):
            axes = e.params.get("axes", e.params.get("axis", e.params.get("dimension", ())))
            axes = (axes,) if isinstance(axes, int) else tuple(axes or ())
            over_batch = 0 in axes
        elif name == "dot_general" and len(ins) == 2:
            (lc, rc), _ = e.params["dimension_numbers"]
            over_batch = (0 in lc and lead(ins[0])) or (0 in rc and lead(ins[1]))
        if tainted or over_batch:
            reduced.update(v for v in e.outs if isinstance(v, int))
    return False
