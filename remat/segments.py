"""How a plan becomes (nested) ``jax.checkpoint`` segments of the forward program.

Input: the forward program's leaf equations (:mod:`remat.frontend`), the forward node of each
(``graph.program.fwd_node``) and how often the plan computes each forward node
(``c_i = plan.R[:, i].sum()``).  Output: a tree of :class:`Segment` over equation positions.

Level ``L`` (1 = outermost) cuts its range after every stage the plan computes at most ``L``
times (kept at this level); each piece is a segment:

* a segment holding a stage computed more than ``L`` times is a ``jax.checkpoint`` with nothing
  saveable: JAX keeps only its inputs (the checkpoints) and recomputes it in the backward pass;
  inside, level ``L + 1`` cuts it again, so a stage computed ``c`` times sits in ``c - 1``
  nested checkpoints (recursive checkpointing, as Griewank's revolve and rotor);
* at level 1 a segment of kept stages is also a checkpoint when it holds only *safe*
  equations (elementwise and layout ops, reductions, contractions and lookups, whose
  derivatives need their inputs only): JAX then keeps exactly the segment boundaries, instead of
  its own per-primitive residuals (``1 - tanh(z)^2`` next to ``tanh(z)``), and the backward
  recomputes only cheap elementwise work; segments with loops or custom derivatives run as is.

Boundary shifting: the saved value at a cut is whatever crosses it.  A cut at the end of a stage
whose tail is cheap (``tanh``, a bias add, a normalisation) moves back to just after the
stage's last expensive equation when no more bytes cross there: ``tanh(x @ w)`` keeps
``x @ w`` (same bytes) and the next segment recomputes ``tanh`` from it, so the contraction is
never recomputed for a kept stage.  (JAX decides residuals per primitive, and ``tanh``'s
derivative reads ``tanh``'s own output: a cut after ``tanh`` would make JAX recompute the
contraction to get it back.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from remat._jax_compat import call_body, open_jaxpr
from remat.core.scan_plan import aval_bytes
from remat.flops import ELEMENTWISE, REDUCTION, ZERO
from remat.frontend import FlatJaxpr, LeafEqn, Lit

__all__ = ["Segment", "plan_segments", "region_segments", "walk", "cheap_leaf", "safe_leaf"]

_EFFECTS = frozenset({"debug_callback", "pure_callback", "io_callback", "debug_print",
                      "optimization_barrier", "create_token", "after_all", "unreachable"})
CHEAP = (ELEMENTWISE | ZERO | REDUCTION) - _EFFECTS
"""Primitives recomputed freely (elementwise, layout, reductions)."""
SAFE_HEAVY = frozenset({"dot_general", "conv_general_dilated", "ragged_dot", "reduce_window_sum",
                        "reduce_window_max", "reduce_window_min", "reduce_window"})
"""Expensive primitives whose derivatives read only their inputs."""
_CALLS = frozenset({"custom_jvp_call", "custom_jvp_call_jaxpr", "pjit", "jit", "closed_call"})


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of forward-program equations ``[start, stop)`` (leaf positions).

    Attributes:
      nodes: forward graph nodes with equations in it, in order.
      remat: wrapped in ``jax.checkpoint`` (nothing saveable); False: evaluated as is.
      kept: nodes of ``nodes`` the plan computes at most ``level`` times.
      level: nesting depth (1 = outermost).
      children: the segments inside a checkpointed segment (level + 1).
      saves: for a checkpointed segment from a plan's regions (:func:`region_segments`): the
        leaf positions whose outputs its policy saves by name (``None``: nothing saveable).
    """

    start: int
    stop: int
    nodes: tuple[int, ...]
    remat: bool
    kept: tuple[int, ...]
    level: int = 1
    children: tuple[Segment, ...] = ()
    saves: tuple[int, ...] | None = None

    @property
    def saved_nodes(self) -> tuple[int, ...]:
        """Alias of :attr:`kept` (older name)."""
        return self.kept


def walk(segs: Sequence[Segment]):
    """Every segment of a tree, depth first."""
    for s in segs:
        yield s
        yield from walk(s.children)


def _body_eqns(e: LeafEqn):
    sub = call_body(e)
    return None if sub is None else open_jaxpr(sub).eqns


def _cheap_jaxpr_eqn(e) -> bool:
    name = e.primitive.name
    if name in CHEAP:
        return True
    if name in _CALLS:
        body = _body_eqns(e)
        return body is not None and all(_cheap_jaxpr_eqn(x) for x in body)
    return False


def cheap_leaf(e: LeafEqn) -> bool:
    """Recomputing ``e`` costs about as much as reading its result (elementwise, layout,
    reductions, custom-derivative wrappers of those)."""
    if e.effectful:
        return False
    return _cheap_jaxpr_eqn(e)


def safe_leaf(e: LeafEqn) -> bool:
    """``e``'s derivative needs only its inputs, or ``e`` is cheap to recompute."""
    return cheap_leaf(e) or e.name in SAFE_HEAVY or e.name in ("gather", "dynamic_slice")


