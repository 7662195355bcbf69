"""Melon (Wang et al., MobiSys 2022): lifetime-aware pool, memory-calibrated progressive
recomputation (TPS eviction), micro-batching for models without BatchNorm, and on-the-fly budget
adaptation.

**Progressive recomputation (§4.3, Algorithm 1 with the errata of the notes).**  Nodes run in
index order; step ``t`` first recomputes, in index order, every missing input of node ``t`` and
their missing inputs recursively (Algorithm 1 lines 13-19), then node ``t``.  After each op the
pool is checked: the *projected* lifetimes of the whole iteration (past allocations as they
were, resident values until their last reader, future nodes as in the original schedule) are
laid out with the lifetime-aware pool (:func:`solvers.melon_pool.lifetime_aware`, then
``refine_iters`` local-search moves of :func:`solvers.melon_pool.refine`), and
``pool.size(now)`` is ``max(offset + size)`` over the allocations live now (bytes; the
address-aware size, not the sum of live sizes).  While it exceeds the budget (``>``, the
prose; line 6's ``>=`` is an erratum) the resident value of maximal Eq. (1)

    TPS(x) = size(x) [bytes] × FreedLifetime(x) [ops] / RecomputationTime(x) [s]

is evicted and the layout is recalibrated (recomputed on the new lifetimes).  As in the
artifact's ``Recomputer::update_metric``: ``FreedLifetime = last_reader(x) - t`` (original op
indices) and ``RecomputationTime = cost(x) + Σ cost(a)`` over the ancestors of ``x`` that are not
resident (BFS stopping at resident values), re-evaluated after every eviction.  Candidates are
all resident values, forward and backward, except the inputs and output of the running op, the
inputs of the ops left in the step and the next op's inputs (Algorithm 1's ``skipRelease``);
ties go to the lowest node index.

The steps become a legal plan (:func:`policies.from_checkpoints.plan_from_steps`, which frees an
evicted value right after its last read), whose event program is laid out with the refined pool
:func:`solvers.melon_pool.melon_pool` (longest-lifetime-first greedy, both fits, plus a local
search; on-demand's first-fit layout is one of its seeds, so the pool is never worse than
on-demand's); that is ``Plan.offsets``, and ``meta["greedy_arena_bytes"]`` keeps the paper's raw
greedy pool for comparison.  Should that pool still
exceed the budget (the simulation's projection differs from the final lifetimes), the
simulation is rerun with its target lowered by the overshoot ("calibration", at most
``calibrations`` times).

**Micro-batch (§4.1, A.3).**  Without batch-coupled layers (``ctx.batch_coupled`` False) and when
the whole batch does not fit without recomputation, the largest micro-batch (smallest ``k`` of
``ctx.microbatch_counts()``) whose pool fits without recomputation is used; else recomputation
only.  ``meta["microbatch_reason"]`` says which and why.

**Budget adaptation (§4.4).**  :meth:`Melon.adapt` switches to the new budget's plan mid-step:
with A the values resident under the old plan, C those the pool shrink cuts off
(``offset + size > new_budget``) and B those the new plan holds at that point, it keeps
``(A - C) ∩ B``, recomputes ``B - (A - C)`` (the notes' correction of the paper's
``C - (A - B)``) and moves the kept values to their new offsets, and compares the modelled cost
with stop-restart (rerunning the new plan from its first op up to the same point).
``Adaptation.stitched`` (:func:`stitch`) is the whole iteration as one executable plan: the old
plan's steps before the switch, one step recomputing ``B - (A - C)``, the new plan's remaining
steps; it keeps the surviving tensors at their old offsets when the rest fits around them
within the new budget (``meta["stitch_layout"] == "in_place"``, no memcpy), else it lays out
everything live from the switch on afresh (``"relayout"``).

Length: one module holds the policy and its three stages (progressive-recomputation simulation,
micro-batch rule, budget adaptation with the stitched plan), which share the simulation state
and the pool layout; splitting them would scatter the paper's Algorithm 1 over files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from policies.base import (
    BasePolicy,
    PolicyContext,
    bisect_min_budget,
    checkpoint_all_plan,
    register,
)
from policies.from_checkpoints import plan_from_steps
from remat.core.errors import InfeasibleBudgetError, InvalidPlanError, RematError, SolverError
from remat.core.events import COMPUTE, STEP
from remat.core.graph import Graph
from remat.core.layout import arena_size, lifetimes, validate
from remat.core.plan import Plan
from solvers.melon_pool import (
    lifetime_aware,
    lifetime_aware_lowest,
    melon_pool,
    place_around,
    refine,
)

__all__ = ["Melon", "Adaptation", "melon_steps", "pool_layout", "stitch", "MEMCPY_BYTES_PER_S"]

#: memcpy speed of the artifact's adaptation script (bytes/s); relayout costs 3 × bytes / speed.
MEMCPY_BYTES_PER_S = 22_238_208.0


def pool_layout(graph: Graph, plan: Plan) -> Plan:
    """``plan`` with ``offsets`` from the refined lifetime-aware pool
    (:func:`solvers.melon_pool.melon_pool`: the longest-lifetime-first greedy, then local
    search, on-demand's layout as a guard seed), ``meta["arena_bytes"]`` (bytes) and
    ``meta["greedy_arena_bytes"]`` (the paper's raw greedy, best of its two variants, bytes)."""
    events = dataclasses.replace(plan, offsets=None).validate(graph)
    lt = lifetimes(events)
    off = melon_pool(lt.intervals, lt.sizes)
    greedy = min(arena_size(fn(lt.intervals, lt.sizes), lt.sizes)
                 for fn in (lifetime_aware, lifetime_aware_lowest))
    return dataclasses.replace(plan, offsets=off).with_meta(
        layout="melon_refined", arena_bytes=arena_size(off, lt.sizes),
        greedy_arena_bytes=int(greedy))


class _Sim:
    """State of one progressive-recomputation simulation (see :func:`melon_steps`)."""

    def __init__(self, graph: Graph, target: int, refine_iters: int = 8):
        self.g, self.target = graph, int(target)
        self.refine_iters = int(refine_iters)
        self.n = graph.n
        self.graph = graph
        self.preds = graph.preds
        self.sizes = [int(x) for x in graph.sizes]
        self.costs = [float(x) + 1e-12 for x in graph.costs]  # zero-cost ops still rank by TPS
        self.last = [int(x) for x in graph.last_reader]
        self.res: dict[int, int] = {}  # resident node -> its allocation record
        self.rec_node: list[int] = []  # allocation records: node, start op, end op (-1: open)
        self.rec_start: list[int] = []
        self.rec_end: list[int] = []
        self.now = 0
        self.version = 0
        self._layout: tuple[int, np.ndarray, np.ndarray] | None = None
        self.evictions = 0

    # -- bookkeeping
    def alloc(self, v: int) -> None:
        self.res[v] = len(self.rec_node)
        self.rec_node.append(v)
        self.rec_start.append(self.now)
        self.rec_end.append(-1)

    def free(self, v: int, at: int) -> None:
        self.rec_end[self.res.pop(v)] = at

    # -- the calibrated pool
    def pool_now(self, t: int, step: Sequence[int], pos: int, lastpos: dict[int, int]) -> int:
        """``pool.size(now)``: bytes of the lifetime-aware layout of the projected lifetimes,
        over the allocations live now."""
        if self._layout is None or self._layout[0] != self.version:
            now, rem = self.now, len(step) - pos - 1
            iv, sz = [], []
            for k, v in enumerate(self.rec_node):
                end = self.rec_end[k]
                if end < 0:  # resident: until its last reader (in this step, or a later node)
                    lr = self.last[v]
                    end = now + rem + (lr - t) if lr > t else now + max(0, lastpos.get(v, pos) - pos)
                iv.append((self.rec_start[k], end))
                sz.append(self.sizes[v])
            for j in range(pos + 1, len(step)):  # the rest of this step
                v = step[j]
                lr = self.last[v]
                end = now + rem + (lr - t) if lr > t else now + max(0, lastpos.get(v, j) - pos)
                iv.append((now + j - pos, end))
                sz.append(self.sizes[v])
            for u in range(t + 1, self.n):  # the rest of the iteration, as originally scheduled
                s0 = now + rem + (u - t)
                iv.append((s0, s0 + max(0, self.last[u] - u)))
                sz.append(self.sizes[u])
            iva = np.asarray(iv, dtype=np.int64).reshape(-1, 2)
            sza = np.asarray(sz, dtype=np.int64)
            greedy = lifetime_aware(iva, sza)
            top = refine(iva, sza, [greedy], iters=self.refine_iters) + sza
            self._layout = (self.version, iva, top)
        _, iva, top = self._layout
        live = (iva[:, 0] <= self.now) & (self.now <= iva[:, 1])
        return int(top[live].max(initial=0))

    def recompute_time(self, x: int) -> float:
        """Eq. (1)'s RecomputationTime: ``cost(x)`` plus the costs of its non-resident ancestors
        (seconds)."""
        return sum((self.costs[u] for u in self.graph.ancestors_outside(self.preds[x], self.res)),
                   self.costs[x])

    def evict_one(self, t: int, protect: set[int]) -> bool:
        """Evict the max-TPS resident value not in ``protect`` (False: no candidate)."""
        best, best_tps = -1, -1.0
        for x in sorted(self.res):
            if x in protect:
                continue
            tps = self.sizes[x] * max(1, self.last[x] - t) / self.recompute_time(x)
            if tps > best_tps:
                best, best_tps = x, tps
        if best < 0:
            return False
        self.free(best, self.now - 1)
        self.version += 1
        self.evictions += 1
        return True


def melon_steps(graph: Graph, target: int, *, protect_next: bool = True, refine_iters: int = 8
                ) -> tuple[list[list[int]], int] | None:
    """Simulate Melon's progressive recomputation with the pool capped at ``target`` bytes.

    Returns:
      ``(steps, evictions)``: ``steps[t]`` the sorted nodes run in step ``t`` (recomputations,
      then node ``t``), or ``None`` when a pool overflow has no evictable value left.
      ``protect_next``: never evict the next op's inputs (Algorithm 1's ``skipRelease``); the
      artifact's pool-aware planner does not protect them.
      ``refine_iters``: local-search moves (:func:`solvers.melon_pool.refine`) applied to the
      greedy layout at every pool check (0: the paper's raw greedy).
    """
    sim = _Sim(graph, target, refine_iters)
    preds = sim.preds
    steps: list[list[int]] = []
    for t in range(sim.n):
        step = sorted(graph.ancestors_outside(preds[t], sim.res))  # getRecomputeOpsRecursively
        step.append(t)
        need: dict[int, int] = {}
        lastpos: dict[int, int] = {}
        for j, v in enumerate(step):
            for p in preds[v]:
                need[p] = need.get(p, 0) + 1
                lastpos[p] = j
        nxt = set(preds[t + 1]) if protect_next and t + 1 < sim.n else set()
        for pos, v in enumerate(step):
            sim.alloc(v)
            if v != t:
                sim.version += 1  # a recomputation extends the time axis: recalibrate
            protect = set(need) | {v} | (nxt if v == t else set())
            while sim.pool_now(t, step, pos, lastpos) > sim.target:
                if not sim.evict_one(t, protect):
                    # nothing left to evict: only a layout conflict is left if the live bytes
                    # fit (the final layout and calibration settle it), else infeasible
                    if sum(sim.sizes[x] for x in sim.res) > sim.target:
                        return None
                    break
            for p in preds[v]:
                k = need[p] - 1
                if k:
                    need[p] = k
                else:
                    del need[p]
                    if sim.last[p] <= t and p in sim.res:
                        sim.free(p, sim.now)
            if sim.last[v] <= t and v not in need:
                sim.free(v, sim.now)
            sim.now += 1
        steps.append(step)
    return steps, sim.evictions


@dataclasses.dataclass(frozen=True)
class Adaptation:
    """The switch from a plan to the new budget's plan part-way through a training step (§4.4).

    Attributes:
      plan: the new budget's plan (offsets filled); execution resumes at ``resume_step``.
      switch_step: step of the old plan at whose start the switch happens.
      resume_step: first step of ``plan`` still to run.
      kept: nodes kept in place or moved, ``(A - C) ∩ B``.
      dumped: nodes released without a memory operation, ``A - kept``.
      recompute: nodes recomputed before resuming, ``B - (A - C)`` and their missing ancestors,
        in index order.
      recompute_s: modelled time of ``recompute`` (seconds, node ``time_s``).
      relayout_bytes: bytes of kept values whose offset changes.
      relayout_s: ``3 × relayout_bytes / memcpy_bytes_per_s`` (seconds, the artifact's model).
      stop_restart_s: modelled time of the new plan's steps before ``resume_step`` (seconds).
      overhead: ``(recompute_s + relayout_s) / stop_restart_s`` (0 when nothing was run yet).
      stitched: the whole iteration as one executable plan (:func:`stitch`): the old plan's
        steps before ``switch_step``, one step recomputing ``recompute``, then ``plan``'s steps
        from ``resume_step`` on; ``meta`` holds ``switch_step`` (its row of the recompute step),
        ``peak_before_bytes`` / ``peak_after_bytes`` (replayed live bytes before / from that
        row) and ``arena_before_bytes`` / ``arena_after_bytes`` (pool tops, bytes).
    """

    plan: Plan
    switch_step: int
    resume_step: int
    kept: tuple[int, ...]
    dumped: tuple[int, ...]
    recompute: tuple[int, ...]
    recompute_s: float
    relayout_bytes: int
    relayout_s: float
    stop_restart_s: float
    overhead: float
    stitched: Plan | None = None


@register("melon")
@dataclasses.dataclass(frozen=True)
class Melon(BasePolicy):
    """Melon: lifetime-aware pool + TPS progressive recomputation + micro-batch (module doc).

    Args:
      budget: pool bytes, or ``"60%"`` / ``"512MiB"`` (``None``: no limit, pool only).
      microbatch: allow micro-batching for graphs that are not batch-coupled.
      calibrations: reruns of the simulation with a lowered target when the final pool
        exceeds the budget.
      refine_iters: local-search moves on the simulation's pool at each check (the final
        layout always gets the full :func:`solvers.melon_pool.melon_pool` search).
      search_rtol: relative precision of the minimum feasible budget on infeasibility.
      search_time_s: time box of that search, seconds (``None``: none); the minimum is then a
        budget the search saw succeed, possibly above the true one.
    """

    budget: int | str | None = None
    microbatch: bool = True
    calibrations: int = 8
    refine_iters: int = 8
    search_rtol: float = 1e-2
    search_time_s: float | None = 30.0

    budget_kind = "arena_bytes"

    def _recompute_plan(self, graph: Graph, budget: int) -> Plan | None:
        """Progressive recomputation under ``budget`` bytes of pool, or ``None``."""
        for protect_next in (True, False):  # the paper's skip set first, then the artifact's
            target = int(budget)
            for it in range(self.calibrations + 1):
                found = melon_steps(graph, target, protect_next=protect_next,
                                    refine_iters=self.refine_iters)
                if found is None:
                    break
                steps, ev = found
                p = pool_layout(graph, plan_from_steps(graph, steps, policy="melon",
                                                       status="heuristic"))
                over = int(p.meta["arena_bytes"]) - int(budget)
                if over <= 0:
                    return p.with_meta(evictions=ev, calibrations=it, method="recompute",
                                       protect_next_inputs=protect_next)
                target -= over
        return None

    def _pool_only(self, graph: Graph) -> Plan:
        return pool_layout(graph, checkpoint_all_plan(graph).with_meta(status="heuristic"))

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int:
        """Smallest pool budget (bytes, within ``search_rtol``) at which the recomputation
        succeeds: bisection (:func:`policies.base.bisect_min_budget`), or the pool-only size
        when even the no-remat peak fails (fragmentation)."""
        def fits(b: int) -> bool:
            return self._recompute_plan(graph, b) is not None
        try:
            return bisect_min_budget(graph, fits, rtol=self.search_rtol, name="melon",
                                     time_s=self.search_time_s)
        except SolverError:
            return int(self._pool_only(graph).meta["arena_bytes"])

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        pool = self._pool_only(graph)
        if budget_bytes is None or int(pool.meta["arena_bytes"]) <= budget_bytes:
            return pool.with_meta(method="pool_only", microbatch_reason="the whole batch fits")
        counts = ctx.microbatch_counts() if self.microbatch else []
        if not self.microbatch:
            why = "micro-batching disabled"
        elif ctx.batch_coupled:
            why = "batch-coupled layers (BatchNorm): micro-batching changes the math"
        elif not counts:
            why = "no micro-batch count available (no graph_at or batch size)"
        else:
            why = "no micro-batch fits without recomputation"
            for k in counts:
                pk = self._pool_only(ctx.graph_at(k))
                if int(pk.meta["arena_bytes"]) <= budget_bytes:
                    return dataclasses.replace(pk, microbatches=k).with_meta(
                        method="microbatch",
                        microbatch_reason=f"largest micro-batch ({ctx.batch_size // k}) whose "
                                          "pool fits without recomputation")
        p = self._recompute_plan(graph, budget_bytes)
        if p is None:  # the wrapper adds min_feasible_budget
            raise InfeasibleBudgetError(
                budget_bytes, None, "melon heuristic's own minimum (bisection), not a proven bound")
        return p.with_meta(microbatch_reason=f"recomputation only: {why}")

    def adapt(self, plan: Plan, graph: Graph, new_budget: int | str, progress: float,
              *, memcpy_bytes_per_s: float = MEMCPY_BYTES_PER_S) -> Adaptation:
        """Switch ``plan`` (with offsets, micro-batch count 1) to ``new_budget`` after
        ``progress`` (fraction in ``[0, 1]``) of its events (§4.4).

        The switch happens at the start of the step holding event ``progress × E``; the new
        plan (:meth:`plan` at ``new_budget``) resumes after the step computing the highest node
        computed so far.  Costs use node ``time_s`` (seconds).

        Raises:
          InvalidPlanError: ``plan`` has no offsets, micro-batches, or ``progress`` outside
            ``[0, 1]``.
          InfeasibleBudgetError: no Melon plan fits ``new_budget``.
        """
        if plan.offsets is None or plan.microbatches != 1:
            raise InvalidPlanError("adapt needs a Melon plan with offsets and one micro-batch")
        if not 0.0 <= progress <= 1.0:
            raise InvalidPlanError(f"progress must be in [0, 1], got {progress}")
        new = self.plan(graph, budget=new_budget)
        if new.microbatches != 1:  # adaptation re-plans recomputation, not the batch split
            raise RematError("adapt: the new budget's plan is micro-batched; use a "
                             "Melon(microbatch=False)")
        nb = int(new.meta["budget"])
        ev = plan.validate(graph)
        e = min(int(progress * len(ev)), len(ev) - 1)
        t_sw = int(ev.step[e])
        starts = np.flatnonzero(ev.kind == STEP)
        e0 = int(starts[t_sw])
        alloc_of: dict[int, int] = {}
        for k in np.flatnonzero(ev.creates[:e0]).tolist():
            alloc_of[int(ev.node[k])] = int(ev.alloc[k])
        sizes, off_old = graph.sizes, np.asarray(plan.offsets)
        A = {int(i) for i in np.flatnonzero(plan.S[t_sw])}
        C = {i for i in A if int(off_old[alloc_of[i]]) + int(sizes[i]) > nb}
        done = ev.kind[:e0] == COMPUTE
        last_done = int(ev.node[:e0][done].max()) if done.any() else -1
        resume = last_done + 1  # plans built here compute node t last in step t
        B = {int(i) for i in np.flatnonzero(new.S[resume])} if resume < new.R.shape[0] else set()
        kept = (A - C) & B
        missing = B - (A - C)
        rec = set(graph.ancestors_outside(missing, kept))
        costs = graph.costs
        nev = new.validate(graph)
        new_alloc: dict[int, int] = {}
        ns = np.flatnonzero(nev.kind == STEP)
        n0 = int(ns[resume]) if resume < len(ns) else len(nev)
        for k in np.flatnonzero(nev.creates[:n0]).tolist():
            new_alloc[int(nev.node[k])] = int(nev.alloc[k])
        moved = sum(int(sizes[i]) for i in kept
                    if int(new.offsets[new_alloc[i]]) != int(off_old[alloc_of[i]]))
        rec_s = float(sum(costs[i] for i in rec))
        relayout_s = 3.0 * moved / memcpy_bytes_per_s
        restart_s = float((new.R[:resume].sum(axis=0) * costs).sum())
        stitched = stitch(graph, plan, new, t_sw, resume, kept, rec)
        return Adaptation(
            plan=new, switch_step=t_sw, resume_step=resume, kept=tuple(sorted(kept)),
            dumped=tuple(sorted(A - kept)), recompute=tuple(sorted(rec)), recompute_s=rec_s,
            relayout_bytes=moved, relayout_s=relayout_s, stop_restart_s=restart_s,
            overhead=(rec_s + relayout_s) / restart_s if restart_s > 0 else 0.0,
            stitched=stitched)


def stitch(graph: Graph, old: Plan, new: Plan, switch_step: int, resume_step: int,
           kept: set[int], recompute: set[int]) -> Plan:
    """One executable plan for an iteration whose budget shrinks at ``switch_step`` (§4.4).

    Rows: ``old`` steps ``0 .. switch_step-1`` (the same computations; ``S`` at the switch is
    ``kept``, so the dumped values are freed after their last read before the switch instead of
    being carried to it), then one step computing ``recompute`` in index order (omitted when
    empty), then ``new`` steps ``resume_step ..`` (``S`` there is the new plan's ``B``, which
    ``kept ∪ recompute`` covers).

    Layout: allocations made before the switch keep their old offsets -- the kept values
    (``offset + size <= new budget``, :meth:`Melon.adapt`'s ``A - C``) stay in place, no memcpy --
    and the recomputations and the new plan's remaining allocations are placed around them
    (:func:`solvers.melon_pool.place_around`, lowest offset, the best of three visiting orders:
    longest lifetime first, allocation order, largest first).

    Returns:
      The stitched :class:`Plan` with offsets and ``meta``: ``switch_step``,
      ``peak_before_bytes`` / ``peak_after_bytes`` (replayed live bytes, events before / from
      the switch row), ``arena_before_bytes`` / ``arena_after_bytes`` (max ``offset + size`` of
      the allocations live before / from it), ``budget`` (the new plan's).

    Raises:
      InvalidPlanError: the stitched plan does not replay (a bug), or its layout collides.
    """
    n = graph.n
    rows_r = [old.R[:switch_step]]
    rows_s = [old.S[:switch_step]]
    sw = switch_step
    if recompute:
        r = np.zeros((1, n), dtype=bool)
        r[0, sorted(recompute)] = True
        s = np.zeros((1, n), dtype=bool)
        s[0, sorted(kept)] = True
        rows_r.append(r)
        rows_s.append(s)
    rows_r.append(new.R[resume_step:])
    rows_s.append(new.S[resume_step:])
    S = np.concatenate(rows_s)
    plan = Plan(R=np.concatenate(rows_r), S=S, meta={
        **dict(new.meta), "policy": "melon", "adapted_from": dict(old.meta).get("budget"),
        "switch_step": sw})
    ev = plan.validate(graph)
    lt = lifetimes(ev)
    old_lt = lifetimes(old.validate(graph))
    starts = np.flatnonzero(ev.kind == STEP)
    e_sw = int(starts[sw]) if sw < len(starts) else len(ev.kind)
    before = lt.intervals[:, 0] < e_sw
    # allocations before the switch are the old plan's first ones, in the same order
    nb = int(before.sum())
    if nb > len(old_lt.sizes) or not np.array_equal(lt.node[:nb], old_lt.node[:nb]):
        raise InvalidPlanError("stitch: the prefix does not match the old plan's allocations")
    fixed = np.zeros(len(lt.sizes), dtype=bool)
    fixed[:nb] = True
    base = np.zeros(len(lt.sizes), dtype=np.int64)
    base[:nb] = np.asarray(old.offsets, dtype=np.int64)[:nb]
    after = lt.intervals[:, 1] >= e_sw
    new_budget = int(dict(new.meta).get("budget") or np.iinfo(np.int64).max)
    off, strategy = _around(lt.intervals, lt.sizes, fixed, base, after), "in_place"
    if int((off + lt.sizes)[after].max(initial=0)) > new_budget:
        # relayout: the values live across the switch move (memcpy) to a layout of everything
        # live from the switch on (lifetimes clipped at the switch: any two of them overlap
        # there iff they overlap at all), and the prefix is placed around them
        strategy = "relayout"
        post = np.flatnonzero(after)
        iv_post = lt.intervals[post].copy()
        iv_post[:, 0] = np.maximum(iv_post[:, 0], e_sw)
        fixed2 = after.copy()
        base2 = np.zeros(len(lt.sizes), dtype=np.int64)
        base2[post] = melon_pool(iv_post, lt.sizes[post])
        off = _around(lt.intervals, lt.sizes, fixed2, base2, ~after, prefer=base)
    validate(lt.intervals, lt.sizes, off)
    tops = off + lt.sizes
    during = ev.kind != STEP
    pre = np.arange(len(ev.kind)) < e_sw
    return dataclasses.replace(plan, offsets=off).with_meta(
        peak_before_bytes=int(ev.live[pre & during].max(initial=0)),
        peak_after_bytes=int(ev.live[~pre & during].max(initial=0)),
        arena_before_bytes=int(tops[before].max(initial=0)),
        arena_after_bytes=int(tops[after].max(initial=0)),
        arena_bytes=int(tops.max(initial=0)), stitch_layout=strategy)


def _around(iv: np.ndarray, s: np.ndarray, fixed: np.ndarray, base: np.ndarray,
            score_mask: np.ndarray, prefer: np.ndarray | None = None) -> np.ndarray:
    """The best of a few visiting orders of :func:`solvers.melon_pool.place_around` for the
    allocations not ``fixed``, judged by the pool top over ``score_mask`` (bytes): by
    ``prefer`` offsets (when given), longest lifetime first, allocation order, largest first."""
    free = np.flatnonzero(~fixed)
    span = iv[free, 1] - iv[free, 0]
    orders = [free[np.lexsort((free, -s[free], -span))],
              free[np.argsort(iv[free, 0], kind="stable")],
              free[np.lexsort((free, -s[free]))]]
    if prefer is not None:
        orders.insert(0, free[np.lexsort((free, prefer[free]))])
    best = None
    for order in orders:
        off = place_around(iv, s, fixed, base, order)
        top = int((off + s)[score_mask].max(initial=0))
        if best is None or top < best[0]:
            best = (top, off)
    return best[1]
