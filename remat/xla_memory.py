"""A memory model calibrated to XLA: the temp bytes a plan's compiled training step allocates.

:func:`remat.simulate` counts the graph's live bytes: every stage output the plan keeps, at
JAX's residual granularity.  XLA allocates something else (on transformers the plan's peak is
3-6x the compiled ``memory_analysis().temp_size_in_bytes``).  :func:`predict_temp_bytes`
models what XLA does with the step the drop-in really runs (``jax.value_and_grad`` of the
function :mod:`remat.apply` builds from the plan), in five steps, each a rule read off XLA's
buffer-assignment dumps (``--xla_dump_to``):

1. **The program.**  The step's jaxpr, flattened (calls and custom derivatives inlined);
   every ``jax.checkpoint`` that JAX differentiated becomes, as JAX lowers it, an
   ``optimization_barrier`` over all its operands followed by its body, so its recomputation
   cannot start before its last operand (the incoming cotangent) exists.  Three rewrites XLA
   makes: ``add(scatter-add(zeros, i, u), x)`` is ``scatter-add(x, i, u)`` (a tied embedding's
   gradient has no zeros buffer); a transpose read only by contractions, or the only reader
   of one, is folded into them; and layout copies are added: a convolution operand off
   XLA:CPU's canonical layout (a weight gradient's activations and cotangent, a data
   gradient's kernel) and the right operand of a contraction over several dimensions (a
   weight gradient summed over batch and sequence) are read through a transposed copy of
   their own.  A forward value copied for a convolution is read from the copy by the backward
   pass and by fusions, so the original dies with its last forward contraction.  A
   contraction's copy recomputes an elementwise operand from that operand's inputs (XLA
   duplicates it into the copy), unless the operand is written, reads two inputs of its size
   and is held in the 2-D layout of the contractions (:func:`_flat_values`): XLA does not
   duplicate it then, and the copy reads it.
2. **Fusion: what is materialised.**  Contractions, convolutions, reductions, gathers and
   scatters, sorts, loops and custom calls write a buffer; a PRNG draw writes two 32-bit
   words per result word (XLA:CPU runs threefry as a loop whose state holds both halves, and
   the bits are their fused combination).  Elementwise, broadcast and layout ops fuse into
   their consumers and write nothing, except (a) a value that a non-fusible op, a barrier, a
   loop or the program's outputs read (the fusion computing it writes it), and (b) an
   expensive elementwise op (``exp``, ``tanh``, ``div``, ...) read by more than one fusion
   (XLA does not duplicate it).  ``reshape``/``squeeze``/``expand_dims`` alias their operand.
   A fused value costs nothing itself but keeps the buffers it is computed from alive until
   its last consumer runs (XLA recomputes it there).  Where XLA:CPU compiles reductions as
   XNNPACK fusions (jaxlib 0.12: operands of 4096 elements or more; :func:`xnnpack_reductions`
   probes it), a reduction fuses the arithmetic of its operand itself and the walk back from
   it stops at a value read elsewhere too, an op outside that arithmetic, or a broadcast:
   that value is written by a fusion of its own (a layer norm's ``x - mean``, kept for the
   backward pass).
3. **Schedule.**  XLA:CPU orders instructions breadth-first (its concurrency-optimised
   scheduler: Kahn's algorithm, first in first out, from the program order), so an
   instruction runs as soon as its operands exist: what the backward pass needs that depends
   only on the inputs is computed early and held through the forward pass.  A barrier's
   results are read through get-tuple-elements that the queue visits last element first, so
   of two ops a barrier releases, the one reading only later elements (a data gradient: the
   cotangent and the weight) runs before the one reading the first (the recomputation).
4. **Live ranges.**  A buffer lives from the instruction that writes it to the last one that
   reads it (directly or through fused values); an elementwise fusion or a scatter writes its
   output into an operand of the same size that dies there (in place), unless that operand
   passed through a barrier (a tuple element, which XLA does not reuse); the two are one
   allocation, at one offset, from the operand's start to the output's end (XLA colocates
   them), so a gradient written in place holds its operand in the gradient's allocation.  A
   loop adds its body's own peak at the loop instruction, and an instruction with scratch
   memory (:mod:`remat.workspace`: a grouped convolution's weight gradient) its scratch bytes.
5. **Buffer assignment.**  As XLA's ``BufferAssigner``: each output (the loss, every gradient)
   has its own allocation, outside temp; a temporary that fits in an output's allocation and
   whose life does not overlap the output's (or the other temporaries' already there) goes
   there, largest first, into the smallest allocation that takes it, and costs no temp bytes
   (the gradients of the first layers, written last, hold forward residuals).  The rest share
   the one temp allocation, largest first, each at the lowest offset free over its life
   (:func:`remat.core.layout.greedy_by_size`), sizes rounded up to 64 bytes.

Accuracy (``experiments/results/memory_model_jax*.csv``: six models, no remat, sqrt(n),
Checkmate at 30/50/70%, the scan planner on the scanned model; the plan's simulated peak was
0.8-5.5x the compiled temp): within 10% on 27 of 30 rows on jax 0.8 and 24 of 30 on jax 0.12.
Not within 10%: zoo ``gpt2_small`` (0.8: 0.77-0.82 on two Checkmate plans; 0.12: 0.63-1.13
on all five, where XLA packs the thirteen dropout loops' state into an arena 12-39% above its
own peak of live buffers) and ResNet-50 at 30% (0.84-0.88).

Length: one pass over a program (flatten, fuse, schedule, live ranges, assignment) whose steps
share the same per-value tables; split into modules they would pass a dozen arrays around.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from remat import _jax_compat as compat
from remat.core import layout
from remat.core.errors import ExtractionError, InvalidPlanError
from remat.core.scan_plan import aval_bytes
from remat.flops import ELEMENTWISE
from remat.frontend import INLINE_ALL, batch_size, is_transpose
from remat.interpreter import plan_function
from remat.microbatch import microbatch
from remat.workspace import eqn_workspace_bytes

__all__ = ["predict_temp_bytes", "predict_step_temp_bytes", "temp_breakdown", "TempReport",
           "Rules", "RULES", "xnnpack_reductions"]

ALIAS = frozenset({"reshape", "squeeze", "expand_dims", "copy", "copy_p", "pvary", "name",
                   "sharding_constraint", "mesh_cast", "reshard", "folded_transpose"})
"""Primitives whose result is (a bitcast of) their operand's buffer."""
FUSIBLE = (ELEMENTWISE | frozenset(
    {"broadcast_in_dim", "transpose", "convert_element_type", "slice", "concatenate", "pad",
     "rev", "iota", "select_n", "clamp", "gather", "dynamic_slice", "integer_pow", "split",
     "reduce_precision", "bitcast_convert_type", "square"})) - ALIAS
