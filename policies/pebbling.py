r"""Budget-bounded pebbling: a heuristic that fits budgets close to a DAG's pebbling limit.

Nodes are taken in index (topological) order; plan step ``t`` ends with node ``t``'s first
computation, preceded by whatever recomputation its inputs need.  Each step is planned
*backwards*, as a pebbling of the set of values that must be live when it ends:

1. Entering step ``t`` the resident set is ``L``.  A keep set ``K ⊆ L`` of values with a
   reader ``> t`` is chosen (below); every other resident value is dropped.
2. A state ``X`` is the set of values still needed.  From ``X = K ∪ {t}``, a member
   ``x ∉ K`` is picked as the one computed last; the state becomes ``X \ {x} ∪ preds(x)`` and
   that compute holds ``size(X ∪ preds(x))`` bytes (remat's replay semantics: inputs plus
   everything needed later plus the output).  Largest index first, so that with no
   backtracking the step is one Checkmate frontier stage (each node once, index order); when a
   compute would exceed the budget the depth-first search backtracks to another choice, which
   may compute a node more than once (a smaller-memory pebbling, Sethi-Ullman style).  The
   search ends at a state made of kept values only; dead states are remembered and the search
   gives up after ``max_states`` states.
3. ``K`` is the longest prefix of the residents, ranked by a keep score, whose step fits
   (bisection; keeping more only holds values longer).  ``K = ∅`` is the last resort.
4. Values the step computed that have a reader ``> t`` are then carried into step ``t + 1``
   too, in score order, while the step still fits (fewer recomputes later).

Keep scores (the higher, the more worth keeping), for a value ``u`` with next reader ``r > t``:

* ``"belady"``: ``1 / (r - t)`` (keep what is read soonest);
* ``"dtr"``: ``c(u) / (m(u) · (r - t))`` with ``c(u) = cost[u] + Σ cost[p]`` over non-resident
  inputs ``p`` (DTR's ``h``, Kirisame et al. ICLR 2021, one level deep, with Belady's distance);
* ``"size"``: ``1 / m(u)`` (keep the small ones).

``score="auto"`` runs all three and keeps the cheapest plan (it stops at the first score
that fails: see :meth:`Pebbling._best`).  Each step becomes one plan step per strictly
increasing run of its computes, so the plan is frontier-form (``T = n``, usable as a MILP warm
start) exactly when no step repeats a node.

Compared with :mod:`policies.greedy_remat` (evict on demand, then recompute the evicted
ancestry with everything it recomputes kept live), every recomputed value here is freed after
its last in-step reader and each step is bounded by construction, so far tighter budgets fit,
at a compute cost that can be large.  On infeasibility,
:class:`~remat.core.errors.InfeasibleBudgetError` carries this heuristic's own smallest budget
(bisection), not a proven bound; :func:`solvers.pebbling_bound.prove_infeasible` gives proofs.

Witness search (``method="auto"``, the default, or ``"witness"`` alone).  The step-by-step
walk above plans one node's first computation at a time and can fail at budgets some schedule
fits.  The complete backward search of :func:`solvers.pebbling_search.decide` (sinks produced
one after another, any order, any recomputation, within ``witness_states`` states and
``witness_time_s`` seconds) runs as well; its schedule, after
:func:`~solvers.pebbling_search.prune_best` (recomputations pruned most expensive per byte
first, and most expensive first, the cheaper kept), competes with the step-wise plans on
cost, and ``meta["method"]`` says which won. Unless ``frontier=True``, the step-wise plans are
pruned the same way.  When that search proves a budget infeasible the error says so.  What the
witness search and the pruning bought:
``docs/design/decisions/0010-pebbling-witness-search.md``.
"""

from __future__ import annotations

import bisect
import dataclasses
import time

import numpy as np

from policies.base import BasePolicy, PolicyContext, bisect_min_budget, choose_scores, register
from remat.core.errors import (
    InfeasibleBudgetError,
    InvalidOptionError,
)
from remat.core.graph import Graph
from remat.core.plan import Plan
from solvers.pebbling_search import copy_ends, decide, prune_best

SCORES = ("belady", "dtr", "size")  # "auto" tries them in this order
METHODS = ("auto", "steps", "witness")  # step-wise walk, witness search, or both (cheaper wins)


