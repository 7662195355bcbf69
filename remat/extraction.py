"""Jaxpr -> training graph extraction.

``extract(fn, *args)`` traces ``jax.value_and_grad(fn, argnums)`` with ``jax.make_jaxpr`` (the
backward half is JAX's own transpose, never a hand-written mirror), inlines call-like primitives
(``jit``, ``closed_call``, ``core_call``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat2`` /
``checkpoint``) with fresh value ids, keeps ``scan``/``while``/``cond`` as single equations, and
groups the resulting *leaf equations* into stages (the nodes of :class:`remat.Graph`).

Forward / backward split
  JAX emits every primal equation before the first transposed one (the name stack of a transposed
  equation contains ``transpose(...)``).  Everything before the first transposed equation is the
  forward half, the rest is the backward half.  Equations with an empty name stack in the prefix
  (the loss, written outside any module) are forward; those in the suffix (cotangent seeds, zero
  gradients, gradient sums) are backward.  Hence no forward stage reads a backward output and the
  stage order "forward stages, loss stage(s), backward stages" is topological.

Module scopes and stage grouping (``stages=``)
  The *scope key* of an equation (:func:`scope_of`) is the ``/``-joined list of the ``Scope``
  entries of its name stack, ignoring transforms (``jvp(...)``, ``transpose(...)``), so
  ``transpose(jvp(MLP))/Dense_3`` and ``jvp(MLP)/Dense_3`` and the forward-only ``MLP/Dense_3`` all
  map to ``"MLP/Dense_3"``.  Grouping then uses an *effective* key: an equation whose scope is a
  strict ancestor of the previous equation's effective key (e.g. an activation written in the
  parent module right after a child ``Dense``, a residual ``add`` after the block's last
  ``BatchNorm``) joins that previous stage; a leading run of such ancestor-scope equations joins the
  following child stage.  The empty scope (code outside every module: the loss head, input
  preprocessing) is never absorbed.  So a 16-layer Flax MLP gives 16 forward stages (Dense +
  activation) plus one ``fwd/loss`` stage (everything the loss function does outside the model,
  e.g. the softmax cross-entropy), and its backward mirror.

  * ``"eqn"``: one node per leaf equation.
  * ``"module"``: maximal contiguous runs of equal effective key (forward and backward separately).
  * ``int k``: at most ``k`` forward nodes: the loss stage stays separate and the other module
    stages (or, for functions without module scopes, the forward equations) are merged into at
    most ``k - 1`` contiguous, cost-balanced (FLOPs) groups; backward equations are labelled with
    the group of the forward stage of the same scope key, and contiguous runs of equal label form
    the backward stages (without scopes: ``k`` cost-balanced backward groups).
  * ``"auto"``: ``"module"`` when it gives 2..64 forward module stages, else ``k = 32`` (too many)
    or ``k = 8`` (no module structure: plain JAX functions, single-module models).

Dead code and residual preparation
  Equations whose results reach no program output are dropped (``meta["n_dead_eqns"]``).  In the
  forward prefix only the *primal* computation of the loss value stays in forward stages; the
  equations JAX's linearisation adds there for the backward pass alone (derivative masks such as
  ``gt x 0`` for a ReLU, broadcast zeros, ``cos x`` for ``sin x``) are *sunk* into the earliest
  backward stage that reads them (``meta["n_sunk_eqns"]``).  So forward FLOPs equal those of the
  forward-only program, and the backward reads primal values (what XLA's fusion keeps) instead of
  JAX's materialised residuals.  ``stages="eqn"`` keeps every prefix equation forward.

Costs: ``flops`` from :mod:`remat.flops`; ``time_s``/``energy_j`` from a device profile
(:mod:`remat.devices`, ``"host"`` by default); ``out_bytes`` = bytes of the stage's values that
another stage or the program outputs read; ``param_bytes`` = bytes of differentiated arguments the
stage reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import source_info_util as _siu
from jax.extend import core as jc

from remat.errors import ExtractionError
from remat.flops import eqn_flops
from remat.graph import Graph, make_graph

__all__ = ["extract", "scope_of", "Program", "LeafEqn", "group_keys", "AUTO_MAX_STAGES"]

# call-like primitives inlined during flattening: primitive name -> param holding the sub-jaxpr
INLINE = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "custom_jvp_call_jaxpr": "fun_jaxpr",
    "composite": "jaxpr",
    "custom_vmap_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}

AUTO_MAX_STAGES = 64
AUTO_K_MANY = 32
AUTO_K_FLAT = 8


# ---------------------------------------------------------------------------------- values
@dataclasses.dataclass(frozen=True)
class Lit:
    """A literal operand (a Python/numpy scalar baked into the equation)."""

    val: Any


@dataclasses.dataclass(frozen=True, eq=False)
class LeafEqn:
    """One equation of the flattened program.

    Attributes:
      primitive: the JAX primitive.
      params: its parameters (sub-jaxprs kept for scan/while/cond).
      ins: operands: an ``int`` value id or a :class:`Lit`.
      outs: value ids of the results (dropped results get ids too, never read).
      name_stack: the full name stack (outer call sites prepended).
      source_info: the equation's source info (for error messages).
      ctx: the equation's context (``JaxprEqnContext``) or ``None``.
      flops: FLOPs of one execution.
      scope: :func:`scope_of` key.
    """

    primitive: Any
    params: dict
    ins: tuple
    outs: tuple[int, ...]
    name_stack: Any
    source_info: Any
    ctx: Any
    flops: float
    scope: str
    effectful: bool = False

    @property
    def name(self) -> str:
        return self.primitive.name


# JAX-internal scopes that are not user modules (jax.checkpoint traces its backward recompute
# under "rematted_computation")
_IGNORED_SCOPES = frozenset({"rematted_computation"})


def _scope_from_stack(stack) -> str:
    names = [
        s.name for s in stack.stack if isinstance(s, _siu.Scope) and s.name not in _IGNORED_SCOPES
    ]
    # bodies JAX traces under the current (absolute) name stack, e.g. the transposed remat2, get
    # their caller's scopes twice once prefixed: collapse a repeated leading block
    for k in range(len(names) // 2, 0, -1):
        if names[:k] == names[k : 2 * k]:
            names = names[k:]
            break
    return "/".join(names)


def scope_of(eqn) -> str:
    """Module scope key of a Jaxpr equation: the ``/``-joined ``Scope`` entries of its name stack,
    ignoring transforms (``jvp``, ``transpose``, ...).

    ``jvp(MLP)/Dense_0``, ``transpose(jvp(MLP))/Dense_0`` and (in a forward-only jaxpr)
    ``MLP/Dense_0`` all give ``"MLP/Dense_0"``.  The loss written outside any module gives ``""``.
    Stage grouping applies :func:`group_keys` on top of these keys.
    """
    return _scope_from_stack(eqn.source_info.name_stack)


def _is_transpose(stack) -> bool:
    return any(isinstance(s, _siu.Transform) and s.name == "transpose" for s in stack.stack)


def _strict_ancestor(a: str, b: str) -> bool:
    return bool(a) and b.startswith(a + "/")


def group_keys(scopes: Sequence[str]) -> list[str]:
    """Effective grouping keys of a sequence of raw scope keys (program order).

    An entry that is a strict ancestor of the previous effective key joins it; a leading run of
    ancestor entries joins the following child; ``""`` is never absorbed.  Contiguous runs of
    equal effective key are the ``"module"`` stages.
    """
    eff = list(scopes)
    m = len(eff)
    for j in range(1, m):
        if _strict_ancestor(scopes[j], eff[j - 1]):
            eff[j] = eff[j - 1]
    for j in range(m - 2, -1, -1):
        if eff[j] == scopes[j] and _strict_ancestor(scopes[j], eff[j + 1]):
            eff[j] = eff[j + 1]
    return eff


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


# ------------------------------------------------------------------------------- flattening
def _flatten(closed) -> tuple[list[LeafEqn], list[Any], list[int], list[int], list[Any], list]:
    """Inline call-like primitives.  Returns (eqns, avals, arg_ids, const_ids, const_vals, outs)."""
    avals: list[Any] = []
    eqns: list[LeafEqn] = []
    const_ids: list[int] = []
    const_vals: list[Any] = []

    def new(aval) -> int:
        avals.append(aval)
        return len(avals) - 1

    def read(env, v):
        if isinstance(v, jc.Literal):
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
            key = INLINE.get(e.primitive.name)
            full = stack + e.source_info.name_stack
            if key is not None and key in e.params:
                sub = e.params[key]
                sj = sub.jaxpr if hasattr(sub, "jaxpr") and not isinstance(sub, jc.Jaxpr) else sub
                senv: dict = {}
                add_consts(senv, sj, getattr(sub, "consts", ()))
                for iv, ov in zip(sj.invars, e.invars):
                    senv[iv] = read(env, ov)
                run(sj, senv, full)
                for o, io in zip(e.outvars, sj.outvars):
                    if not isinstance(o, jc.DropVar):
                        env[o] = read(senv, io)
                continue
            ins = tuple(read(env, v) for v in e.invars)
            outs = tuple(new(o.aval) for o in e.outvars)
            for o, i in zip(e.outvars, outs):
                if not isinstance(o, jc.DropVar):
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
                    flops=eqn_flops(e),
                    scope=_scope_from_stack(full),
                    effectful=bool(getattr(e, "effects", None)),
                )
            )

    env: dict = {}
    arg_ids = [new(v.aval) for v in closed.jaxpr.invars]
    env.update(zip(closed.jaxpr.invars, arg_ids))
    add_consts(env, closed.jaxpr, closed.consts)
    run(closed.jaxpr, env, _siu.NameStack())
    outs = [read(env, v) for v in closed.jaxpr.outvars]
    return eqns, avals, arg_ids, const_ids, const_vals, outs


# ---------------------------------------------------------------------------------- program
@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """Everything needed to run the stages of an extracted graph one by one.

    Value ids: ``0 .. n_args-1`` are the flattened arguments (``jax.tree_util.tree_leaves(args)``
    order), then constants, then equation results.

    Attributes:
      fn, arg_shapes, stages, argnums: what ``extract`` was called with (shapes as
        ``jax.ShapeDtypeStruct`` pytrees) so micro-batch code can re-extract.
      in_tree: treedef of the ``args`` tuple; out_tree: treedef of ``(value, grads)``.
      eqns: the flattened leaf equations.
      avals: abstract value per value id.
      diff_args: ``bool[n_args]``, argument leaf belongs to ``args[argnums]``.
      const_ids, consts: closed-over constants (value ids and arrays).
      node_eqns: per node, the leaf-equation indices it runs (in order).
      node_inputs: per node, ordered value ids produced by *other* nodes that it reads.
      node_args: per node, ordered argument ids it reads.
      node_outputs: per node, ordered value ids it produces that other nodes or the program
        outputs read (their bytes are ``Node.out_bytes``).
      producer: value id -> (node, position in ``node_outputs[node]``) for stage outputs.
      out_refs: flattened program outputs: value id (int) or :class:`Lit`.
      forward_scopes: per node, the raw scope keys its equations cover (``()`` for backward).
      cache: jitted stage functions, filled lazily by :meth:`stage_fn`.
    """

    fn: Callable
    arg_shapes: Any
    stages: Any
    argnums: Any
    in_tree: Any
    out_tree: Any
    eqns: tuple[LeafEqn, ...]
    avals: tuple
    n_args: int
    diff_args: np.ndarray
    const_ids: tuple[int, ...]
    consts: tuple
    node_eqns: tuple[tuple[int, ...], ...]
    node_inputs: tuple[tuple[int, ...], ...]
    node_args: tuple[tuple[int, ...], ...]
    node_outputs: tuple[tuple[int, ...], ...]
    producer: dict
    out_refs: tuple
    forward_scopes: tuple[tuple[str, ...], ...]
    out_avals: tuple = ()
    cache: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def n_nodes(self) -> int:
        return len(self.node_eqns)

    def _core(self, i: int) -> Callable:
        eqns = [self.eqns[j] for j in self.node_eqns[i]]
        arg_ids = self.node_args[i]
        in_ids = self.node_inputs[i]
        out_ids = self.node_outputs[i]
        cset = set(self.const_ids)
        const_ids = sorted({r for e in eqns for r in e.ins if isinstance(r, int) and r in cset})
        cpos = {c: k for k, c in enumerate(self.const_ids)}
        consts = [self.consts[cpos[c]] for c in const_ids]

        def core(arg_vals, in_vals):
            env = dict(zip(arg_ids, arg_vals))
            env.update(zip(const_ids, consts))
            env.update(zip(in_ids, in_vals))
            for e in eqns:
                invals = [r.val if isinstance(r, Lit) else env[r] for r in e.ins]
                bparams = e.primitive.get_bind_params(e.params)
                subfuns: tuple = ()
                if isinstance(bparams, tuple):  # older JAX: (subfuns, params)
                    subfuns, bparams = bparams
                with _siu.user_context(None, name_stack=e.name_stack):
                    if e.ctx is not None:
                        with e.ctx.manager:
                            ans = e.primitive.bind(*subfuns, *invals, **bparams)
                    else:
                        ans = e.primitive.bind(*subfuns, *invals, **bparams)
                if not e.primitive.multiple_results:
                    ans = (ans,)
                env.update(zip(e.outs, ans))
            return tuple(env[o] for o in out_ids)

        return core

    def stage_fn(self, i: int) -> Callable:
        """``stage_fn(i)(args_flat, inputs) -> outputs``: run node ``i``.

        ``args_flat`` is the full list of flattened argument leaves, ``inputs`` the arrays of
        ``node_inputs[i]`` in order; returns the arrays of ``node_outputs[i]``.  The jitted
        function is built once and cached on the program.
        """
        f = self.cache.get(i)
        if f is None:
            jitted = jax.jit(self._core(i))
            arg_ids = self.node_args[i]

            def f(args_flat, inputs, _j=jitted, _a=arg_ids):
                return _j([args_flat[a] for a in _a], list(inputs))

            self.cache[i] = f
        return f



# ---------------------------------------------------------------------------------- grouping
def _balanced(costs: np.ndarray, k: int) -> np.ndarray:
    """Contiguous cost-balanced partition of ``len(costs)`` units into at most ``k`` groups.

    Unit ``j`` goes to group ``floor(k * (C_j - c_j / 2) / C)`` (its cost midpoint's quantile),
    relabelled to ``0 .. g-1``.  Returns ``int64[len(costs)]`` non-decreasing labels.
    """
    c = np.asarray(costs, dtype=np.float64)
    if len(c) == 0:
        return np.zeros(0, dtype=np.int64)
    if c.sum() <= 0:
        c = np.ones_like(c)
    c = c + 1e-9 * c.sum()  # zero-cost units follow their neighbours smoothly
    cum = np.cumsum(c)
    lab = np.minimum(((cum - c / 2) / cum[-1] * k).astype(np.int64), k - 1)
    return np.unique(lab, return_inverse=True)[1].astype(np.int64)


def _runs(labels: Sequence) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of maximal runs of equal labels."""
    out = []
    s = 0
    for j in range(1, len(labels) + 1):
        if j == len(labels) or labels[j] != labels[j - 1]:
            out.append((s, j))
            s = j
    return out


@dataclasses.dataclass
class _Stage:
    eqns: list[int]
    name: str
    is_backward: bool
    key: Any = None
    forward_of: int | None = None  # index into forward stage list


def _group(eqns: list[LeafEqn], F: list[int], B: list[int], stages) -> list[_Stage]:
    """Group leaf equations (forward ``F``, backward ``B``, program order) into stages."""
    if stages == "eqn":
        out = [
            _Stage([j], f"fwd/{eqns[j].scope + '/' if eqns[j].scope else ''}{j}:{eqns[j].name}", False)
            for j in F
        ]
        out += [
            _Stage([j], f"bwd/{eqns[j].scope + '/' if eqns[j].scope else ''}{j}:{eqns[j].name}", True)
            for j in B
        ]
        return out

    fkeys = group_keys([eqns[j].scope for j in F])
    bkeys = group_keys([eqns[j].scope for j in B])
    fruns = _runs(fkeys)
    # trailing "" run = the loss head (only when the model has module scopes at all)
    has_modules = any(k != "" for k in fkeys)
    loss_run = fruns[-1] if (has_modules and fruns and fkeys[fruns[-1][0]] == "") else None
    body_runs = fruns[:-1] if loss_run is not None else fruns
    n_module = len(body_runs) if has_modules else 0

    if stages == "auto":
        if 2 <= n_module <= AUTO_MAX_STAGES:
            stages = "module"
        elif n_module > AUTO_MAX_STAGES:
            stages = AUTO_K_MANY
        else:
            stages = AUTO_K_FLAT

    def fname(key: str, pos: int) -> str:
        if key:
            return f"fwd/{key}"
        return "fwd/loss" if loss_run is not None and pos == loss_run[0] else "fwd/top"

    if stages == "module":
        fst = [_Stage(F[a:b], fname(fkeys[a], a), False, key=fkeys[a]) for a, b in fruns]
        key_to_f = {s.key: i for i, s in enumerate(fst)}
        loss_f = len(fst) - 1 if fst else None
        out = list(fst)
        for a, b in _runs(bkeys):
            k = bkeys[a]
            fi = key_to_f.get(k, loss_f if k == "" else None)
            out.append(
                _Stage(B[a:b], f"bwd/{k}" if k else "bwd/loss", True, key=k, forward_of=fi)
            )
        return out

    if isinstance(stages, (int, np.integer)) and not isinstance(stages, bool):
        k = int(stages)
        if k < 1:
            raise ExtractionError(f"stages={k}: need at least one stage")
        use_modules = n_module >= 2  # else: no usable module structure, balance equations
        if use_modules and k >= 2 and loss_run is not None:
            kb = k - 1
        else:
            kb = k
        out: list[_Stage] = []
        if use_modules:
            units = body_runs if (kb < k) else fruns
            costs = np.array([sum(eqns[F[j]].flops for j in range(a, b)) for a, b in units])
            lab = _balanced(costs, kb)
            unit_keys = [fkeys[a] for a, _ in units]
            key_group: dict[str, int] = {}
            for u, g in enumerate(lab):
                key_group[unit_keys[u]] = int(g)
            for g in range(int(lab.max()) + 1 if len(lab) else 0):
                us = np.flatnonzero(lab == g)
                idx = [F[j] for u in us for j in range(*units[u])]
                k0, k1 = unit_keys[us[0]], unit_keys[us[-1]]
                nm = fname(k0, units[us[0]][0]) + (f"..{k1}" if k1 != k0 else "")
                out.append(_Stage(idx, nm, False, key=g))
            ng = len(out)
            if kb < k:
                a, b = loss_run
                out.append(_Stage(F[a:b], "fwd/loss", False, key=ng))
                loss_g = ng
            else:
                loss_g = ng - 1 if ng else None
            # backward: label by the forward group of the same scope key
            blab: list[int] = []
            prev = loss_g
            for key in bkeys:
                g = loss_g if key == "" else key_group.get(key, prev)
                blab.append(g if g is not None else 0)
                prev = blab[-1]
            for a, b in _runs(blab):
                g = blab[a]
                nm = "bwd/" + out[g].name[4:] if g is not None and g < len(out) else "bwd/group"
                out.append(_Stage(B[a:b], nm, True, key=g, forward_of=g))
        else:
            costs = np.array([eqns[j].flops for j in F])
            lab = _balanced(costs, k)
            for g, (a, b) in enumerate(_runs(list(lab))):
                out.append(_Stage(F[a:b], f"fwd/group{g}", False, key=g))
            ng = len(out)
            if B:
                blab = _balanced(np.array([eqns[j].flops for j in B]), max(ng, 1))
                for a, b in _runs(list(blab)):
                    g = int(blab[a])
                    fi = ng - 1 - g if ng else None
                    out.append(_Stage(B[a:b], f"bwd/group{fi}", True, key=g, forward_of=fi))
        return out

    raise ExtractionError(f"stages must be 'auto', 'module', 'eqn' or an int, got {stages!r}")


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        c = seen.get(n, 0)
        seen[n] = c + 1
        out.append(n if c == 0 else f"{n}#{c}")
    return out


def _dce(eqns: list[LeafEqn], out_refs) -> list[LeafEqn]:
    """Drop equations none of whose results reach the program outputs (effects kept).

    Value ids are not renumbered, so surviving equations keep their ``ins``/``outs``.
    """
    needed = {r for r in out_refs if isinstance(r, int)}
    keep = [False] * len(eqns)
    for j in range(len(eqns) - 1, -1, -1):
        e = eqns[j]
        if e.effectful or any(o in needed for o in e.outs):
            keep[j] = True
            needed.update(r for r in e.ins if isinstance(r, int))
    return [e for e, k in zip(eqns, keep) if k]


def _primal_split(eqns: list[LeafEqn], nf: int, loss_ref) -> tuple[list[int], list[int]]:
    """Split the forward prefix ``eqns[:nf]`` into the primal computation of the loss value and
    the rest (residual preparation for the backward pass: derivative masks, broadcast zeros,
    ``cos`` for ``sin``, ...), which is *sunk* into the backward stage that first reads it.

    This keeps forward FLOPs equal to the forward-only program's and makes the backward read
    primal values (what XLA's fusion keeps) rather than JAX's materialised residuals.
    """
    needed = {loss_ref} if isinstance(loss_ref, int) else set()
    primal = [False] * nf
    for j in range(nf - 1, -1, -1):
        e = eqns[j]
        if e.effectful or any(o in needed for o in e.outs):
            primal[j] = True
            needed.update(r for r in e.ins if isinstance(r, int))
    F = [j for j in range(nf) if primal[j]]
    return F, [j for j in range(nf) if not primal[j]]


def _sink(eqns: list[LeafEqn], st: list[_Stage], sunk: list[int]) -> None:
    """Assign each sunk equation to the earliest stage that reads it (in place; stage equation
    lists stay in program order, which is topological)."""
    stage_of = {}
    for i, s in enumerate(st):
        for j in s.eqns:
            stage_of[j] = i
    readers: dict[int, list[int]] = {}
    sunk_set = set(sunk)
    for j, e in enumerate(eqns):
        if j in stage_of or j in sunk_set:
            for r in e.ins:
                if isinstance(r, int):
                    readers.setdefault(r, []).append(j)
    first_bwd = next((i for i, s in enumerate(st) if s.is_backward), len(st) - 1)
    for j in reversed(sunk):
        cands = [stage_of[c] for o in eqns[j].outs for c in readers.get(o, ()) if c in stage_of]
        stage_of[j] = min(cands) if cands else max(first_bwd, 0)
        st[stage_of[j]].eqns.append(j)
    for s in st:
        s.eqns.sort()


# ---------------------------------------------------------------------------------- devices
def _resolve_device(device):
    """A device profile: ``None`` -> ``remat.devices.get("host")``, a name -> that profile, any
    object with ``node_costs(graph) -> (times, energies)`` as is."""
    if device is None or isinstance(device, str):
        from remat import devices

        return devices.get(device or "host")
    return device


# ---------------------------------------------------------------------------------- extract
def _check_loss(fn, args):
    try:
        out = jax.eval_shape(fn, *args)
    except ExtractionError:
        raise
    except Exception as e:  # noqa: BLE001 - report the tracing failure as an extraction error
        raise ExtractionError(f"tracing the loss failed: {type(e).__name__}: {e}") from e
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != 1 or not hasattr(leaves[0], "shape"):
        raise ExtractionError(
            f"the loss must return a single scalar array, got a pytree with {len(leaves)} leaves "
            f"({jax.tree_util.tree_structure(out)})"
        )
    o = leaves[0]
    if o.shape != ():
        raise ExtractionError(f"the loss must be a scalar, got shape {tuple(o.shape)} ({o.dtype})")
    if not jax.numpy.issubdtype(o.dtype, jax.numpy.floating):
        raise ExtractionError(
            f"the loss must be a floating-point scalar to be differentiable, got dtype {o.dtype}"
        )


def _batch_size(leaves) -> int | None:
    for nd in (2, 1):
        for x in leaves:
            shape = getattr(x, "shape", ())
            if len(shape) >= nd:
                return int(shape[0])
    return None


def extract(
    fn: Callable,
    *args: Any,
    stages: str | int = "auto",
    argnums: int | Sequence[int] = 0,
    device=None,
    name: str | None = None,
) -> Graph:
    """Trace ``jax.value_and_grad(fn, argnums)(*args)`` and return its training graph.

    Args:
      fn: ``fn(*args) -> scalar`` loss; args are pytrees (params first by convention).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``; only shapes are used, but the
        executor needs concrete arrays).
      stages: ``"auto"``, ``"module"``, ``"eqn"`` or an int ``k`` (see the module docstring).
      argnums: which argument(s) are differentiated (the parameters).
      device: a :mod:`remat.devices` profile, a profile name, or ``None`` for ``"host"``; gives
        ``time_s`` (seconds) and ``energy_j`` (joules) per node.
      name: graph label (defaults to ``fn.__name__``).

    Returns:
      A :class:`remat.Graph` whose ``program`` is a :class:`Program`.  ``graph.meta`` holds
      ``node_primitives`` (per node, the primitive names of its equations), ``stages``,
      ``argnums``, ``batch_size`` (or ``None``), ``loss_nodes``, ``n_eqns`` and ``notes``.

    Raises:
      ExtractionError: non-scalar / non-float loss, bad ``stages``, tracing failure.
      UnsupportedPrimitiveError: an equation whose primitive has no FLOP rule.
    """
    if not args:
        raise ExtractionError("extract needs the example arguments of fn")
    _check_loss(fn, args)
    argnums_t = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in argnums_t:
        if not 0 <= a < len(args):
            raise ExtractionError(f"argnums {argnums} out of range for {len(args)} arguments")
    try:
        closed, out_shape = jax.make_jaxpr(jax.value_and_grad(fn, argnums=argnums), return_shape=True)(
            *args
        )
    except Exception as e:  # noqa: BLE001
        raise ExtractionError(f"differentiating the loss failed: {type(e).__name__}: {e}") from e

    leaves, in_tree = jax.tree_util.tree_flatten(args)
    diff = np.zeros(len(leaves), dtype=bool)
    pos = 0
    for ai, a in enumerate(args):
        n = len(jax.tree_util.tree_leaves(a))
        if ai in argnums_t:
            diff[pos : pos + n] = True
        pos += n
    out_tree = jax.tree_util.tree_structure(out_shape)

    eqns, avals, arg_ids, const_ids, const_vals, out_refs = _flatten(closed)
    n_flat = len(eqns)
    eqns = _dce(eqns, out_refs)
    n_args = len(arg_ids)
    # forward / backward split at the first transposed equation
    nf = next((j for j, e in enumerate(eqns) if _is_transpose(e.name_stack)), len(eqns))
    B = list(range(nf, len(eqns)))
    if stages == "eqn":
        F, sunk = list(range(nf)), []
    else:
        F, sunk = _primal_split(eqns, nf, out_refs[0])
    st = _group(eqns, F, B, stages)
    st = [s for s in st if s.eqns]
    if sunk:
        _sink(eqns, st, sunk)
    n = len(st)

    # value bookkeeping (vectorised over equations where it matters)
    eqn_node = np.empty(len(eqns), dtype=np.int64)
    for i, s in enumerate(st):
        eqn_node[s.eqns] = i
    nvals = len(avals)
    prod_node = np.full(nvals, -1, dtype=np.int64)
    for j, e in enumerate(eqns):
        prod_node[list(e.outs)] = eqn_node[j]
    vbytes = np.array([aval_bytes(a) for a in avals], dtype=np.int64)
    reads_src, reads_dst = [], []
    for j, e in enumerate(eqns):
        for r in e.ins:
            if isinstance(r, int):
                reads_src.append(r)
                reads_dst.append(eqn_node[j])
    rs = np.array(reads_src, dtype=np.int64)
    rd = np.array(reads_dst, dtype=np.int64)
    out_val_ids = np.array([r for r in out_refs if isinstance(r, int)], dtype=np.int64)

    pn = prod_node[rs] if len(rs) else np.zeros(0, dtype=np.int64)
    cross = (pn >= 0) & (pn != rd)
    # exported values: read by another node, or a program output
    exported = np.zeros(nvals, dtype=bool)
    exported[rs[cross]] = True
    if len(out_val_ids):
        exported[out_val_ids[prod_node[out_val_ids] >= 0]] = True
    node_outputs: list[list[int]] = [[] for _ in range(n)]
    for v in np.flatnonzero(exported):
        node_outputs[prod_node[v]].append(int(v))
    producer = {v: (i, p) for i in range(n) for p, v in enumerate(node_outputs[i])}
    node_inputs: list[list[int]] = [[] for _ in range(n)]
    node_args: list[list[int]] = [[] for _ in range(n)]
    seen_in: set = set()
    for v, d, p in zip(rs.tolist(), rd.tolist(), pn.tolist()):
        if (v, d) in seen_in:
            continue
        seen_in.add((v, d))
        if p >= 0 and p != d:
            node_inputs[d].append(v)
        elif p < 0 and v < n_args:
            node_args[d].append(v)
    edges = sorted({(int(p), int(d)) for p, d in zip(pn[cross].tolist(), rd[cross].tolist())})

    out_bytes = [int(vbytes[node_outputs[i]].sum()) if node_outputs[i] else 0 for i in range(n)]
    arg_b = vbytes[:n_args]
    param_bytes = [int(sum(arg_b[a] for a in node_args[i] if diff[a])) for i in range(n)]
    flops = [float(sum(eqns[j].flops for j in s.eqns)) for s in st]
    names = _unique_names([s.name for s in st])
    nfwd = sum(1 for s in st if not s.is_backward)
    fwd_index = [s.forward_of if (s.is_backward and s.forward_of is not None and s.forward_of < nfwd) else None for s in st]
    forward_scopes = tuple(
        tuple(dict.fromkeys(eqns[j].scope for j in s.eqns)) if not s.is_backward else () for s in st
    )
    loss_nodes = [i for i, s in enumerate(st) if not s.is_backward and s.name == "fwd/loss"]
    notes = []
    if any(e.name == "while" for e in eqns):
        notes.append("while loops: FLOPs count one iteration of cond + body (trip count unknown)")
    meta = {
        "node_primitives": tuple(tuple(eqns[j].name for j in s.eqns) for s in st),
        "stages": stages,
        "argnums": argnums,
        "batch_size": _batch_size([x for x, d in zip(leaves, diff) if not d]),
        "loss_nodes": tuple(loss_nodes),
        "n_eqns": len(eqns),
        "n_dead_eqns": n_flat - len(eqns),
        "n_sunk_eqns": len(sunk),
        "notes": tuple(notes),
        "cost_unit": "s",
    }
    gname = name or getattr(fn, "__name__", "extracted")
    g = make_graph(
        names,
        edges,
        out_bytes=out_bytes,
        time_s=[0.0] * n,
        is_backward=[s.is_backward for s in st],
        flops=flops,
        param_bytes=param_bytes,
        forward_index=fwd_index,
        name=gname,
        meta=meta,
        graph_param_bytes=int(arg_b[diff].sum()),
        input_bytes=int(arg_b[~diff].sum()),
    )
    dev = _resolve_device(device)
    times, energies = dev.node_costs(g)
    nodes = tuple(
        dataclasses.replace(v, time_s=float(t), energy_j=float(en))
        for v, t, en in zip(g.nodes, np.asarray(times), np.asarray(energies))
    )
    arg_shapes = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype") else np.result_type(x)),
        args,
    )
    program = Program(
        fn=fn,
        arg_shapes=arg_shapes,
        stages=stages,
        argnums=argnums,
        in_tree=in_tree,
        out_tree=out_tree,
        eqns=tuple(eqns),
        avals=tuple(avals),
        n_args=n_args,
        diff_args=diff,
        const_ids=tuple(const_ids),
        consts=tuple(const_vals),
        node_eqns=tuple(tuple(s.eqns) for s in st),
        node_inputs=tuple(tuple(x) for x in node_inputs),
        node_args=tuple(tuple(x) for x in node_args),
        node_outputs=tuple(tuple(x) for x in node_outputs),
        producer=producer,
        out_refs=tuple(out_refs),
        forward_scopes=forward_scopes,
        out_avals=tuple(v.aval for v in closed.jaxpr.outvars),
    )
    meta["device"] = getattr(dev, "name", type(dev).__name__)
    return dataclasses.replace(g, nodes=nodes, meta=meta, program=program)
