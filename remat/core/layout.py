"""Memory layout: allocation lifetimes and sizes in, byte offsets in one arena out.

Every allocation of a plan's event program (:mod:`remat.core.events`: one per ``COMPUTE``, per
allocating ``PAGE_IN`` and per ``ALLOC``; a value computed k times has k allocations) lives over
an inclusive interval ``[first event, last event]`` of event indices and occupies ``sizes[a]``
bytes at ``[offsets[a], offsets[a] + sizes[a])``.  A layout is valid when no two allocations that
are live at the same event overlap in address.

* :func:`lifetimes` reads the intervals off an :class:`~remat.core.events.Events` program.
* :func:`validate`, :func:`max_live_lower_bound` (the peak of live bytes: no layout uses less),
  :func:`arena_size` and :func:`fragmentation` (``arena / max_live - 1``) judge a layout.
* A *placement* is any function ``(intervals int64[A, 2], sizes int64[A]) -> offsets int64[A]``
  (:data:`Placement`).  :func:`first_fit`, :func:`best_fit` and :func:`greedy_by_size` are
  provided; :func:`place` is the engine they share (visit allocations in a given order, put each
  at the lowest (``fit="first"``) or tightest (``fit="best"``) gap among the already placed
  allocations whose lifetimes overlap it), so e.g. Melon's lifetime-aware pool is
  ``place(iv, sizes, np.argsort(-(iv[:, 1] - iv[:, 0]), kind="stable"))``; an address ILP
  (OLLA) or NNTrainer's planners plug in as another function of the same signature, via
  :data:`PLACEMENTS` or by passing the function itself to :func:`allocate`.
* :func:`allocate` runs a placement on a plan and returns the plan with ``offsets`` filled.

Sizes and offsets are bytes (``int64``).  Zero-byte allocations occupy no memory and never
collide.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from remat.core.errors import InvalidPlanError, UnknownNameError
from remat.core.events import FREE, Events

__all__ = [
    "Lifetimes",
    "Placement",
    "PLACEMENTS",
    "lifetimes",
    "validate",
    "max_live_lower_bound",
    "arena_size",
    "fragmentation",
    "place",
    "first_fit",
    "best_fit",
    "greedy_by_size",
    "get_placement",
    "allocate",
]

Placement = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``placement(intervals int64[A, 2], sizes int64[A]) -> offsets int64[A]`` (bytes)."""


class Lifetimes(NamedTuple):
    """Allocations of an event program, in allocation order (allocation ids).

    Attributes:
      intervals: ``int64[A, 2]`` inclusive ``[first, last]`` event indices: the event that
        allocates and the ``FREE`` that releases.
      sizes: ``int64[A]`` bytes of each allocation.
      node: ``int64[A]`` node whose output it holds.
    """

    intervals: np.ndarray
    sizes: np.ndarray
    node: np.ndarray


def lifetimes(events: Events) -> Lifetimes:
    """The allocations of ``events`` with their lifetimes and sizes (bytes)."""
    made = np.flatnonzero(events.creates)
    iv = np.empty((len(made), 2), dtype=np.int64)
    iv[:, 0] = made
    iv[:, 1] = len(events.kind)  # every allocation is freed by the end; kept as a guard
    freed = np.flatnonzero(events.kind == FREE)
    iv[events.alloc[freed], 1] = freed
    return Lifetimes(iv, events.bytes[made].astype(np.int64), events.node[made].astype(np.int64))


def _as_arrays(intervals: Any, sizes: Any) -> tuple[np.ndarray, np.ndarray]:
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if len(iv) != len(s):
        raise InvalidPlanError(f"{len(iv)} lifetimes but {len(s)} sizes")
    if (s < 0).any() or (iv[:, 0] > iv[:, 1]).any():
        raise InvalidPlanError("negative size or lifetime ending before it starts")
    return iv, s