def _walk(t, keep, preds, sizes, budget, max_states, backtrack=True):
    """Backward depth-first search for step ``t`` from the bases ``keep``.

    A state ``X`` is the set of values still needed (by the step's remaining computes or kept
    into the next step); expanding ``x ∈ X \\ keep`` (the last of them to be computed) gives
    ``X \\ {x} ∪ preds(x)`` and costs ``sizes(X ∪ preds(x))`` live bytes.  Largest index first,
    backtracking when a compute exceeds ``budget``; states proven dead are remembered.

    Returns ``(events, before, live)`` in run order (``before[k]``: the set live entering event
    ``k``, ``live[k]`` bytes live while it runs) or ``None`` (no fit within ``max_states``).
    """
    x0 = frozenset(keep) | {t}
    z0 = frozenset([t]) - keep  # X minus the bases: what still has to be computed

    def cands(Z):
        top = max(Z)
        yield top  # largest index first; the rest only when backtracking
        yield from sorted(Z - {top}, reverse=True)

    size0 = sum(sizes[u] for u in x0)
    stack = [(x0, z0, size0, cands(z0))]
    path: list[tuple[int, frozenset, int]] = []
    dead: set[frozenset] = set()
    states = 0
    while stack:
        X, Z, size_x, it = stack[-1]
        if not Z:
            break
        for x in it:
            px = preds[x]
            Y = (X - {x}) | px
            if Y in dead:
                continue
            size_y = size_x - sizes[x] + sum(sizes[p] for p in px if p not in X)
            mem = size_y + sizes[x]
            if mem > budget:
                if not backtrack:
                    return None  # frontier mode: the largest-index walk or nothing
                continue
            states += 1
            if states > max_states:
                return None
            Zy = (Z - {x}) | (px - keep)
            stack.append((Y, Zy, size_y, cands(Zy) if Zy else iter(())))
            path.append((x, Y, mem))
            break
        else:
            dead.add(X)
            stack.pop()
            if path:
                path.pop()
    if not stack:
        return None
    path.reverse()
    return [p[0] for p in path], [p[1] for p in path], [p[2] for p in path]


def pebbling_steps(graph: Graph, budget: int, score: str = "dtr", max_states: int | None = None,
                   frontier: bool = False):
    """Run the pebbling heuristic (module docstring) under ``budget`` bytes.

    Args:
      graph: ``n`` nodes in topological index order.
      budget: device bytes for node outputs.
      score: ``"dtr"``, ``"belady"`` or ``"size"``.
      max_states: search states per step walk (default ``200 * n``; keep-set probes ``2 * n``).
      frontier: never backtrack, so every step is one Checkmate frontier stage (fails sooner).

    Returns:
      ``(events, before, peak)``: ``events[t]`` the nodes step ``t`` runs in run order (node
      ``t`` last; a node may repeat), ``before[t][k]`` the set live entering ``events[t][k]``
      and ``peak`` the largest live bytes of any compute; or ``None`` when some step does not
      fit even with nothing kept.
    """
    if score not in SCORES:
        raise InvalidOptionError(f"Pebbling score must be one of {SCORES}, got {score!r}")
    n = graph.n
    max_states = 200 * n if max_states is None else int(max_states)
    probe_states = max(64, min(2 * n, max_states))  # keep-set probes give up sooner
    preds = [frozenset(p) for p in graph.preds]
    succs = [list(s) for s in graph.succs]
    sizes = [int(x) for x in graph.sizes]
    costs = [float(x) + 1e-9 for x in graph.costs]
    resident: frozenset[int] = frozenset()
    all_events: list[list[int]] = []
    all_before: list[list[frozenset]] = []
    peak = 0

    def next_reader(u, t):
        s = succs[u]
        j = bisect.bisect_right(s, t)
        return s[j] if j < len(s) else -1

    def key(u, r, t):
        if score == "dtr":
            c = costs[u] + sum(costs[p] for p in preds[u] if p not in resident)
            return c / ((sizes[u] + 1) * (r - t))
        if score == "belady":
            return 1.0 / (r - t)
        return 1.0 / (sizes[u] + 1)

    for t in range(n):
        ranked = [u for _, u in sorted((-key(u, next_reader(u, t), t), u) for u in resident)]
        k = len(ranked)
        best = _walk(t, frozenset(ranked), preds, sizes, budget, probe_states, not frontier)
        if best is None:
            lo, hi = -1, len(ranked)  # ranked[:lo] fits (-1: none found yet), ranked[:hi] not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                w = _walk(t, frozenset(ranked[:mid]), preds, sizes, budget, probe_states,
                          not frontier)
                if w is None:
                    hi = mid
                else:
                    lo, best = mid, w
            if best is None and lo < 0:
                best = _walk(t, frozenset(), preds, sizes, budget, max_states, not frontier)
                lo = 0
            if best is None:
                return None
            k = lo
        events, before, live = best
        keep = frozenset(ranked[:k])
        # carry values recomputed here that have a later reader, while the step still fits
        last_pos = {x: i for i, x in enumerate(events)}
        last_read = {}
        for i, x in enumerate(events):
            for p in preds[x]:
                last_read[p] = i
        live_arr = np.asarray(live, dtype=np.int64)
        extra = sorted(
            (-key(x, next_reader(x, t), t), x)
            for x in last_pos
            if x != t and x not in keep and next_reader(x, t) > 0
        )
        carried = set(keep)
        carried.add(t)
        for _, x in extra:
            start = max(last_read.get(x, -1), last_pos[x]) + 1
            if start < len(events) and live_arr[start:].max() + sizes[x] > budget:
                continue
            live_arr[start:] += sizes[x]
            carried.add(x)
            for j in range(start, len(events)):
                before[j] = before[j] | {x}
        peak = max(peak, int(live_arr.max()))
        all_events.append(events)
        all_before.append(before)
        resident = frozenset(u for u in carried if next_reader(u, t) > 0)
    return all_events, all_before, peak


