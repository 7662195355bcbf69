"""Block operations (:mod:`solvers.hierarchical.dp`) as per-step compute lists of the graph.

``F_CK`` of block ``b`` runs its forward nodes but the residual-only ones (``BlockOptions.ck``),
``F_OPT`` those the option's run computes (``run``), ``F_TAIL`` the option's ``tail``
(the block re-run when nothing after it reads its output); ``BWD`` of block ``b`` with option
``o`` runs the block's backward nodes, each recomputed value just before the first backward node
that needs it (:func:`solvers.hierarchical.options.lazy_order`; a new step wherever a
recomputation follows a backward node, since a step runs its nodes in index order).  Retention is left to
:func:`policies.from_checkpoints.plan_from_steps`-style liveness: a value is held from its last
computation to its last reader, so an option's kept values survive from ``F_OPT`` to ``BWD``
and nothing else does.

:func:`block_regions` gives the same schedule as checkpoint regions for the drop-in
(:mod:`remat.core.regions`): a block run with option ``o`` is a region saving the option's kept
values; blocks ``s..s'-1`` run keeping only their output form a region saving nothing, with the
recursion's regions nested inside.
"""

from __future__ import annotations

from collections.abc import Sequence

from remat.core.graph import Graph
from remat.core.regions import CheckpointRegion
from solvers.hierarchical.blocks import BlockChain
from solvers.hierarchical.dp import BWD, F_CK, F_OPT, F_TAIL
from solvers.hierarchical.options import BlockOptions, lazy_order

__all__ = ["block_steps", "block_regions"]


def block_steps(graph: Graph, chain: BlockChain, options: Sequence[BlockOptions],
                ops: Sequence[tuple[int, int, int]]) -> list[list[int]]:
    """``steps[t]``: the graph nodes step ``t`` runs, in topological order.

    Args:
      graph: the graph the chain was cut from.
      chain: the blocks.
      options: per block ``b``, the options of its distinct block (``chain.distinct[b]``).
      ops: the schedule's ``(kind, block, option)`` operations.
    """
    steps: list[list[int]] = []
    for kind, b, o in ops:
        blk = chain.blocks[b]
        if kind == F_CK:
            steps.append([int(blk.fwd[i]) for i in options[b].ck])
        elif kind == F_OPT:
            steps.append([int(blk.fwd[i]) for i in options[b].options[o].run])
        elif kind == F_TAIL:
            steps.append([int(blk.fwd[i]) for i in options[b].options[o].tail])
        elif kind == BWD:
            opt = options[b].options[o]
            rec = [int(blk.fwd[i]) for i in opt.recomputed]
            rset = set(rec)
            cur: list[int] = []
            for v in lazy_order(graph, rec, [int(u) for u in blk.bwd]):
                if v in rset and cur and cur[-1] not in rset:
                    steps.append(cur)
                    cur = []
                cur.append(v)
            steps.append(cur)
        else:  # pragma: no cover - the DP emits only these
            raise ValueError(f"unknown block operation {kind}")
    return [s for s in steps if s]


def block_regions(chain: BlockChain, options: Sequence[BlockOptions], tree: tuple,
                  unwrapped: frozenset[int] = frozenset()) -> tuple[CheckpointRegion, ...]:
    """The schedule's recursion (:attr:`solvers.hierarchical.BlockSchedule.tree`) as
    checkpoint regions over forward node ids; a block's region also saves the pinned values
    computed in it (later blocks read them).  A block run with an option that holds a node of
    ``unwrapped`` (a scan applying its own per-iteration decision) gets no region of its own:
    it runs as written."""
    pinned = set(int(p) for p in chain.pinned)
    out = []
    for item in tree:
        if item[0] == F_OPT:
            _, b, o = item
            blk = chain.blocks[b]
            if unwrapped and any(int(v) in unwrapped for v in blk.fwd):
                continue
            kept = {int(blk.fwd[i]) for i in options[b].options[o].kept_nodes}
            kept |= {int(v) for v in blk.fwd if int(v) in pinned}
            out.append(CheckpointRegion(int(blk.fwd[0]), int(blk.fwd[-1]) + 1,
                                        tuple(sorted(kept))))
        elif item[0] == F_CK:
            _, s, sp, sub = item
            out.append(CheckpointRegion(int(chain.blocks[s].fwd[0]),
                                        int(chain.blocks[sp - 1].fwd[-1]) + 1, (),
                                        block_regions(chain, options, sub, unwrapped)))
        else:  # pragma: no cover - the DP emits only these
            raise ValueError(f"unknown block item {item[0]}")
    return tuple(out)