def validate(
    intervals: Any, sizes: Any, offsets: Any, *, labels: Sequence[Any] | None = None
) -> None:
    """Raise :class:`InvalidPlanError` unless ``offsets`` is a layout of the allocations: one
    non-negative offset (bytes) per allocation, and no two allocations live at a common event
    overlap in ``[offset, offset + size)``.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.
      offsets: ``int64[A]`` bytes.
      labels: optional name per allocation for the message (e.g. its node's name).
    """
    iv, s = _as_arrays(intervals, sizes)
    off = np.asarray(offsets).reshape(-1)
    if len(off) != len(s):
        raise InvalidPlanError(f"layout has {len(off)} offsets for {len(s)} allocations")
    if len(off) and (not np.issubdtype(off.dtype, np.integer) or (off < 0).any()):
        raise InvalidPlanError("offsets must be non-negative integers (bytes)")
    pair = _first_collision(iv, s, off.astype(np.int64))
    if pair is not None:
        a, b = pair
        at = int(max(iv[a, 0], iv[b, 0]))

        def desc(k: int) -> str:
            tag = f" ({labels[k]!r})" if labels is not None else ""
            return f"allocation {k}{tag} at [{off[k]}, {off[k] + s[k]})"

        raise InvalidPlanError(f"{desc(a)} overlaps {desc(b)}, both live at event {at}")


def _first_collision(iv: np.ndarray, s: np.ndarray, off: np.ndarray) -> tuple[int, int] | None:
    """The first pair ``(a, b)`` of allocations overlapping in time and address, ``b`` the
    later-starting one, or None.  A sweep in start order keeps the live blocks sorted by offset;
    as they are disjoint until the first collision, a new block can only collide with its
    neighbours in that order.  Time ``O(A log A)``."""
    keep = np.flatnonzero(s > 0)
    order = keep[np.lexsort((keep, iv[keep, 0]))]
    start, end = iv[:, 0].tolist(), iv[:, 1].tolist()
    lo_of, hi_of = off.tolist(), (off + s).tolist()
    blocks: list[tuple[int, int, int]] = []  # live (lo, hi, id), sorted
    ends: list[tuple[int, int, int, int]] = []  # (last event, lo, hi, id)
    for b in order.tolist():
        while ends and ends[0][0] < start[b]:
            _, lo, hi, a = heapq.heappop(ends)
            del blocks[bisect.bisect_left(blocks, (lo, hi, a))]
        item = (lo_of[b], hi_of[b], b)
        j = bisect.bisect_left(blocks, item)
        if j > 0 and blocks[j - 1][1] > item[0]:
            return blocks[j - 1][2], b
        if j < len(blocks) and blocks[j][0] < item[1]:
            return blocks[j][2], b
        blocks.insert(j, item)
        heapq.heappush(ends, (end[b], *item))
    return None


def max_live_lower_bound(intervals: Any, sizes: Any) -> int:
    """Peak over events of the bytes of live allocations (bytes): no layout's arena is smaller."""
    iv, s = _as_arrays(intervals, sizes)
    if not len(s):
        return 0
    diff = np.zeros(int(iv[:, 1].max()) + 2, dtype=np.int64)
    np.add.at(diff, iv[:, 0], s)
    np.add.at(diff, iv[:, 1] + 1, -s)
    return int(np.cumsum(diff).max(initial=0))


def arena_size(offsets: Any, sizes: Any) -> int:
    """Bytes of the arena a layout needs: ``max(offsets + sizes)`` (0 when empty)."""
    off = np.asarray(offsets, dtype=np.int64).reshape(-1)
    return int((off + np.asarray(sizes, dtype=np.int64).reshape(-1)).max(initial=0))


def fragmentation(intervals: Any, sizes: Any, offsets: Any) -> float:
    """``arena_size / max_live_lower_bound - 1``: 0.0 for a perfect layout (and when nothing is
    ever live)."""
    bound = max_live_lower_bound(intervals, sizes)
    return arena_size(offsets, sizes) / bound - 1.0 if bound > 0 else 0.0