def plan_from_events(graph: Graph, events, before, **meta) -> Plan:
    """Plan from per-step event lists: one plan step per maximal strictly increasing run of a
    step's events (so a frontier-form ``T = n`` plan whenever no step repeats a node), entering
    it with the walk's live set; carried values leave through the next run's live set."""
    runs, entry = [], []
    for ev, bf in zip(events, before):
        cur = [ev[0]]
        entry.append(bf[0])
        for k in range(1, len(ev)):
            if ev[k] > cur[-1]:
                cur.append(ev[k])
            else:
                runs.append(cur)
                cur = [ev[k]]
                entry.append(bf[k])
        runs.append(cur)
    T, n = len(runs), graph.n
    R = np.zeros((T, n), dtype=bool)
    S = np.zeros((T, n), dtype=bool)
    for i, (r, e) in enumerate(zip(runs, entry)):
        R[i, r] = True
        if e:
            S[i, list(e)] = True
    return Plan(R=R, S=S, meta=meta)


def _sequence_events(graph: Graph, seq) -> tuple[list[int], list[frozenset]]:
    """``(events, before)`` of a run order for :func:`plan_from_events`: ``before[k]`` the
    nodes whose copies are alive across event ``k`` (computed before it, read at ``k`` or
    later)."""
    end = copy_ends(seq, graph.preds)
    opens: dict[int, list[int]] = {}
    closes: dict[int, list[int]] = {}
    for i, e in enumerate(end):
        if e > i:
            opens.setdefault(i + 1, []).append(i)
            closes.setdefault(int(e) + 1, []).append(i)
    live: set[int] = set()
    before = []
    for k in range(len(seq)):
        live.update(opens.get(k, ()))
        live.difference_update(closes.get(k, ()))
        before.append(frozenset(int(seq[i]) for i in live))
    return [int(x) for x in seq], before


