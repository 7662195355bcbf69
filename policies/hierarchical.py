"""Hierarchical: op-level choices inside blocks, rotor's DP across them (Rockmate-style).

The recommended policy for "make it fit, as fast as possible".  Three steps:

1. cut the graph into blocks at the articulation points of its forward pass
   (:func:`solvers.hierarchical.block_chain`): a transformer's residual stream, a ResNet's
   block outputs; identical blocks are one distinct block;
2. per distinct block, the Pareto options of which of its values the backward keeps and which it
   recomputes, at the graph's granularity (an equation per node with ``stages="eqn"``, the
   drop-in's default for this policy) (:func:`solvers.hierarchical.block_options`);
3. rotor's DP over the chain (:func:`solvers.hierarchical.solve_blocks`): one option per block
   and which block boundaries to checkpoint for recursive recomputation, least compute cost
   within the memory.

A ``lax.scan`` is one node of its block; the blocks are planned around each of a few points of
the scan's Pareto front of per-iteration options (ScanLayers' option generator,
:func:`policies.scan_layers.scan_front`): points spread over the front and its fewest-FLOPs
points within shares of the budget; the cheapest plan wins (``meta["scans"]``).

Micro-batches: when no schedule of the whole batch fits and the samples do not interact
(``ctx.batch_coupled`` False: no BatchNorm statistics), the same planning runs on
``ctx.graph_at(k)`` for the smallest ``k`` micro-batches at which it fits (Melon's rule, §4.1:
the largest micro-batch that fits); ``Plan.microbatches`` is ``k`` and
``meta["microbatch_reason"]`` says why (and why not, when the whole batch fits or the samples
are coupled).

Below the modelled floor, for the compiled-budget loop only (``ctx.compiled_budget``: every
plan is compiled and checked): where a block's least transient bounds every schedule (a
BatchNorm backward at equation granularity, which XLA fuses), the DP at its floor spends the
slack elsewhere.  There the policy returns the cheapest schedule whose held bytes plus block
transients capped at the largest feasible ``cap`` fit the budget (``meta["transient_cap"]``,
``meta["over_modelled_budget"]``): within the budget outside those blocks.

Values are sized as a region saves them (:func:`remat.core.regions.region_saved_graph`): JAX
re-derives a residual of the linearization (a ReLU's mask) from its operands, so keeping it costs
the operands' bytes.  The DP's memory model is per block (kept bytes, transients); the plan is
then replayed on the whole graph, and the DP's memory is corrected and solved again (at most ``rounds`` times) so
the returned plan's replayed peak fits the budget and uses it.  ``meta``: ``blocks``,
``distinct_blocks``, ``options`` (per distinct block), ``option_status`` (``"optimal"`` when
every block's options were solved exactly), ``dp_memory``, ``rounds`` and ``regions`` (the
schedule as nested checkpoint regions, :mod:`remat.core.regions`: the drop-in applies the plan
as one ``jax.checkpoint`` per block saving the option's kept values by name, nested where the
DP recomputes blocks recursively).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import ClassVar

import numpy as np

from policies.base import BasePolicy, PolicyContext, register
from policies.from_checkpoints import plan_from_steps
from policies.scan_layers import anchor_units, scan_front
from remat.core.errors import InfeasibleBudgetError, InvalidOptionError
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.regions import region_saved_graph
from remat.core.scan_plan import adjusted_graph, scan_nodes
from remat.core.schedule import replay
from solvers.hierarchical import (
    BlockChainCosts,
    block_chain,
    block_options,
    block_regions,
    block_steps,
    fill_blocks,
    schedule,
)


def chain_costs(graph: Graph, chain, options) -> BlockChainCosts:
    """The DP's per-block arrays from the blocks and their options."""
    n = chain.n
    width = max(len(o.options) for o in options)
    kept = np.zeros((n, width), dtype=np.int64)
    cb = np.full((n, width), np.inf)
    tb = np.zeros((n, width), dtype=np.int64)
    tk = np.zeros((n, width), dtype=np.int64)
    kb = np.zeros((n, width), dtype=np.int64)
    kin = np.ones((n, width), dtype=bool)
    tc = np.zeros((n, width))
    cr = np.zeros((n, width))
    for b, opts in enumerate(options):
        for j, o in enumerate(opts.options):
            kept[b, j], cb[b, j], tb[b, j] = o.kept, opts.bwd_cost + o.recompute, o.bwd_transient
            tk[b, j], kb[b, j], kin[b, j] = o.fwd_transient, o.bwd_kept, o.needs_input
            tc[b, j], cr[b, j] = o.tail_cost, o.run_cost
    return BlockChainCosts(
        cf=np.array([o.fwd_cost for o in options]),
        wa=np.array([int(graph.sizes[blk.out]) for blk in chain.blocks], dtype=np.int64),
        tf=np.array([o.fwd_transient for o in options], dtype=np.int64),
        nopt=np.array([len(o.options) for o in options], dtype=np.int64),
        kept=kept, cb=cb, tb=tb, tk=tk, kb=kb, kin=kin, tc=tc, cr=cr,
        cc=np.array([o.ck_cost for o in options]))