"""Primitives XLA fuses into their consumers (loop fusion)."""
EXPENSIVE = frozenset({"exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "div", "pow",
                       "sqrt", "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "atan2", "sin", "cos",
                       "tan", "rem", "lgamma", "digamma"})
"""Elementwise primitives XLA does not duplicate into several consumers."""
IN_PLACE = frozenset({"scatter", "scatter-add", "scatter_add", "scatter_mul", "scatter_min",
                      "scatter_max", "dynamic_update_slice"})
"""Non-fusible primitives that write into their first operand's buffer."""
_CONTROL = frozenset({"scan", "while", "cond"})
PRNG_WORDS = {"random_bits": 2, "threefry2x32": 1}
"""Counter-based PRNG draws: XLA:CPU runs threefry as a loop whose state holds two 32-bit words
per output word (the bits are their fused combination), so these write ``k`` times their
result's bytes."""
_REMAT = frozenset({"remat2", "checkpoint"})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax",
                        "argmin", "reduce_and", "reduce_or"})
REDUCE_FUSIBLE = frozenset({"add", "add_any", "sub", "mul", "div", "neg", "max", "min", "exp",
                            "square", "integer_pow", "abs", "convert_element_type"})
"""Elementwise primitives an XNNPACK reduction fuses into itself."""
_COPY = "layout_copy"  # a transposed copy XLA inserts (see _layout_copies)
_COPY_DOT = "layout_copy_dot"  # the same for a contraction's operand
_FOLDED = "folded_transpose"  # a transpose XLA folds into the contraction it reads


@dataclasses.dataclass(frozen=True)
class Rules:
    """The model's switches (all on by default; the report turns them off one at a time).

    Attributes:
      schedule: ``"bfs"`` (XLA:CPU's breadth-first order) or ``"program"`` (the jaxpr's).
      reduce_broadcasts: a broadcast in a reduction's fused operand is written (XLA:CPU
        with XNNPACK fusions; set by :func:`xnnpack_reductions` when left ``None``).
      xnnpack_min_elements: the smallest reduction operand XLA:CPU gives XNNPACK.
      no_dup_expensive: an expensive elementwise value read by several fusions is written.
      in_place: elementwise fusions write into a dying operand of their size.
      colocate: temporaries go into output allocations where they fit.
      heap: ``"greedy"`` (offsets by decreasing size) or ``"live"`` (peak live bytes).
      align: allocation granularity, bytes.
    """

    schedule: str = "bfs"
    reduce_broadcasts: bool | None = None
    xnnpack_min_elements: int = 4096
    no_dup_expensive: bool = True
    in_place: bool = True
    colocate: bool = True
    heap: str = "greedy"
    align: int = 64


RULES = Rules()
"""The calibrated rules."""


# --------------------------------------------------------------------------------- program
@dataclasses.dataclass(frozen=True, eq=False)
class _Op:
    name: str
    ins: tuple  # value ids (int) or None for literals
    outs: tuple[int, ...]
    eqn: Any  # the JaxprEqn (None for a barrier)


@dataclasses.dataclass(frozen=True, eq=False)
class _Program:
    ops: tuple[_Op, ...]
    avals: tuple
    static: frozenset  # arguments and constants
    outs: tuple  # output value ids (ints only)


