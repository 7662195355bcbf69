"""Group the leaf equations of a forward program into stages (the forward nodes of a Graph).

Input: the forward program's leaf equations in program order (see :mod:`remat.frontend`), only
those that compute the loss value.  Output: a non-decreasing stage label per equation and a
name per stage.  Every mode yields contiguous groups, so stage order is topological.

Modes (``stages=``):

* ``"module"``: Flax module scopes (code without any module scope falls back to ``"layer"``).  The *scope key* of an equation is the ``/``-joined
  ``Scope`` entries of its name stack; an equation whose key is a strict ancestor of the
  previous equation's effective key (an activation written in the parent module right after a
  child ``Dense``) joins that stage, and a leading run of such equations joins the following
  child (:func:`group_keys`).  Contiguous runs of equal effective key are the stages; a trailing
  run of code outside every module (the loss head) is the stage ``fwd/loss`` (a scan in it is a
  stage of its own, and what precedes the scan joins the stage before); other runs outside
  every module join the module run before them.
* ``"layer"``: dataflow layers, for code without modules (plain JAX, Flax nnx, pytree
  modules).  A *cut* is a point of the program where at most one *activation* (a value that
  depends on both the batch and the parameters) is live, i.e. a single value carries
  everything forward (an articulation point of the dataflow).  The program is cut there into
  natural segments; a segment holding a contraction (``dot_general``, ``conv``), a lookup into
  a parameter (``gather``/``dynamic_slice``) or a loop starts a new layer, other segments
  (activations, bias adds, normalisations, the loss) join the layer before them.  A plain chain
  ``tanh(x @ w)`` gives one stage per layer.  When that finds fewer than three layers although
  the program has several contractions (a DAG with long skips such as a U-Net, where no single
  value carries everything), every contraction starts a stage instead.
* ``int k``: at most ``k`` stages: module stages (the loss stage kept apart) or layers, merged
  into contiguous cost-balanced (FLOPs) groups; merging whole natural units never cuts a layer.
* ``"auto"``: ``"module"`` when it gives 2..64 module stages; else layers; more than 64 units
  are merged into 32.  ``"module"`` and ``"layer"`` asked for by name are never merged (a
  100-layer Flax MLP gives 101 + 101 nodes).
* ``"sage"``: Sage's fusion groups (:func:`remat.core.passes.fusion_labels`): each contraction or
  reduction with its neighbouring element-wise ops, opaque ops (sort, argmax, scans) alone.

Every ``scan`` equation is a stage of its own, named after the modules of its body
(``fwd/GPT2/layers/block[scan x12]``): :mod:`remat.scans` plans inside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from remat._jax_compat import call_body, open_jaxpr, scan_params
from remat.core.errors import ExtractionError
from remat.core.passes import fusion_labels, op_class
from remat.frontend import INLINE_FORWARD, LeafEqn, Lit, flatten

__all__ = ["StageGroups", "eqn_class", "group_forward", "group_keys", "balanced", "runs", "dependence",
           "AUTO_MAX_STAGES"]

AUTO_MAX_STAGES = 64
AUTO_K_MANY = 32
_MIN_LAYERS = 3

HEAVY = frozenset({"dot_general", "conv_general_dilated", "ragged_dot", "scan", "while"})
LOOKUP = frozenset({"gather", "dynamic_slice", "take", "take_along_axis"})


@dataclasses.dataclass(frozen=True)
class StageGroups:
    """The grouping of a forward program.

    Attributes:
      labels: ``int64[E]`` stage of each forward leaf equation, non-decreasing from 0.
      names: per stage, its node name (``"fwd/..."``).
      keys: per stage, the raw scope keys its equations cover (for ``checkpoint_policy``).
      mode: what grouped them: ``"module"``, ``"layer"``, ``"contraction"`` or ``"eqn"``.
      loss_stage: index of the ``fwd/loss`` stage, or ``None``.
    """

    labels: np.ndarray
    names: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]
    mode: str
    loss_stage: int | None = None

    @property
    def n_stages(self) -> int:
        return len(self.names)


# ------------------------------------------------------------------------------ helpers
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


def balanced(costs: np.ndarray, k: int) -> np.ndarray:
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


def runs(labels: Sequence) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of maximal runs of equal labels."""
    out = []
    s = 0
    for j in range(1, len(labels) + 1):
        if j == len(labels) or labels[j] != labels[j - 1]:
            out.append((s, j))
            s = j
    return out


