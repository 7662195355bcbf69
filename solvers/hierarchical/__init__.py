"""Hierarchical planning: blocks at the forward graph's articulation points
(:mod:`~solvers.hierarchical.blocks`), op-level options per distinct block
(:mod:`~solvers.hierarchical.options`), rotor's DP across the blocks
(:mod:`~solvers.hierarchical.dp`) and the schedule as graph steps
(:mod:`~solvers.hierarchical.emit`).  Numpy, scipy and numba; no jax."""

from solvers.hierarchical.blocks import Block, BlockChain, block_chain
from solvers.hierarchical.dp import (
    BlockChainCosts,
    BlockSchedule,
    BlockTable,
    fill_blocks,
    schedule,
    solve_blocks,
)
from solvers.hierarchical.emit import block_regions, block_steps
from solvers.hierarchical.options import BlockOption, BlockOptions, block_options

__all__ = ["Block", "BlockChain", "block_chain", "BlockChainCosts", "BlockSchedule", "BlockTable", "fill_blocks", "schedule",
           "solve_blocks",
           "block_steps", "block_regions", "BlockOption", "BlockOptions", "block_options"]