def _flatten(closed) -> _Program:
    """Flatten ``closed`` with calls inlined, and differentiated ``jax.checkpoint`` bodies
    behind an ``optimization_barrier`` over their operands (as JAX lowers them)."""
    avals: list = []
    ops: list[_Op] = []
    static: set[int] = set()
    inline = {k: v for k, v in INLINE_ALL.items() if k not in _REMAT}

    def new(aval) -> int:
        avals.append(aval)
        return len(avals) - 1

    def read(env, v):
        return None if compat.is_literal(v) else env[v]

    def run(jaxpr, env):
        for e in jaxpr.eqns:
            nm = e.primitive.name
            body = None
            if nm in inline or nm in _REMAT:
                body = compat.call_body(e, inline.get(nm))
            if body is not None:
                sj = compat.open_jaxpr(body)
                senv: dict = {}
                for cv in sj.constvars:
                    senv[cv] = new(cv.aval)
                    static.add(senv[cv])
                ins = [read(env, v) for v in e.invars]
                if nm in _REMAT and e.params.get("differentiated", False) and \
                        any(np.atleast_1d(e.params.get("prevent_cse", True))):
                    ids = [i for i in ins if i is not None]
                    outs = tuple(new(avals[i]) for i in ids)
                    ops.append(_Op("optimization_barrier", tuple(ids), outs, None))
                    it = iter(outs)
                    ins = [None if i is None else next(it) for i in ins]
                for iv, i in zip(sj.invars, ins):
                    senv[iv] = i
                run(sj, senv)
                for o, io in zip(e.outvars, sj.outvars):
                    if not compat.is_dropvar(o):
                        env[o] = read(senv, io)
                continue
            ins = tuple(read(env, v) for v in e.invars)
            outs = tuple(new(o.aval) for o in e.outvars)
            for o, i in zip(e.outvars, outs):
                if not compat.is_dropvar(o):
                    env[o] = i
            ops.append(_Op(nm, ins, outs, e))

    top = compat.open_jaxpr(closed)
    env: dict = {}
    for v in list(top.invars) + list(top.constvars):
        env[v] = new(v.aval)
        static.add(env[v])
    run(top, env)
    outs = tuple(env[v] for v in top.outvars if not compat.is_literal(v))
    return _layout_copies(_scatter_into_sums(
        _dce(_Program(tuple(ops), tuple(avals), frozenset(static), outs))))


def _canonical_conv(dn, nd: int) -> tuple[bool, bool, bool]:
    """Whether a convolution's input, kernel and output are in XLA:CPU's canonical layout
    (input/output batch first, features last; kernel spatial first, output features last)."""
    sp = tuple(range(1, nd - 1))
    lhs = tuple(dn.lhs_spec) == (0, nd - 1, *sp)
    rhs = tuple(dn.rhs_spec) == (nd - 1, nd - 2, *range(nd - 2))
    out = tuple(dn.out_spec) == (0, nd - 1, *sp)
    return lhs, rhs, out


def _is_backward(op: _Op) -> bool:
    return op.eqn is not None and is_transpose(op.eqn.source_info.name_stack)


def _copied_operands(op: _Op, avals, swapped: bool = False) -> tuple[int, ...]:
    """Operand positions XLA:CPU reads through a transposed copy: convolution operands not in
    the canonical layout (its convolution canonicalisation), and the right operand of a
    contraction over several dimensions (a weight gradient summed over batch and sequence:
    the dot decomposer transposes it; the left one when only a transpose reads the result,
    which XLA folds into the contraction by swapping its operands)."""
    if op.eqn is None:
        return ()
    if op.name == "conv_general_dilated":
        dn = op.eqn.params.get("dimension_numbers")
        nd = len(getattr(avals[op.outs[0]], "shape", ()))
        if dn is None or nd < 3:
            return ()
        ok = _canonical_conv(dn, nd)
        return tuple(k for k in (0, 1) if not ok[k])
    if op.name == "dot_general":
        (lc, _), (lb, _) = op.eqn.params["dimension_numbers"]
        return ((0,) if swapped else (1,)) if len(lc) >= 2 and not len(lb) else ()
    return ()


def _scatter_into_sums(p: _Program) -> _Program:
    """``add(scatter-add(zeros, i, u), x)`` is ``scatter-add(x, i, u)`` (XLA's algebraic
    simplifier): a tied embedding's gradient is scattered into the other gradient, no zeros
    buffer exists."""
    prod = {o: op for op in p.ops for o in op.outs}
    nread: dict[int, int] = collections.Counter(i for op in p.ops for i in op.ins if i is not None)

    def zeros(v) -> bool:
        op = prod.get(v)
        return (op is not None and op.name == "broadcast_in_dim" and op.ins
                and op.ins[0] is None)  # a broadcast literal (JAX's zeros)

    moved: dict[int, _Op] = {}  # id(add) -> the scatter rewritten to run in its place
    gone: set[int] = set()
    for op in p.ops:
        if op.name not in ("add", "add_any") or len(op.ins) != 2 or None in op.ins:
            continue
        for a, x in (op.ins, op.ins[::-1]):
            sc = prod.get(a)
            if (sc is not None and sc.name in ("scatter-add", "scatter_add") and nread[a] == 1
                    and sc.ins and zeros(sc.ins[0])
                    and getattr(p.avals[x], "shape", None) == getattr(p.avals[a], "shape", 0)):
                moved[id(op)] = dataclasses.replace(sc, ins=(x, *sc.ins[1:]))
                gone.add(id(sc))
                break
    if not moved:
        return p
    ops: list[_Op] = []
    for op in p.ops:
        if id(op) in gone:
            continue
        if id(op) in moved:
            sc = moved[id(op)]
            ops.append(sc)
            op = _Op(_FOLDED, (sc.outs[0],), op.outs, op.eqn)
        ops.append(op)
    return _dce(dataclasses.replace(p, ops=tuple(ops)))


