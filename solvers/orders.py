"""The peak of running every node once in a given order, and its per-step profile (no jax).

At each step the bytes resident are the outputs created so far that the step or a later one
reads, plus the step's own output (an output nobody reads lives only at its own step): the
project's event semantics (:mod:`remat.core.events`), OLLA's eq. 13 (Steiner et al.) evaluated.
For the identity order this is :meth:`remat.core.graph.Graph.no_remat_peak`.
Used by :mod:`solvers.olla` and :mod:`solvers.order_search`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["order_peak", "order_profile", "interval_sweep"]


def order_peak(sizes: np.ndarray, edges: np.ndarray, order: Sequence[int]) -> int:
    """Peak bytes of running every node once in ``order`` (the max of :func:`order_profile`).

    Args:
      sizes: ``int64[n]`` output bytes per node.
      edges: ``int[m, 2]`` data edges ``(src, dst)``.
      order: ``int[n]`` node indices in run order.

    Raises:
      ValueError: ``order`` is not a topological order of ``edges``.
    """
    return int(order_profile(sizes, edges, order).max(initial=0))


def order_profile(sizes: np.ndarray, edges: np.ndarray, order: Sequence[int]) -> np.ndarray:
    """``int64[n]`` resident bytes at each step of ``order`` (see :func:`order_peak`)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(n)
    if len(e) and (pos[e[:, 0]] >= pos[e[:, 1]]).any():
        raise ValueError("order is not a topological order of the edges")
    end = pos.copy()
    if len(e):
        np.maximum.at(end, e[:, 0], pos[e[:, 1]])
    return interval_sweep(pos, end, sizes, n)


def interval_sweep(start: np.ndarray, end: np.ndarray, sizes: np.ndarray,
                   length: int) -> np.ndarray:
    """``int64[length]``: at each index, the bytes of the items whose inclusive
    ``[start, end]`` covers it."""
    diff = np.zeros(length + 1, dtype=np.int64)
    np.add.at(diff, start, sizes)
    np.add.at(diff, end + 1, -sizes)
    return np.cumsum(diff)[:length]
