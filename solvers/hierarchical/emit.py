"""Block operations (:mod:`solvers.hierarchical.dp`) as per-step compute lists of the graph.

``F_CK`` and ``F_OPT`` of block ``b`` run its forward nodes; ``BWD`` of block ``b`` with option
``o`` recomputes the option's nodes then runs the block's backward nodes.  Retention is left to
:func:`policies.from_checkpoints.plan_from_steps`-style liveness: a value is held from its last
computation to its last reader, so an option's kept values survive from ``F_OPT`` to ``BWD``
and nothing else does.
"""

from __future__ import annotations

from collections.abc import Sequence

from solvers.hierarchical.blocks import BlockChain
from solvers.hierarchical.dp import BWD, F_CK, F_OPT
from solvers.hierarchical.options import BlockOptions

__all__ = ["block_steps"]


def block_steps(chain: BlockChain, options: Sequence[BlockOptions],
                ops: Sequence[tuple[int, int, int]]) -> list[list[int]]:
    """``steps[t]``: the graph nodes step ``t`` runs, in topological order.

    Args:
      chain: the blocks.
      options: per block ``b``, the options of its distinct block (``chain.distinct[b]``).
      ops: the schedule's ``(kind, block, option)`` operations.
    """
    steps: list[list[int]] = []
    for kind, b, o in ops:
        blk = chain.blocks[b]
        if kind in (F_CK, F_OPT):
            steps.append([int(v) for v in blk.fwd])
        elif kind == BWD:
            opt = options[b].options[o]
            rec = [int(blk.fwd[i]) for i in opt.recomputed]
            steps.append(rec + [int(v) for v in blk.bwd])
        else:  # pragma: no cover - the DP emits only these
            raise ValueError(f"unknown block operation {kind}")
    return [s for s in steps if s]
