"""Jaxpr -> training graph extraction.

``extract(fn, *args)`` reads ``fn`` twice through :mod:`remat.frontend`:

1. the **forward program**: ``jax.make_jaxpr(fn)`` flattened with call wrappers and
   ``jax.checkpoint`` regions inlined (the plan decides what is recomputed) and custom-derivative
   calls kept as leaves.  Its leaf equations that compute the loss are grouped into *stages*
   (:mod:`remat.stages`): by Flax module scope, by dataflow layers for code without modules, or
   merged into ``k`` cost-balanced groups;
2. the **training program**: ``jax.make_jaxpr(jax.value_and_grad(marked))`` where ``marked``
   re-evaluates the forward program with each leaf ``k`` under the name scope ``remat@k``.  The
   backward half is JAX's own transpose (never a hand-written mirror), fully flattened, and every
   equation names the forward leaf it comes from (:func:`remat.frontend.origin_of`).

A forward equation of the training program belongs to the stage of its forward leaf; a backward
equation to the backward mirror of that stage (contiguous runs form the backward nodes).
This identity is recorded in the :class:`Program` (``fwd_node``), so the applier
(:mod:`remat.apply`) puts exactly the same equations in each stage, whatever the code looks
like (plain JAX, Flax linen or nnx, pytree modules).

Forward / backward split
  JAX emits every primal equation before the first transposed one.  Everything before the first
  transposed equation is the forward half, the rest is the backward half.

Dead code and residual preparation
  Equations whose results reach no program output are dropped (``meta["n_dead_eqns"]``).  In the
  forward half only the *primal* computation of the loss value stays in forward stages; the
  equations JAX's linearisation adds there for the backward pass alone (derivative masks such as
  ``gt x 0`` for a ReLU, ``cos x`` for ``sin x``) are *sunk* into the earliest backward stage that
  reads them (``meta["n_sunk_eqns"]``).  So forward FLOPs equal those of the forward-only program,
  and the backward reads primal values (what XLA's fusion keeps) instead of JAX's materialised
  residuals.  ``stages="eqn"`` (one node per training-program equation) keeps every forward-half
  equation forward.

Costs: ``flops`` from :mod:`remat.flops`; ``time_s``/``energy_j`` from a device profile
(:mod:`remat.devices`; by default the backend's: ``host`` on the CPU, calibrated on an
accelerator, :func:`remat.devices.for_backend`); ``out_bytes`` = bytes of the stage's values that
another stage or the program outputs read; ``param_bytes`` = bytes of differentiated arguments the
stage reads.  The loss node reaches the first backward node by an edge even when no backward
equation reads the loss value (``sum(y ** 2)``), so every node of the graph is needed.

Length: one pass from a traced function to a Graph and its Program (the stage functions the
executor runs); splitting the value bookkeeping from ``extract`` would pass a dozen arrays
between modules.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from remat import devices
from remat.core.errors import ExtractionError, RematWarning
from remat.core.graph import Graph, make_graph
from remat.core.scan_plan import aval_bytes
from remat.devices import DeviceProfile
from remat.flops import eqn_flops, fallback_bytes, unknown_primitives
from remat.frontend import (
    INLINE_ALL,
    INLINE_FORWARD,
    ORIGIN_PREFIX,
    FlatJaxpr,
    LeafEqn,
    Lit,
    batch_coupled,
    batch_size,
    bind,
    dce,
    flatten,
    is_key,
    is_transpose,
    origin_of,
    scope_of,
)
from remat.scans import analyse_scan, unroll_scans
from remat.stages import AUTO_MAX_STAGES, dependence, eqn_class, group_forward, group_keys, runs
from remat.workspace import eqn_workspace_bytes

__all__ = ["extract", "scope_of", "Program", "LeafEqn", "Lit", "group_keys", "AUTO_MAX_STAGES"]


# ---------------------------------------------------------------------------------- program
@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """Everything needed to run the stages of an extracted graph, and to re-evaluate the forward
    program stage by stage.

    Value ids (training program): ``0 .. n_args-1`` are the flattened arguments
    (``jax.tree_util.tree_leaves(args)`` order), then constants, then equation results.

    Attributes:
      fn, arg_shapes, stages, argnums, has_aux: what ``extract`` was called with (shapes as
        ``jax.ShapeDtypeStruct`` pytrees) so micro-batch code can re-extract.
      in_tree: treedef of the ``args`` tuple; out_tree: treedef of ``(value, grads)``.
      eqns: the training program's leaf equations (dead code removed).
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
      forward_scopes: per node, the raw scope keys its forward equations cover (``()`` for
        backward nodes).
      forward: the forward program (``jax.make_jaxpr(fn)`` flattened, aux outputs included).
      fwd_node: ``int64[len(forward.eqns)]`` forward graph node of each forward-program leaf,
        non-decreasing (the applier's stage map; leaves the loss does not need go with the
        node before them).
      origin: ``int64[len(eqns)]`` forward-program leaf each training equation comes from
        (``-1``: none, e.g. gradient sums).
      fwd_out_tree: treedef of ``fn``'s output.
      eqn_classes: Sage's operator class of each training equation
        (:func:`remat.stages.eqn_class`: ``"symmetrical"``, ``"asymmetrical"``, ``"opaque"``).
      scans: per ``scan`` of the forward program that the loss needs, its
        :class:`remat.scans.ScanBody` (compact view; empty when scans were unrolled).
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
    forward: FlatJaxpr | None = None
    fwd_node: np.ndarray | None = None
    origin: np.ndarray | None = None
    fwd_out_tree: Any = None
    has_aux: bool = False
    scans: tuple = ()
    eqn_classes: tuple[str, ...] = ()
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
                env.update(zip(e.outs, bind(e, invals)))
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


