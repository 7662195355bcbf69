"""Schedule-independent memory bounds on arrays (numpy only, no jax).

The *frontier bound*: whatever the schedule, a node runs with its own output allocated and every
input resident, so ``max_v (size_v + sum_{p in preds(v)} size_p)`` bytes are live at some moment
of every schedule under the replay model of :mod:`remat.core.schedule`.  A budget below it is
infeasible; the bound is exact only when some schedule attains it.
"""

from __future__ import annotations

import numpy as np

from remat.core.errors import InvalidGraphError

__all__ = ["frontier_lower_bound", "node_step_bytes"]


def node_step_bytes(sizes: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``int64[n]``: bytes live while each node runs in any schedule (its output + its inputs).

    Args:
      sizes: ``int[n]`` output bytes of each node.
      edges: ``int[m, 2]`` data edges ``(src, dst)`` (``dst`` reads ``src``'s output); a repeated
        edge is counted once.

    Returns:
      ``need[v] = sizes[v] + sum(sizes[p] for p in preds(v))`` in bytes.

    Raises:
      InvalidGraphError: a negative size, or an edge naming a node that does not exist.
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if (sizes < 0).any():
        raise InvalidGraphError("negative output size", node=int(np.flatnonzero(sizes < 0)[0]))
    if len(e) and (e.min() < 0 or e.max() >= len(sizes)):
        raise InvalidGraphError(f"edge endpoint outside 0..{len(sizes) - 1}")
    need = sizes.copy()
    if len(e):
        e = np.unique(e, axis=0)
        np.add.at(need, e[:, 1], sizes[e[:, 0]])
    return need


def frontier_lower_bound(sizes: np.ndarray, edges: np.ndarray) -> int:
    """Bytes live while the most demanding node runs, in any schedule (``0`` for no node).

    ``max_v (sizes[v] + sum_{p in preds(v)} sizes[p])``: a lower bound (bytes) on the smallest
    feasible memory budget.  Arguments as in :func:`node_step_bytes`.
    """
    return int(node_step_bytes(sizes, edges).max(initial=0))