def _layout_copies(p: _Program) -> _Program:
    """Layout work XLA:CPU adds or removes.  A transpose that alone reads a contraction is
    folded into it (the contraction writes the transposed result: the transpose aliases it),
    and so is a transpose that only contractions read (they read it transposed).
    Every operand that :func:`_copied_operands` names is read through a copy of its own; a
    forward value copied for a convolution is read from the copy by the backward pass and by
    every fusion (they read either layout), so the original dies with its last forward
    contraction."""
    avals = list(p.avals)
    readers: dict[int, list[_Op]] = collections.defaultdict(list)
    for op in p.ops:
        for i in op.ins:
            if i is not None:
                readers[i].append(op)
    folded: set[int] = set()  # ids of transposes folded into the contraction they read
    swapped: set[int] = set()  # ids of those contractions
    for op in p.ops:
        if op.name == "dot_general":
            rs = readers.get(op.outs[0], [])
            if len(rs) == 1 and rs[0].name == "transpose" and op.outs[0] not in p.outs:
                folded.add(id(rs[0]))
                swapped.add(id(op))
        elif op.name == "transpose":  # a transposed operand of contractions only: folded
            rs = readers.get(op.outs[0], [])
            if rs and all(r.name == "dot_general" for r in rs) and op.outs[0] not in p.outs:
                folded.add(id(op))
    copy_of: dict[tuple[int, int], int] = {}
    redirect: dict[int, int] = {}
    copy_name: dict[int, str] = {}
    for op in p.ops:
        for k in _copied_operands(op, avals, id(op) in swapped):
            v = op.ins[k]
            if v is not None and (v, k) not in copy_of:
                avals.append(avals[v])
                c = copy_of[(v, k)] = len(avals) - 1
                copy_name[c] = _COPY if op.name == "conv_general_dilated" else _COPY_DOT
                if op.name == "conv_general_dilated":
                    redirect.setdefault(v, c)
    if not copy_of and not folded:
        return p
    by_value: dict[int, list[int]] = collections.defaultdict(list)
    for (v, _), c in copy_of.items():
        by_value[v].append(c)
    produced_fwd = {o for op in p.ops if not _is_backward(op) for o in op.outs}
    ops: list[_Op] = [_Op(copy_name[c], (v,), (c,), None) for v, cs in by_value.items()
                      if v in p.static for c in cs]
    for op in p.ops:
        ks = _copied_operands(op, p.avals, id(op) in swapped)
        if ks:
            op = dataclasses.replace(op, ins=tuple(
                copy_of.get((v, k), v) if k in ks else v for k, v in enumerate(op.ins)))
        elif id(op) in folded:
            op = dataclasses.replace(op, name=_FOLDED)
        elif _is_backward(op) or _kind(op) in ("fuse", "alias"):
            # fusions (and the backward pass) read a forward value from its copy
            op = dataclasses.replace(op, ins=tuple(
                redirect[v] if v in redirect and v in produced_fwd else v for v in op.ins))
        ops.append(op)
        ops.extend(_Op(copy_name[c], (o,), (c,), None) for o in op.outs
                   for c in by_value.get(o, ()))
    return dataclasses.replace(p, ops=tuple(ops), avals=tuple(avals))


def _dce(p: _Program) -> _Program:
    need = set(p.outs)
    keep = []
    for op in reversed(p.ops):
        eff = op.eqn is not None and bool(getattr(op.eqn, "effects", None))
        if eff or any(o in need for o in op.outs):
            keep.append(op)
            need.update(i for i in op.ins if i is not None)
    return dataclasses.replace(p, ops=tuple(reversed(keep)))


def _body_program(jaxpr) -> _Program:
    """A loop or branch body as a program (its inputs are the loop's buffers: static)."""
    return _flatten(jaxpr)


# --------------------------------------------------------------------------------- the model
@dataclasses.dataclass(frozen=True)
class TempReport:
    """What :func:`temp_breakdown` found.

    Attributes:
      temp_bytes: the predicted ``temp_size_in_bytes`` (the temp allocation's size).
      peak_live_bytes: the peak of live temporaries (before assignment: output allocations
        and packing left out).
      colocated_bytes: bytes of temporaries placed in output allocations.
      n_buffers: materialised temporaries.
      at_peak: ``(bytes, primitive, shape, phase, name stack)`` of the temporaries live at
        the peak, largest first (``phase``: ``"forward"``, ``"backward"`` or ``"recompute"``).
      loop_bytes: the largest loop-body peak added at a loop instruction.
    """

    temp_bytes: int
    peak_live_bytes: int
    colocated_bytes: int
    n_buffers: int
    at_peak: tuple = ()
    loop_bytes: int = 0