# ---------------------------------------------------------------------------------- stages
@dataclasses.dataclass
class _Stage:
    eqns: list[int]
    name: str
    is_backward: bool
    forward_of: int | None = None  # index of the forward stage (backward stages)


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        c = seen.get(n, 0)
        seen[n] = c + 1
        out.append(n if c == 0 else f"{n}#{c}")
    return out


def _primal_split(eqns: list[LeafEqn], nf: int, loss_ref) -> tuple[list[int], list[int]]:
    """Split the forward half ``eqns[:nf]`` into the primal computation of the loss value and
    the rest (residual preparation for the backward pass), which is *sunk* into the backward
    stage that first reads it."""
    primal = dce(eqns[:nf], [loss_ref] if isinstance(loss_ref, int) else [])
    return np.flatnonzero(primal).tolist(), np.flatnonzero(~primal).tolist()


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


def _fill_forward(labels: np.ndarray) -> np.ndarray:
    """Replace ``-1`` entries by the previous label (leading ones by the first label)."""
    lab = np.asarray(labels, dtype=np.int64).copy()
    known = np.flatnonzero(lab >= 0)
    if len(known) == 0:
        return np.zeros_like(lab)
    idx = np.where(lab >= 0, np.arange(len(lab)), 0)
    np.maximum.accumulate(idx, out=idx)
    out = lab[idx]
    out[: known[0]] = lab[known[0]]
    return out


def _group_training(
    eqns: list[LeafEqn], F: list[int], nf: int, origin: np.ndarray, fwd_label: dict[int, int],
    names: Sequence[str],
) -> list[_Stage]:
    """Stages of the training program from the forward grouping: a primal forward equation
    (``F``) joins the stage of its origin leaf; backward equations (``nf ..``) are labelled with
    their origin's forward stage (unmarked ones, e.g. gradient sums, join the label before them)
    and contiguous runs of equal label form the backward stages.  Empty forward stages are
    dropped."""
    S = len(names)
    f_lab = _fill_forward(np.array([fwd_label.get(int(origin[j]), -1) for j in F],
                                   dtype=np.int64))
    fst = [_Stage([], names[s], False) for s in range(S)]
    for j, g in zip(F, f_lab.tolist()):
        fst[g].eqns.append(j)
    kept = [s for s in range(S) if fst[s].eqns]
    renum = {s: i for i, s in enumerate(kept)}
    out = [fst[s] for s in kept]
    b_raw = np.array([fwd_label.get(int(origin[j]), -1) for j in range(nf, len(eqns))],
                     dtype=np.int64)
    if len(b_raw) and (b_raw < 0).all():
        b_raw[:] = S - 1
    b_lab = _fill_forward(b_raw)
    for a, b in runs(list(b_lab)):
        s = int(b_lab[a])
        out.append(_Stage([nf + j for j in range(a, b)], "bwd/" + names[s][4:], True,
                          forward_of=renum.get(s)))
    return out


