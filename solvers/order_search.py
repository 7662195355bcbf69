"""Low-peak topological orders by randomised greedy list scheduling (no recomputation).

The peak of running every node once in an order is :func:`solvers.orders.order_peak`'s: at each
step the outputs created so far that the step or a later one reads, plus the step's own output.
Choosing the order that minimises it is NP-hard (register sufficiency); OLLA's order ILP
(:func:`solvers.olla.solve_order`, Steiner et al. eq. 14) solves it exactly on small graphs and
by large-neighbourhood search on large ones, starting from a warm order.  This module gives that
search a better start than the program's order, in milliseconds.

:func:`greedy_order` builds orders one node at a time.  Among the ready nodes (every input
already placed) it places the one whose placement changes the resident bytes least:

    delta(v) = size(v) · [v has a reader] - Σ size(p) over inputs p whose last unplaced reader is v

(the bytes it allocates minus the bytes it frees), ties broken by the smaller index.  Restart 0
is this rule as is; restart ``r > 0`` adds ``noise · mean(size) · z_v`` to ``delta(v)`` with one
standard-normal ``z_v`` per node and restart (a fixed random priority, so that different
restarts explore different orders).  The lowest-peak order over all restarts is returned.

Measured on the published random layered DAGs:
``docs/design/decisions/0009-peak-shaving-and-low-peak-orders.md``.

This module does not import jax.
"""

from __future__ import annotations

import time

import numpy as np

from remat.core.errors import InvalidGraphError, RematError
from solvers.orders import order_peak

__all__ = ["greedy_order", "greedy_orders"]


def greedy_orders(
    sizes: np.ndarray,
    edges: np.ndarray,
    *,
    restarts: int = 32,
    noise: float = 0.3,
    seed: int = 0,
    control_edges: np.ndarray | None = None,
    time_limit: float | None = None,
) -> tuple[np.ndarray, int]:
    """The distinct orders of ``restarts`` randomised greedy list schedules, lowest peak first.

    Args:
      sizes: ``int64[n]`` output bytes per node.
      edges: ``int[m, 2]`` data edges ``(src, dst)`` (an output lives until its last reader).
      restarts: orders built (at least 1; restart 0 is the deterministic rule).
      noise: scale of the random priority of restarts ``> 0``, in mean output sizes.
      seed: seed of the random priorities.
      control_edges: ``int[k, 2]`` extra precedence pairs that hold no memory.
      time_limit: seconds; no restart starts after it (restart 0 always runs).

    Returns:
      ``[(order, peak), ...]``: ``int64[n]`` node indices in run order and its peak, bytes (as
      :func:`solvers.orders.order_peak`), by peak then by restart.

    Raises:
      InvalidGraphError: an edge names a node outside ``0..n-1`` or the edges have a cycle.
      RematError: ``restarts < 1`` or a negative ``noise``.
    """
    if restarts < 1 or noise < 0:
        raise RematError(f"greedy_order needs restarts >= 1 and noise >= 0, got {restarts}, "
                         f"{noise}")
    t0 = time.perf_counter()
    s = np.asarray(sizes, dtype=np.int64)
    n = len(s)
    e = np.unique(np.asarray(edges, dtype=np.int64).reshape(-1, 2), axis=0)
    c = (np.zeros((0, 2), np.int64) if control_edges is None
         else np.unique(np.asarray(control_edges, dtype=np.int64).reshape(-1, 2), axis=0))
    both = np.concatenate([e, c])
    if len(both) and (both.min() < 0 or both.max() >= n):
        raise InvalidGraphError(f"an edge names a node outside 0..{n - 1}")
    e = e[e[:, 0] != e[:, 1]]
    # CSR adjacency: data readers of each node, and every successor (data + control)
    readers = _csr(n, e[:, 0], e[:, 1])
    inputs = _csr(n, e[:, 1], e[:, 0])
    succ = _csr(n, both[:, 0], both[:, 1])
    indeg0 = np.bincount(both[:, 1], minlength=n).astype(np.int64)
    nread0 = np.bincount(e[:, 0], minlength=n).astype(np.int64)
    has_reader = (nread0 > 0).astype(np.int64)
    rng = np.random.default_rng(seed)
    scale = noise * float(s.mean()) if n else 0.0
    found: dict[bytes, tuple[int, int, np.ndarray]] = {}
    for r in range(restarts):
        if r and time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
        prio = np.zeros(n) if r == 0 else scale * rng.standard_normal(n)
        order = _one_order(s, readers, inputs, succ, indeg0, nread0, has_reader, prio)
        found.setdefault(order.tobytes(), (int(order_peak(s, e, order)), r, order))
    return [(o, p) for p, _, o in sorted(found.values(), key=lambda x: x[:2])]


def greedy_order(sizes: np.ndarray, edges: np.ndarray, **options) -> tuple[np.ndarray, int]:
    """The lowest-peak order among ``restarts`` randomised greedy list schedules (the first
    of :func:`greedy_orders`, same arguments): ``(order, peak)``."""
    return greedy_orders(sizes, edges, **options)[0]


def _csr(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets[n + 1], targets)``: ``targets[offsets[u]:offsets[u + 1]]`` are the ``dst`` of
    the pairs whose ``src`` is ``u``."""
    o = np.argsort(src, kind="stable")
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    return off, np.asarray(dst, dtype=np.int64)[o]


def _one_order(s, readers, inputs, succ, indeg0, nread0, has_reader, prio) -> np.ndarray:
    """One greedy list schedule (see the module docstring); ``prio`` is added to ``delta``."""
    n = len(s)
    roff, rdst = readers
    ioff, isrc = inputs
    soff, sdst = succ
    indeg = indeg0.copy()
    left = nread0.copy()  # unplaced readers of each node
    placed = np.zeros(n, dtype=bool)
    # frees[v]: bytes freed by placing v (inputs whose only unplaced reader is v)
    frees = np.zeros(n, dtype=np.int64)
    one = np.flatnonzero(left == 1)
    if len(one):
        np.add.at(frees, rdst[roff[one]], s[one])
    key = (s * has_reader).astype(np.float64) + prio
    ready = indeg == 0
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        cand = np.flatnonzero(ready)
        if not len(cand):
            raise InvalidGraphError("the edges have a cycle: no order runs every node")
        v = int(cand[np.argmin(key[cand] - frees[cand])])
        order[i] = v
        ready[v] = False
        placed[v] = True
        for p in isrc[ioff[v]:ioff[v + 1]]:
            left[p] -= 1
            if left[p] == 1:  # its last unplaced reader now frees it
                rs = rdst[roff[p]:roff[p + 1]]
                last = rs[~placed[rs]]
                frees[last[0]] += s[p]
        for w in sdst[soff[v]:soff[v + 1]]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready[w] = True
    return order