def _units_to_labels(bounds: list[tuple[int, int]], n: int) -> np.ndarray:
    lab = np.zeros(n, dtype=np.int64)
    for u, (a, b) in enumerate(bounds):
        lab[a:b] = u
    return lab


def _absorb_unscoped(body_runs: list[tuple[int, int]], fkeys: list[str]):
    """Runs of code outside every module between module runs (activations written in a
    scopeless parent, as with Equinox) join the module run before them; a leading one joins the
    module run after it.  Returns ``(runs, keys)``."""
    out: list[list[int]] = []
    keys: list[str] = []
    pending = None
    for a, b in body_runs:
        if fkeys[a] == "":
            if out:
                out[-1][1] = b
            else:
                pending = a
            continue
        out.append([a if pending is None else pending, b])
        keys.append(fkeys[a])
        pending = None
    return [tuple(x) for x in out], keys


def _library_scope(key: str) -> bool:
    """Scopes JAX itself opens (``jnp.einsum`` names its call after the spec ``ab,bc->ac``)."""
    return all("->" in part for part in key.split("/"))


# ------------------------------------------------------------------------------ layers
def dependence(eqns: Sequence[LeafEqn], data_ids, param_ids):
    """Per value id: depends on the batch (``data``) / on the parameters (``param``)."""
    data: dict[int, bool] = {v: True for v in data_ids}
    param: dict[int, bool] = {v: True for v in param_ids}
    for e in eqns:
        ins = [r for r in e.ins if not isinstance(r, Lit)]
        d = any(data.get(r, False) for r in ins)
        p = any(param.get(r, False) for r in ins)
        for o in e.outs:
            data[o], param[o] = d, p
    return data, param


def _layer_units(eqns: Sequence[LeafEqn], out_ids, data_ids, param_ids) -> tuple[list, str]:
    """Layer boundaries ``[(start, stop)]`` over equation positions (see the module docstring)."""
    E = len(eqns)
    if E == 0:
        return [], "layer"
    data, param = dependence(eqns, data_ids, param_ids if data_ids else ())
    if not data_ids:  # no batch argument: everything computed from the parameters counts
        data = param
        param = {v: True for v in data}
    pos = {}
    for j, e in enumerate(eqns):
        for o in e.outs:
            pos[o] = j
    last = {}
    for j, e in enumerate(eqns):
        for r in e.ins:
            if isinstance(r, int):
                last[r] = j
    for r in out_ids:
        if isinstance(r, int):
            last[r] = E
    diff = np.zeros(E + 2, dtype=np.int64)
    for v, a in pos.items():
        b = last.get(v)
        if b is None or b <= a or not (data.get(v) and param.get(v)):
            continue
        diff[a + 1] += 1  # live across boundaries a+1 .. b (boundary p: between eqns p-1, p)
        diff[b + 1] -= 1
    live = np.cumsum(diff)[: E + 1]
    cuts = [0] + [p for p in range(1, E) if live[p] <= 1] + [E]
    segs = list(zip(cuts[:-1], cuts[1:]))

    def heavy(j: int) -> bool:
        e = eqns[j]
        if e.name in HEAVY:
            return True
        if e.name in LOOKUP and e.ins and isinstance(e.ins[0], int):
            v = e.ins[0]
            return bool(param.get(v)) and not data.get(v)
        return False

    hv = np.array([heavy(j) for j in range(E)], dtype=bool)
    layers: list[list[int]] = []
    for a, b in segs:
        if hv[a:b].any() and (not layers or hv[layers[-1][0]:layers[-1][1]].any()):
            layers.append([a, b])
        elif layers:
            layers[-1][1] = b
        else:
            layers.append([a, b])
    layers = [tuple(x) for x in layers]
    n_heavy = int(hv.sum())
    if len(layers) < _MIN_LAYERS and n_heavy >= 2 and n_heavy > len(layers):
        # no articulation structure (long skips): every contraction starts a stage
        hs = np.flatnonzero(hv).tolist()
        starts = [0] + hs[1:]  # leading light equations join the first contraction
        return list(zip(starts, starts[1:] + [E])), "contraction"
    return layers, "layer"


