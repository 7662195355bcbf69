"""Options of one block: which of its forward values the backward keeps, at op granularity.

An option of block ``b`` (:mod:`solvers.hierarchical.blocks`) is a kept set ``K`` of its forward
nodes (its output ``a_b`` always kept: the next block reads it).  The block's backward reads
``D`` (``Block.reads``); every value of ``D`` not kept is recomputed in the backward from ``K``,
the block input ``a_{b-1}`` and pinned values, with the ancestors that need (Checkmate's
``solve_r_opt`` for fixed checkpoints, restricted to the block).  Each option carries

* ``kept``: bytes of ``K`` (``a_b`` included) held from the block's forward to its backward;
* ``recompute``: the compute cost of the recomputed nodes (the graph's ``time_s``; FLOPs too);
* ``bwd_transient``: the peak bytes of the block's backward beyond ``K``: recomputed values,
  the incoming and outgoing cotangents and the backward's own values, each freed after its last
  reader in the block, and each node's scratch while it runs (``graph.workspace``: XLA:CPU's
  dense expansion of a depthwise convolution's weight gradient);
* ``fwd_transient``: the peak bytes of the block's forward beyond its input, ``K`` held to its end;
* ``bwd_kept``: the bytes of ``K`` its backward still reads (``a_b`` only when read there: the
  next block consumes it otherwise);
* ``needs_input``: whether its backward or recomputation reads the block input ``a_{b-1}``
  (otherwise the input is freed once the block's forward has run);
* ``run`` / ``run_cost``: the forward nodes (and their cost) a run keeping ``K`` computes: the
  block without its *residual-only* nodes (values only its backward reads, e.g. ``1 - y**2``
  of a ``tanh``) that are not ancestors of ``K`` (the backward recomputes those it reads);
* ``tail`` / ``tail_cost``: the forward nodes (and their cost) a re-run of the block computes
  when nothing after it needs its output ``a_b`` (the last block of a recursively recomputed
  segment: ``a_b``'s cotangent is given): the ancestors in the block of ``K`` without ``a_b``,
  ``a_b`` only if the backward reads it;

and the block's ``fwd_transient``: the peak bytes of its forward beyond its input, nothing kept,
and ``ck`` / ``ck_cost``: the nodes a run keeping only ``a_b`` computes (no residual-only ones).

The Pareto set of (kept bytes, recompute cost) comes from a small integer programme per kept-bytes
cap (HiGHS through ``scipy.optimize.milp``, sparse constraints)::

    min  sum_u t_u r_u                      (r_u: u recomputed, k_u: u kept; u in the block)
    s.t. k_u + r_u >= 1          u in D      (what the backward reads is there)
         r_u <= k_p + r_p        (p, u) an edge inside the block
         sum_u s_u k_u <= cap

exact for each cap (``status "optimal"``); a block with more than ``max_exact`` nodes, or a
solve that stops at its time limit, gives ``"heuristic"`` options (the incumbent, or the
greedy: keep the values saving the most recompute per byte).  Numpy and scipy only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from remat.core.graph import Graph
from solvers.hierarchical.blocks import Block

__all__ = ["BlockOption", "BlockOptions", "block_options", "lazy_order"]


@dataclasses.dataclass(frozen=True, eq=False)
class BlockOption:
    """One option (see the module docstring); ``kept_nodes`` / ``recomputed`` are positions in
    ``Block.fwd``, so identical blocks share options."""

    kept_nodes: tuple[int, ...]
    recomputed: tuple[int, ...]
    kept: int
    recompute: float
    recompute_flops: float
    bwd_transient: int
    fwd_transient: int
    bwd_kept: int = 0
    needs_input: bool = True
    tail: tuple[int, ...] = ()
    tail_cost: float = 0.0
    run: tuple[int, ...] = ()
    run_cost: float = 0.0


@dataclasses.dataclass(frozen=True, eq=False)
class BlockOptions:
    """The Pareto options of a distinct block, cheapest-to-store first, and how they were found
    (``"optimal"``: every cap's programme solved to optimality; ``"heuristic"``: otherwise)."""

    options: tuple[BlockOption, ...]
    fwd_cost: float
    fwd_flops: float
    bwd_cost: float
    bwd_flops: float
    fwd_transient: int
    status: str
    ck: tuple[int, ...] = ()
    ck_cost: float = 0.0


def _recompute_set(graph: Graph, block: Block, keep: set[int], avail_out: set[int]) -> list[int]:
    """Nodes of the block to recompute so that ``block.reads`` are resident (topological)."""
    fset = set(int(v) for v in block.fwd)
    avail = keep | {v for v in avail_out}
    todo = [int(u) for u in block.reads if int(u) not in avail]
    out: set[int] = set()
    preds = graph.preds
    while todo:
        v = todo.pop()
        if v in out:
            continue
        out.add(v)
        todo.extend(p for p in preds[v] if p in fset and p not in avail and p not in out)
    return sorted(out)


def _transient(graph: Graph, seq: list[int], start_live: dict[int, int], stay: set[int]) -> int:
    """Peak bytes of running ``seq`` in order from ``start_live``: each value freed after its
    last reader in ``seq``, except those in ``stay``; a node's workspace (``graph.workspace``)
    counts while it runs."""
    pos = {v: i for i, v in enumerate(seq)}
    sizes = graph.sizes
    succs = graph.succs
    free_at: dict[int, list[int]] = {}
    for v in list(seq) + list(start_live):
        if v in stay:
            continue
        readers = [pos[s] for s in succs[v] if s in pos]
        free_at.setdefault(max(readers) if readers else pos.get(v, 0), []).append(v)
    live = sum(start_live.values())
    peak = live
    work = graph.workspace
    for i, v in enumerate(seq):
        live += int(sizes[v])
        peak = max(peak, live + int(work[v]))
        for u in free_at.get(i, ()):
            live -= int(sizes[u]) if u in pos else start_live[u]
    return int(peak)


def lazy_order(graph: Graph, rec: list[int], bwd: list[int]) -> list[int]:
    """``rec + bwd`` with each recomputed value moved to just before the first backward node
    that needs it (directly or through other recomputed values), as a memory-aware scheduler
    places the recomputation; node ids are topological, so the order stays one."""
    rset = set(rec)
    preds = graph.preds
    first = {u: len(bwd) for u in rec}
    for i, v in enumerate(bwd):
        for p in preds[v]:
            if p in rset and first[p] > i:
                first[p] = i
    for u in sorted(rec, reverse=True):
        for p in preds[u]:
            if p in rset and first[p] > first[u]:
                first[p] = first[u]
    at: dict[int, list[int]] = {}
    for u in sorted(rec):
        at.setdefault(first[u], []).append(u)
    out: list[int] = []
    for i, v in enumerate(bwd):
        out.extend(at.get(i, ()))
        out.append(v)
    out.extend(at.get(len(bwd), ()))
    return out


def _residual_only(graph: Graph, block: Block, pinned: set[int]) -> set[int]:
    """The block's forward nodes that are not ancestors of its output ``a_b`` (nor pinned) but
    are ancestors of what its backward reads."""
    to_out = set(_ancestors(graph, block, {block.out}, set()))
    to_reads = set(_ancestors(graph, block, {int(u) for u in block.reads}, set()))
    return to_reads - to_out - pinned


def _option(graph: Graph, block: Block, keep: set[int], pinned: set[int]) -> BlockOption:
    out = block.out
    keep = set(keep) | {out}
    avail_out = pinned | ({block.inp} if block.inp >= 0 else set())
    rec = _recompute_set(graph, block, keep, avail_out)
    local = {int(v): i for i, v in enumerate(block.fwd)}
    costs, flops, sizes = graph.costs, graph.flops_array, graph.sizes
    seq = lazy_order(graph, rec, [int(v) for v in block.bwd])
    incoming = {}
    for v in block.bwd:
        for p in graph.preds[int(v)]:
            if graph.is_backward_array[p] and p not in incoming and p < block.bwd[0]:
                incoming[p] = int(sizes[p])
    in_seq = set(seq)
    stay = {v for v in seq if any(s not in in_seq and s > v for s in graph.succs[v])}
    kept_b = int(sizes[sorted(keep)].sum())
    reads_out = out in set(int(u) for u in block.reads) or any(
        out in graph.preds[v] for v in rec)
    needs_input = block.inp >= 0 and any(block.inp in graph.preds[v] for v in seq)
    tail = _ancestors(graph, block, (keep - {out}) | ({out} if reads_out else set()), pinned)
    skip = _residual_only(graph, block, pinned) - set(_ancestors(graph, block, keep, set()))
    run = [int(v) for v in block.fwd if int(v) not in skip]
    return BlockOption(
        kept_nodes=tuple(sorted(local[v] for v in keep)),
        recomputed=tuple(local[v] for v in rec),
        kept=kept_b,
        recompute=float(costs[rec].sum()) if rec else 0.0,
        recompute_flops=float(flops[rec].sum()) if rec else 0.0,
        bwd_transient=_transient(graph, seq, incoming, stay),
        fwd_transient=_transient(graph, [int(v) for v in block.fwd], {}, keep),
        bwd_kept=kept_b - (0 if reads_out else int(sizes[out])),
        needs_input=bool(needs_input),
        tail=tuple(local[v] for v in tail),
        tail_cost=float(costs[tail].sum()) if tail else 0.0,
        run=tuple(local[v] for v in run),
        run_cost=float(costs[run].sum()) if run else 0.0,
    )


def _ancestors(graph: Graph, block: Block, targets: set[int], pinned: set[int]) -> list[int]:
    """``targets`` and their ancestors among the block's forward nodes, pinned values left out
    (they are kept from their first computation); topological."""
    fset = set(int(v) for v in block.fwd) - pinned
    out: set[int] = set()
    todo = [v for v in targets if v in fset]
    while todo:
        v = todo.pop()
        if v in out:
            continue
        out.add(v)
        todo.extend(p for p in graph.preds[v] if p in fset and p not in out)
    return sorted(out)


def _pareto(opts: list[BlockOption]) -> list[BlockOption]:
    """Options no other beats on both kept bytes and recompute cost (then backward transient)."""
    opts = sorted(opts, key=lambda o: (o.kept, o.recompute, o.bwd_transient))
    out: list[BlockOption] = []
    for o in opts:
        if any(p.kept <= o.kept and p.recompute <= o.recompute and
               p.bwd_transient <= o.bwd_transient and p.bwd_kept <= o.bwd_kept and
               p.needs_input <= o.needs_input and p.fwd_transient <= o.fwd_transient
               for p in out):
            continue
        out.append(o)
    return out


def _milp_keep(graph: Graph, block: Block, nodes: np.ndarray, cap: int, pinned: set[int],
               time_limit: float) -> tuple[set[int], bool] | None:
    """The kept set of least recompute cost within ``cap`` bytes (and whether proven)."""
    import scipy.sparse as sp
    from scipy.optimize import Bounds, LinearConstraint, milp

    k = len(nodes)
    idx = {int(v): i for i, v in enumerate(nodes)}
    sizes = graph.sizes[nodes].astype(np.float64)
    cost = graph.costs[nodes].astype(np.float64)
    # x = [k_0..k_{k-1}, r_0..r_{k-1}]
    scale = max(float(cost.max(initial=0.0)), 1e-30)
    c = np.concatenate([sizes / max(sizes.sum(), 1.0) * 1e-6, cost / scale])
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    for u in block.reads:
        i = idx.get(int(u))
        if i is None:
            continue
        rows += [r, r]
        cols += [i, k + i]
        vals += [1.0, 1.0]
        lo.append(1.0)
        hi.append(np.inf)
        r += 1
    for v in nodes:
        i = idx[int(v)]
        for p in graph.preds[int(v)]:
            j = idx.get(p)
            if j is None:
                continue
            rows += [r, r, r]
            cols += [k + i, j, k + j]
            vals += [1.0, -1.0, -1.0]
            lo.append(-np.inf)
            hi.append(0.0)
            r += 1
    rows += [r] * k
    cols += list(range(k))
    vals += list(sizes)
    lo.append(-np.inf)
    hi.append(float(cap))
    r += 1
    A = sp.csr_matrix((vals, (rows, cols)), shape=(r, 2 * k))
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.ones(2 * k),
               bounds=Bounds(0, 1), options={"time_limit": time_limit, "disp": False})
    if res.x is None:
        return None
    x = np.round(res.x).astype(bool)
    return {int(nodes[i]) for i in np.flatnonzero(x[:k])}, res.status == 0


