"""Reading published training graphs (networkx node-link JSON).

Two attribute flavours are understood:

* **Checkmate** (Jain et al., MLSys 2020, as republished by Moccasin): nodes carry ``name``,
  ``backward`` (bool), ``cost_cpu`` (profiled time units) and ``cost_ram`` (output bytes);
  links carry ``source``/``target``.
* **Moccasin random layered DAGs**: nodes carry ``duration``, ``out_cost``, ``param_cost``;
  links may be keyed ``"0"``/``"1"``; ``graph.order`` gives the node order.

The node order is ``graph.order`` when present, otherwise a topological sort that breaks ties by
node id (so a file already in topological order keeps its order).
"""

from __future__ import annotations

import json
import os
from typing import Any

from remat.errors import InvalidGraphError
from remat.graph import Graph, make_graph

_CHECKMATE = ("cost_cpu", "cost_ram")
_MOCCASIN = ("duration", "out_cost")


def _link_ends(link: dict[str, Any]) -> tuple[Any, Any]:
    for a, b in (("source", "target"), ("0", "1"), (0, 1)):
        if a in link and b in link:
            return link[a], link[b]
    raise InvalidGraphError(f"link {link!r} has neither source/target nor '0'/'1' keys")


def graph_from_node_link(data: dict[str, Any], *, name: str | None = None) -> Graph:
    """Build a :class:`~remat.Graph` from a parsed node-link dictionary (see module doc)."""
    import networkx as nx

    if "nodes" not in data or "links" not in data and "edges" not in data:
        raise InvalidGraphError("not a node-link graph: needs 'nodes' and 'links'")
    nodes = data["nodes"]
    if not nodes:
        raise InvalidGraphError("graph has no nodes")
    first = nodes[0]
    if all(k in first for k in _CHECKMATE):
        flavour = "checkmate"
    elif all(k in first for k in _MOCCASIN):
        flavour = "moccasin"
    else:
        raise InvalidGraphError(
            "unknown attribute flavour: nodes need cost_cpu/cost_ram (Checkmate) or "
            "duration/out_cost (Moccasin)",
            node=first.get("name", first.get("id", 0)),
        )
    ids = []
    attrs = {}
    for pos, nd in enumerate(nodes):
        nid = nd.get("id", nd.get("name", pos))
        label = nd.get("name", nid)
        if flavour == "checkmate":
            need = _CHECKMATE
        else:
            need = _MOCCASIN
        for key in need:
            if key not in nd or nd[key] is None:
                raise InvalidGraphError(f"missing attribute {key!r}", node=label)
        try:
            if flavour == "checkmate":
                size, cost = int(nd["cost_ram"]), float(nd["cost_cpu"])
                backward = bool(nd.get("backward", False))
                param = int(nd.get("param_cost", 0) or 0)
            else:
                size, cost = int(nd["out_cost"]), float(nd["duration"])
                backward = bool(nd.get("backward", False))
                param = int(nd.get("param_cost", 0) or 0)
        except (TypeError, ValueError) as exc:
            raise InvalidGraphError(f"non-numeric attribute ({exc})", node=label) from None
        if size < 0:
            raise InvalidGraphError(f"negative output size {size}", node=label)
        if cost < 0:
            raise InvalidGraphError(f"negative cost {cost}", node=label)
        if param < 0:
            raise InvalidGraphError(f"negative parameter size {param}", node=label)
        if nid in attrs:
            raise InvalidGraphError("duplicate node id", node=label)
        ids.append(nid)
        attrs[nid] = dict(
            name=str(label),
            size=size,
            cost=cost,
            backward=backward,
            param=param,
            flops=float(nd.get("flops", 0.0) or 0.0),
            energy=float(nd.get("energy_j", 0.0) or 0.0),
            fwd=nd.get("forward_index"),
        )
    g = nx.DiGraph()
    g.add_nodes_from(ids)
    for link in data.get("links", data.get("edges", [])):
        s, d = _link_ends(link)
        for end in (s, d):
            if end not in attrs:
                raise InvalidGraphError(f"link refers to a missing node {end!r}", node=end)
        if s == d:
            raise InvalidGraphError("self-loop", node=attrs[s]["name"])
        g.add_edge(s, d)
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        raise InvalidGraphError(
            "graph has a cycle: " + " -> ".join(str(attrs[u]["name"]) for u, _ in cycle),
            node=attrs[cycle[0][0]]["name"],
        )
    meta_graph = data.get("graph", {}) or {}
    order = meta_graph.get("order")
    if order is not None:
        order = [type(ids[0])(o) if not isinstance(o, type(ids[0])) else o for o in order]
        if sorted(map(str, order)) != sorted(map(str, ids)):
            raise InvalidGraphError("graph.order is not a permutation of the node ids")
        pos = {u: i for i, u in enumerate(order)}
        for s, d in g.edges:
            if pos[s] >= pos[d]:
                raise InvalidGraphError(
                    f"graph.order puts a reader before its input {attrs[s]['name']!r}",
                    node=attrs[d]["name"],
                )
    else:
        rank = {u: i for i, u in enumerate(ids)}
        order = list(nx.lexicographical_topological_sort(g, key=lambda u: rank[u]))
    pos = {u: i for i, u in enumerate(order)}
    cols = [attrs[u] for u in order]
    names = [c["name"] for c in cols]
    if len(set(names)) != len(names):  # keep names unique for reports
        names = [f"{c['name']}#{i}" for i, c in enumerate(cols)]
    fwd_index = None  # files written by remat carry forward_index (an index in file order)
    if any(c["fwd"] is not None for c in cols):
        fwd_index = [None if c["fwd"] is None else pos[ids[int(c["fwd"])]] for c in cols]
    gname = name or meta_graph.get("name") or "graph"
    return make_graph(
        names,
        [(pos[s], pos[d]) for s, d in g.edges],
        out_bytes=[c["size"] for c in cols],
        time_s=[c["cost"] for c in cols],
        is_backward=[c["backward"] for c in cols],
        flops=[c["flops"] for c in cols],
        energy_j=[c["energy"] for c in cols],
        param_bytes=[c["param"] for c in cols],
        forward_index=fwd_index,
        name=str(gname),
        meta={
            "flavour": flavour,
            "cost_unit": meta_graph.get("cost_unit", "profiled units"),
        },
        graph_param_bytes=meta_graph.get("param_bytes"),
        input_bytes=int(meta_graph.get("input_bytes", 0) or 0),
    )


def load_graph(path: str | os.PathLike, *, name: str | None = None) -> Graph:
    """Load a training graph from networkx node-link JSON (Checkmate or Moccasin flavour).

    Raises:
      InvalidGraphError: unreadable JSON, a cycle, a missing or negative attribute (the error
        names the node).
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise InvalidGraphError(f"{os.fspath(path)} is not valid JSON: {exc}") from None
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    g = graph_from_node_link(data, name=name or stem)
    return g
