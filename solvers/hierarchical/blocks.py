"""A training graph as a sequence of blocks cut at the articulation points of its forward pass.

A *cut* after forward node ``p`` (forward nodes in topological order) is a point where ``p`` is
the only forward value computed so far that a later forward node still reads: the residual
stream of a transformer or ResNet between blocks, the activation between two MLP layers.
*Free* nodes (forward nodes that cost at most a FLOP per output byte and read only free
forward values: parameter casts and transposes, a causal mask from ``iota`` and comparisons,
an embedding lookup) are recomputable from the arguments alone and do not break a cut; one that
a later block reads is *pinned* (kept from its forward computation).  A node with real work
(the first layer's contraction of the batch) and everything after it is an activation like any
other.
A long skip (a U-Net's, a DenseNet's concatenations) leaves no cut inside what it spans, so
those nodes form one block.

Block ``b`` holds the forward nodes after cut ``b - 1`` up to and including cut ``b`` (its
output ``a_b``, the next block's input).  Backward nodes are assigned in topological order:
block ``b``'s backward runs until the first backward node that reads the interior of an earlier
block or a cut before ``a_{b-1}`` (so the assignment is monotone and every value a block's
backward reads is its own, its input ``a_{b-1}``, ``a_b`` or pinned).

Blocks with the same *signature* (forward and backward structure relative to the block, node
sizes and costs) are one distinct block, solved once (:mod:`solvers.hierarchical.options`).
Numpy only.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from remat.core.errors import InvalidGraphError
from remat.core.graph import Graph

__all__ = ["Block", "BlockChain", "block_chain"]


@dataclasses.dataclass(frozen=True, eq=False)
class Block:
    """One block of the chain.

    Attributes:
      index: position ``b`` in the chain.
      fwd: ``int64[k]`` its forward nodes in topological order; ``fwd[-1]`` is ``a_b``.
      bwd: ``int64[j]`` the backward nodes assigned to it, in topological order.
      inp: the node ``a_{b-1}`` (``-1`` for the first block: its input is the batch).
      reads: ``int64`` forward nodes of ``fwd`` that ``bwd`` reads (``a_b`` included if read).
      signature: equal for blocks with the same structure, sizes and costs.
    """

    index: int
    fwd: np.ndarray
    bwd: np.ndarray
    inp: int
    reads: np.ndarray
    signature: str

    @property
    def out(self) -> int:
        """The node ``a_b``."""
        return int(self.fwd[-1])


@dataclasses.dataclass(frozen=True, eq=False)
class BlockChain:
    """A graph's blocks (see the module docstring).

    Attributes:
      blocks: the chain, in order.
      pinned: ``int64`` roots read across a cut: kept from their forward computation.
      distinct: ``distinct[b]`` the index of the first block with ``blocks[b]``'s signature.
    """

    blocks: tuple[Block, ...]
    pinned: np.ndarray
    distinct: np.ndarray

    @property
    def n(self) -> int:
        return len(self.blocks)


def _cuts(graph: Graph, fwd: np.ndarray, roots: np.ndarray) -> list[int]:
    """Forward nodes after which no other non-root forward value is read later (the cuts)."""
    bwd = graph.is_backward_array
    e = graph.edge_array
    ff = e[~bwd[e[:, 0]] & ~bwd[e[:, 1]]] if len(e) else e
    last = np.full(graph.n, -1, dtype=np.int64)
    if len(ff):
        np.maximum.at(last, ff[:, 0], ff[:, 1])
    is_root = np.zeros(graph.n, dtype=bool)
    is_root[roots] = True
    # open[p]: number of non-root forward values u < p (in forward order) still read after p
    pos = np.full(graph.n, -1, dtype=np.int64)
    pos[fwd] = np.arange(len(fwd))
    delta = np.zeros(len(fwd) + 1, dtype=np.int64)
    for u in fwd:
        if is_root[u] or last[u] <= u:
            continue
        # u is open from its own position (exclusive) up to the position of its last reader
        delta[pos[u] + 1] += 1
        delta[pos[last[u]]] -= 1
    open_after = np.cumsum(delta)[:len(fwd)]  # values other than fwd[p] crossing the cut after p
    cuts = [int(fwd[p]) for p in range(len(fwd)) if open_after[p] == 0 and not is_root[fwd[p]]]
    if not cuts or cuts[-1] != int(fwd[-1]):
        cuts.append(int(fwd[-1]))
    return cuts


def _signature(graph: Graph, fwd: np.ndarray, bwd_nodes: np.ndarray, inp: int) -> str:
    """A hash of a block's structure relative to its own nodes: each node's kind, size, FLOPs,
    time and workspace, and its predecessors as offsets inside the block (``-1``: the block
    input, ``-2``: anything else outside)."""
    local = {int(v): i for i, v in enumerate(np.concatenate([fwd, bwd_nodes]))}
    h = hashlib.blake2b(digest_size=16)
    for v in np.concatenate([fwd, bwd_nodes]):
        node = graph.nodes[int(v)]
        preds = tuple(local.get(p, -1 if p == inp else -2) for p in graph.preds[int(v)])
        h.update(repr((node.is_backward, node.out_bytes, round(node.flops), f"{node.time_s:.6e}",
                       node.workspace_bytes, preds)).encode())
    return h.hexdigest()


def block_chain(graph: Graph) -> BlockChain:
    """Cut ``graph`` into blocks (see the module docstring).

    Raises:
      InvalidGraphError: the graph has no forward node.
    """
    bwd_mask = graph.is_backward_array
    fwd = np.flatnonzero(~bwd_mask)
    if not len(fwd):
        raise InvalidGraphError("no forward node to cut into blocks")
    preds = graph.preds
    flops, sizes = graph.flops_array, graph.sizes
    free = np.zeros(graph.n, dtype=bool)
    for v in fwd:  # topological: cheap, and every forward value it reads is free
        free[v] = flops[v] <= sizes[v] and all(bwd_mask[p] or free[p] for p in preds[v])
    roots = np.flatnonzero(free)
    cuts = _cuts(graph, fwd, roots)
    block_of = np.full(graph.n, -1, dtype=np.int64)
    starts = np.searchsorted(fwd, [-1] + cuts[:-1], side="right")
    stops = np.searchsorted(fwd, cuts, side="right")
    for b, (a, z) in enumerate(zip(starts, stops)):
        block_of[fwd[a:z]] = b
    is_cut = np.zeros(graph.n, dtype=bool)
    is_cut[cuts] = True
    is_root = np.zeros(graph.n, dtype=bool)
    is_root[roots] = True
    nb = len(cuts)

    # backward nodes, monotone: block b's backward stops at the first node that needs an
    # earlier block (its interior, or a cut before a_{b-1})
    assign: list[list[int]] = [[] for _ in range(nb)]
    cur = nb - 1
    for v in np.flatnonzero(bwd_mask):
        need = nb - 1
        for u in preds[v]:
            if bwd_mask[u] or is_root[u]:
                continue
            b = int(block_of[u])
            need = min(need, b + 1 if is_cut[u] else b)  # a cut a_b is also block b+1's input
        need = min(need, nb - 1)
        while cur > 0 and need < cur:
            cur -= 1
        assign[cur].append(int(v))

    # pinned: cheap roots read by a node (forward or backward) of another block than their own
    owner = block_of.copy()
    for b, vs in enumerate(assign):
        owner[vs] = b
    pinned = [int(r) for r in roots if any(owner[s] != block_of[r] for s in graph.succs[r])]
    pinned_set = set(pinned)

    blocks = []
    sig_first: dict[str, int] = {}
    distinct = np.zeros(nb, dtype=np.int64)
    for b, (a, z) in enumerate(zip(starts, stops)):
        f = fwd[a:z]
        bw = np.asarray(assign[b], dtype=np.int64)
        inp = int(cuts[b - 1]) if b else -1
        fset = set(int(x) for x in f)
        reads = sorted({u for v in bw for u in preds[v] if u in fset and u not in pinned_set})
        sig = _signature(graph, f, bw, inp)
        distinct[b] = sig_first.setdefault(sig, b)
        blocks.append(Block(b, f, bw, inp, np.asarray(reads, dtype=np.int64), sig))
    return BlockChain(tuple(blocks), np.asarray(sorted(pinned_set), dtype=np.int64), distinct)