def _greedy_keeps(graph: Graph, block: Block, nodes: np.ndarray, pinned: set[int],
                  steps: int) -> list[set[int]]:
    """Kept sets growing by the read value that saves the most recompute per byte."""
    cand = [int(u) for u in block.reads if int(u) != block.out]
    keep: set[int] = set()
    out = [set()]
    avail_out = pinned | ({block.inp} if block.inp >= 0 else set())
    costs = graph.costs
    base = float(costs[_recompute_set(graph, block, keep | {block.out}, avail_out)].sum())
    while cand and len(out) <= steps:
        best, best_v = None, -1.0
        for u in cand:
            c = float(costs[_recompute_set(graph, block, keep | {u, block.out}, avail_out)].sum())
            v = (base - c) / max(int(graph.sizes[u]), 1)
            if v > best_v:
                best, best_v = u, v
        keep = keep | {best}
        cand.remove(best)
        base = float(costs[_recompute_set(graph, block, keep | {block.out}, avail_out)].sum())
        out.append(set(keep))
    out.append(set(cand) | keep)
    return out


def block_options(graph: Graph, block: Block, pinned: set[int] | frozenset[int] = frozenset(), *,
                  caps: int = 12, max_exact: int = 600, time_limit: float = 1.0) -> BlockOptions:
    """The Pareto options of ``block`` (see the module docstring).

    Args:
      caps: kept-bytes caps swept between nothing and everything the backward reads.
      max_exact: blocks with more forward nodes use the greedy (status ``"heuristic"``).
      time_limit: seconds per integer programme.
    """
    pinned = set(int(p) for p in pinned)
    nodes = np.asarray([v for v in block.fwd if int(v) != block.out], dtype=np.int64)
    reads = [int(u) for u in block.reads if int(u) != block.out]
    full = set(reads)
    keeps: list[set[int]] = [set(), full]
    status = "optimal"
    if reads and len(nodes) <= max_exact:
        total = int(graph.sizes[reads].sum())
        for cap in np.unique(np.linspace(0, total, caps + 1).astype(np.int64))[1:-1]:
            got = _milp_keep(graph, block, nodes, int(cap), pinned, time_limit)
            if got is None:
                status = "heuristic"
                continue
            keeps.append(got[0])
            if not got[1]:
                status = "heuristic"
    elif reads:
        keeps += _greedy_keeps(graph, block, nodes, pinned, caps)
        status = "heuristic"
    opts = _pareto([_option(graph, block, k, pinned) for k in keeps])
    f = block.fwd
    fwd_seq = [int(v) for v in f]
    ro = _residual_only(graph, block, pinned)
    ck = [i for i, v in enumerate(fwd_seq) if v not in ro]
    return BlockOptions(
        options=tuple(opts),
        fwd_cost=float(graph.costs[f].sum()),
        fwd_flops=float(graph.flops_array[f].sum()),
        bwd_cost=float(graph.costs[block.bwd].sum()) if len(block.bwd) else 0.0,
        bwd_flops=float(graph.flops_array[block.bwd].sum()) if len(block.bwd) else 0.0,
        fwd_transient=_transient(graph, fwd_seq, {}, {block.out}),
        status=status,
        ck=tuple(ck),
        ck_cost=float(graph.costs[f[ck]].sum()) if ck else 0.0,
    )