# ---------------------------------------------------------------------------------- checks
def _check_loss(fn, args, has_aux):
    try:
        out = jax.eval_shape(fn, *args)
    except ExtractionError:
        raise
    except Exception as e:  # noqa: BLE001 - report the tracing failure as an extraction error
        raise ExtractionError(f"tracing the loss failed: {type(e).__name__}: {e}") from e
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ExtractionError("with has_aux=True the function must return (loss, aux)")
        out = out[0]
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


def _analyse_scans(fwd: FlatJaxpr, fidx: np.ndarray, data_ids, param_ids) -> tuple:
    """:class:`remat.scans.ScanBody` of every scan the loss needs (compact view)."""
    leaves = [int(k) for k in fidx if fwd.eqns[k].name == "scan"]
    if not leaves:
        return ()
    data, _ = dependence(fwd.eqns, data_ids or param_ids, ())
    return tuple(
        analyse_scan(fwd, k, [bool(data.get(r, False)) if isinstance(r, int) else False
                              for r in fwd.eqns[k].ins])
        for k in leaves
    )


def _resolve_device(device):
    """A device profile: ``None`` -> the device the step runs on (:func:`remat.devices.for_backend`:
    ``host`` on the CPU, measured once per process on an accelerator), a name -> that profile,
    any object with ``node_costs(graph) -> (times, energies)`` as is."""
    if device is None:
        return devices.for_backend()
    if isinstance(device, str):
        return devices.get(device)
    return device


def _data_leaves(leaves, diff, B) -> np.ndarray:
    """``bool[n_args]``: the batch leaves (non-differentiated, leading dimension ``B``, not a
    PRNG key)."""
    out = np.zeros(len(leaves), dtype=bool)
    if B is None:
        return out
    for i, x in enumerate(leaves):
        shape = np.shape(x)
        raw_key = getattr(x, "dtype", None) == np.uint32 and tuple(shape) == (2,)
        out[i] = (not diff[i] and len(shape) >= 1 and shape[0] == B and not is_key(x)
                  and not raw_key)
    return out


