r"""Decide whether a DAG can run within a memory budget: a complete search over live sets that
returns either a schedule that fits (a witness) or a proof that none exists.

Schedules here are *sequences*: any order, any amount of recomputation, remat's replay
semantics (running ``x`` holds its inputs, everything still needed later and its own output;
a value may be dropped at any time).  The question "can node ``v`` be produced within ``B``
bytes?" is answered backwards, as in :mod:`solvers.pebbling_bound`: a state is the set ``X``
of values that must be live together; the member ``x`` computed last turns it into
``X \ {x} ∪ preds(x)`` and that compute holds ``size(X ∪ preds(x))`` bytes.  ``X`` can be
produced within ``B`` iff some sequence of such moves, each within ``B``, empties it.

Two facts make the search small enough for the published random DAGs:

* **Free moves.**  If every input of ``x ∈ X`` is in ``X`` (or ``x`` has none), computing it
  last holds ``size(X)`` bytes and leaves ``X \ {x}``; since a subset of a producible set is
  producible, ``X`` is producible iff ``X \ {x}`` is.  Such moves are applied without
  branching.  One pass in decreasing index order reaches the fixpoint (whether ``x`` is free
  depends only on members below ``x``, which the pass removes later).
* **Dead states are remembered** (a set that cannot be produced never can), and sets are
  Python integers (bit masks), so a state costs a few hash and bit operations.

Moves are tried largest index first: with no backtracking this is a topological schedule
without recomputation (one computation per node), so the witness recomputes only where the
budget forces it.  The search is complete: when every move from the start state is exhausted
the budget is *proven* infeasible (this is the recursion ``LB`` of
:mod:`solvers.pebbling_bound` decided exactly).  It stops at ``max_states`` states or
``time_limit`` seconds and then says ``"unknown"``.

A graph is feasible iff every sink can be produced (its ancestors are computed on the way), so
:func:`decide` produces the sinks one after the other, each from an empty memory, and the
concatenation is the witness; :func:`prune_recomputation` then keeps values alive instead of
recomputing them wherever the budget allows.

What it decided on the published random layered DAGs:
``docs/design/decisions/0010-pebbling-witness-search.md``.

This module does not import jax.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from remat.core.errors import InvalidGraphError, RematError, UnknownNameError
from solvers.bounds import node_step_bytes
from solvers.pebbling_bound import check_inputs

__all__ = ["Decision", "copy_ends", "decide", "prune_best", "prune_recomputation",
           "sequence_live_bytes"]


@dataclasses.dataclass(frozen=True)
class Decision:
    """Outcome of :func:`decide`.

    Attributes:
      status: ``"feasible"`` (``schedule`` fits), ``"infeasible"`` (proven: no schedule of any
        order with any recomputation fits) or ``"unknown"`` (a limit stopped the search).
      budget: the budget tested, bytes.
      schedule: ``feasible`` only: the nodes in run order (every node at least once).
      peak_bytes: ``feasible`` only: the schedule's peak (:func:`sequence_live_bytes`), bytes.
      node: ``infeasible``: a node no schedule produces within the budget; ``unknown``: the
        sink whose search hit the limit.
      proof: ``infeasible`` only: ``"single step"`` (the node's inputs and output alone exceed
        the budget) or ``"exhaustive search"``.
      states: search states expanded.
      seconds: wall time.
    """

    status: str
    budget: int
    schedule: tuple[int, ...] | None
    peak_bytes: int | None
    node: int | None
    proof: str | None
    states: int
    seconds: float


class _Limit(Exception):
    pass


def _bits(x: int) -> list[int]:
    """Members of the bit set ``x``, decreasing."""
    out = []
    while x:
        top = x.bit_length() - 1
        out.append(top)
        x ^= 1 << top
    return out


class _Searcher:
    """The backward search, its dead-state memo shared by every target of one budget."""

    def __init__(self, preds, sizes, budget: int, max_states: int, deadline: float):
        self.pm = [sum(1 << p for p in {int(q) for q in ps}) for ps in preds]  # bit sets
        self.sz = sizes
        self.budget = budget
        self.dead: set[int] = set()
        self.states = 0
        self.max_states = max_states
        self.deadline = deadline

    def _size(self, x: int) -> int:
        sz = self.sz
        return sum(sz[i] for i in _bits(x))

    def _reduce(self, X: int, s: int, done: list[int]) -> tuple[int, int]:
        """Apply every free move (module docstring); appends the nodes computed to ``done``."""
        pm, sz = self.pm, self.sz
        for x in _bits(X):
            if pm[x] & ~X == 0:
                X &= ~(1 << x)
                s -= sz[x]
                done.append(x)
        return X, s

    def produce(self, target: int) -> list[int] | None:
        """Run order producing ``target`` within the budget, or ``None`` when none exists;
        raises :class:`_Limit` at the state or time limit."""
        pm, sz, B, dead = self.pm, self.sz, self.budget, self.dead
        done: list[int] = []
        X, s = self._reduce(1 << target, sz[target], done)
        if X == 0:
            return done[::-1]
        # frames: [state, its size, members (decreasing), next member, computes made entering]
        stack = [[X, s, _bits(X), 0, done]]
        while stack:
            fr = stack[-1]
            X, s, mem, i = fr[0], fr[1], fr[2], fr[3]
            child = None
            while i < len(mem):
                x = mem[i]
                i += 1
                add = pm[x] & ~X
                s_add = self._size(add)
                if s + s_add > B:
                    continue  # computing x last overflows the budget
                comp = [x]
                Y, sy = self._reduce((X & ~(1 << x)) | add, s + s_add - sz[x], comp)
                if Y in dead:
                    continue
                child = (Y, sy, comp)
                break
            fr[3] = i
            if child is None:
                dead.add(X)
                stack.pop()
                continue
            Y, sy, comp = child
            if Y == 0:  # every value produced: read the computes back to front
                seq = [u for f in stack for u in f[4]] + comp
                return seq[::-1]
            self.states += 1
            if self.states > self.max_states or (
                    self.states & 1023 == 0 and time.perf_counter() > self.deadline):
                raise _Limit
            stack.append([Y, sy, _bits(Y), 0, comp])
        return None


def decide(
    preds: Sequence[Sequence[int]],
    sizes: Sequence[int],
    budget: int,
    *,
    max_states: int = 2_000_000,
    time_limit: float = 60.0,
) -> Decision:
    """Decide whether some schedule of the DAG (any order, any recomputation) fits ``budget``.

    Args:
      preds: ``preds[v]`` the inputs of node ``v`` (indices in topological order).
      sizes: ``int[n]`` output bytes per node.
      budget: device bytes for node outputs.
      max_states: search states (over all sinks) before the answer is ``"unknown"``.
      time_limit: seconds before the answer is ``"unknown"``.

    Returns:
      A :class:`Decision`: a witness schedule, a proof, or ``"unknown"`` with where it stopped.

    Raises:
      InvalidGraphError: ``preds``/``sizes`` lengths differ, a negative size, or an input
        index not smaller than its reader's.
      BudgetFormatError: a negative or fractional budget.
      RematError: ``max_states < 1`` or ``time_limit <= 0``.
    """
    t0 = time.perf_counter()
    P, sz, B = check_inputs(preds, sizes, budget)
    if int(max_states) != max_states or max_states < 1 or not time_limit > 0:
        raise RematError(f"need max_states >= 1 and time_limit > 0, got {max_states!r}, "
                         f"{time_limit!r}")
    n = len(sz)

    def result(status, schedule=None, peak=None, node=None, proof=None, states=0):
        return Decision(status, B, schedule, peak, node, proof, states, time.perf_counter() - t0)

    edges = np.array([(p, v) for v in range(n) for p in P[v]], dtype=np.int64).reshape(-1, 2)
    need = node_step_bytes(np.asarray(sz, dtype=np.int64), edges).tolist()
    over = [v for v in range(n) if need[v] > B]
    if over:
        return result("infeasible", node=max(over, key=lambda v: need[v]), proof="single step")
    has_reader = np.zeros(n, dtype=bool)
    for ps in P:
        has_reader[ps] = True
    sinks = [v for v in range(n) if not has_reader[v]]
    search = _Searcher(P, sz, B, int(max_states), t0 + float(time_limit))
    seq: list[int] = []
    for v in sorted(sinks, key=lambda v: -need[v]):  # the hardest first: fail fast
        try:
            part = search.produce(v)
        except _Limit:
            return result("unknown", node=v, states=search.states)
        if part is None:
            return result("infeasible", node=v, proof="exhaustive search", states=search.states)
        seq.extend(part)
    peak = int(sequence_live_bytes(seq, P, sz).max(initial=0))
    if peak > B:
        raise RematError(f"internal: witness peaks at {peak} B over the budget {B} B")
    return result("feasible", schedule=tuple(seq), peak=peak, states=search.states)


def copy_ends(seq: Sequence[int], preds: Sequence[Sequence[int]]) -> np.ndarray:
    """``int64[len(seq)]``: for each event ``i`` of the run order, the last event reading the
    copy event ``i`` made (a read takes the latest copy computed before it; ``i`` itself when
    nothing reads it).

    Raises:
      InvalidGraphError: an event names no node of ``preds``, or runs before one of its inputs
        was ever computed.
    """
    latest: dict[int, int] = {}
    end = np.arange(len(seq))
    n = len(preds)
    for i, x in enumerate(seq):
        if not 0 <= int(x) < n:
            raise InvalidGraphError(f"event {i} runs node {x}, not one of the {n} nodes")
        for p in preds[x]:
            j = latest.get(p)
            if j is None:
                raise InvalidGraphError(f"event {i} runs node {x} before its input {p}", node=x)
            end[j] = i
        latest[x] = i
    return end


def sequence_live_bytes(seq: Sequence[int], preds: Sequence[Sequence[int]],
                        sizes: Sequence[int]) -> np.ndarray:
    """``int64[len(seq)]`` bytes live while each event of the run order ``seq`` runs: every
    copy from its computation to its last read (remat's replay of such a schedule)."""
    if not len(seq):
        return np.zeros(0, dtype=np.int64)
    end = copy_ends(seq, preds)
    sz = np.asarray(sizes, dtype=np.int64)[np.asarray(seq)]
    diff = np.zeros(len(seq) + 1, dtype=np.int64)
    diff[:-1] += sz
    np.add.at(diff, end + 1, -sz)
    return np.cumsum(diff)[:-1]


def prune_recomputation(seq: Sequence[int], preds: Sequence[Sequence[int]], sizes: Sequence[int],
                        costs: Sequence[float], budget: int, order: str = "cost") -> list[int]:
    """Remove recomputations from the run order ``seq`` while its peak stays within ``budget``.

    Removing a recomputation ``i`` of ``u`` keeps the previous copy ``k`` of ``u`` alive until
    the reads ``i`` served and drops ``i``'s own reads (which can end its inputs' copies
    sooner).  Bytes only grow between ``k``'s last read and ``i``, so that range alone is
    checked against the budget.  Candidates are tried in ``order``: ``"cost"``, the most
    expensive first, or ``"density"``, the most expensive per byte first (cost over output
    size: a knapsack's greedy order, better when sizes differ; measured in
    ``docs/design/decisions/0007-chain-dp-level-portfolio.md``).  Passes repeat until
    one removes nothing.  The first computation of every node stays.  Returns the new run
    order, whose peak (:func:`sequence_live_bytes`) is within ``max(budget, peak of seq)``.

    Raises:
      InvalidGraphError: ``preds``/``sizes``/``costs`` lengths differ, or ``seq`` is not a run
        order of the graph (:func:`copy_ends`).
      BudgetFormatError: a negative, fractional or boolean budget.
      UnknownNameError: ``order`` is neither ``"cost"`` nor ``"density"``.
    """
    import bisect

    if order not in ("cost", "density"):
        raise UnknownNameError("prune order", order, ["cost", "density"])

    P0, sz, budget = check_inputs(preds, sizes, budget)
    c = np.asarray(costs, dtype=float).reshape(-1)
    if len(c) != len(sz):
        raise InvalidGraphError(f"costs has {len(c)} entries but sizes has {len(sz)}")
    seq = [int(x) for x in seq]
    E = len(seq)
    if E == 0:
        return seq
    P = [sorted(set(ps)) for ps in P0]  # each input once
    live = sequence_live_bytes(seq, P, sz).astype(np.int64)
    sz_in = [int(sz[x]) - sum(int(sz[p]) for p in P[x]) for x in range(len(sz))]
    limit = max(int(budget), int(live.max()))
    alive = np.ones(E, dtype=bool)
    serve: list[list[int]] = []  # serve[i][q]: the event whose copy event i reads for preds[q]
    readers: list[set[int]] = [set() for _ in range(E)]
    copies: dict[int, list[int]] = {}
    latest: dict[int, int] = {}
    for i, x in enumerate(seq):
        row = [latest[p] for p in P[x]]
        for j in row:
            readers[j].add(i)
        serve.append(row)
        latest[x] = i
        copies.setdefault(x, []).append(i)
    end = np.array([max(r) if r else i for i, r in enumerate(readers)], dtype=np.int64)

    def shrink(j: int, reader: int, s: int) -> None:
        readers[j].discard(reader)
        new = max(readers[j]) if readers[j] else j
        if new < end[j]:
            live[new + 1:end[j] + 1] -= s
            end[j] = new

    while True:
        removed = 0
        key = c / np.maximum(sz, 1) if order == "density" else c
        cand = sorted((-key[seq[i]], i) for i in range(E)
                      if alive[i] and copies[seq[i]][0] != i)
        for _, i in cand:
            u = seq[i]
            cu = copies[u]
            k = cu[bisect.bisect_left(cu, i) - 1]  # previous alive copy of u
            lo, hi = int(end[k]) + 1, i  # bytes grow on [lo, hi): k now lives until i's reads
            if hi > lo and readers[i]:
                # necessary: the inputs' copies can end sooner by at most their sizes
                if int(live[lo:hi].max()) + sz_in[u] > limit:
                    continue
                delta = np.full(hi - lo, sz[u], dtype=np.int64)
                for q, p in enumerate(P[u]):
                    j = serve[i][q]
                    if end[j] != i:  # i is not the last read of j's copy: no earlier end
                        continue
                    rest = [r for r in readers[j] if r != i]
                    new = max(rest) if rest else j
                    a, b = max(new + 1, lo), min(int(end[j]) + 1, hi)
                    if b > a:
                        delta[a - lo:b - lo] -= sz[p]
                seg = live[lo:hi] + delta
                if seg[alive[lo:hi]].max(initial=0) > limit:
                    continue
                live[lo:hi] += sz[u]
            # on (i, end_i] k's copy replaces i's: no change there
            for q, p in enumerate(P[u]):
                shrink(serve[i][q], i, sz[p])
            for r in readers[i]:  # i's readers now read k's copy
                row = serve[r]
                for q in range(len(row)):
                    if row[q] == i:
                        row[q] = k
            readers[k] |= readers[i]
            end[k] = max(int(end[k]), int(end[i])) if readers[i] else end[k]
            readers[i] = set()
            alive[i] = False
            live[i] = np.iinfo(np.int64).min // 2  # nothing runs here any more
            cu.remove(i)
            removed += 1
        if not removed:
            break
    out = [seq[i] for i in np.flatnonzero(alive)]
    peak = int(sequence_live_bytes(out, P, sz).max(initial=0))
    if peak > limit:
        raise RematError(f"internal: pruned schedule peaks at {peak} B over {limit} B")
    return out


def prune_best(seq: Sequence[int], preds: Sequence[Sequence[int]], sizes: Sequence[int],
               costs: Sequence[float], budget: int) -> tuple[list[int], str | None]:
    """:func:`prune_recomputation` in both orders (``"density"``, then ``"cost"``); returns
    the cheaper run order and its order (``None`` when neither removed anything: ``seq``
    itself).  Ties go to ``"density"``.

    Raises: as :func:`prune_recomputation`.
    """
    got = {o: prune_recomputation(seq, preds, sizes, costs, budget, order=o)
           for o in ("density", "cost")}  # (checks every input first)
    c = np.asarray(costs, dtype=float).reshape(-1)
    best, order = [int(x) for x in seq], None
    for o, run in got.items():
        if float(c[run].sum()) < float(c[best].sum()):
            best, order = run, o
    return best, order

