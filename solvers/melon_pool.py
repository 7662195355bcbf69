"""Melon's lifetime-aware memory pool (Wang et al., MobiSys 2022, §4.2), as layout placements.

Every allocation is a rectangle in the (time × address) plane: x-extent its lifetime (inclusive
``[first, last]`` event indices, :func:`remat.core.layout.lifetimes`), height its size in bytes, y its
offset.  Two rectangles may share addresses only when their lifetimes are disjoint; the pool
size is ``max(offset + size)`` (2D strip packing, NP-hard).  Melon's greedy places the
allocation with the **longest lifetime first**, each at the lowest non-colliding offset (paper:
"iteratively places the tensor with the longest lifetime over the lowest memory address
possible"), ties broken as the authors' ``GreedyAllocator`` does: lifetime ↓, size ↓, alloc
time ↑, free time ↑.  The artifact places each one in the *smallest* gap that fits
(best-fit), not the lowest one; both variants are here:

* :func:`lifetime_aware` (``fit="best"``, the artifact; registered as ``"melon"``) and
  :func:`lifetime_aware_lowest` (``fit="first"``, the paper's wording; ``"melon_lowest"``):
  the paper-faithful raw greedy, kept as its own named placement;
* :func:`lifetime_aware_refined` and :func:`melon_pool` (``"melon_refined"``): the same
  greedy followed by a local search, below.

The two allocators Melon compares against already live in :mod:`remat.core.layout`: on-demand
sequential allocation is :func:`remat.core.layout.first_fit` (allocation order, lowest free offset)
and "large tensor first" is :func:`remat.core.layout.greedy_by_size`.  :func:`pool_report` measures
any of them against the max-live lower bound.

What holds and what does not: on a *laminar* set of lifetimes (any two nested or disjoint,
Melon's "first produce, last release" activations) longest-first packing reaches the max-live
lower bound exactly (the live set at any time is a chain of nested lifetimes, and each
allocation lands right on top of its placed ancestors), so it is never worse than on-demand
there.  For general lifetimes it can be worse than on-demand (``tests/test_melon.py`` holds a
counterexample); the paper's "never worse" is an empirical claim about training graphs.

**Why the raw greedy loses on forward+backward stage graphs, and the refined pool.**  The
forward activations are laminar and longest-first stacks them perfectly; the backward stage
outputs are short, similar-length lifetimes that *cross* each other and the activations (each
overlaps its neighbours in time).  Ordering those by length is ordering them arbitrarily in
time: a later tensor placed first (e.g. ``[80, 89]``) sits right on the activation staircase,
the one crossing it (``[76, 82]``) lands on top of it, and the big one crossing only the latter
(``[73, 78]``) cannot use the hole under it and goes on top of both -- three tensors stacked at
an event where only two are live (measured on mobilenet_v2, batch 2, 32x32: 8.6 % over the
max-live bound against on-demand's 2.0 %; squeezenet 3.8 % vs 0.06 %, resnet50 6.6 % vs 1.5 %).
:func:`refine` repairs this with a local search over visiting orders:

1. *Gravity compaction*: re-place every allocation, in ascending order of its current offset,
   at the lowest offset clear of those already re-placed.  Never worse: by induction each lands
   at or below its old offset (the ones placed before it had offsets below it and moved down,
   so they cannot reach its old range), so the pool cannot grow.
2. *Critical moves*: pick an allocation ``c`` whose top is the pool size, one ``k`` live at the
   same time as ``c``, move ``k`` to the front, the back or a random position of the compacted
   order, re-place (lowest offset) and compact; keep the result when
   ``(pool, #allocations at the top, Σ tops)`` does not increase (plateau moves allowed).
   Stops within ``rtol`` (default 0.01 %) of the max-live bound or after ``iters`` moves; the
   moves use a seeded generator, so the result is deterministic.

:func:`lifetime_aware_refined` runs it from Melon's two greedy layouts only (longest lifetime
first, best-fit and lowest-address); :func:`melon_pool` -- the pool the :class:`Melon` policy
uses (registered ``"melon_refined"``) -- runs it from those **and from on-demand's layout
(allocation order, first-fit) as a third seed**, so "never worse than on-demand" holds there by
construction (the search compacts every seed, then searches from the best ones).  ``experiments/results/melon_pool.csv`` reports both, plus the paper's raw
greedy (``lifetime_aware``), so one sees whether the guard seed ever mattered.

numpy only; the packing itself is :func:`remat.core.layout.place`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from remat.core.layout import (
    PLACEMENTS,
    Placement,
    arena_size,
    first_fit,
    fragmentation,
    greedy_by_size,
    max_live_lower_bound,
    place,
    validate,
)

__all__ = [
    "lifetime_order",
    "lifetime_aware",
    "lifetime_aware_lowest",
    "compact",
    "refine",
    "lifetime_aware_refined",
    "melon_pool",
    "place_around",
    "PoolReport",
    "pool_report",
    "COMPARED",
]


def lifetime_order(intervals: Any, sizes: Any) -> np.ndarray:
    """Melon's visiting order: lifetime (``last - first``, events) descending, then size (bytes)
    descending, then first event ascending, then last event ascending (``GreedyAllocator``'s
    sort key); remaining ties by allocation id."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    span = iv[:, 1] - iv[:, 0]
    return np.lexsort((np.arange(len(s)), iv[:, 1], iv[:, 0], -s, -span))