def _kind(op: _Op) -> str:
    if op.name in (_COPY, _COPY_DOT):
        return "copy"
    if op.name == "optimization_barrier":
        return "barrier"
    if op.name in ALIAS:
        return "alias"
    if op.name in FUSIBLE and op.name not in PRNG_WORDS:
        return "fuse"
    return "heavy"


def _scalar_like(p: _Program, prod, i) -> bool:
    """A literal, a scalar or a broadcast scalar (any layout XLA wants, for free)."""
    if i is None or not getattr(p.avals[i], "shape", ()):
        return True
    op = p.ops[prod[i]] if i in prod else None
    return op is not None and op.name == "broadcast_in_dim" and all(
        x is None or not getattr(p.avals[x], "shape", ()) for x in op.ins)


_SINKABLE = ELEMENTWISE - PRNG_WORDS.keys() - {"psum", "pmax", "pmin"}


def _flat_values(p: _Program, readers) -> set[int]:
    """Values XLA:CPU holds in the 2-D layout of a contraction: the output of a
    ``dot_general`` with several free dimensions on a side (its dot is a 2-D dot and a reshape)
    and, as XLA's ``ReshapeMover`` sinks that reshape, every elementwise value all of whose
    operands are such values of one shape or scalars, when every other reader of those
    operands sinks too (contractions and reshapes read the 2-D value and do not hold it back)."""
    ops, avals = p.ops, p.avals
    key: dict[int, tuple] = {}
    for op in ops:
        if op.name == "dot_general" and op.eqn is not None:
            (_, _), (lb, _) = op.eqn.params["dimension_numbers"]
            shape = tuple(getattr(avals[op.outs[0]], "shape", ()))
            if len(shape) > len(lb) + 2:
                key[op.outs[0]] = (int(np.prod(shape)), shape[-1])

    prod = {o: j for j, op in enumerate(ops) for o in op.outs}
    passive = ("dot_general", _COPY_DOT) + tuple(ALIAS)
    while True:
        cand: dict[int, tuple] = {}
        for j, op in enumerate(ops):
            if op.name not in _SINKABLE or op.outs[0] in key:
                continue
            ks = {key[i] for i in op.ins if i in key}
            if len(ks) == 1 and all(i in key or _scalar_like(p, prod, i) for i in op.ins):
                cand[j] = ks.pop()
        while True:
            drop = {r for j in cand for i in ops[j].ins if i in key
                    if any(r2 not in cand and ops[r2].name not in passive for r2 in readers[i])
                    for r in readers[i] if r in cand}
            if not drop:
                break
            for r in drop:
                del cand[r]
        if not cand:
            return set(key)
        for j, k in cand.items():
            key[ops[j].outs[0]] = k