# ---------------------------------------------------------------------------------- extract
def extract(
    fn: Callable,
    *args: Any,
    stages: str | int = "auto",
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    scans: str = "compact",
    device=None,
    name: str | None = None,
) -> Graph:
    """Trace ``jax.value_and_grad(fn, argnums)(*args)`` and return its training graph.

    Args:
      fn: ``fn(*args) -> scalar`` loss (``(scalar, aux)`` with ``has_aux``); args are pytrees
        (params first by convention).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``; only shapes are used, but the
        executor needs concrete arrays).
      stages: ``"auto"``, ``"module"``, ``"layer"``, ``"eqn"`` or an int ``k`` (see
        :mod:`remat.stages`).
      argnums: which argument(s) are differentiated (the parameters).
      has_aux: ``fn`` returns ``(loss, aux)``; the graph differentiates the loss, the applier
        also returns ``aux``.
      scans: ``"compact"``: a ``lax.scan`` is one stage (and its backward one more), analysed
        per iteration for the scan planner (:mod:`remat.scans`, ``program.scans``);
        ``"unroll"``: scans are unrolled into one copy of the body per iteration first, so
        every policy plans (and the applier runs) the unrolled program.
      device: a :mod:`remat.devices` profile, a profile name, or ``None`` for the backend's
        (:func:`remat.devices.for_backend`: ``"host"`` on the CPU); gives
        ``time_s`` (seconds) and ``energy_j`` (joules) per node.
      name: graph label (defaults to ``fn.__name__``).

    Returns:
      A :class:`remat.Graph` whose ``program`` is a :class:`Program`; each node's
      ``workspace_bytes`` is the largest scratch allocation of its equations while they run on
      this backend (:mod:`remat.workspace`).  ``graph.meta`` holds
      ``node_primitives`` (per node, the primitive names of its equations), ``stages``,
      ``stage_mode`` (``module``/``layer``/``contraction``/``eqn``), ``argnums``, ``batch_size``
      (or ``None``), ``loss_nodes``, ``n_eqns``, ``notes`` and ``unknown_primitives`` (sorted
      names of primitives costed by :mod:`remat.flops`' fallback rule; empty when none, else a
      :class:`~remat.core.errors.RematWarning` names them once).

    Raises:
      ExtractionError: non-scalar / non-float loss, bad ``stages``, tracing failure.
      UnsupportedPrimitiveError: a primitive without a FLOP rule whose output has no static
        shape.
    """
    if not args:
        raise ExtractionError("extract needs the example arguments of fn")
    if scans not in ("compact", "unroll"):
        raise ExtractionError(f"scans must be 'compact' or 'unroll', got {scans!r}")
    if not (stages == "eqn" or stages in ("auto", "module", "layer", "sage")
            or (isinstance(stages, (int, np.integer)) and not isinstance(stages, bool))):
        raise ExtractionError(
            f"stages must be 'auto', 'module', 'layer', 'sage', 'eqn' or an int, got {stages!r}")
    _check_loss(fn, args, has_aux)
    argnums_t = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in argnums_t:
        if not 0 <= a < len(args):
            raise ExtractionError(f"argnums {argnums} out of range for {len(args)} arguments")

    leaves, in_tree = jax.tree_util.tree_flatten(args)
    diff = np.zeros(len(leaves), dtype=bool)
    pos = 0
    for ai, a in enumerate(args):
        n = len(jax.tree_util.tree_leaves(a))
        if ai in argnums_t:
            diff[pos : pos + n] = True
        pos += n

    # 1. the forward program
    try:
        closed_f, fwd_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    except Exception as e:  # noqa: BLE001
        raise ExtractionError(f"tracing the loss failed: {type(e).__name__}: {e}") from e
    if scans == "unroll":

        closed_f = unroll_scans(closed_f)
    fwd = flatten(closed_f, INLINE_FORWARD)
    loss_ref = fwd.out_refs[0]
    produced = {o for e in fwd.eqns for o in e.outs}
    if not (isinstance(loss_ref, int) and loss_ref in produced):
        raise ExtractionError("the loss is a constant or an argument: there is nothing to plan")
    fkeep = dce(fwd.eqns, [loss_ref])
    fidx = np.flatnonzero(fkeep)

    # 2. the training program of the marked forward program
    def marked(*a):
        env = fwd.const_env()
        env.update(zip(fwd.arg_ids, jax.tree_util.tree_leaves(a)))
        for k in fidx.tolist():
            e = fwd.eqns[k]
            invals = [r.val if isinstance(r, Lit) else env[r] for r in e.ins]
            env.update(zip(e.outs, bind(e, invals, scope=f"{ORIGIN_PREFIX}{k}")))
        return env[loss_ref]

    try:
        closed, out_shape = jax.make_jaxpr(
            jax.value_and_grad(marked, argnums=argnums), return_shape=True)(*args)
    except Exception as e:  # noqa: BLE001
        raise ExtractionError(f"differentiating the loss failed: {type(e).__name__}: {e}") from e
    out_tree = jax.tree_util.tree_structure(out_shape)
    vg = flatten(closed, INLINE_ALL)
    keep = dce(vg.eqns, [r for r in vg.out_refs if isinstance(r, int)])
    eqns = [e for e, k in zip(vg.eqns, keep) if k]
    avals, arg_ids, out_refs = vg.avals, vg.arg_ids, vg.out_refs
    n_args = len(arg_ids)
    eflops = np.array([eqn_flops(e.jaxpr_eqn) for e in eqns], dtype=np.float64)
    origin = np.array([origin_of(e.name_stack) for e in eqns], dtype=np.int64)
    nf = next((j for j, e in enumerate(eqns) if is_transpose(e.name_stack)), len(eqns))

    # 3. stages
    B = batch_size(args, argnums)
    data = _data_leaves(leaves, diff, B)
    notes = []
    unknown = unknown_primitives([e.jaxpr_eqn for e in eqns])
    if unknown:
        msg = (f"no FLOP rule for primitive(s) {', '.join(unknown)} (jax {jax.__version__}): "
               "costed by remat.flops' fallback rule (one FLOP per output element; bytes in + "
               "out moved when not elementwise)")
        warnings.warn(msg, RematWarning, stacklevel=2)
        notes.append(msg)
    if stages == "eqn":
        F, sunk = list(range(nf)), []
        st = [_Stage([j], f"fwd/{e.scope + '/' if e.scope else ''}{j}:{e.name}", False)
              for j, e in enumerate(eqns[:nf])]
        st += [_Stage([j], f"bwd/{eqns[j].scope + '/' if eqns[j].scope else ''}{j}:{eqns[j].name}",
                      True) for j in range(nf, len(eqns))]
        mode = "eqn"
    else:
        F, sunk = _primal_split(eqns, nf, out_refs[0])
        leaf_flops = np.zeros(len(fwd.eqns))
        for j in F:
            if origin[j] >= 0:
                leaf_flops[origin[j]] += eflops[j]
        groups = group_forward(
            [fwd.eqns[k] for k in fidx], stages, out_ids=[loss_ref],
            data_ids=[fwd.arg_ids[i] for i in np.flatnonzero(data)],
            param_ids=[fwd.arg_ids[i] for i in np.flatnonzero(diff)],
            flops=leaf_flops[fidx],
        )
        fwd_label = {int(k): int(g) for k, g in zip(fidx, groups.labels)}
        st = _group_training(eqns, F, nf, origin, fwd_label, groups.names)
        mode = groups.mode
        if stages == "module" and mode != "module":
            notes.append("no Flax module structure: stages='module' grouped by dataflow layers")
    if fwd.n_inlined.get("remat2") or fwd.n_inlined.get("checkpoint"):
        notes.append("jax.checkpoint regions in the loss are inlined: the plan decides what is "
                     "recomputed")
    if sunk:
        _sink(eqns, st, sunk)
    n = len(st)

    # 4. value bookkeeping (vectorised over equations where it matters)
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
    # The loss value seeds the backward pass (Checkmate's convention).  When no backward node
    # reads it (``sum(y ** 2)``: the derivative needs ``y`` only) the loss node would be a sink
    # that chain policies never schedule; an edge to the first backward node keeps it needed
    # (4 bytes held until the backward starts; the executor's inputs come from the program).
    lref = out_refs[0] if out_refs else None
    ln = int(prod_node[lref]) if isinstance(lref, int) else -1
    if ln >= 0 and not st[ln].is_backward and not any(p == ln for p, _ in edges):
        first = min((d for _, d in edges if st[d].is_backward and d > ln), default=None)
        if first is not None:
            edges = sorted(edges + [(ln, first)])
            notes.append("no backward node reads the loss value: edge loss -> first backward "
                         "node added")

    out_bytes = [int(vbytes[node_outputs[i]].sum()) if node_outputs[i] else 0 for i in range(n)]
    arg_b = vbytes[:n_args]
    param_bytes = [int(sum(arg_b[a] for a in node_args[i] if diff[a])) for i in range(n)]
    flops = [float(eflops[s.eqns].sum()) for s in st]
    efb = np.array([fallback_bytes(e.jaxpr_eqn) for e in eqns]) if unknown else np.zeros(len(eqns))
    extra_bytes = np.array([efb[s.eqns].sum() for s in st], dtype=np.float64)
    names = _unique_names([s.name for s in st])
    nfwd = sum(1 for s in st if not s.is_backward)
    fwd_index = [s.forward_of if (s.is_backward and s.forward_of is not None
                                  and s.forward_of < nfwd) else None for s in st]

    # the applier's stage map: forward-program leaf -> forward node
    leaf_node = np.full(len(fwd.eqns), -1, dtype=np.int64)
    for i, s in enumerate(st):
        if not s.is_backward:
            for j in s.eqns:
                if origin[j] >= 0:
                    leaf_node[origin[j]] = max(leaf_node[origin[j]], i)
    fwd_node = _fill_forward(leaf_node)
    fwd_node = np.maximum.accumulate(fwd_node) if len(fwd_node) else fwd_node
    forward_scopes = tuple(
        tuple(dict.fromkeys(fwd.eqns[k].scope for k in np.flatnonzero(fwd_node == i)))
        if not s.is_backward else () for i, s in enumerate(st)
    )
    loss_nodes = [i for i, s in enumerate(st) if not s.is_backward and s.name == "fwd/loss"]
    scan_bodies = _analyse_scans(fwd, fidx, [fwd.arg_ids[i] for i in np.flatnonzero(data)],
                                 [fwd.arg_ids[i] for i in np.flatnonzero(diff)])
    if any(e.name == "while" for e in eqns):
        notes.append("while loops: FLOPs count one iteration of cond + body (trip count unknown)")
    backend = jax.default_backend()
    ews = [eqn_workspace_bytes(e.jaxpr_eqn, backend) if e.jaxpr_eqn is not None else 0
           for e in eqns]
    meta = {
        "node_primitives": tuple(tuple(eqns[j].name for j in s.eqns) for s in st),
        "stages": stages,
        "stage_mode": mode,
        "argnums": argnums,
        "batch_size": B,
        "batch_coupled": batch_coupled(fwd, B, [fwd.arg_ids[i] for i in np.flatnonzero(data)]),
        "loss_nodes": tuple(loss_nodes),
        "n_eqns": len(eqns),
        "n_dead_eqns": len(vg.eqns) - len(eqns),
        "n_sunk_eqns": len(sunk),
        "notes": tuple(notes),
        "unknown_primitives": unknown,
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
        workspace_bytes=[max((ews[j] for j in s.eqns), default=0) for s in st],
        name=gname,
        meta=meta,
        graph_param_bytes=int(arg_b[diff].sum()),
        input_bytes=int(arg_b[~diff].sum()),
    )
    dev = _resolve_device(device)
    if extra_bytes.any() and isinstance(dev, DeviceProfile):
        times, energies = dev.node_costs(g, extra_bytes=extra_bytes)
    else:
        times, energies = dev.node_costs(g)
    nodes = tuple(
        dataclasses.replace(v, time_s=float(t), energy_j=float(en))
        for v, t, en in zip(g.nodes, np.asarray(times), np.asarray(energies))
    )
    arg_shapes = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype")
                                       else np.result_type(x)),
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
        const_ids=tuple(vg.const_ids),
        consts=tuple(vg.consts),
        node_eqns=tuple(tuple(s.eqns) for s in st),
        node_inputs=tuple(tuple(x) for x in node_inputs),
        node_args=tuple(tuple(x) for x in node_args),
        node_outputs=tuple(tuple(x) for x in node_outputs),
        producer=producer,
        out_refs=tuple(out_refs),
        forward_scopes=forward_scopes,
        out_avals=tuple(v.aval for v in closed.jaxpr.outvars),
        forward=fwd,
        fwd_node=fwd_node,
        origin=origin,
        fwd_out_tree=jax.tree_util.tree_structure(fwd_shape),
        has_aux=has_aux,
        scans=scan_bodies,
        eqn_classes=tuple(eqn_class(e) for e in eqns),
    )
    meta["device"] = getattr(dev, "name", type(dev).__name__)
    return dataclasses.replace(g, nodes=nodes, meta=meta, program=program)
