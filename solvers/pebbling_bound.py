"""Proofs that no schedule fits a budget: a pebbling lower bound valid for *any* order and any
amount of recomputation (so for every Checkmate, Moccasin or remat plan of the graph).

The argument.  Suppose the values of a set ``X`` are live together at some moment (each copy
computed before it).  Let ``x`` be the member whose copy was computed last, at time ``τ``.  While
``x`` runs, every other member of ``X`` is already live and so is every input of ``x``: the
bytes live at ``τ`` are at least ``size(X ∪ preds(x))``, and just before ``τ`` the set
``X \\ {x} ∪ preds(x)`` is live together.  Hence the peak of any schedule producing ``X``
is at least

    LB(X) = max(size(X), min over x in X of max(size(X ∪ preds(x)), LB(X \\ {x} ∪ preds(x))))

(``LB(∅) = 0``; a source ``x`` has ``preds(x) = ∅``).  Every schedule runs every node ``v``, so
``LB({v}) > budget`` for any single ``v`` proves the budget infeasible.  Since sets only move to
lexicographically smaller index multisets, the recursion is finite.

:func:`prove_infeasible` decides ``LB({v}) > budget`` by an AND-OR depth-first search: every
choice of ``x`` must overflow the budget or lead to a set already shown to.  A branch that
reaches ``∅`` (or a set known to be producible) is a schedule that fits, and ends the attempt
for that ``v``.  The search is exponential in the worst case, so it stops after ``max_states``
sets per node and reports "unknown" rather than guessing.

This module does not import jax.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from remat.core.errors import BudgetFormatError, InvalidGraphError


@dataclasses.dataclass(frozen=True)
class PebblingBound:
    """Outcome of :func:`prove_infeasible`.

    Attributes:
      proven: ``True`` when no schedule of the graph fits ``budget`` bytes.
      node: the node whose every production needs more than ``budget`` (when proven).
      budget: the budget tested, bytes.
      states: AND-OR search states visited in total.
      unknown_nodes: nodes whose search hit ``max_states`` (neither proven nor refuted).
      seconds: wall time of the search.
    """

    proven: bool
    node: int | None
    budget: int
    states: int
    unknown_nodes: tuple[int, ...]
    seconds: float


class _Limit(Exception):
    pass


def check_inputs(preds: Sequence[Sequence[int]], sizes: Sequence[int], budget: int
                 ) -> tuple[list[list[int]], list[int], int]:
    """``(preds, sizes, budget)`` as Python ints, after the checks every pebbling search needs.

    Raises:
      InvalidGraphError: ``preds``/``sizes`` lengths differ, a size is negative, or an input
        index is not smaller than its reader's (the searches rely on topological indices).
      BudgetFormatError: a negative, fractional or boolean budget.
    """
    n = len(sizes)
    if len(preds) != n:
        raise InvalidGraphError(f"preds has {len(preds)} entries but sizes has {n}")
    P = [[int(p) for p in ps] for ps in preds]
    sz = [int(s) for s in sizes]
    for v in range(n):
        if sz[v] < 0:
            raise InvalidGraphError(f"negative output size {sz[v]}", node=v)
        bad = [p for p in P[v] if not 0 <= p < v]
        if bad:
            raise InvalidGraphError(
                f"input {bad[0]} is not an earlier node (indices must be topological)", node=v)
    if isinstance(budget, bool) or int(budget) != budget or budget < 0:
        raise BudgetFormatError(f"budget must be a non-negative number of bytes, got {budget!r}")
    return P, sz, int(budget)


def prove_infeasible(
    preds: Sequence[Sequence[int]],
    sizes: Sequence[int],
    budget: int,
    *,
    max_states: int = 20_000,
    time_limit: float = 60.0,
    nodes: Sequence[int] | None = None,
) -> PebblingBound:
    """Try to prove that every schedule of the DAG peaks above ``budget`` bytes.

    Args:
      preds: ``preds[v]`` the inputs of node ``v`` (indices in topological order).
      sizes: output bytes of each node (``int[n]``).
      budget: device bytes.
      max_states: search states per node before it is reported unknown.
      time_limit: seconds for the whole search (remaining nodes are reported unknown).
      nodes: nodes to try (default: all, the largest single-step need first).

    Returns:
      A :class:`PebblingBound`; ``proven=False`` says only that no proof was found.

    Raises:
      InvalidGraphError: ``preds``/``sizes`` lengths differ, a size is negative, or an input
        index is not smaller than its reader's (the search relies on topological indices).
      BudgetFormatError: a negative or fractional budget.
    """
    t0 = time.perf_counter()
    P0, sz, budget = check_inputs(preds, sizes, budget)
    n = len(sz)
    P = [frozenset(ps) for ps in P0]
    if nodes is None:
        nodes = sorted(range(n), key=lambda v: -(sz[v] + sum(sz[p] for p in P[v])))
    proven: dict[frozenset, bool] = {}
    total = 0
    unknown: list[int] = []

    def size(X) -> int:
        return sum(sz[u] for u in X)

    nodes = list(nodes)
    for i, v in enumerate(nodes):
        if time.perf_counter() - t0 > time_limit:
            unknown.extend(nodes[i:])
            break
        count = 0

        def lb_exceeds(X: frozenset, size_x: int) -> bool:
            nonlocal count, total
            if size_x > budget:
                return True
            if not X:
                return False
            hit = proven.get(X)
            if hit is not None:
                return hit
            count += 1
            total += 1
            if count > max_states or (count & 255 == 0 and time.perf_counter() - t0 > time_limit):
                raise _Limit
            moves = []
            for x in X:
                add = P[x] - X
                size_add = sum(sz[p] for p in add)
                if size_x + size_add > budget:
                    continue  # computing x last overflows: this branch is closed
                moves.append((size_add - sz[x], -x, x, add))
            moves.sort()  # the branch most likely to fit first: refute early
            result = True
            for d, _, x, add in moves:
                if not lb_exceeds((X - {x}) | add, size_x + d):
                    result = False
                    break
            proven[X] = result
            return result

        try:
            x0 = frozenset([v])
            if _deep(lambda x0=x0: lb_exceeds(x0, size(x0))):
                return PebblingBound(True, v, budget, total, tuple(unknown),
                                     time.perf_counter() - t0)
        except _Limit:
            unknown.append(v)
    return PebblingBound(False, None, budget, total, tuple(unknown), time.perf_counter() - t0)


def _deep(fn):
    """Run ``fn`` with a recursion limit large enough for long search paths."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        return fn()
    except RecursionError as e:
        raise _Limit from e
    finally:
        sys.setrecursionlimit(old)
