"""ChainDP: the optimal persistent schedule of a sequential training graph (rotor-style DP).

Beaumont et al. 2019, "Optimal checkpointing for heterogeneous chains" (rotor), re-derived for
remat's memory model; the recursions, their memory terms and their complexity are documented in
the :mod:`solvers.chain_dp` package (the derivation: :mod:`solvers.chain_dp.exact`).  This module
recognises the chain inside a :class:`~remat.Graph` (:func:`chain_problem`), runs the DP
(:func:`solvers.chain_dp.solve_chain`, or the compiled tables of
:mod:`solvers.chain_dp.compiled` over a :func:`~solvers.chain_dp.level_portfolio`), checks the
plan on replay and polishes rounded plans.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from policies.base import BasePolicy, PolicyContext, register
from policies.from_checkpoints import plan_from_steps
from remat.core.errors import (
    InfeasibleBudgetError,
    InvalidGraphError,
    NotApplicableError,
    SolverError,
)
from remat.core.graph import Graph
from remat.core.plan import Plan
from remat.core.schedule import replay
from solvers.chain_dp import (
    ChainProblem,
    check_count,
    compiled_available,
    level_portfolio,
    solve_chain,
    use_fast,
)
from solvers.gcpause import gc_paused


def chain_problem(graph: Graph) -> tuple[ChainProblem, list[int], list[int], list[int]]:
    """Recognise the chain structure of ``graph``.

    The forward chain is the longest prefix ``0 -> 1 -> ... -> K-1`` of nodes each reading only
    the previous one (node 0 reads nothing); trailing prefix nodes read by one node only (the
    loss) join the backward chain.  The remaining nodes, in index order, must each read the
    previous one (``B_{k-1}``) plus forward values ``{x-1, x}`` or ``{x}``, right to left.

    Isolated backward stages (no inputs, no readers: e.g. a constant zero cotangent) are left
    out of the chain and run first, on their own.

    Returns:
      ``(problem, fwd_nodes, bwd_nodes, isolated)``: the :class:`ChainProblem`, the graph node
      index of each forward value ``v_j`` and backward node ``B_k``, and the isolated nodes.

    Raises:
      NotApplicableError: the graph is not such a chain (the message says where it breaks).
    """
    n = graph.n
    preds, succs = graph.preds, graph.succs
    K = 0
    while K < n and preds[K] == ((K - 1,) if K else ()):
        K += 1
    K0 = K
    while K > 1 and len(succs[K - 1]) == 1 and succs[K - 1][0] == K:
        K -= 1  # the loss (read once, by the first backward node) belongs to the backward chain
    if K == 0 or K == n:
        raise NotApplicableError(f"{graph.name}: no forward chain followed by a backward chain")
    fwd = list(range(K))
    isolated = [v for v in range(K0, n) if not preds[v] and not succs[v]]
    bwd = [v for v in range(K, n) if v not in set(isolated)]
    stray = [v for v in range(K0, n) if not graph.nodes[v].is_backward]
    if stray:
        v = stray[0]
        raise NotApplicableError(
            f"{graph.name}: the forward graph is not a chain (node reads "
            f"{[graph.nodes[u].name for u in preds[v]]}, forward chain ends at node {K - 1})",
            node=graph.nodes[v].name)
    hi = np.full(len(bwd), -1, dtype=np.int64)
    lo = np.full(len(bwd), -1, dtype=np.int64)
    for k, v in enumerate(bwd):
        ps = preds[v]
        bp = [u for u in ps if u >= K]
        fp = [u for u in ps if u < K]
        if bp != ([bwd[k - 1]] if k else []):
            raise NotApplicableError(
                f"{graph.name}: backward node reads {[graph.nodes[u].name for u in bp]}, expected only "
                "the previous backward node (not a chain)", node=graph.nodes[v].name)
        nxt = [bwd[k + 1]] if k + 1 < len(bwd) else []
        if list(succs[v]) not in ([], nxt):
            raise NotApplicableError(f"{graph.name}: backward output read out of order (not a chain)",
                                    node=graph.nodes[v].name)
        if fp:
            if len(fp) > 2 or fp[-1] - fp[0] > 1:
                raise NotApplicableError(
                    f"{graph.name}: backward node reads forward values {fp}; ChainDP needs a layer's "
                    "input and/or output only", node=graph.nodes[v].name)
            hi[k], lo[k] = fp[-1], fp[0]
    sizes, costs = graph.sizes, graph.costs
    try:
        prob = ChainProblem(
            fwd_sizes=sizes[fwd], fwd_costs=costs[fwd], bwd_sizes=sizes[bwd], bwd_costs=costs[bwd],
            bwd_hi=hi, bwd_lo=lo,
        )
    except InvalidGraphError as e:
        raise InvalidGraphError(f"{graph.name}: {e}") from None
    return prob, fwd, bwd, isolated


#: chains up to this many forward values run the exact ``(min, max)`` recursion first (under
#: 0.1 s; 0.5 s at 1000): an infeasible budget is then named before any cost table is filled
MEM_FIRST_MAX_K = 500


def ops_to_steps(ops, fwd: list[int], bwd: list[int], isolated: list[int] = ()) -> list[list[int]]:
    """One step per isolated node, then one per operation: ``("f", j)`` -> ``[fwd[j]]``,
    ``("b", k)`` -> ``[bwd[k]]``."""
    return [[v] for v in isolated] + [[fwd[i]] if kind == "f" else [bwd[i]] for kind, i in ops]


@register("chain_dp")
@dataclasses.dataclass(frozen=True)
class ChainDP(BasePolicy):
    """Optimal persistent checkpointing of a chain (Beaumont et al. 2019, rotor), for remat's
    memory model.

    Args:
      budget: activation bytes (or ``"60%"``, ``"512MiB"``); ``None`` = unlimited (no
        recomputation, as checkpoint-all).
      max_levels: most memory levels in the DP table; beyond, sizes are rounded (status
        ``"feasible"`` instead of ``"optimal"``).  ``None``: 4096 (exact mode); in the compiled
        fast mode the level portfolio of :func:`solvers.chain_dp.level_portfolio` (256 levels
        when they hold the budget without rounding, else 16, and 256 too on chains up to ~400
        layers), each polished, the cheapest kept (``meta["dp_levels_tried"]``); 256 without
        numba.
      mode: ``"exact"``, ``"fast"`` or ``"auto"`` (exact up to 32 forward values, fast beyond),
        see :func:`solvers.chain_dp.solve_chain`.  The fast mode solves the persistent recursion
        only (no checkpoint drops) with rounded sizes, vectorised: 500-layer chains in seconds.
      max_first: fast mode: at most this many first checkpoints per DP state (an explicit
        approximation, status ``"feasible"``); ``None`` = all.
      polish: when the DP was not exact (sizes rounded to levels, or ``max_first``), remove
        recomputations from its schedule while the replayed peak fits the real budget
        (:func:`solvers.pebbling_search.prune_recomputation`, most expensive per byte first and
        most expensive first, the cheaper kept: ``meta["polish_order"]``;
        ``meta["dp_cost_unpolished"]`` keeps the DP's own cost).  Rounding sizes to levels
        distorts the DP (every size becomes a whole number of levels, at least one), and the
        polish recovers most of it (``experiments/chain_dp_levels.py`` compares polished plans
        with the persistent optimum).  Exact plans are never touched.

    ``meta["status"]`` is ``"optimal"`` when no size was rounded: optimal over the DP's class
    (persistent schedules plus checkpoint drops, see :mod:`solvers.chain_dp.exact`), which matched
    an exhaustive search on every uniform-size test chain and the Checkmate MILP; with unequal sizes
    a rare non-persistent schedule can be cheaper.  ``"feasible"`` when sizes were rounded.

    ``plan`` raises :class:`~remat.core.errors.NotApplicableError` on a non-chain graph and
    :class:`~remat.core.errors.InfeasibleBudgetError` (with the DP's exact minimum) on a too-small
    budget.
    """

    budget: int | str | None = None
    max_levels: int | None = None
    mode: str = "auto"
    max_first: int | None = None
    polish: bool = True

    shortcut = True

    def check_applicable(self, graph: Graph) -> None:
        check_count("ChainDP max_levels", self.max_levels, allow_none=True)
        check_count("ChainDP max_first", self.max_first, allow_none=True)
        chain_problem(graph)

    def solve(self, graph: Graph, budget_bytes: int | None, ctx: PolicyContext) -> Plan:
        b = budget_bytes
        prob, fwd, bwd, iso = chain_problem(graph)
        iso_peak = int(graph.sizes[iso].max()) if iso else 0
        fast = use_fast(prob, self.mode)
        kw = dict(max_levels=self.max_levels, mode=self.mode, max_first=self.max_first)
        if fast and self.max_first is None and compiled_available():
            with gc_paused():  # allocation-heavy: no full collections in the middle of it
                return self._solve_compiled(graph, b, prob, fwd, bwd, iso, iso_peak)
        try:
            # fast mode: nearest rounding first (sizes rounded up by up to a level each add up
            # over hundreds of held values); the replayed peak is checked below, and sizes are
            # rounded up (always fits) when it does not fit
            sol = solve_chain(prob, b, rounding="nearest" if fast else "up", **kw)
        except InfeasibleBudgetError as e:
            raise InfeasibleBudgetError(b, max(e.min_feasible_bytes, iso_peak), "ChainDP") from None
        if iso_peak > b:
            raise InfeasibleBudgetError(b, max(sol.min_budget, iso_peak), "an isolated stage")

        def build(s):
            return plan_from_steps(
                graph, ops_to_steps(s.ops, fwd, bwd, iso),
                status="optimal" if s.exact else "feasible", dp_cost=s.cost,
                min_budget=max(s.min_budget, iso_peak), dp_unit=s.unit, exact=s.exact,
                dp_mode="fast" if fast else "exact",
            )

        plan = build(sol)
        if fast and not sol.exact and replay(graph, plan, strict=True).peak_bytes > b:
            # hold back 1/16 of the levels, then round up
            alt = solve_chain(prob, b, rounding="nearest", slack_levels=max(1, b // sol.unit // 16),
                              **kw)
            plan = build(alt)
            if replay(graph, plan, strict=True).peak_bytes > b:
                plan = build(solve_chain(prob, b, rounding="up", **kw))
        elif not sol.exact and not fast:
            # sizes were rounded up to memory levels: also try nearest rounding, holding back a
            # few levels until the real (replayed) peak fits, and keep the cheaper plan
            for slack in (0, 1, 2, 4, 8, 16):
                alt = solve_chain(prob, b, rounding="nearest", slack_levels=slack, **kw)
                if alt.cost >= sol.cost:
                    break
                cand = build(alt)
                if replay(graph, cand, strict=True).peak_bytes <= b:
                    plan = cand
                    break
            plan = self._inflate(graph, b, prob, sol.unit, plan, build, kw)
        plan = self._polish(graph, b, plan)
        peak = replay(graph, plan, strict=True).peak_bytes
        if peak > b:
            raise SolverError(f"ChainDP schedule peaks at {peak} bytes > budget {b} (bug)")
        return plan

    def _polish(self, graph: Graph, b: int, plan: Plan) -> Plan:
        """The ``polish`` option: the plan with recomputations pruned (one node per step, as
        the DP's plans), or ``plan`` itself when it is exact or nothing could go."""
        if not self.polish or plan.meta.get("exact", True):
            return plan
        seq = [int(v) for v in replay(graph, plan, strict=True).node]
        meta = {k: v for k, v in plan.meta.items() if k != "policy"}
        pruned, meta = self._polish_seq(graph, b, seq, meta)
        if pruned is seq:
            return plan
        return plan_from_steps(graph, [[v] for v in pruned], **meta)

    @staticmethod
    def _inflate(graph: Graph, b: int, prob: ChainProblem, unit: int, plan: Plan, build,
                 kw: dict, max_levels: int = 64) -> Plan:
        """Exact mode with rounded sizes: solve the DP at ``b + j * unit`` bytes (``j = 1, 2,
        4, ..``, nearest rounding) and keep the cheapest plan whose *replayed* peak still fits
        ``b``.  The DP's level accounting over-estimates the replay's live bytes, so at a tight
        budget it can miss plans that fit: VGG16 (16 stages) one byte above its smallest
        feasible budget, 3.68x overhead at ``b`` and 1.26x (what Checkmate's MILP proves
        optimal) at ``b`` plus one level, both peaking at ``b - 1`` bytes.  Stops at the first
        inflation whose plan does not fit; ``meta["dp_inflation_levels"]`` records the one
        used."""
        best, cost = plan, float(plan.meta.get("dp_cost", math.inf))
        j = 1
        while j <= max_levels:
            try:
                alt = solve_chain(prob, b + j * unit, rounding="nearest", **kw)
            except InfeasibleBudgetError:
                j *= 2
                continue
            if alt.cost >= cost:
                j *= 2
                continue
            cand = build(alt)
            if replay(graph, cand, strict=True).peak_bytes > b:
                break
            best, cost = cand.with_meta(dp_inflation_levels=j), alt.cost
            j *= 2
        return best

    def _solve_compiled(self, graph: Graph, b: int, prob: ChainProblem, fwd, bwd, iso,
                        iso_peak: int) -> Plan:
        """Fast mode with the compiled kernels: a portfolio of level counts
        (:func:`solvers.chain_dp.level_portfolio`), each one DP fill with sizes rounded to the
        nearest level; when a plan overshoots the budget on replay, the plans of lower levels come from the same
        table (1, 2, 4, ... levels lower), sizes rounded up (always fits) as the last resort.
        Each plan is polished (both orders) and the cheapest kept.  The exact ``(min, max)``
        recursion runs first on chains up to ``MEM_FIRST_MAX_K`` forward values (an infeasible
        budget is named at once, ``meta["min_budget"]``); on longer ones only when nothing fits
        (to name the smallest budget, or for its smallest-peak schedule) or an isolated stage
        exceeds the budget."""
        from solvers.chain_dp.compiled import cost_dp, emit_at, min_peak_dp  # (imports numba)
        from solvers.pebbling_search import sequence_live_bytes

        mdp = min_peak_dp(prob) if prob.K <= MEM_FIRST_MAX_K or iso_peak > b else None
        mn = int(mdp.value(-1, 0, 0)) if mdp is not None else None
        if iso_peak > b:
            raise InfeasibleBudgetError(b, max(mn, iso_peak), "an isolated stage")
        if mn is not None and b < mn:
            raise InfeasibleBudgetError(b, max(mn, iso_peak), "ChainDP")
        costs = np.asarray(graph.costs, dtype=float)

        def seq_of(ops):
            return list(iso) + [fwd[i] if kind == "f" else bwd[i] for kind, i in ops]

        def fits(seq):
            return int(sequence_live_bytes(seq, graph.preds, graph.sizes).max(initial=0)) <= b

        tried, best = [], None  # best: (cost, seq, meta)
        for levels in level_portfolio(prob, b, self.max_levels):
            dp, unit, exact = cost_dp(prob, b, max_levels=levels, table_bytes=2**30,
                                      rounding="nearest", slack_levels=0)
            got, slack = emit_at(prob, dp, dp.Lv), 0
            seq = seq_of(got[1]) if got else None
            while not exact and (seq is None or not fits(seq)):
                slack = 1 if slack == 0 else 2 * slack
                got = emit_at(prob, dp, dp.Lv - slack) if slack <= dp.Lv else None
                if got is None:  # nothing fits with nearest rounding: round sizes up
                    up, unit, _ = cost_dp(prob, b, max_levels=levels, table_bytes=2**30,
                                          rounding="up", slack_levels=0)
                    got, slack = emit_at(prob, up, up.Lv), -1
                    seq = seq_of(got[1]) if got else None
                    if seq is not None and not fits(seq):
                        raise SolverError("ChainDP: a schedule with sizes rounded up overshoots"
                                          " the budget (bug)")
                    break
                seq = seq_of(got[1])
            if seq is None:
                tried.append({"levels": levels, "cost": None})
                continue
            meta = dict(dp_cost=got[0], dp_unit=unit, exact=bool(exact), dp_levels=dp.Lv,
                        dp_slack_levels=slack)
            cost = float(costs[seq].sum())
            if exact:  # no size rounded: optimal over the persistent class, nothing to polish
                tried.append({"levels": levels, "cost": cost})
                best = (cost, seq, meta)
                break
            if self.polish:
                seq, meta = self._polish_seq(graph, b, seq, meta)
                cost = float(costs[seq].sum())
            tried.append({"levels": levels, "cost": cost})
            if best is None or cost < best[0]:
                best = (cost, seq, meta)
        extra = {} if mn is None else {"min_budget": max(mn, iso_peak)}
        if best is None:  # no rounding fits: the exact smallest-peak schedule, if any
            if mdp is None:
                mdp = min_peak_dp(prob)
                mn = int(mdp.value(-1, 0, 0))
            if b < mn:
                raise InfeasibleBudgetError(b, max(mn, iso_peak), "ChainDP")
            ops: list[tuple[str, int]] = []
            mdp.emit(-1, 0, 0, 0, ops)
            seq = seq_of(ops)  # (min, max) recursion in bytes: unit 1, no levels
            meta = dict(dp_cost=float(costs[seq].sum()), dp_unit=1, exact=False, dp_levels=0,
                        dp_slack_levels=-1)
            if self.polish:
                seq, meta = self._polish_seq(graph, b, seq, meta)
            best, extra = (float(costs[seq].sum()), seq, meta), {"min_budget": max(mn, iso_peak)}
        plan = plan_from_steps(graph, [[v] for v in best[1]],
                               status="optimal" if best[2]["exact"] else "feasible",
                               dp_mode="fast", dp_levels_tried=tried, **best[2], **extra)
        peak = replay(graph, plan, strict=True).peak_bytes
        if peak > b:
            raise SolverError(f"ChainDP schedule peaks at {peak} bytes > budget {b} (bug)")
        return plan

    @staticmethod
    def _polish_seq(graph: Graph, b: int, seq: list[int], meta: dict) -> tuple[list[int], dict]:
        """Recomputations pruned from the run order ``seq`` in both candidate orders
        (:func:`solvers.pebbling_search.prune_recomputation`), the cheaper kept;
        ``meta`` gains ``dp_cost_unpolished`` and ``polish_order`` when something went."""
        from solvers.pebbling_search import prune_best

        costs = np.asarray(graph.costs, dtype=float)
        best, order = prune_best(seq, graph.preds, graph.sizes, costs, b)
        if order is None:
            return seq, meta
        return best, {**meta, "dp_cost_unpolished": float(costs[seq].sum()), "polish_order": order}
