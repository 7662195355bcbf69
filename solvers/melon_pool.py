"""Melon's lifetime-aware memory pool (Wang et al., MobiSys 2022, §4.2), as layout placements.

Every allocation is a rectangle in the (time × address) plane: x-extent its lifetime (inclusive
``[first, last]`` event indices, :func:`remat.layout.lifetimes`), height its size in bytes, y its
offset.  Two rectangles may share addresses only when their lifetimes are disjoint; the pool
size is ``max(offset + size)`` (2D strip packing, NP-hard).  Melon's greedy places the
allocation with the **longest lifetime first**, each at the lowest non-colliding offset (paper:
"iteratively places the tensor with the longest lifetime over the lowest memory address
possible"), ties broken as the authors' ``GreedyAllocator`` does: lifetime ↓, size ↓, alloc
time ↑, free time ↑.  The artifact places each one in the *smallest* gap that fits
(best-fit), not the lowest one; both variants are here:

* :func:`lifetime_aware` (``fit="best"``, the artifact; registered as ``"melon"``) and
  :func:`lifetime_aware_lowest` (``fit="first"``, the paper's wording; ``"melon_lowest"``).

The two allocators Melon compares against already live in :mod:`remat.layout`: on-demand
sequential allocation is :func:`remat.layout.first_fit` (allocation order, lowest free offset)
and "large tensor first" is :func:`remat.layout.greedy_by_size`.  :func:`pool_report` measures
any of them against the max-live lower bound.

What holds and what does not: on a *laminar* set of lifetimes (any two nested or disjoint,
Melon's "first produce, last release" activations) longest-first packing reaches the max-live
lower bound exactly (the live set at any time is a chain of nested lifetimes, and each
allocation lands right on top of its placed ancestors), so it is never worse than on-demand
there.  For general lifetimes it can be worse than on-demand (``tests/test_melon.py`` holds a
counterexample); the paper's "never worse" is an empirical claim about training graphs.

numpy only; the packing itself is :func:`remat.layout.place`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from remat.layout import (
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


PLACEMENTS.setdefault("melon", lifetime_aware)
PLACEMENTS.setdefault("melon_lowest", lifetime_aware_lowest)

COMPARED: dict[str, Placement] = {
    "on_demand": first_fit,
    "large_first": greedy_by_size,
    "lifetime_aware": lifetime_aware,
    "lifetime_aware_lowest": lifetime_aware_lowest,
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
    """Run ``placement`` and report pool size and fragmentation via :mod:`remat.layout`.

    Args:
      intervals: ``int64[A, 2]`` inclusive lifetimes.
      sizes: ``int64[A]`` bytes.
      placement: any :data:`remat.layout.Placement`.
      check: validate the layout (no two live allocations overlap).

    Returns:
      ``(offsets int64[A], PoolReport)``.
    """
    off = np.asarray(placement(intervals, sizes), dtype=np.int64)
    if check:
        validate(intervals, sizes, off)
    return off, PoolReport(arena_size(off, sizes), max_live_lower_bound(intervals, sizes),
                           fragmentation(intervals, sizes, off))