def capped_transients(costs: BlockChainCosts, cap: int) -> BlockChainCosts:
    """``costs`` with each block's transients lowered by what its least one exceeds ``cap``:
    per block, the options' backward (``tb``) and forward (``tk``) transients shifted down
    together (so the DP still tells its options apart) until the least is at most ``cap``;
    the forward transient keeping only the output (``tf``) capped.

    Raises:
      InvalidOptionError: ``cap`` is negative.
    """
    if int(cap) < 0:
        raise InvalidOptionError(f"capped_transients: cap must be >= 0 bytes, got {cap!r}")
    valid = np.arange(costs.tb.shape[1])[None, :] < costs.nopt[:, None]

    def shifted(t):
        least = np.where(valid, t, np.iinfo(np.int64).max).min(axis=1)
        return np.maximum(t - np.maximum(least - cap, 0)[:, None], 0)

    return dataclasses.replace(costs, tb=shifted(costs.tb), tk=shifted(costs.tk),
                               tf=np.minimum(costs.tf, cap))


@register("hierarchical")
@dataclasses.dataclass(frozen=True)
class Hierarchical(BasePolicy):
    """Blocks, op-level options per block, rotor's DP across blocks (see the module docstring).

    Args:
      budget: activation bytes or ``"60%"`` / ``"512MiB"`` (of the graph's no-remat peak).
      levels: memory levels of the DP table (its resolution: ``budget / levels`` bytes).
      caps: kept-bytes caps per block's option search (about that many options per block).
      rounds: most DP solves while correcting its memory to the replayed peak.
      option_time_limit: seconds per block option programme.
      scan_options: most scan decisions (:class:`~remat.core.scan_plan.ScanDecision`, the
        per-iteration options ScanLayers searches) the blocks are planned around, in all; a
        scan is one node of its block, with that decision's kept bytes and FLOPs.
      microbatch: when the whole batch does not fit, plan ``k`` micro-batches (needs
        ``ctx.graph_at``; never when ``ctx.batch_coupled``).
    """

    budget: int | str | None = None
    levels: int = 256
    caps: int = 12
    rounds: int = 8
    option_time_limit: float = 1.0
    scan_options: int = 8
    microbatch: bool = True

    shortcut: ClassVar[bool] = True
    #: the drop-in extracts at equation granularity for this policy (``stages="auto"``)
    preferred_stages: ClassVar[str] = "eqn"

    def __post_init__(self) -> None:
        for name in ("levels", "caps", "rounds", "scan_options"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidOptionError(f"hierarchical: {name} must be a positive int, got {v!r}")
        if not isinstance(self.microbatch, bool):
            raise InvalidOptionError(f"hierarchical: microbatch must be a bool, got {self.microbatch!r}")
        if not self.option_time_limit > 0:
            raise InvalidOptionError("hierarchical: option_time_limit must be > 0, got "
                                     f"{self.option_time_limit!r}")

    def _prepare(self, graph: Graph, cache: dict | None = None):
        chain = block_chain(graph)
        pinned = frozenset(int(p) for p in chain.pinned)
        cache = {} if cache is None else cache  # block signature -> options
        solved: dict[int, object] = {}
        for b in range(chain.n):
            d = int(chain.distinct[b])
            if d not in solved:
                blk = chain.blocks[d]
                key = (blk.signature, int(blk.fwd[0]), int(blk.fwd[-1]), pinned)
                if key not in cache:
                    cache[key] = block_options(graph, blk, pinned, caps=self.caps,
                                               time_limit=self.option_time_limit)
                solved[d] = cache[key]
        options = [solved[int(chain.distinct[b])] for b in range(chain.n)]
        return chain, options, chain_costs(graph, chain, options)

    def _plan_at(self, graph, chain, options, table, memory):
        sched = schedule(table, memory)
        plan = plan_from_steps(graph, block_steps(graph, chain, options, sched.ops), policy=self.name)
        scans = frozenset(scan_nodes(graph, body)[0] for body in
                          (getattr(graph.program, "scans", ()) or ())) if graph.program else frozenset()
        plan = plan.with_meta(regions=block_regions(chain, options, sched.tree, scans))
        return plan, replay(graph, plan).peak_bytes, sched

    def _scan_candidates(self, graph: Graph, budget: int | None = None) -> list[tuple]:
        """Decisions for the graph's scans to plan the blocks around (``[()]`` without scans):
        up to ``scan_options`` points of each scan's Pareto front
        (:func:`policies.scan_layers.scan_front`), evenly spread by kept bytes, and with a
        ``budget``, each scan's fewest-FLOPs point whose residual and transient bytes fit the
        budget (the point ScanLayers chooses for a lone scan) and 3/4, 1/2 and 1/4 of it (room
        for the blocks around the scan)."""
        bodies = tuple(getattr(graph.program, "scans", ()) or ()) if graph.program else ()
        if not bodies:
            return [()]
        per = max(1, int(round(self.scan_options ** (1.0 / len(bodies)))))
        picks = []
        for body in bodies:
            front, _ = scan_front(graph, body, anchor_units(body), 12, True)
            front = sorted(front, key=lambda c: (c[0], c[2]))
            idx = set(np.linspace(0, len(front) - 1, min(per, len(front))).round().astype(int))
            for share in ((1.0, 0.75, 0.5, 0.25) if budget is not None else ()):
                fits = [i for i, c in enumerate(front) if c[0] + c[1] <= share * budget]
                if fits:
                    idx.add(min(fits, key=lambda i: (front[i][2], front[i][0])))
            picks.append([front[i][3] for i in sorted(idx)])
        return [tuple(d for d in combo if d is not None) for combo in itertools.product(*picks)]

    def evaluation_graph(self, graph: Graph, plan: Plan, ctx: PolicyContext) -> Graph:
        """The graph with each scan node's bytes and FLOPs under the plan's scan decisions, and,
        for a plan applied as regions, each residual sized as what a region saves to keep it
        (:func:`remat.core.regions.region_saved_graph`)."""
        graph = super().evaluation_graph(graph, plan, ctx)
        decisions = plan.meta.get("scans", ())
        graph = adjusted_graph(graph, decisions) if decisions else graph
        return region_saved_graph(graph) if plan.meta.get("regions") else graph

    def _microbatch_counts(self, ctx: PolicyContext) -> tuple[list[int], str]:
        """The micro-batch counts to try, smallest first, and why there are none."""
        if not self.microbatch:
            return [], "micro-batching disabled"
        if ctx.batch_coupled:
            return [], "batch-coupled layers (BatchNorm): micro-batching changes the math"
        counts = ctx.microbatch_counts()
        return counts, "" if counts else "no micro-batch count (no graph_at or batch size)"

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        counts, why = self._microbatch_counts(ctx)
        cache: dict = {}  # block signature -> options, shared with the plan below the floor
        try:
            plan = self._solve_batch(graph, budget_bytes, cache)
        except InfeasibleBudgetError as whole:
            for k in counts:
                try:
                    plan = self._solve_batch(ctx.graph_at(k), budget_bytes)
                except InfeasibleBudgetError:
                    continue
                return dataclasses.replace(plan, microbatches=k).with_meta(
                    microbatch_reason=f"the whole batch does not fit ({whole.reason}); "
                                      f"{k} micro-batches of {ctx.batch_size // k} do")
            if ctx.compiled_budget:
                try:
                    return self._below_floor(graph, budget_bytes, cache).with_meta(
                        microbatch_reason=why or f"no micro-batch count fits ({whole.reason})")
                except InfeasibleBudgetError as e:
                    whole = e
            if not counts:
                raise InfeasibleBudgetError(whole.budget, whole.min_feasible_bytes,
                                            f"{whole.reason}; not micro-batched: {why}") from None
            # the smallest feasible budget over micro-batch counts: min_feasible_budget
            raise InfeasibleBudgetError(whole.budget, None, f"{whole.reason}, nor with "
                                        f"{counts[0]} to {counts[-1]} micro-batches") from None
        return plan.with_meta(microbatch_reason=why or "the whole batch fits")

    def _solve_batch(self, graph: Graph, budget_bytes: int, cache: dict | None = None) -> Plan:
        """:meth:`solve` on one graph (no micro-batching): the cheapest plan over the scan
        decisions, or :class:`InfeasibleBudgetError` with the smallest replayed peak."""
        budget = int(budget_bytes)
        cache = {} if cache is None else cache
        best, smallest = None, None
        for decisions in self._scan_candidates(graph, budget):
            g = region_saved_graph(adjusted_graph(graph, decisions) if decisions else graph)
            try:
                plan, cost = self._solve_graph(g, budget, cache)
            except InfeasibleBudgetError as e:
                mf = e.min_feasible_bytes
                if mf is not None and np.isfinite(mf):
                    smallest = mf if smallest is None else min(smallest, mf)
                continue
            if best is None or cost < best[0]:
                best = (cost, plan.with_meta(scans=decisions) if decisions else plan)
        if best is None:
            raise InfeasibleBudgetError(budget, smallest,
                                        "hierarchical: no DP schedule replays within the budget")
        return best[1]

    def _solve_graph(self, graph: Graph, budget: int, cache: dict) -> tuple[Plan, float]:
        chain, options, costs = self._prepare(graph, cache)
        pinned_bytes = int(graph.sizes[chain.pinned].sum()) if len(chain.pinned) else 0
        mem = max(budget - pinned_bytes, 1)
        table = fill_blocks(costs, 2 * budget, levels=self.levels)
        best, best_cost, best_mem = None, np.inf, None
        lo = hi = None  # DP memories whose plans replay within / over the budget
        dp_min = 0  # the DP has no schedule below this memory
        rounds = []
        for _ in range(self.rounds):
            try:
                plan, peak, _ = self._plan_at(graph, chain, options, table, mem)
            except InfeasibleBudgetError as e:
                rounds.append({"dp_memory": mem, "peak_bytes": None})
                dp_min = int(e.min_feasible_bytes) if np.isfinite(e.min_feasible_bytes) else None
                if dp_min is None or dp_min <= mem or (hi is not None and dp_min >= hi):
                    break
                mem = dp_min
                continue
            rounds.append({"dp_memory": mem, "peak_bytes": int(peak)})
            if peak <= budget:
                cost = float(plan.compute_counts() @ graph.costs)
                if cost < best_cost:
                    best, best_cost, best_mem = plan, cost, mem
                lo = mem if lo is None else max(lo, mem)
                if peak >= 0.98 * budget or not plan.compute_counts().max() > 1:
                    break
                nxt = mem + (budget - peak) if hi is None else (lo + hi) // 2
            else:
                hi = mem if hi is None else min(hi, mem)
                nxt = mem - (peak - budget) if lo is None else (lo + hi) // 2
                nxt = max(nxt, dp_min)
            if nxt == mem or (lo is not None and hi is not None and hi - lo <= max(budget // 512, 1)):
                break
            mem = int(nxt)
        if best is None:  # the DP's least-memory schedule, on its finest table, may still fit
            least = self._least_memory(graph, chain, options, costs)
            if least is None or least[1] > budget:
                raise InfeasibleBudgetError(budget, None if least is None else least[1],
                                            "hierarchical: no DP schedule replays within the budget")
            best, best_cost, best_mem = least[0], float(least[0].compute_counts() @ graph.costs), 0
        return self._with_meta(best, chain, options, best_mem, rounds, budget), best_cost

    def _below_floor(self, graph: Graph, budget_bytes: int, cache: dict | None = None) -> Plan:
        """For a compiled-budget loop (``ctx.compiled_budget``), below the DP's modelled floor:
        the cheapest schedule whose held bytes plus block transients capped at ``cap`` fit the
        budget, for the largest such ``cap`` (bisected), over the scan decisions.  Where a
        block's least transient is the floor (a BatchNorm's backward at equation granularity,
        which XLA fuses), the uncapped DP spends the slack it leaves elsewhere; this schedule
        holds at most the budget outside such blocks.  ``meta``: ``transient_cap`` (bytes) and
        ``over_modelled_budget`` (its replayed peak over the budget).

        Raises:
          InfeasibleBudgetError: not even with every transient capped at 0 (the smallest budget
            with a schedule then).
        """
        budget = int(budget_bytes)
        cache = {} if cache is None else cache
        best, smallest = None, None
        for decisions in self._scan_candidates(graph, budget):
            g = region_saved_graph(adjusted_graph(graph, decisions) if decisions else graph)
            chain, options, costs = self._prepare(g, cache)
            pinned_bytes = int(g.sizes[chain.pinned].sum()) if len(chain.pinned) else 0
            mem = budget - pinned_bytes

            def table_at(cap: int, costs=costs, mem=mem):
                return fill_blocks(capped_transients(costs, cap), max(mem, 1), levels=self.levels)

            floor = table_at(0).min_memory + pinned_bytes
            smallest = floor if smallest is None else min(smallest, floor)
            if mem <= 0 or floor > budget:
                continue
            lo, hi = 0, int(max(costs.tb.max(), costs.tk.max(), costs.tf.max()))
            while hi - lo > max(1, hi // 256):
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if table_at(mid).min_memory <= mem else (lo, mid)
            plan, peak, _ = self._plan_at(g, chain, options, table_at(lo), mem)
            cost = float(plan.compute_counts() @ g.costs)
            if best is None or cost < best[0]:
                best = (cost, self._with_meta(plan, chain, options, mem, (), budget).with_meta(
                    transient_cap=lo, over_modelled_budget=int(max(peak - budget, 0)),
                    **({"scans": decisions} if decisions else {})))
        if best is None:
            raise InfeasibleBudgetError(budget, smallest, "hierarchical: no DP schedule fits "
                                        "the budget even with block transients capped at 0")
        return best[1]

    @staticmethod
    def _with_meta(plan: Plan, chain, options, dp_memory: int, rounds, budget: int) -> Plan:
        status = "optimal" if all(o.status == "optimal" for o in options) else "heuristic"
        return plan.with_meta(
            status="heuristic", option_status=status, blocks=chain.n,
            distinct_blocks=len(set(int(d) for d in chain.distinct)),
            options=tuple(len(options[int(d)].options) for d in sorted(set(chain.distinct))),
            dp_memory=int(dp_memory), rounds=tuple(rounds), budget=budget)

    def _least_memory(self, graph, chain, options, costs) -> tuple[Plan, int] | None:
        """The DP's schedule at its smallest memory and its replayed peak (``None``: none)."""
        table = fill_blocks(costs, 0, levels=self.levels)
        if not np.isfinite(table.min_memory):
            return None
        plan, peak, _ = self._plan_at(graph, chain, options, table, int(table.min_memory))
        return plan, int(peak)

    def _min_peak(self, graph, chain, options, costs) -> int | None:
        least = self._least_memory(graph, chain, options, costs)
        return None if least is None else least[1]

    def min_feasible_budget(self, graph: Graph, ctx: PolicyContext | None = None) -> int | None:
        """The smallest replayed peak of the DP's schedule at its smallest memory, over the
        scan decisions it plans around; with micro-batches allowed, also on the graph of the
        most micro-batches (one sample each)."""
        floor = self._min_batch_peak(graph)
        counts, _ = self._microbatch_counts(ctx or PolicyContext())
        if counts:
            at = self._min_batch_peak(ctx.graph_at(counts[-1]))
            floor = at if floor is None else floor if at is None else min(floor, at)
        return floor

    def _min_batch_peak(self, graph: Graph) -> int | None:
        cache: dict = {}
        peaks = []
        for decisions in self._scan_candidates(graph):
            g = region_saved_graph(adjusted_graph(graph, decisions) if decisions else graph)
            p = self._min_peak(g, *self._prepare(g, cache))
            if p is not None:
                peaks.append(p)
        return min(peaks) if peaks else None
