"""Sharded steps: per-device bytes of an extracted graph and the collectives XLA inserts.

A step whose inputs carry ``jax.sharding`` shardings (``NamedSharding`` on a ``Mesh``, internal
``with_sharding_constraint`` allowed) runs as one SPMD program per device; its memory limit and
``compiled.memory_analysis()`` are per device.  :func:`per_device_graph` turns the global graph
:func:`remat.extract` builds into a per-device one:

* **values**: the training program (:class:`remat.extraction.Program`) is compiled once with
  every stage output as an extra program output and no output shardings given, so XLA's sharding
  propagation chooses them; a value's per-device bytes are its global bytes times
  ``prod(sharding.shard_shape(shape)) / prod(shape)`` of the chosen output sharding.
  ``Node.out_bytes``, ``Node.param_bytes`` (the shards of the parameters a node reads) and the
  graph's parameter and input bytes become per-device;
* **collectives**: the compiled no-remat SPMD step's HLO is read for ``all-gather``,
  ``all-reduce``, ``reduce-scatter``, ``all-to-all`` and ``collective-permute``
  (:func:`collectives`), each with its result bytes per device and a ring-model time at the
  profile's ``interconnect_bw`` (:class:`remat.core.devices.DeviceProfile`): all-gather and
  reduce-scatter move ``(g - 1) / g`` of the result, all-reduce twice that, for a group of ``g``
  devices;
* **partial sums** (tensor parallelism): a forward contraction over a dimension sharded on
  both operands (a row-parallel matmul) writes per-device partial sums that an all-reduce
  completes (:func:`remat.sharded_memory.forward_partial_sums`, on the forward program's
  propagated partition specs); its node is charged the all-reduce's ring time, so recomputing
  it runs the all-reduce again, and ``meta["sharding"]["node_collectives"]`` lists it;
* **gathered parameters** (FSDP): a sharded differentiated argument whose global shape is the
  result of an all-gather is gathered before use.  Each forward node reading it is charged the
  gather's time (recomputing the node regathers) and the parameter's full bytes in its
  ``out_bytes`` (keeping the node keeps the gathered weight for the backward).

Limits: the shardings are those XLA picks for the program *with the extra outputs*, which may
differ from the ones it picks for the step itself (an extra output can pin a layout); stage times
are the global roofline times scaled by each node's per-device share of its bytes, plus its
gathers and forward all-reduces; collectives XLA inserts in the backward (gradient all-reduce /
reduce-scatter) are listed in ``graph.meta["sharding"]`` but charged to no node (each runs once
whatever the plan).  On XLA:CPU the gradient all-reduces are
combined into one tuple all-reduce at the end of the backward, so every per-device partial
weight gradient is live at once: a floor on the compiled per-device temp that no remat plan
lowers (the drop-in then raises :class:`~remat.core.errors.InfeasibleBudgetError` naming it).
``shard_map`` bodies are per-device programs already and need none of this.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from remat.core.scan_plan import aval_bytes
from remat.mesh import is_sharded, n_devices
from remat.mesh import leaf_sharding as _sharding
from remat.sharded_memory import forward_partial_sums

__all__ = ["abstract", "n_devices", "is_sharded", "Collective", "collectives", "value_bytes",
           "per_device_graph"]

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
                "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
                "c64": 8, "c128": 16}
_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(r"=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(_KINDS) + r")(?P<start>-start)?\(")
_SHAPE = re.compile(r"\b(?P<dt>[a-z]+[0-9]*(?:e[0-9]m[0-9](?:fn)?)?)\[(?P<dims>[0-9,]*)\]")


def abstract(args):
    """``jax.ShapeDtypeStruct`` pytree of ``args`` that keeps each leaf's sharding when it spans
    more than one device (so lowering it compiles the SPMD program)."""
    def f(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            s = _sharding(x)
            if s is not None:
                return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, a.dtype)

    return jax.tree_util.tree_map(f, args)


def signature(args) -> tuple:
    """The shardings of ``args``' leaves (``None`` where unsharded), for plan caches."""
    return tuple(None if (s := _sharding(x)) is None else repr(s)
                 for x in jax.tree_util.tree_leaves(args))


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled SPMD program.

    Attributes:
      kind: ``"all-gather"``, ``"all-reduce"``, ``"reduce-scatter"``, ``"all-to-all"`` or
        ``"collective-permute"``.
      bytes: its result bytes on one device (summed over a combined tuple's elements).
      shapes: the result shapes ``((dtype, dims), ...)``.
      group: devices in one replica group.
      time_s: ring-model time at the profile's link bandwidth, s.
      name: the HLO instruction's ``op_name`` metadata (``""`` when none).
    """

    kind: str
    bytes: int
    shapes: tuple
    group: int
    time_s: float
    name: str = ""


def _group_size(line: str, default: int) -> int:
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=\{\{([0-9,]*)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        sizes = dict((k.strip("' "), int(v)) for k, v in
                     (kv.split("=") for kv in m.group(1).split(",") if "=" in kv))
        axes = [a.strip("' ") for a in m.group(2).split(",") if a.strip("' ")]
        return int(np.prod([sizes.get(a, 1) for a in axes])) if axes else default
    return default


def collective_time(kind: str, nbytes: float, group: int, link_bw: float) -> float:
    """Ring-model time of one collective, s: all-gather / reduce-scatter / all-to-all move
    ``(g - 1) / g`` of ``nbytes`` (the larger of operand and result) per device, all-reduce
    ``2 (g - 1) / g``, collective-permute ``nbytes``; at ``link_bw`` bytes/s."""
    if group <= 1:
        return 0.0
    f = {"all-reduce": 2 * (group - 1) / group, "collective-permute": 1.0}.get(
        kind, (group - 1) / group)
    return float(f * nbytes / link_bw)


def collectives(hlo_text: str, n: int, link_bw: float) -> list[Collective]:
    """The collectives of a compiled SPMD program's HLO text (``compiled.as_text()``).

    Args:
      hlo_text: the optimized HLO module.
      n: devices of the program (the group size when the HLO names none).
      link_bw: bytes/s of the collectives' transfers (``DeviceProfile.link_bw``).
    """
    out = []
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if m is None or "-done(" in line:
            continue
        shapes = tuple((s.group("dt"), tuple(int(d) for d in s.group("dims").split(",") if d))
                       for s in _SHAPE.finditer(m.group("type"))
                       if s.group("dt") in _DTYPE_BYTES)
        sizes = [_DTYPE_BYTES[dt] * int(np.prod(dims)) for dt, dims in shapes]
        # an async start's type is (operand, result[, ...]): count its largest buffer once
        nbytes = max(sizes, default=0) if m.group("start") else sum(sizes)
        g = _group_size(line, n)
        nm = re.search(r'op_name="([^"]*)"', line)
        out.append(Collective(m.group("op"), int(nbytes), shapes, g,
                              collective_time(m.group("op"), nbytes, g, link_bw),
                              nm.group(1) if nm else ""))
    return out


def _shard_fraction(sharding, shape) -> float:
    if sharding is None or not hasattr(sharding, "shard_shape") or not len(shape):
        return 1.0
    full = int(np.prod(shape))
    return float(np.prod(sharding.shard_shape(tuple(shape)))) / full if full else 1.0


def value_bytes(prog, args, value_ids: Sequence[int]) -> dict[int, int]:
    """Per-device bytes of training-program values (``value_ids``) of ``prog`` (a
    :class:`remat.extraction.Program`) at the sharded abstract ``args``: the program compiled
    with those values as outputs, each value's bytes times its output sharding's shard fraction.
    """
    from remat.frontend import evaluate

    ids = [int(v) for v in value_ids]
    leaves = jax.tree_util.tree_leaves(args)

    def f(*xs):
        env = dict(zip(range(prog.n_args), xs))
        env.update(zip(prog.const_ids, prog.consts))
        evaluate(prog.eqns, env)
        return [env[v] for v in ids]

    compiled = jax.jit(f).lower(*leaves).compile()
    shards = compiled.output_shardings
    return {v: int(math.ceil(aval_bytes(prog.avals[v])
                             * _shard_fraction(s, getattr(prog.avals[v], "shape", ()))))
            for v, s in zip(ids, shards)}


def _node_times(graph, factors, extra_s):
    return [float(nd.time_s * f + e) for nd, f, e in zip(graph.nodes, factors, extra_s)]


def per_device_graph(graph, args, *, step_hlo: str | None = None, device: Any = None):
    """The per-device view of ``graph`` (extracted from the step at the sharded ``args``).

    Args:
      graph: the global graph (:func:`remat.extract` at ``args``).
      args: the abstract arguments with their shardings (:func:`abstract`).
      step_hlo: the compiled no-remat step's HLO text (collectives); ``None``: compiled here.
      device: a :class:`~remat.core.devices.DeviceProfile` for the collectives' times
        (``None``: the backend's, :func:`remat.devices.for_backend`).

    Returns:
      ``graph`` with per-device ``out_bytes``, ``param_bytes``, ``param_bytes`` of the graph,
      ``input_bytes`` and ``time_s``, and ``meta["sharding"]``: ``n_devices``, ``collectives``
      (:class:`Collective` list), ``gathered_args`` (argument leaf -> gathered bytes),
      ``node_collectives`` (forward node -> the collectives charged to it: the all-reduces of
      its partial sums), ``global_out_bytes``.  ``graph`` itself when nothing is sharded.
    """
    n = n_devices(args)
    if n <= 1:
        return graph
    prog = graph.program
    if device is None:
        from remat import devices

        device = devices.for_backend()
    link = float(getattr(device, "link_bw", None) or device.memory_bandwidth)
    leaves = jax.tree_util.tree_leaves(args)
    if step_hlo is None:
        from remat.compiled_budget import step_compiled

        step_hlo = step_compiled(prog.fn, args, argnums=prog.argnums,
                                 has_aux=prog.has_aux).as_text()
    colls = collectives(step_hlo, n, link)
    ids = sorted({v for outs in prog.node_outputs for v in outs})
    per = value_bytes(prog, args, ids) if ids else {}
    arg_frac = [_shard_fraction(_sharding(x), np.shape(x)) for x in leaves]
    arg_bytes = [aval_bytes(prog.avals[a]) for a in range(prog.n_args)]
    # FSDP: a sharded differentiated argument whose global shape an all-gather produces
    gathered_shapes = {dims for c in colls if c.kind == "all-gather" for _, dims in c.shapes}
    gathered = {a: arg_bytes[a] for a in range(prog.n_args)
                if prog.diff_args[a] and arg_frac[a] < 1.0
                and tuple(np.shape(leaves[a])) in gathered_shapes}
    out_bytes, param_bytes, factors, extra = [], [], [], []
    for i, nd in enumerate(graph.nodes):
        ob = sum(per.get(v, 0) for v in prog.node_outputs[i])
        pb = sum(int(math.ceil(arg_bytes[a] * arg_frac[a])) for a in prog.node_args[i]
                 if prog.diff_args[a])
        gb = [gathered[a] for a in prog.node_args[i] if a in gathered]
        if not nd.is_backward and gb:
            ob += sum(gb)
        out_bytes.append(int(ob))
        param_bytes.append(int(pb))
        factors.append(ob / nd.out_bytes if nd.out_bytes else 1.0 / n)
        extra.append(sum(collective_time("all-gather", b, n, link) for b in gb))
    # tensor parallelism: a forward contraction writing partial sums is completed by an
    # all-reduce, which recomputing its node runs again
    node_colls: dict[int, tuple] = {}
    if prog.forward is not None:
        for j, (axes, g, nb) in sorted(forward_partial_sums(prog.forward, args).items()):
            i = int(prog.fwd_node[j])
            c = Collective("all-reduce", nb, (), g, collective_time("all-reduce", nb, g, link),
                           f"partial sums of forward equation {j} over {'/'.join(axes)}")
            node_colls[i] = node_colls.get(i, ()) + (c,)
            extra[i] += c.time_s
    times = _node_times(graph, factors, extra)
    nodes = tuple(dataclasses.replace(nd, out_bytes=ob, param_bytes=pb, time_s=t)
                  for nd, ob, pb, t in zip(graph.nodes, out_bytes, param_bytes, times))
    diff = np.asarray(prog.diff_args, dtype=bool)
    frac = np.asarray(arg_frac)
    ab = np.asarray(arg_bytes, dtype=np.float64)
    meta = dict(graph.meta)
    meta["sharding"] = {
        "n_devices": n,
        "collectives": tuple(colls),
        "gathered_args": gathered,
        "node_collectives": node_colls,
        "global_out_bytes": tuple(int(nd.out_bytes) for nd in graph.nodes),
    }
    return dataclasses.replace(
        graph, nodes=nodes, meta=meta,
        param_bytes=int(np.ceil((ab * frac)[diff].sum())),
        input_bytes=int(np.ceil((ab * frac)[~diff].sum())))


def traced_mesh_size(args) -> int:
    """Devices of the (abstract) mesh that traced ``args`` live on inside ``jax.jit`` (1 when
    none): under ``jax.jit`` with ``Auto`` mesh axes a tracer's aval names the mesh but not the
    argument's partition spec, so a step traced there cannot be planned per device from its
    arguments alone.  Axes a ``shard_map`` made manual do not count: its body's arguments are
    per-device shapes, so a plan made there is per device."""
    best = 1
    for x in jax.tree_util.tree_leaves(args):
        mesh = getattr(getattr(getattr(x, "aval", None), "sharding", None), "mesh", None)
        sizes = getattr(mesh, "axis_sizes", None) or ()
        manual = set(getattr(mesh, "manual_axes", ()) or ())
        # axes a shard_map made manual: its body is a per-device program already
        auto = [n for a, n in zip(getattr(mesh, "axis_names", ()), sizes) if a not in manual]
        if auto:
            best = max(best, int(np.prod(auto)))
    return best