def _crossing_bytes(forward: FlatJaxpr) -> np.ndarray:
    """``int64[E + 1]``: bytes of equation results produced before position ``p`` and read at or
    after it (program outputs read at ``E``)."""
    eqns = forward.eqns
    E = len(eqns)
    pos: dict[int, int] = {}
    for j, e in enumerate(eqns):
        for o in e.outs:
            pos[o] = j
    last: dict[int, int] = {}
    for j, e in enumerate(eqns):
        for r in e.ins:
            if not isinstance(r, Lit):
                last[r] = j
    for r in forward.out_refs:
        if not isinstance(r, Lit):
            last[r] = E
    diff = np.zeros(E + 2, dtype=np.int64)
    for v, a in pos.items():
        b = last.get(v)
        if b is None or b <= a:
            continue
        nb = aval_bytes(forward.avals[v])
        diff[a + 1] += nb
        diff[b + 1] -= nb
    return np.cumsum(diff)[: E + 1]


def plan_segments(forward: FlatJaxpr, leaf_node: Sequence[int],
                  counts: Sequence[int], *, trim: bool = True) -> tuple[Segment, ...]:
    """The segment tree of a plan (see the module docstring).

    Args:
      forward: the forward program.
      leaf_node: ``int[E]`` forward node of each forward-program equation (non-decreasing).
      counts: ``int[n_fwd]`` how often the plan computes each forward node (0 is read as 1).
      trim: also checkpoint level-1 segments of kept, safe stages (JAX keeps their boundaries
        instead of its per-primitive residuals; cheap work is recomputed); ``False``: kept
        stages run as is, with JAX's own residuals and no recomputation.
    """
    lab = np.asarray(leaf_node, dtype=np.int64)
    cnt = np.maximum(np.asarray(counts, dtype=np.int64), 1)
    if len(cnt) <= (int(lab.max()) if len(lab) else -1):
        cnt = np.concatenate([cnt, np.ones(int(lab.max()) + 1 - len(cnt), dtype=np.int64)])
    cheap = np.array([cheap_leaf(e) for e in forward.eqns], dtype=bool)
    safe = np.array([trim and safe_leaf(e) for e in forward.eqns], dtype=bool)
    cross = _crossing_bytes(forward)
    return _segments(lab, cnt, cheap, safe, cross, 0, len(lab), 1)


def _shift(c: int, lo: int, cheap: np.ndarray, cross: np.ndarray) -> int:
    """Move cut ``c`` back over cheap equations (not below ``lo``) to the earliest position
    where no more bytes cross than at ``c``."""
    best, p = c, c
    while p - 1 >= lo and cheap[p - 1]:
        p -= 1
        if cross[p] <= cross[c]:
            best = p
    return best


def _segments(lab, cnt, cheap, safe, cross, a: int, b: int, level: int) -> tuple[Segment, ...]:
    if b <= a:
        return ()
    ends = [e for e in range(a + 1, b + 1)
            if cnt[lab[e - 1]] <= level and (e == b or lab[e] != lab[e - 1])]
    cuts: list[int] = []
    prev = a
    for c in sorted(set(ends) | {b}):
        if c < b:
            c = _shift(c, prev + 1, cheap, cross)
        if c > prev:
            cuts.append(c)
            prev = c
    if not cuts or cuts[-1] != b:
        cuts.append(b)
    out: list[Segment] = []
    s = a
    for e in cuts:
        nodes = tuple(dict.fromkeys(lab[s:e].tolist()))
        kept = tuple(n for n in nodes if cnt[n] <= level)
        if len(kept) < len(nodes):
            kids = _segments(lab, cnt, cheap, safe, cross, s, e, level + 1)
            out.append(Segment(s, e, nodes, True, kept, level, kids))
        elif level == 1 and safe[s:e].all():
            inner = Segment(s, e, nodes, False, kept, level + 1)
            out.append(Segment(s, e, nodes, True, kept, level, (inner,)))
        else:
            out.append(Segment(s, e, nodes, False, kept, level))
        s = e
    return tuple(out)


def region_segments(leaf_node: Sequence[int], regions, counts: Sequence[int]) -> tuple[Segment, ...]:
    """The segment tree of a plan's checkpoint regions (:mod:`remat.core.regions`): each region
    is a checkpointed segment saving the leaves of its ``saves`` nodes by name; leaves outside
    every region run as is.

    Args:
      leaf_node: ``int[E]`` forward node of each forward-program equation (non-decreasing).
      regions: the plan's top-level :class:`~remat.core.regions.CheckpointRegion` tuple.
      counts: ``int[n_fwd]`` how often the plan computes each forward node (for ``kept``).
    """
    lab = np.asarray(leaf_node, dtype=np.int64)
    cnt = np.asarray(counts, dtype=np.int64)
    return _region_level(lab, cnt, tuple(regions), 0, len(lab), 1)


def _region_level(lab, cnt, regions, a: int, b: int, level: int) -> tuple[Segment, ...]:
    out: list[Segment] = []
    pos = a

    def plain(s: int, e: int) -> None:
        if e > s:
            nodes = tuple(dict.fromkeys(lab[s:e].tolist()))
            out.append(Segment(s, e, nodes, False, nodes, level))

    for r in regions:
        s = int(np.searchsorted(lab, r.start, side="left"))
        e = int(np.searchsorted(lab, r.stop, side="left"))
        s, e = max(s, pos), min(e, b)
        if e <= s:
            continue
        plain(pos, s)
        nodes = tuple(dict.fromkeys(lab[s:e].tolist()))
        saved = set(int(v) for v in r.saves)
        saves = tuple(k for k in range(s, e) if int(lab[k]) in saved)
        kept = tuple(n for n in nodes if cnt[n] <= level)
        kids = _region_level(lab, cnt, r.children, s, e, level + 1)
        out.append(Segment(s, e, nodes, True, kept, level, kids, saves))
        pos = e
    plain(pos, b)
    return tuple(out)
