"""The training graph: one IR for every policy.

A :class:`Graph` is a DAG of *stages* (groups of Jaxpr equations, or the ops of a published
graph) in a fixed topological order: node ``i`` may only read outputs of nodes ``j < i``.
Forward stages come first, then the loss, then the backward stages (for extracted graphs);
published graphs keep the order their file gives.

Units: ``out_bytes`` and ``param_bytes`` in bytes, ``flops`` in floating-point operations,
``time_s`` in seconds (for loaded graphs: the file's profiled cost units, see
``Graph.meta["cost_unit"]``), ``energy_j`` in joules.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from remat.core.errors import InvalidGraphError


@dataclasses.dataclass(frozen=True)
class Node:
    """One stage of the training graph.

    Attributes:
      index: position in the graph's topological order.
      name: a readable, unique name (``"fwd/Dense_3"``, ``"bwd/Dense_3"``, ``"block1_conv1"``).
      is_backward: True for stages of the backward (gradient) pass.
      flops: floating-point operations of one execution of the stage.
      out_bytes: bytes of the stage's outputs that other stages (or the result) read.
      time_s: modelled (or profiled) compute time of one execution; the solvers' compute cost.
      energy_j: modelled energy of one execution, joules.
      param_bytes: bytes of parameters the stage reads (not counted in activation memory).
      forward_index: for a backward stage, the index of the forward stage it differentiates
        (``None`` when unknown or not applicable).
      workspace_bytes: scratch bytes the stage allocates while it runs, beyond its inputs and
        outputs (:mod:`remat.workspace`: XLA:CPU's depthwise weight gradient), freed when it ends.
    """

    index: int
    name: str
    is_backward: bool = False
    flops: float = 0.0
    out_bytes: int = 0
    time_s: float = 0.0
    energy_j: float = 0.0
    param_bytes: int = 0
    forward_index: int | None = None
    workspace_bytes: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """A training graph: nodes in topological order and data edges ``(src, dst)``, ``src < dst``.

    Attributes:
      nodes: the stages, ``nodes[i].index == i``.
      edges: data dependencies ``(src, dst)`` with ``src < dst``, no duplicates.
      param_bytes: total parameter bytes (not part of activation memory).
      input_bytes: bytes of the non-parameter inputs (the batch).
      name: a label for reports.
      meta: free-form information (``cost_unit``, source file, batch size, ...).
      program: for graphs extracted from JAX, the executable description of each stage
        (see :mod:`remat.extraction`); ``None`` for loaded graphs.
    """

    nodes: tuple[Node, ...]
    edges: tuple[tuple[int, int], ...]
    param_bytes: int = 0
    input_bytes: int = 0
    name: str = "graph"
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    program: Any = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            if node.index != i:
                raise InvalidGraphError(f"node index {node.index} at position {i}", node=node.name)
            if node.out_bytes < 0:
                raise InvalidGraphError("negative output size", node=node.name)
            if node.workspace_bytes < 0:
                raise InvalidGraphError("negative workspace size", node=node.name)
            if node.time_s < 0 or node.flops < 0 or node.energy_j < 0:
                raise InvalidGraphError("negative cost", node=node.name)
        seen = set()
        for s, d in self.edges:
            if not (0 <= s < n and 0 <= d < n):
                raise InvalidGraphError(f"edge ({s}, {d}) refers to a missing node")
            if s >= d:
                raise InvalidGraphError(
                    f"edge ({s}, {d}) goes backwards in the topological order",
                    node=self.nodes[d].name,
                )
            if (s, d) in seen:
                raise InvalidGraphError(f"duplicate edge ({s}, {d})")
            seen.add((s, d))

    # ----------------------------------------------------------------- views
    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    @property
    def forward_nodes(self) -> tuple[Node, ...]:
        return tuple(v for v in self.nodes if not v.is_backward)

    @property
    def backward_nodes(self) -> tuple[Node, ...]:
        return tuple(v for v in self.nodes if v.is_backward)

    @cached_property
    def sizes(self) -> np.ndarray:
        """``int64[n]`` output bytes per node."""
        return np.array([v.out_bytes for v in self.nodes], dtype=np.int64)

    @cached_property
    def workspace(self) -> np.ndarray:
        """``int64[n]`` scratch bytes a node allocates while it runs, beyond its inputs and
        outputs (:attr:`Node.workspace_bytes`, set by :func:`remat.extract`)."""
        return np.array([v.workspace_bytes for v in self.nodes], dtype=np.int64)

    @cached_property
    def costs(self) -> np.ndarray:
        """``float64[n]`` compute cost per node (``time_s``)."""
        return np.array([v.time_s for v in self.nodes], dtype=np.float64)

    @cached_property
    def energies(self) -> np.ndarray:
        """``float64[n]`` energy per execution, joules."""
        return np.array([v.energy_j for v in self.nodes], dtype=np.float64)

    @cached_property
    def flops_array(self) -> np.ndarray:
        return np.array([v.flops for v in self.nodes], dtype=np.float64)

    @cached_property
    def is_backward_array(self) -> np.ndarray:
        return np.array([v.is_backward for v in self.nodes], dtype=bool)

    @cached_property
    def edge_array(self) -> np.ndarray:
        """``int64[m, 2]`` edges (src, dst)."""
        return np.array(self.edges, dtype=np.int64).reshape(-1, 2)

    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        """``preds[i]``: sorted indices of the nodes whose outputs node ``i`` reads."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for s, d in self.edges:
            out[d].append(s)
        return tuple(tuple(sorted(p)) for p in out)

    def ancestors_outside(self, targets, available, *, through_backward: bool = True) -> list[int]:
        """Nodes to run so that every node of ``targets`` is resident, in depth-first visit order:
        the targets not in ``available`` and, recursively, their predecessors not in
        ``available``. With
        ``through_backward=False`` backward nodes other than the targets count as available
        (they run once and are carried). The recomputation set of Checkmate's ``solve_r_opt``
        given fixed checkpoints, Melon's ``getRecomputeOpsRecursively`` and NNTrainer's
        on-demand recompute."""
        out: dict[int, None] = {}
        preds = self.preds
        bwd = None if through_backward else self.is_backward_array
        stack = [t for t in targets if t not in available]
        while stack:
            v = stack.pop()
            if v in out:
                continue
            out[v] = None
            stack.extend(u for u in preds[v] if u not in available and u not in out
                         and (bwd is None or not bwd[u]))
        return list(out)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        """``succs[i]``: sorted indices of the nodes that read node ``i``'s output."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for s, d in self.edges:
            out[s].append(d)
        return tuple(tuple(sorted(p)) for p in out)

    @cached_property
    def last_reader(self) -> np.ndarray:
        """``int64[n]``: index of the last node reading each output (the node itself if none)."""
        last = np.arange(self.n, dtype=np.int64)
        if self.edges:
            e = self.edge_array
            np.maximum.at(last, e[:, 0], e[:, 1])
        return last

    def adjacency(self):
        """``scipy.sparse.csr_matrix`` (n × n) with ``A[src, dst] = 1``."""
        import scipy.sparse as sp

        e = self.edge_array
        return sp.csr_matrix(
            (np.ones(len(e), dtype=np.int8), (e[:, 0], e[:, 1])), shape=(self.n, self.n)
        )

    def no_remat_peak(self) -> int:
        """Peak activation bytes of running every node once in order (the standard budget rule).

        Memory at step ``t`` = ``out_bytes[t]`` + every earlier output still needed at step ``t``
        or later (an output is freed right after its last reader); parameters are not counted.
        A relative budget ``m`` is ``ceil(m * no_remat_peak())`` bytes
        (``remat.resolve_budget("90%", g)`` or ``"0.9x"``), as in Moccasin's benchmark script
        (Bartan et al., ICML 2023: ``B = math.ceil(topo_mem * mul)``, ``topo_mem`` the peak of
        the program's order) and the Checkmate budget sweeps.  Equals the replayed peak of
        :func:`remat.core.plan.checkpoint_all_plan`.

        Returns:
          Peak bytes (int); 0 for an empty graph.
        """
        n = self.n
        # live interval of output i is [i, last_reader[i]]; sweep with a difference array.
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, np.arange(n), self.sizes)
        np.add.at(diff, self.last_reader + 1, -self.sizes)
        return int(np.cumsum(diff)[:n].max()) if n else 0

    def is_chain(self) -> bool:
        """True when the forward nodes form a path ``0 -> 1 -> ... -> k`` (single input each)."""
        fwd = [v.index for v in self.nodes if not v.is_backward]
        return all(self.preds[i] == (i - 1,) for i in fwd[1:]) and all(
            self.preds[fwd[0]] == () for _ in fwd[:1]
        )

    # ------------------------------------------------------------- exports
    def to_networkx(self):
        """A ``networkx.DiGraph`` with every node attribute and ``graph.graph`` metadata."""
        import networkx as nx

        g = nx.DiGraph(name=self.name, param_bytes=self.param_bytes, input_bytes=self.input_bytes)
        for v in self.nodes:
            g.add_node(v.index, **dataclasses.asdict(v))
        g.add_edges_from(self.edges)
        return g

    @classmethod
    def from_networkx(cls, g, *, name: str | None = None) -> Graph:
        """Inverse of :meth:`to_networkx` (nodes must carry the :class:`Node` fields)."""
        order = sorted(g.nodes)
        pos = {u: i for i, u in enumerate(order)}
        fields = {f.name for f in dataclasses.fields(Node)} - {"index"}
        nodes = tuple(
            Node(index=pos[u], **{k: v for k, v in g.nodes[u].items() if k in fields})
            for u in order
        )
        edges = tuple(sorted((pos[s], pos[d]) for s, d in g.edges))
        return cls(
            nodes=nodes,
            edges=edges,
            param_bytes=int(g.graph.get("param_bytes", 0)),
            input_bytes=int(g.graph.get("input_bytes", 0)),
            name=name or g.graph.get("name", "graph"),
        )

    def to_json(self, path: str | os.PathLike) -> None:
        """Write networkx node-link JSON in the Checkmate flavour (``name``, ``backward``,
        ``cost_cpu``, ``cost_ram``) plus remat's own fields; ``remat.load_graph`` reads it back."""
        data = {
            "directed": True,
            "multigraph": False,
            "graph": {
                "name": self.name,
                "param_bytes": int(self.param_bytes),
                "input_bytes": int(self.input_bytes),
                "order": list(range(self.n)),
                "cost_unit": self.meta.get("cost_unit", "s"),
            },
            "nodes": [
                {
                    "id": v.index,
                    "name": v.name,
                    "backward": bool(v.is_backward),
                    "cost_cpu": float(v.time_s),
                    "cost_ram": int(v.out_bytes),
                    "flops": float(v.flops),
                    "energy_j": float(v.energy_j),
                    "param_cost": int(v.param_bytes),
                    "forward_index": v.forward_index,
                    "workspace_bytes": int(v.workspace_bytes),
                }
                for v in self.nodes
            ],
            "links": [{"source": int(s), "target": int(d)} for s, d in self.edges],
        }
        with open(path, "w") as f:
            json.dump(data, f, indent=1)

    def summary(self) -> str:
        """One-line description for CLIs and notebooks."""
        from remat.core.errors import format_bytes

        return (
            f"{self.name}: {len(self.forward_nodes)} forward + {len(self.backward_nodes)} backward "
            f"nodes, {len(self.edges)} edges, activations {format_bytes(self.sizes.sum())}, "
            f"no-remat peak {format_bytes(self.no_remat_peak())}, params {format_bytes(self.param_bytes)}"
        )


def make_graph(
    names: Sequence[str],
    edges: Sequence[tuple[int, int]],
    *,
    out_bytes: Sequence[int],
    time_s: Sequence[float],
    is_backward: Sequence[bool] | None = None,
    flops: Sequence[float] | None = None,
    energy_j: Sequence[float] | None = None,
    param_bytes: Sequence[int] | None = None,
    forward_index: Sequence[int | None] | None = None,
    workspace_bytes: Sequence[int] | None = None,
    name: str = "graph",
    meta: Mapping[str, Any] | None = None,
    graph_param_bytes: int | None = None,
    input_bytes: int = 0,
) -> Graph:
    """Build a :class:`Graph` from parallel per-node arrays (already in topological order)."""
    n = len(names)

    def col(x, default):
        return [default] * n if x is None else list(x)

    bw, fl, en, pb, fi, ws = (
        col(is_backward, False),
        col(flops, 0.0),
        col(energy_j, 0.0),
        col(param_bytes, 0),
        col(forward_index, None),
        col(workspace_bytes, 0),
    )
    nodes = tuple(
        Node(
            index=i,
            name=str(names[i]),
            is_backward=bool(bw[i]),
            flops=float(fl[i]),
            out_bytes=int(out_bytes[i]),
            time_s=float(time_s[i]),
            energy_j=float(en[i]),
            param_bytes=int(pb[i]),
            forward_index=None if fi[i] is None else int(fi[i]),
            workspace_bytes=int(ws[i]),
        )
        for i in range(n)
    )
    return Graph(
        nodes=nodes,
        edges=tuple(sorted({(int(s), int(d)) for s, d in edges})),
        param_bytes=int(sum(pb) if graph_param_bytes is None else graph_param_bytes),
        input_bytes=int(input_bytes),
        name=name,
        meta=dict(meta or {}),
    )


def chain_graph(
    n_layers: int,
    *,
    sizes: Sequence[int] | int = 1,
    fwd_costs: Sequence[float] | float = 1.0,
    bwd_costs: Sequence[float] | float | None = None,
    name: str | None = None,
) -> Graph:
    """The canonical chain training graph of Checkmate/rotor: ``f_0 .. f_{L-1}``, a loss node,
    ``b_{L-1} .. b_0``.

    Edges: ``f_i -> f_{i+1}``, ``f_{L-1} -> loss``, ``loss -> b_{L-1}``, ``b_{i+1} -> b_i``, and
    ``f_i -> b_i`` plus ``f_{i-1} -> b_i`` (a layer's backward reads its input and output).
    ``sizes[i]`` is the byte size of ``f_i``'s output (and of ``b_i``'s output gradient);
    the loss node has size ``sizes[-1]``.  ``n = 2L + 1`` nodes.
    """
    L = int(n_layers)
    s = np.broadcast_to(np.asarray(sizes, dtype=np.int64), (L,))
    fc = np.broadcast_to(np.asarray(fwd_costs, dtype=np.float64), (L,))
    bc = 2 * fc if bwd_costs is None else np.broadcast_to(np.asarray(bwd_costs, float), (L,))
    names = [f"f{i}" for i in range(L)] + ["loss"] + [f"b{i}" for i in reversed(range(L))]
    bidx = {i: 2 * L - i for i in range(L)}  # b_i's position
    edges = [(i, i + 1) for i in range(L)]  # f chain, f_{L-1} -> loss
    edges += [(L, bidx[L - 1])] + [(bidx[i + 1], bidx[i]) for i in range(L - 1)]
    edges += [(i, bidx[i]) for i in range(L)] + [(i - 1, bidx[i]) for i in range(1, L)]
    out = list(s) + [int(s[-1])] + [int(s[i]) for i in reversed(range(L))]
    time = list(fc) + [float(fc[-1])] + [float(bc[i]) for i in reversed(range(L))]
    fwd_index = [None] * (L + 1) + [i for i in reversed(range(L))]
    return make_graph(
        names,
        edges,
        out_bytes=out,
        time_s=time,
        is_backward=[False] * (L + 1) + [True] * L,
        forward_index=fwd_index,
        name=name or f"chain{L}",
        meta={"cost_unit": "units"},
    )