def lifetime_aware(intervals: Any, sizes: Any) -> np.ndarray:
    """Longest lifetime first, each in the tightest gap that fits (the Melon artifact's best-fit).

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes (event indices).
      sizes: ``int64[A]`` bytes.

    Returns:
      ``int64[A]`` offsets (bytes) of a valid layout.
    """
    return place(intervals, sizes, lifetime_order(intervals, sizes), fit="best")


def lifetime_aware_lowest(intervals: Any, sizes: Any) -> np.ndarray:
    """Longest lifetime first, each at the lowest offset that fits (the paper's wording)."""
    return place(intervals, sizes, lifetime_order(intervals, sizes), fit="first")


def _by_offset(off: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """Allocations by current offset (bytes) ascending, then first event, then id."""
    return np.lexsort((np.arange(len(off)), iv[:, 0], off))


def compact(intervals: Any, sizes: Any, offsets: Any) -> np.ndarray:
    """Gravity compaction: re-place allocations in ascending order of ``offsets`` (bytes), each
    at the lowest offset clear of those already re-placed.  Every allocation ends at or below
    its old offset (see the module doc), so the pool never grows.

    Returns:
      ``int64[A]`` offsets (bytes) of a valid layout.
    """
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    return place(iv, sizes, _by_offset(np.asarray(offsets, dtype=np.int64), iv), fit="first")


def _score(off: np.ndarray, s: np.ndarray) -> tuple[int, int, int]:
    top = off + s
    m = int(top.max(initial=0))
    return m, int((top == m).sum()), int(top.sum())


def refine(intervals: Any, sizes: Any, seeds: Sequence[Any], *, iters: int | None = None,
           seed: int = 0, rtol: float = 1e-4) -> np.ndarray:
    """Local search over visiting orders from the layouts in ``seeds`` (module doc, steps 1-2).

    Every seed is compacted first; the search then runs from the compacted seeds, best first
    (all of them when ``A <= 1000``, else only the best), and stops as soon as the pool is
    within ``rtol`` of the max-live bound.  The result is never worse than any compacted seed,
    hence than any seed.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes (event indices).
      sizes: ``int64[A]`` bytes.
      seeds: starting layouts, each ``int64[A]`` offsets (bytes).
      iters: critical moves per searched seed (``None``: ``clip(40000 // A, 8, 300)``, so a
        search stays about ``O(A^2)`` numpy work whatever the graph size).
      seed: seed of the move generator (the result is deterministic).
      rtol: stop when ``pool <= (1 + rtol) × max_live_lower_bound``.

    Returns:
      ``int64[A]`` offsets (bytes): a valid layout whose pool is at most the smallest seed's.
    """
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if not len(s):
        return np.zeros(0, dtype=np.int64)
    good = max_live_lower_bound(iv, s) * (1.0 + rtol)
    n_iter = int(np.clip(40000 // len(s), 8, 300)) if iters is None else int(iters)
    starts: list[np.ndarray] = []
    for x in seeds:  # compacted, duplicates searched once
        c = compact(iv, s, np.asarray(x, dtype=np.int64))
        if not any(np.array_equal(c, y) for y in starts):
            starts.append(c)
    starts.sort(key=lambda c: _score(c, s))
    best, best_sc = starts[0], _score(starts[0], s)
    for cur in starts[:len(starts) if len(s) <= 1000 else 1]:
        if best_sc[0] <= good:
            break
        rng = np.random.default_rng(seed)
        sc = _score(cur, s)
        for _ in range(n_iter):
            if sc[0] <= good:
                break
            crit = np.flatnonzero(cur + s == sc[0])
            c = int(crit[rng.integers(len(crit))])
            hit = np.flatnonzero((iv[:, 0] <= iv[c, 1]) & (iv[c, 0] <= iv[:, 1]) & (s > 0))
            k = int(hit[rng.integers(len(hit))])
            order = [int(a) for a in _by_offset(cur, iv) if a != k]
            move = int(rng.integers(3))
            pos = 0 if move == 0 else len(order) if move == 1 else int(rng.integers(len(order) + 1))
            order.insert(pos, k)
            cand = compact(iv, s, place(iv, s, np.asarray(order, dtype=np.int64), fit="first"))
            csc = _score(cand, s)
            if csc <= sc:
                cur, sc = cand, csc
        if sc < best_sc:
            best, best_sc = cur, sc
    return best


def lifetime_aware_refined(intervals: Any, sizes: Any) -> np.ndarray:
    """:func:`refine` from Melon's two longest-lifetime-first layouts only (no on-demand seed).

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.

    Returns:
      ``int64[A]`` offsets (bytes); pool at most :func:`lifetime_aware`'s.
    """
    return refine(intervals, sizes,
                  [lifetime_aware(intervals, sizes), lifetime_aware_lowest(intervals, sizes)])


def melon_pool(intervals: Any, sizes: Any) -> np.ndarray:
    """The pool the Melon policy uses: :func:`refine` from Melon's two longest-lifetime-first
    layouts **and from on-demand's layout** (:func:`remat.core.layout.first_fit`) as a guard seed, so
    its pool is never larger than on-demand's nor than the paper's greedy.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.

    Returns:
      ``int64[A]`` offsets (bytes).
    """
    return refine(intervals, sizes, [lifetime_aware(intervals, sizes),
                                     lifetime_aware_lowest(intervals, sizes),
                                     first_fit(intervals, sizes)])



def place_around(intervals: Any, sizes: Any, fixed: Any, offsets: Any, order: Any) -> np.ndarray:
    """Lowest-offset placement of the allocations not ``fixed``, in ``order``, around the fixed
    ones (which keep ``offsets``); used to lay out what runs after a budget switch around the
    tensors that stay where they are.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.
      fixed: ``bool[A]``: allocations whose offset is given.
      offsets: ``int64[A]`` bytes; read where ``fixed``.
      order: the allocations not ``fixed``, in visiting order.

    Returns:
      ``int64[A]`` offsets (bytes); valid when the fixed ones do not collide among themselves.
    """
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    done = np.asarray(fixed, dtype=bool).copy()
    off = np.where(done, np.asarray(offsets, dtype=np.int64), 0)
    for a in np.asarray(order, dtype=np.int64).tolist():
        hit = done & (iv[:, 0] <= iv[a, 1]) & (iv[a, 0] <= iv[:, 1]) & (s > 0)
        lo, hi = off[hit], off[hit] + s[hit]
        idx = np.argsort(lo, kind="stable")
        below = 0
        for j in idx.tolist():
            if lo[j] - below >= s[a]:
                break
            below = max(below, int(hi[j]))
        off[a] = below
        done[a] = True
    return off

PLACEMENTS.setdefault("melon", lifetime_aware)
PLACEMENTS.setdefault("melon_lowest", lifetime_aware_lowest)
PLACEMENTS.setdefault("melon_refined", melon_pool)

COMPARED: dict[str, Placement] = {
    "on_demand": first_fit,
    "large_first": greedy_by_size,
    "lifetime_aware": lifetime_aware,
    "lifetime_aware_lowest": lifetime_aware_lowest,
    "lifetime_aware_refined": lifetime_aware_refined,
    "melon_pool": melon_pool,
}
"""The allocators of Melon's comparison (§6, Fig. 6), by the names used in reports."""


class PoolReport(NamedTuple):
    """One layout judged against the max-live lower bound.

    Attributes:
      pool_bytes: ``max(offset + size)``, the pool Melon ``malloc``s once (bytes).
      lower_bound_bytes: peak of live bytes; no layout's pool is smaller (bytes).
      fragmentation: ``pool / lower_bound - 1`` (the paper's "waste" is
        ``1 - lower_bound / pool``).
    """

    pool_bytes: int
    lower_bound_bytes: int
    fragmentation: float

    @property
    def waste(self) -> float:
        """Fraction of the pool never usable at the peak: ``1 - lower_bound / pool``."""
        return 1.0 - self.lower_bound_bytes / self.pool_bytes if self.pool_bytes else 0.0


def pool_report(intervals: Any, sizes: Any, placement: Placement = lifetime_aware,
                *, check: bool = True) -> tuple[np.ndarray, PoolReport]:
    """Run ``placement`` and report pool size and fragmentation via :mod:`remat.core.layout`.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.
      placement: any :data:`remat.core.layout.Placement`.
      check: validate the layout (no two live allocations overlap).

    Returns:
      ``(offsets int64[A], PoolReport)``.
    """
    off = np.asarray(placement(intervals, sizes), dtype=np.int64)
    if check:
        validate(intervals, sizes, off)
    return off, PoolReport(arena_size(off, sizes), max_live_lower_bound(intervals, sizes),
                           fragmentation(intervals, sizes, off))