def _analyse(p: _Program, rules: Rules, *, top: bool = True, want_detail: bool = False):
    ops = p.ops
    n = len(ops)
    avals = p.avals
    kinds = [_kind(op) for op in ops]
    prod: dict[int, int] = {}
    readers: dict[int, list[int]] = collections.defaultdict(list)
    for j, op in enumerate(ops):
        for o in op.outs:
            prod[o] = j
        for i in dict.fromkeys(i for i in op.ins if i is not None):
            readers[i].append(j)
    outs = set(p.outs)
    static = set(p.static)  # arguments, constants and their aliases: never temp

    # 1. materialisation, last op first (a value's readers decide)
    def materialise(forced) -> dict[int, bool]:
        mat: dict[int, bool] = {}
        for j in range(n - 1, -1, -1):
            op, k = ops[j], kinds[j]
            for o in op.outs:
                if k in ("heavy", "barrier", "copy"):
                    mat[o] = k != "barrier"
                    continue
                rs = readers.get(o, [])
                m = (o in outs or o in forced
                     or any(kinds[r] in ("heavy", "barrier") and not (
                         fuse_reduce and ops[r].name in REDUCTIONS
                         and np.prod(getattr(avals[o], "shape", ())) >= rules.xnnpack_min_elements)
                         for r in rs)
                     or any(kinds[r] == "alias" and mat.get(ops[r].outs[0], False) for r in rs))
                if k == "fuse" and rules.no_dup_expensive and op.name in EXPENSIVE and len(rs) > 1:
                    m = True
                mat[o] = m
        return mat

    fuse_reduce = (xnnpack_reductions() if rules.reduce_broadcasts is None
                   else rules.reduce_broadcasts)
    mat = materialise(set())
    if fuse_reduce:
        mat = materialise(_reduction_operands(p, kinds, prod, readers, mat,
                                              rules.xnnpack_min_elements))
    # 2. buffers: value -> (buffer id, op after which it is ready); static values have none
    buf: dict[int, int] = {}
    ready: dict[int, int] = {}
    for j, op in enumerate(ops):
        k = kinds[j]
        for pos, o in enumerate(op.outs):
            src = op.ins[pos] if k == "barrier" else (op.ins[0] if op.ins else None)
            if k in ("alias", "barrier") and src is not None and (src in buf or src in static):
                if src in buf:
                    buf[o] = buf[src]
                else:
                    static.add(o)
                ready[o] = n + o if k == "barrier" else ready.get(src, -1)
                continue
            if mat.get(o):
                buf[o] = o
                ready[o] = j
    eff: dict[int, frozenset] = {}

    def eff_in(v):  # materialised (or static) values a value is computed from
        if v in buf or v in static:
            return frozenset((v,))
        got = eff.get(v)
        if got is not None:
            return got
        s: frozenset = frozenset()
        for i in ops[prod[v]].ins:
            if i is not None:
                s = s | eff_in(i)
        eff[v] = s
        return s

    executed = [kinds[j] in ("heavy", "barrier", "copy") or any(buf.get(o) == o for o in op.outs)
                for j, op in enumerate(ops)]
    flat = _flat_values(p, readers) if any(op.name == _COPY_DOT for op in ops) else set()
    reads: list[frozenset] = []
    for j, op in enumerate(ops):
        s: frozenset = frozenset()
        if executed[j]:
            for i in op.ins:
                if i is None:
                    continue
                if (op.name == _COPY_DOT and i in prod and kinds[prod[i]] == "fuse"
                        and not (buf.get(i) == i and i in flat and len(
                            {x for x in ops[prod[i]].ins if not _scalar_like(p, prod, x)}) > 1)):
                    # a contraction's copy is a fusion of its own: it recomputes an elementwise
                    # operand from that operand's inputs rather than reading it, unless the
                    # operand is written in the 2-D layout its contractions read (XLA then
                    # does not duplicate it: it reads at least two inputs of its size and
                    # has a reader that cannot fuse it)
                    for x in ops[prod[i]].ins:
                        if x is not None:
                            s = s | eff_in(x)
                else:
                    s = s | eff_in(i)
        reads.append(s)

    # 3. schedule
    ex = [j for j in range(n) if executed[j]]
    if rules.schedule == "bfs":
        # a barrier's outputs are read through get-tuple-elements (ids n + value), which XLA
        # visits last element first: an op reading only late elements (a data gradient's
        # cotangent and weight) runs before one reading the first (the recomputation's inputs)
        deps = {j: {ready[v] for v in reads[j] if ready.get(v, -1) >= 0} - {j} for j in ex}
        gtes = {}
        for j in ex:
            if kinds[j] == "barrier":
                gtes.update({n + o: j for o in reversed(ops[j].outs)})
        deps.update({g: {b} for g, b in gtes.items()})
        users: dict[int, list[int]] = collections.defaultdict(list)
        for g, b in gtes.items():
            users[b].append(g)
        for j in ex:
            for d in sorted(deps[j]):
                users[d].append(j)
        left = {j: len(d) for j, d in deps.items()}
        queue = collections.deque(j for j in ex if left[j] == 0)
        order = []
        while queue:
            j = queue.popleft()
            if j < n:
                order.append(j)
            for u in users[j]:
                left[u] -= 1
                if left[u] == 0:
                    queue.append(u)
        if len(order) != len(ex):  # pragma: no cover - a cycle cannot happen in a jaxpr
            order = ex
    else:
        order = ex
    pos = {j: t for t, j in enumerate(order)}
    T = len(order)

    # 4. live ranges (in half steps: 2t = op t runs; an in-place output frees its operand at 2t-1)
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for j in ex:
        for o in ops[j].outs:
            if buf.get(o) == o:
                start[o] = 2 * pos[j]
                end[o] = 2 * pos[j]
    for j in ex:
        for v in reads[j]:
            b = buf.get(v)
            if b is not None:
                end[b] = max(end[b], 2 * pos[j])
    outbufs = {buf[v] for v in outs if v in buf}
    size = {b: aval_bytes(avals[b]) * PRNG_WORDS.get(ops[prod[b]].name, 1) for b in start}
    if rules.in_place:
        # a buffer that passes through a barrier is a tuple element too: XLA writes no fusion
        # into it in place (the recomputed ``tanh(x @ w + b)`` of a checkpointed layer gets a
        # buffer of its own beside the kept ``x @ w``)
        barriered = {buf[o] for j in ex if kinds[j] == "barrier" for o in ops[j].outs if o in buf}
        for j in sorted(ex, key=pos.__getitem__):
            k = kinds[j]
            if k not in ("fuse", "alias") and ops[j].name not in IN_PLACE:
                continue
            o = ops[j].outs[0]
            if buf.get(o) != o:
                continue
            cands = [buf[v] for v in (reads[j] if k != "heavy" else eff_in(ops[j].ins[0]))
                     if v in buf]
            for c in sorted(set(cands)):
                if (c != o and c not in outbufs and c not in barriered and end[c] == 2 * pos[j]
                        and size[c] == size[o]):
                    # XLA colocates them: one allocation at one offset for the chain's life
                    # (an output written in place holds its operand in the output allocation)
                    start[o] = min(start[o], start[c])
                    size[c] = 0
                    break
    loops = {}
    for j in ex:
        if ops[j].name in _CONTROL:
            loops[j] = _loop_peak(ops[j], rules)
    temps = [(start[b], end[b] if b not in outbufs else 2 * T, size[b], b in outbufs, b)
             for b in start if size[b] > 0]
    temps += [(2 * pos[j], 2 * pos[j], int(x), False, None) for j, x in loops.items() if x > 0]
    backend = jax.default_backend()
    work = {j: eqn_workspace_bytes(ops[j].eqn, backend) for j in ex if ops[j].eqn is not None}
    temps += [(2 * pos[j], 2 * pos[j], int(x), False, None) for j, x in work.items() if x > 0]
    if not top:
        live = _live_peak([(s, e, z) for s, e, z, o, _ in temps if not o])
        return live
    return _assign(temps, rules, p, ops, prod, want_detail, max(loops.values(), default=0))