def _scan_name(e: LeafEqn, scope: str) -> str:
    """``fwd/<scope>/<body scope>[scan x L]``: named after the modules in the scan's body."""

    sp = scan_params(e)
    body = flatten(sp.jaxpr, INLINE_FORWARD)
    keys = [b.scope.split("/") for b in body.eqns if b.scope]
    common: list[str] = []
    for parts in zip(*keys) if keys else ():
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    name = "/".join([p for p in (scope, "/".join(common)) if p])
    return f"fwd/{name}[scan x{sp.length}]"


def _isolate_scans(eqns, units, names, scopes):
    """Every ``scan`` equation is a stage of its own (the planner of :mod:`remat.scans` decides
    inside it)."""
    out_u, out_n = [], []
    for (a, b), nm in zip(units, names):
        cuts = [j for j in range(a, b) if eqns[j].name == "scan"]
        if not cuts:
            out_u.append((a, b))
            out_n.append(nm)
            continue
        s = a
        for j in cuts:
            if j > s:
                out_u.append((s, j))
                out_n.append(nm)
            out_u.append((j, j + 1))
            out_n.append(_scan_name(eqns[j], scopes[j]))
            s = j + 1
        if s < b:
            out_u.append((s, b))
            out_n.append(nm)
    return out_u, out_n


_CUSTOM = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")
_CALLS = ("pjit", "jit", "closed_call", "core_call", "remat2", "checkpoint")  # remat2: jax.checkpoint


def eqn_class(eqn: Any) -> str:
    """:func:`remat.core.passes.op_class` of a leaf equation (Sage's operator class); a custom-derivative call (``jax.nn.relu``,
    ``jax.nn.gelu``) takes the class of its body: symmetrical when every primitive in it is,
    asymmetrical when one is not (opaque when one is opaque)."""
    name = eqn.primitive.name if hasattr(eqn, "primitive") else str(eqn)
    if name not in _CUSTOM and name not in _CALLS:
        return op_class(name)
    body = call_body(eqn) if getattr(eqn, "params", None) else None
    if body is None:
        return "opaque"
    kinds = {eqn_class(e) for e in open_jaxpr(body).eqns}
    return ("opaque" if "opaque" in kinds else
            "asymmetrical" if "asymmetrical" in kinds else "symmetrical")



def _sage_groups(eqns: Sequence[LeafEqn]) -> StageGroups:
    """``stages="sage"``: Sage's fusion groups (:func:`remat.core.passes.fusion_labels`)."""
    if not eqns:
        return StageGroups(np.zeros(0, dtype=np.int64), ("fwd/top",), ((),), "sage")
    classes = [eqn_class(e) for e in eqns]
    labels = fusion_labels(classes)
    names, keys = [], []
    for g, (a, b) in enumerate(runs(labels.tolist())):
        heavy = [eqns[j].name for j in range(a, b) if classes[j] != "symmetrical"]
        if heavy and heavy[0] == "scan":
            names.append(_scan_name(eqns[a], eqns[a].scope))
        else:
            names.append(f"fwd/fused{g}:{heavy[0] if heavy else 'elementwise'}")
        keys.append(tuple(dict.fromkeys(eqns[j].scope for j in range(a, b))))
    return StageGroups(labels, tuple(names), tuple(keys), "sage")