@register("pebbling")
@dataclasses.dataclass(frozen=True)
class Pebbling(BasePolicy):
    """Budget-bounded pebbling heuristic (module docstring): plans for any DAG, frontier-form
    unless the witness search wins.

    Args:
      budget: activation bytes or ``"60%"`` / ``"512MiB"`` (``None``: the no-remat peak).
      score: ``"auto"`` (every score, cheapest fitting plan) or one of ``"dtr"``,
        ``"belady"``, ``"size"``.
      search_rtol: relative precision of the heuristic's own minimum budget reported on
        infeasibility.
      search_time_s: stop that search after this many seconds and report the smallest budget
        found to work so far (coarser, still a budget at which the heuristic succeeds).
      frontier: never backtrack, so the plan is a Checkmate frontier-form schedule (a MILP
        warm start); fits fewer budgets.  No witness search then.
      method: ``"auto"`` (the step-wise walk and the witness search, the cheaper plan wins),
        ``"steps"`` or ``"witness"`` (module docstring).
      witness_states: search states of the witness search per call (all sinks together).
      witness_time_s: seconds of the witness search per call; past either limit it reports
        ``meta["witness"] == "unknown"`` and proves nothing.
    """

    budget: int | str | None = None
    score: str = "auto"
    search_rtol: float = 1e-3
    frontier: bool = False
    search_time_s: float | None = None
    method: str = "auto"
    witness_states: int = 200_000
    witness_time_s: float = 20.0

    def check_applicable(self, graph: Graph) -> None:
        if self.method not in METHODS:
            raise InvalidOptionError(f"Pebbling method must be one of {METHODS}, got {self.method!r}")
        if self.method == "witness" and self.frontier:
            raise InvalidOptionError("method='witness' plans are not frontier-form: use frontier=False")
        if int(self.witness_states) != self.witness_states or self.witness_states < 1:
            raise InvalidOptionError(
                f"witness_states must be a positive integer, got {self.witness_states!r}")
        if not self.witness_time_s > 0:
            raise InvalidOptionError(f"witness_time_s must be positive, got {self.witness_time_s!r}")

    def _witness(self, graph: Graph, budget: int):
        """:func:`~solvers.pebbling_search.decide` at ``budget`` (``None`` when switched off)."""
        if self.method == "steps" or self.frontier:
            return None
        return decide(graph.preds, graph.sizes, budget, max_states=int(self.witness_states),
                      time_limit=float(self.witness_time_s))

    def _scores(self) -> tuple[str, ...]:
        return choose_scores(self.score, SCORES, "Pebbling")

    def _best(self, graph: Graph, budget: int):
        best = None
        costs = graph.costs
        for sc in self._scores() if self.method != "witness" else ():
            r = pebbling_steps(graph, budget, sc, frontier=self.frontier)
            if r is None and self.frontier:
                continue
            if r is None:
                # the step that failed could not fit even keeping nothing, a walk that does not
                # depend on the score: the other scores would fail there too (up to the rare
                # step a kept value shortens), so "auto" stops instead of paying for them
                break
            events = (r[0], r[1])
            flat = [x for ev in r[0] for x in ev]
            if not self.frontier and len(flat) > graph.n:  # prune its recomputations too
                seq, _ = prune_best(flat, graph.preds, graph.sizes, costs, budget)
                if len(seq) < len(flat):  # else keep the steps as made (frontier-form if so)
                    events = ([seq], [_sequence_events(graph, seq)[1]])
            c = float(sum(costs[s].sum() for s in events[0]))
            if best is None or c < best[0]:
                best = (c, events, sc)
        d = self._witness(graph, budget)
        if d is not None and d.status == "feasible":
            seq, _ = prune_best(d.schedule, graph.preds, graph.sizes, costs, budget)
            c = float(costs[seq].sum())
            if best is None or c < best[0]:
                best = (c, ([seq], [_sequence_events(graph, seq)[1]]), "witness")
        return best, d

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int:
        """Smallest budget (bytes, within ``search_rtol``) at which this heuristic succeeds:
        bisection between the largest single-node need and the no-remat peak; a probe succeeds
        when the step-wise walk or the witness search finds a schedule.  (On an infeasible
        budget :meth:`solve` runs the same search from that budget up, and says whether the
        witness search proved every rejected budget infeasible.)"""
        return self._min_budget(graph, None)[0]

    def _min_budget(self, graph: Graph, failed_at: int | None) -> tuple[int, bool]:
        """:meth:`min_feasible_budget` and whether every budget it rejected was proven
        infeasible by the witness search (then no schedule at all fits below the result
        minus ``search_rtol``)."""
        sc = self._scores()[0]  # feasibility barely depends on it (a failing step keeps nothing)
        proven = [True]

        def fits(b: int) -> bool:
            if self.method != "witness" and pebbling_steps(graph, b, sc,
                                                           frontier=self.frontier) is not None:
                return True
            d = self._witness(graph, b)
            if d is not None and d.status == "feasible":
                return True
            proven[0] = proven[0] and d is not None and d.status == "infeasible"
            return False

        t0 = time.perf_counter()
        mf = bisect_min_budget(graph, fits, rtol=self.search_rtol, name="pebbling",
                               failed_at=failed_at, time_s=self.search_time_s)
        stopped = (self.search_time_s is not None
                   and time.perf_counter() - t0 > self.search_time_s)
        return mf, proven[0] and not stopped

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        b = budget_bytes
        if b is None:
            b = graph.no_remat_peak()
        found, d = self._best(graph, int(b))
        if found is None:
            mf, exact = self._min_budget(graph, int(b))
            if d is not None and d.status == "infeasible" and exact:
                why = (f"proven: no schedule of any order fits {int(b)} bytes (node {d.node}, "
                       f"{d.proof}), nor any budget the bisection rejected; {int(mf)} fits "
                       f"(search_rtol={self.search_rtol})")
            elif d is not None and d.status == "infeasible":
                why = (f"proven: no schedule of any order fits {int(b)} bytes (node {d.node}, "
                       f"{d.proof}); the smallest budget is the heuristic's, by bisection")
            else:
                why = "pebbling heuristic's own minimum (bisection), not a proven bound"
            raise InfeasibleBudgetError(b, mf, why)
        _, (events, before), sc = found
        meta = dict(status="heuristic", method="witness" if sc == "witness" else "steps")
        if sc != "witness":
            meta["score"] = sc
        if d is not None:
            meta.update(witness=d.status, witness_states=d.states,
                        witness_seconds=round(d.seconds, 3))
        return plan_from_events(graph, events, before, **meta)