@functools.lru_cache(maxsize=1)
def xnnpack_reductions() -> bool:
    """Whether XLA:CPU compiles reductions as XNNPACK fusions (``__ynn_fusion``; jaxlib 0.12
    does, 0.8 does not; for operands of at least 4096 elements): probed once by compiling a
    small layer norm."""
    import jax.numpy as jnp

    def f(x):
        m = x.mean(-1, keepdims=True)
        return ((x - m) ** 2).mean()

    try:
        cpu = jax.devices("cpu")[0]
        x = jax.device_put(jnp.ones((64, 64), jnp.float32), cpu)
        return "__ynn_fusion" in jax.jit(f).lower(x).compile().as_text()
    except Exception:  # noqa: BLE001 - no CPU backend: the classic fusion rules
        return False


def _reduction_operands(p: _Program, kinds, prod, readers, mat, min_elements: int) -> set:
    """What XLA:CPU's XNNPACK reductions read as separate operands.  A reduction fuses the
    arithmetic of its operand (``add``, ``mul``, ``exp``, ...); the walk back from it stops,
    and the value it stops at is written by a fusion of its own, at a value read elsewhere too
    (not duplicated), an op outside that arithmetic (a select, a comparison), a broadcast of a
    non-scalar, or an op that broadcasts an operand of another shape (jax >= 0.12 leaves
    size-1 broadcasts implicit in binary ops)."""
    out: set = set()
    seen: set = set()
    for op in p.ops:
        if op.name not in REDUCTIONS or not op.ins or op.ins[0] is None or \
                np.prod(getattr(p.avals[op.ins[0]], "shape", ())) < min_elements:
            continue
        stack = [i for i in op.ins if i is not None]
        while stack:
            v = stack.pop()
            if v in seen or v not in prod:
                continue
            seen.add(v)
            j = prod[v]
            q = p.ops[j]
            if kinds[j] not in ("fuse", "alias") or mat.get(v):
                continue
            ins = [i for i in q.ins if i is not None]
            if kinds[j] == "alias":
                stack.extend(ins)
                continue
            shape = tuple(getattr(p.avals[v], "shape", ()))
            big = [i for i in ins if np.prod(getattr(p.avals[i], "shape", ())) > 1]
            if q.name == "broadcast_in_dim":
                if big:
                    out.add(v)  # a broadcast scalar is a constant, fused everywhere
                continue
            if (q.name not in REDUCE_FUSIBLE or len(readers.get(v, ())) > 1
                    or any(tuple(getattr(p.avals[i], "shape", ())) != shape for i in big)):
                out.add(v)
                continue
            stack.extend(ins)
    return out


def _live_peak(ivs) -> int:
    d: dict[int, int] = collections.defaultdict(int)
    for s, e, z in ivs:
        d[s] += z
        d[e + 1] -= z
    cur = best = 0
    for k in sorted(d):
        cur += d[k]
        best = max(best, cur)
    return int(best)


def _loop_peak(op: _Op, rules: Rules) -> int:
    """Peak live bytes of a loop body's (or the largest branch's) own temporaries."""
    e = op.eqn
    if op.name == "scan":
        bodies = [compat.scan_params(e).jaxpr]
    elif op.name == "while":
        bodies = [compat.while_parts(e)[1]]
    else:
        bodies = list(compat.cond_branches(e))
    return max(_run(_flatten(b), rules, top=False) for b in bodies)


def _run(p: _Program, rules: Rules, **kw):
    return _analyse(p, rules, **kw)


