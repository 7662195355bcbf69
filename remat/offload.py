"""A plan's page-outs as host offloading through ``jax.checkpoint`` policies.

Where the tags go.  The values a plan keeps between top-level segments are the inputs of the
level-1 checkpointed segments (:mod:`remat.segments`): JAX saves a checkpoint's inputs for its
backward pass.  For each such segment that reads a value produced by a paged forward node
(``plan.page_out[t, i]`` for forward ``i``), the segment's body tags that input on entry with
``checkpoint_name`` (:func:`tag_name`) and the segment's policy becomes :func:`policy`: the tagged
names are ``Offloadable(device, pinned_host)``, everything else is recomputed, as the segment's
``nothing_saveable`` did.  The residual JAX keeps for the segment is then the host copy; the
device copy dies after its last forward reader, and XLA copies it back before the backward reads.

Why not one outer checkpoint around the whole forward (saveable but for the paging tags): an
outer policy is applied to the bodies of the checkpoints inside it, so "saveable" there would
save every value of the recomputed segments and undo the plan's recomputation.  At the segment
boundary every policy in the nest stays "recompute", so the segments' semantics are unchanged.

A paged value read by a top-level segment that runs without ``jax.checkpoint`` (loops, custom
derivatives) stays on the device (JAX's own residuals); page-outs of backward values too (the
backward pass is JAX's).  A device copy JAX keeps for the derivative of a producer that runs
without ``jax.checkpoint`` is counted in ``Applied.residual_bytes`` next to the host copy, so
the fidelity check flags it when it exceeds the plan.  Whether the backend realises offloading at all is probed once per
platform (:func:`realised`): XLA:CPU compiles the annotations but keeps everything in device
memory, and then the drop-in applies no tags and says so.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from remat._jax_compat import save_and_offload_only_these_names
from remat.core.errors import format_bytes
from remat.core.scan_plan import aval_bytes
from remat.frontend import Lit
from remat.segments import Segment

__all__ = ["SRC", "DST", "tag_name", "policy", "tag", "paged_nodes", "Offload", "boundary_values",
           "realised", "host_memory_used", "plan_offload"]

SRC = "device"
"""Memory kind a paged value lives in while computed."""
DST = "pinned_host"
"""Memory kind a paged value is offloaded to."""
_PREFIX = "remat_page_"
_HOST_SPACE = re.compile(r"S\(5\)")  # XLA's host memory space in compiled HLO layouts


def tag_name(v: int) -> str:
    """The ``checkpoint_name`` of forward-program value ``v`` when it is paged out."""
    return f"{_PREFIX}{int(v)}"


def policy(names: Iterable[str]):
    """A ``jax.checkpoint`` policy: values tagged with one of ``names`` are
    ``Offloadable(SRC, DST)``, every other value is recomputed (``nothing_saveable``)."""
    return save_and_offload_only_these_names((), names, src=SRC, dst=DST)


def tag(x, v: int):
    """``x`` (forward value ``v``) tagged for :func:`policy`."""
    return checkpoint_name(x, tag_name(v))


def paged_nodes(graph, plan) -> tuple[int, ...]:
    """Nodes with a page-out in ``plan`` (forward and backward), ascending."""
    if plan is None or plan.page_out is None:
        return ()
    return tuple(int(i) for i in np.flatnonzero(np.asarray(plan.page_out).any(axis=0)))


@dataclasses.dataclass(frozen=True)
class Offload:
    """How a plan's page-outs are realised.

    Attributes:
      tags: ``(start, stop, level)`` of a level-1 checkpointed segment -> the forward-program
        value ids tagged on its entry (offloaded); empty when paging is not realised.
      offloaded_bytes: bytes of the tagged values, one copy per reading segment.
      kept_bytes: bytes of paged values read by top-level segments without ``jax.checkpoint``
        (left on the device).
      notes: what the realisation does with the page-outs.
      warnings: the notes that leave paged bytes on the device.
    """

    tags: Mapping[tuple[int, int, int], tuple[int, ...]] = dataclasses.field(default_factory=dict)
    offloaded_bytes: int = 0
    kept_bytes: int = 0
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def boundary_values(forward, fwd_node: Sequence[int], segs: Sequence[Segment],
                    nodes: Iterable[int]) -> Offload:
    """The values of forward ``nodes`` that cross a top-level segment boundary, as tags.

    Args:
      forward: the forward program (:class:`remat.frontend.FlatJaxpr`).
      fwd_node: ``int[E]`` forward node of each equation.
      segs: the plan's top-level segments.
      nodes: paged forward nodes.
    """
    nodes = set(int(i) for i in nodes)
    owner: dict[int, int] = {}  # value id -> forward node of its equation
    for k, e in enumerate(forward.eqns):
        for o in e.outs:
            owner[o] = int(fwd_node[k])
    tags: dict[tuple[int, int, int], tuple[int, ...]] = {}
    offloaded = kept = 0
    for s in segs:
        produced, ins = set(), []
        for e in forward.eqns[s.start:s.stop]:
            for r in e.ins:
                if not isinstance(r, Lit) and r not in produced and owner.get(r) in nodes \
                        and r not in ins:
                    ins.append(r)
            produced.update(e.outs)
        if not ins:
            continue
        nbytes = sum(aval_bytes(forward.avals[v]) for v in ins)
        if s.remat:
            tags[(s.start, s.stop, s.level)] = tuple(ins)
            offloaded += nbytes
        else:
            kept += nbytes
    return Offload(tags, offloaded, kept)


def host_memory_used(compiled) -> bool:
    """Whether a compiled executable places buffers in host memory (host temp bytes, or XLA's
    host memory space ``S(5)`` in its HLO)."""
    stats = compiled.memory_analysis()
    if int(getattr(stats, "host_temp_size_in_bytes", 0) or 0) > 0:
        return True
    return bool(_HOST_SPACE.search(compiled.as_text() or ""))


@functools.cache
def realised(platform: str | None = None) -> bool:
    """Whether the backend realises offloading (probed once per process): a contraction whose
    checkpointed successor offloads its input (:func:`policy`) must compile to a step that uses
    host memory (:func:`host_memory_used`)."""
    try:
        dev = jax.devices(platform)[0] if platform else jax.devices()[0]
        kinds = {m.kind for m in dev.addressable_memories()}
        if SRC not in kinds or DST not in kinds:
            return False

        def seg(w, h):
            return jnp.sum(jnp.tanh(tag(h, 0) @ w) ** 2)

        def step(w, x):
            return jax.checkpoint(seg, policy=policy([tag_name(0)]))(w, x @ w)

        w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
        x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
        with jax.default_device(dev):
            compiled = jax.jit(jax.value_and_grad(step)).lower(w, x).compile()
        return host_memory_used(compiled)
    except Exception:  # noqa: BLE001 - a backend that cannot compile it does not offload
        return False


def plan_offload(graph, plan, segs: Sequence[Segment], platform: str) -> Offload:
    """The :class:`Offload` of ``plan``'s page-outs on ``platform`` (tags only where
    :func:`realised`), with its notes and warnings; an empty one for a plan without page-outs."""
    paged = paged_nodes(graph, plan)
    if not paged:
        return Offload()
    is_bwd = np.asarray(graph.is_backward_array)
    fwd = [i for i in paged if not is_bwd[i]]
    n_out = int(np.asarray(plan.page_out).sum())
    if not realised(platform):
        msg = (f"paging not realised on this backend ({platform}: a compiled offloading step "
               f"uses no host memory): {n_out} page-outs kept on the device "
               "(remat.execute runs paging for real)")
        return Offload(notes=(msg,), warnings=(msg,))
    prog = graph.program
    off = boundary_values(prog.forward, prog.fwd_node, segs, fwd)
    notes = [f"paging: {off.offloaded_bytes} bytes to {DST} "
             f"({format_bytes(off.offloaded_bytes)}; page-outs of forward node(s) {fwd}, "
             f"{sum(map(len, off.tags.values()))} value(s) at checkpoint boundaries)"]
    warns = []
    if off.kept_bytes:
        warns.append(f"paging: {off.kept_bytes} bytes of paged values are read by segments run "
                     "without jax.checkpoint and stay on the device")
    n_bwd = int(np.asarray(plan.page_out)[:, is_bwd].sum())
    if n_bwd:
        warns.append(f"{n_bwd} page-outs of backward values kept on the device (the backward "
                     "pass is JAX's)")
    return dataclasses.replace(off, notes=tuple(notes + warns), warnings=tuple(warns))