def place(
    intervals: Any, sizes: Any, order: Any, *, fit: Literal["first", "best"] = "first"
) -> np.ndarray:
    """The placement engine: visit allocations in ``order`` and put each beside the already
    placed allocations whose lifetimes overlap its own.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.
      order: a permutation of ``range(A)``: the visiting order.
      fit: ``"first"``: the lowest offset where it fits; ``"best"``: the smallest gap between
        placed blocks that fits (lowest on ties), else the free space at the top of the arena
        placed so far if it fits, else on top of the colliding blocks.

    Returns:
      ``int64[A]`` offsets (bytes).  When ``order`` is by start (allocation order, the online
      case) the live blocks are kept sorted and swept: time ``O(A * live)`` with small
      constants; otherwise every placed allocation is tested for a time overlap (numpy), time
      ``O(A^2)``.
    """
    iv, s = _as_arrays(intervals, sizes)
    order = np.asarray(order, dtype=np.int64).reshape(-1)
    if not np.array_equal(np.sort(order), np.arange(len(s))):
        raise InvalidPlanError("order must be a permutation of the allocations")
    if fit not in ("first", "best"):
        raise InvalidPlanError(f"fit must be 'first' or 'best', got {fit!r}")
    if np.all(np.diff(iv[order, 0]) >= 0):
        return _place_online(iv, s, order, fit)
    return _place_offline(iv, s, order, fit)


def _place_online(iv: np.ndarray, s: np.ndarray, order: np.ndarray, fit: str) -> np.ndarray:
    """:func:`place` for an order by start: every placed block still live overlaps the next
    allocation, so only live blocks are kept (a list sorted by offset; a heap of their ends)."""
    start, end, size_of = iv[:, 0].tolist(), iv[:, 1].tolist(), s.tolist()
    off = [0] * len(size_of)
    blocks: list[tuple[int, int]] = []  # live [lo, hi), disjoint, sorted
    ends: list[tuple[int, int, int]] = []  # (last event, lo, hi)
    arena = 0
    for a in order.tolist():
        while ends and ends[0][0] < start[a]:
            _, lo, hi = heapq.heappop(ends)
            del blocks[bisect.bisect_left(blocks, (lo, hi))]
        size = size_of[a]
        if size == 0:
            continue
        below, choice, tightest = 0, -1, -1
        for lo, hi in blocks:
            gap = lo - below
            if gap >= size and (tightest < 0 or gap < tightest):
                choice, tightest = below, gap
                if fit == "first":
                    break
            below = hi
        if choice < 0 or (fit == "best" and size <= arena - below < tightest):
            choice = below  # the top of the live blocks
        off[a] = choice
        bisect.insort(blocks, (choice, choice + size))
        heapq.heappush(ends, (end[a], choice, choice + size))
        arena = max(arena, choice + size)
    return np.asarray(off, dtype=np.int64)


def _place_offline(iv: np.ndarray, s: np.ndarray, order: np.ndarray, fit: str) -> np.ndarray:
    """:func:`place` for any order: the blocks to avoid are the placed allocations whose
    lifetimes overlap (they need not be live together, so they may overlap each other)."""
    A = len(s)
    off = np.zeros(A, dtype=np.int64)
    start, end = iv[:, 0], iv[:, 1]
    lo, hi, b_start, b_end = (np.empty(A, dtype=np.int64) for _ in range(4))
    k = arena = 0
    for a in order.tolist():
        size = int(s[a])
        if size == 0:
            continue
        hit = (b_start[:k] <= end[a]) & (start[a] <= b_end[:k])
        off[a] = _fit(lo[:k][hit], hi[:k][hit], size, fit, arena)
        lo[k], hi[k], b_start[k], b_end[k] = off[a], off[a] + size, start[a], end[a]
        k += 1
        arena = max(arena, int(off[a]) + size)
    return off