# ------------------------------------------------------------------------------ main entry
def group_forward(
    eqns: Sequence[LeafEqn],
    stages,
    *,
    out_ids: Sequence = (),
    data_ids: Sequence[int] = (),
    param_ids: Sequence[int] = (),
    flops: Sequence[float] | None = None,
) -> StageGroups:
    """Group forward leaf equations into stages.

    Args:
      eqns: the forward program's leaf equations that compute the loss (program order).
      stages: ``"auto"``, ``"module"``, ``"layer"``, ``"sage"`` (Sage's fusion groups,
        :mod:`remat.core.passes`) or an int ``k`` (``"eqn"`` is handled by the extractor on the
        training program).
      out_ids: the program outputs read after the last equation (the loss value).
      data_ids, param_ids: value ids of the batch leaves and of the differentiated arguments.
      flops: FLOPs per equation (cost balancing); ``None`` = 1 each.

    Raises:
      ExtractionError: an unknown ``stages`` or ``k < 1``.
    """
    E = len(eqns)
    if stages == "sage":
        return _sage_groups(eqns)
    fl = np.ones(E) if flops is None else np.asarray(flops, dtype=np.float64)
    is_int = isinstance(stages, (int, np.integer)) and not isinstance(stages, bool)
    if not (is_int or stages in ("auto", "module", "layer")):
        raise ExtractionError(
            f"stages must be 'auto', 'module', 'layer', 'eqn' or an int, got {stages!r}")
    if is_int and int(stages) < 1:
        raise ExtractionError(f"stages={stages}: need at least one stage")
    scopes = [e.scope for e in eqns]
    fkeys = group_keys(scopes)
    fruns = runs(fkeys)
    has_modules = any(k != "" and not _library_scope(k) for k in fkeys)
    loss_run = fruns[-1] if (has_modules and fruns and fkeys[fruns[-1][0]] == "") else None
    body_runs = fruns[:-1] if loss_run is not None else fruns
    n_module = len(body_runs) if has_modules else 0

    use_modules = n_module >= 2 if (is_int or stages == "auto") else stages == "module"
    if stages == "module" and n_module < 1:
        use_modules = False  # no module at all (plain JAX, nnx): fall back to layers
    if use_modules:
        units, unit_keys = _absorb_unscoped(body_runs, fkeys)
        unit_names = [f"fwd/{k}" for k in unit_keys]
        mode = "module"
    else:
        units, mode = _layer_units(eqns, out_ids, data_ids, param_ids)
        prefix = "layer" if mode == "layer" else "op"
        unit_names = [f"fwd/{prefix}{u}" for u in range(len(units))]
        loss_run = None
    k = int(stages) if is_int else None
    if k is None and stages == "auto" and len(units) > AUTO_MAX_STAGES:
        k = AUTO_K_MANY
    if k is not None:
        kb = k - 1 if (loss_run is not None and k >= 2) else k
        if loss_run is not None and kb == k:  # k == 1: the loss joins the single group
            units = units + [loss_run]
            unit_names = unit_names + ["fwd/loss"]
            loss_run = None
        costs = np.array([fl[a:b].sum() for a, b in units])
        lab = balanced(costs, kb) if len(units) else np.zeros(0, dtype=np.int64)
        merged, merged_names = [], []
        for g in range(int(lab.max()) + 1 if len(lab) else 0):
            us = np.flatnonzero(lab == g)
            merged.append((units[us[0]][0], units[us[-1]][1]))
            n0, n1 = unit_names[us[0]], unit_names[us[-1]]
            merged_names.append(n0 + (f"..{n1[4:]}" if n1 != n0 else ""))
        units, unit_names = merged, merged_names
    units, unit_names = _isolate_scans(eqns, units, unit_names, scopes)
    loss_stage = None
    if loss_run is not None and any(eqns[j].name == "scan" for j in range(*loss_run)):
        # a scan in the code after the last module (a scanned stack written in the top-level
        # function, as Equinox models do) is a stage of its own too; unscoped code before it
        # joins the stage before, unless that is a scan; what follows the last scan is the loss
        pieces, names = _isolate_scans(eqns, [loss_run], ["fwd/loss"], scopes)
        for (a, b), nm in zip(pieces[:-1], names[:-1]):
            if nm != "fwd/loss":
                units.append((a, b))
                unit_names.append(nm)
            elif units and eqns[units[-1][0]].name != "scan":
                units[-1] = (units[-1][0], b)
            else:
                units.append((a, b))
                unit_names.append("fwd/unscoped")
        if names[-1] == "fwd/loss":
            loss_run = pieces[-1]
        else:
            units.append(pieces[-1])
            unit_names.append(names[-1])
            loss_run = None
    if loss_run is not None:
        units = units + [loss_run]
        unit_names = unit_names + ["fwd/loss"]
        loss_stage = len(units) - 1
    if not units:
        units, unit_names = [(0, E)], ["fwd/top"]
    labels = _units_to_labels(units, E)
    keys = tuple(tuple(dict.fromkeys(scopes[a:b])) for a, b in units)
    return StageGroups(labels, tuple(unit_names), keys, mode, loss_stage)