def _assign(temps, rules: Rules, p, ops, prod, want_detail, loop_bytes):
    al = max(1, int(rules.align))

    def rnd(x):
        return -(-int(x) // al) * al

    live_ivs = [(s, e, z) for s, e, z, o, _ in temps if not o]
    peak_live = _live_peak(live_ivs)
    pending = [(s, e, rnd(z), b) for s, e, z, o, b in temps if not o]
    coloc = 0
    if rules.colocate:
        allocs = sorted(([z, [(s, e)]] for s, e, z, o, _ in temps if o), key=lambda a: a[0])
        rest = []
        for t in sorted(pending, key=lambda t: (-t[2], t[0])):
            s, e, z, _ = t
            for a in allocs:
                if a[0] >= z and all(e < lo or hi < s for lo, hi in a[1]):
                    a[1].append((s, e))
                    coloc += z
                    break
            else:
                rest.append(t)
        pending = rest
    if not pending:
        temp = 0
    elif rules.heap == "live":
        temp = _live_peak([(s, e, z) for s, e, z, _ in pending])
    else:

        iv = np.array([(s, e) for s, e, _, _ in pending], dtype=np.int64)
        sz = np.array([z for _, _, z, _ in pending], dtype=np.int64)
        temp = int(layout.arena_size(layout.greedy_by_size(iv, sz), sz))
    if not want_detail:
        return temp
    at_peak = ()
    if live_ivs:
        d: dict[int, int] = collections.defaultdict(int)
        for s, e, z in live_ivs:
            d[s] += z
            d[e + 1] -= z
        cur, best, when = 0, -1, 0
        for k in sorted(d):
            cur += d[k]
            if cur > best:
                best, when = cur, k
        rows = []
        for s, e, z, o, b in temps:
            if not o and s <= when <= e:
                if b is None:
                    rows.append((int(z), "loop body", "", "loop", ""))
                    continue
                op = ops[prod[b]]
                src = op.eqn if op.eqn is not None else ops[prod[op.ins[0]]].eqn \
                    if op.ins and op.ins[0] in prod else None
                stack = str(getattr(getattr(src, "source_info", None), "name_stack", ""))
                phase = ("recompute" if "rematted_computation" in stack else
                         "backward" if "transpose" in stack else "forward")
                rows.append((int(z), op.name, str(p.avals[b].str_short()), phase, stack))
        at_peak = tuple(sorted(rows, key=lambda r: -r[0]))
    return TempReport(temp_bytes=int(temp), peak_live_bytes=int(peak_live),
                      colocated_bytes=int(coloc), n_buffers=len(live_ivs), at_peak=at_peak,
                      loop_bytes=int(loop_bytes))


# --------------------------------------------------------------------------------- entry points
def predict_step_temp_bytes(fn: Callable, *args: Any, argnums: int | Sequence[int] = 0,
                    has_aux: bool = False, rules: Rules = RULES, detail: bool = False):
    """Predicted temp bytes of ``jax.jit(jax.value_and_grad(fn, argnums, has_aux))(*args)``
    (``args`` may be ``jax.ShapeDtypeStruct`` pytrees; nothing runs or compiles).

    Returns:
      An ``int`` (bytes), or a :class:`TempReport` with ``detail=True``.
    """
    closed = jax.make_jaxpr(jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux))(*args)
    res = _run(_flatten(closed), rules, want_detail=detail)
    return res


def temp_breakdown(graph, plan=None, *, fn: Callable | None = None,
                   rules: Rules = RULES) -> TempReport:
    """:func:`predict_temp_bytes` with what it found (:class:`TempReport`): the peak of live
    temporaries, what output allocations absorb, and the buffers live at the peak."""
    return _predict(graph, plan, fn, rules, True)


def predict_temp_bytes(graph, plan=None, *, fn: Callable | None = None,
                       rules: Rules = RULES) -> int:
    """Predicted ``memory_analysis().temp_size_in_bytes`` of the compiled training step when
    ``plan`` is applied to ``graph``'s loss by the drop-in (``jax.jit(remat.value_and_grad(
    loss, ...))``, :func:`remat.apply.apply_plan`), XLA:CPU with the ``cse_barrier_expander``
    pass disabled (see the module docstring for the rules).

    Args:
      graph: a graph from :func:`remat.extract` (it carries the program; loaded graphs have no
        program and raise :class:`~remat.core.errors.ExtractionError`).
      plan: a plan for ``graph``; ``None``: no rematerialization (plain
        ``jax.value_and_grad``).
      fn: the rematerialized forward function when the caller already has it
        (``Applied.fn``); by default it is rebuilt from the plan's segments.
      rules: the model's switches (:data:`RULES`).

    Returns:
      Bytes (``int >= 0``).  Traces the step (about one extraction's time); compiles nothing.
      With ``plan.microbatches = k > 1`` the step accumulates ``k`` micro-batches with
      ``lax.scan`` (:func:`remat.microbatch.microbatch`), which is what is modelled.
    """
    return int(_predict(graph, plan, fn, rules, False))


def _predict(graph, plan, fn, rules, detail):
    prog = getattr(graph, "program", None)
    if prog is None or getattr(prog, "forward", None) is None:
        raise ExtractionError("predict_temp_bytes needs a graph from remat.extract (it carries the "
                         "program); loaded graphs have none")
    if plan is not None and plan.R.shape[1] != graph.n:
        raise InvalidPlanError(f"plan has {plan.R.shape[1]} columns, graph has {graph.n} nodes")
    if fn is None:
        fn = prog.fn if plan is None else plan_function(graph, plan)
    args = prog.arg_shapes
    k = 1 if plan is None else int(plan.microbatches)
    if k > 1:

        B = batch_size(args, prog.argnums)
        nums = (prog.argnums,) if isinstance(prog.argnums, int) else tuple(prog.argnums)
        full = tuple(a if i in nums else jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct((x.shape[0] * k, *x.shape[1:]), x.dtype)
            if len(x.shape) and x.shape[0] == B else x, a) for i, a in enumerate(args))
        vg = microbatch(jax.value_and_grad(fn, argnums=prog.argnums, has_aux=prog.has_aux), k,
                        argnums=prog.argnums, has_aux=prog.has_aux)
        closed = jax.make_jaxpr(vg)(*full)
        return _run(_flatten(closed), rules, want_detail=detail)
    return predict_step_temp_bytes(fn, *args, argnums=prog.argnums, has_aux=prog.has_aux, rules=rules,
                           detail=detail)