def _fit(lo: np.ndarray, hi: np.ndarray, size: int, fit: str, arena: int) -> int:
    """Offset for ``size`` bytes among blocks ``[lo, hi)`` (see :func:`place`)."""
    if not len(lo):
        return 0
    idx = np.argsort(lo, kind="stable")
    lo, hi = lo[idx], hi[idx]
    top = np.maximum.accumulate(hi)
    below = np.empty(len(lo), dtype=np.int64)  # top of everything under block j
    below[0] = 0
    below[1:] = top[:-1]
    gap = lo - below
    ok = np.flatnonzero(gap >= size)
    roof = int(top[-1])
    if fit == "first":
        return int(below[ok[0]]) if len(ok) else roof
    # best: the tightest of the interior gaps and the free top of the arena placed so far
    cand_off = np.append(below[ok], roof)
    cand_gap = np.append(gap[ok], arena - roof if arena - roof >= size else np.iinfo(np.int64).max)
    return int(cand_off[np.argmin(cand_gap)])


def first_fit(intervals: Any, sizes: Any) -> np.ndarray:
    """Allocation order, lowest free offset (a classic online first-fit allocator)."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    return place(iv, sizes, np.argsort(iv[:, 0], kind="stable"), fit="first")


def best_fit(intervals: Any, sizes: Any) -> np.ndarray:
    """Allocation order, the tightest free gap that fits (online best-fit)."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    return place(iv, sizes, np.argsort(iv[:, 0], kind="stable"), fit="best")


def greedy_by_size(intervals: Any, sizes: Any) -> np.ndarray:
    """Largest allocations first (earlier start on ties), each at the lowest offset that collides
    with no placed allocation live at the same time (TFLite's greedy-by-size arena planner)."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    return place(iv, s, np.lexsort((iv[:, 0], -s)), fit="first")


PLACEMENTS: dict[str, Placement] = {
    "first_fit": first_fit,
    "best_fit": best_fit,
    "greedy_by_size": greedy_by_size,
}
"""Named placements; a policy adds its own with ``PLACEMENTS["melon"] = fn``."""


def get_placement(placement: str | Placement) -> tuple[str, Placement]:
    """``(name, function)`` for a registered name or a placement function."""
    if callable(placement):
        return getattr(placement, "__name__", "custom"), placement
    if placement not in PLACEMENTS:
        raise UnknownNameError("placement", str(placement), list(PLACEMENTS))
    return placement, PLACEMENTS[placement]


def allocate(graph: Any, plan: Any, placement: str | Placement = "best_fit") -> Any:
    """Lay out ``plan``'s allocations in one arena and return the plan with ``offsets`` filled.

    Args:
      graph: the :class:`remat.Graph`.
      plan: a legal :class:`remat.Plan` (any ``offsets`` it has are replaced).
      placement: a name from :data:`PLACEMENTS` or a :data:`Placement` function.

    Returns:
      The plan with ``offsets`` (``int64[A]``, one per allocation event, in allocation order) and
      ``meta["layout"]`` (placement name), ``meta["arena_bytes"]``.

    Raises:
      InvalidPlanError: the plan is illegal, or the placement returns an invalid layout.
    """
    name, fn = get_placement(placement)
    events = dataclasses.replace(plan, offsets=None).validate(graph)
    lt = lifetimes(events)
    offsets = np.asarray(fn(lt.intervals, lt.sizes), dtype=np.int64)
    validate(lt.intervals, lt.sizes, offsets, labels=_Labels(graph, lt.node))
    return dataclasses.replace(plan, offsets=offsets).with_meta(
        layout=name, arena_bytes=arena_size(offsets, lt.sizes)
    )


class _Labels:
    """``labels[a]``: the name of allocation a's node (looked up only for an error message)."""

    def __init__(self, graph: Any, node: np.ndarray):
        self._graph, self._node = graph, node

    def __getitem__(self, a: int) -> str:
        return self._graph.nodes[int(self._node[a])].name
