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
import math
import os
from typing import Any

from remat.core.errors import InvalidGraphError
from remat.core.graph import Graph, make_graph

_CHECKMATE = ("cost_cpu", "cost_ram")
_MOCCASIN = ("duration", "out_cost")


def _link_ends(link: Any) -> tuple[Any, Any]:
    if isinstance(link, dict):
        for a, b in (("source", "target"), ("0", "1"), (0, 1)):
            if a in link and b in link:
                return link[a], link[b]
    elif isinstance(link, (list, tuple)) and len(link) >= 2:
        return link[0], link[1]
    raise InvalidGraphError(f"link {link!r} has neither source/target nor '0'/'1' keys")


def _number(nd: dict[str, Any], key: str, label: Any, *, integral: bool) -> float | int:
    """Read one numeric node attribute; reject non-numbers, NaN/inf, negatives, fractions."""
    value = nd[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise InvalidGraphError(f"non-numeric attribute {key}={nd[key]!r}", node=label) from None
    if not math.isfinite(value):
        raise InvalidGraphError(f"non-finite attribute {key}={value!r}", node=label)
    if value < 0:
        raise InvalidGraphError(f"negative attribute {key}={value!r}", node=label)
    if integral:
        if value != int(value):
            raise InvalidGraphError(f"attribute {key}={value!r} is not a whole byte count", node=label)
        return int(value)
    return float(value)


def graph_from_node_link(
    data: dict[str, Any], *, name: str | None = None, source: str | None = None
) -> Graph:
    """Build a :class:`~remat.Graph` from a parsed node-link dictionary (see module doc).

    Raises:
      InvalidGraphError: a malformed graph; when a node is to blame the message names it
        (``InvalidGraphError.node``).
    """
    import networkx as nx

    if not isinstance(data, dict):
        raise InvalidGraphError(f"not a node-link graph: top level is a {type(data).__name__}")
    if "nodes" not in data or ("links" not in data and "edges" not in data):
        raise InvalidGraphError("not a node-link graph: needs 'nodes' and 'links'")
    nodes = data["nodes"]
    links = data["links"] if "links" in data else data["edges"]
    if not isinstance(nodes, list) or not isinstance(links, list):
        raise InvalidGraphError("not a node-link graph: 'nodes' and 'links' must be lists")
    if not nodes:
        raise InvalidGraphError("graph has no nodes")
    for pos, nd in enumerate(nodes):
        if not isinstance(nd, dict):
            raise InvalidGraphError(f"node entry {nd!r} is not an object", node=pos)
    # The flavour is the one any node carries completely; a node lacking one of its attributes
    # is then reported by name below.
    if any(all(k in nd for k in _CHECKMATE) for nd in nodes):
        flavour, need = "checkmate", _CHECKMATE
    elif any(all(k in nd for k in _MOCCASIN) for nd in nodes):
        flavour, need = "moccasin", _MOCCASIN
    else:
        first = nodes[0]
        raise InvalidGraphError(
            "unknown attribute flavour: nodes need cost_cpu/cost_ram (Checkmate) or "
            "duration/out_cost (Moccasin)",
            node=first.get("name", first.get("id", 0)),
        )
    size_key, cost_key = ("cost_ram", "cost_cpu") if flavour == "checkmate" else ("out_cost", "duration")
    ids = []
    attrs = {}
    for pos, nd in enumerate(nodes):
        nid = nd.get("id", nd.get("name", pos))
        label = nd.get("name", nid)
        try:
            hash(nid)
        except TypeError:
            raise InvalidGraphError(f"unhashable node id {nid!r}", node=pos) from None
        for key in need:
            if key not in nd or nd[key] is None:
                raise InvalidGraphError(f"missing attribute {key!r}", node=label)
        size = _number(nd, size_key, label, integral=True)
        cost = _number(nd, cost_key, label, integral=False)
        param = _number(nd, "param_cost", label, integral=True) if nd.get("param_cost") is not None else 0
        flops = _number(nd, "flops", label, integral=False) if nd.get("flops") is not None else 0.0
        energy = _number(nd, "energy_j", label, integral=False) if nd.get("energy_j") is not None else 0.0
        work = (_number(nd, "workspace_bytes", label, integral=True)
                if nd.get("workspace_bytes") is not None else 0)
        if nid in attrs:
            raise InvalidGraphError("duplicate node id", node=label)
        ids.append(nid)
        attrs[nid] = dict(
            name=str(label),
            size=size,
            cost=cost,
            backward=bool(nd.get("backward", False)),
            param=param,
            flops=flops,
            energy=energy,
            fwd=nd.get("forward_index"),
            work=work,
        )
    g = nx.DiGraph()
    g.add_nodes_from(ids)
    for link in links:
        s, d = _link_ends(link)
        for end in (s, d):
            try:
                known = end in attrs
            except TypeError:  # an unhashable end (a list, a dict) cannot name a node
                known = False
            if not known:
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
    if not isinstance(meta_graph, dict):
        raise InvalidGraphError("the 'graph' entry of a node-link file must be an object")
    order = meta_graph.get("order")
    if order is not None:
        by_str = {str(u): u for u in ids}  # graph.order may spell ids as strings (or vice versa)
        if not isinstance(order, list) or sorted(map(str, order)) != sorted(by_str):
            raise InvalidGraphError("graph.order is not a permutation of the node ids")
        order = [by_str[str(o)] for o in order]
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
        fwd_index = []
        for c in cols:
            f = c["fwd"]
            if f is not None and not (isinstance(f, int) and 0 <= f < len(ids)):
                raise InvalidGraphError(f"forward_index {f!r} is not a node position", node=c["name"])
            fwd_index.append(None if f is None else pos[ids[f]])
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
        workspace_bytes=[c["work"] for c in cols],
        name=str(gname),
        meta={
            "flavour": flavour,
            "cost_unit": meta_graph.get("cost_unit", "profiled units"),
            "graph_name": str(meta_graph.get("name", "")),  # the file's own label
            **({"source": source} if source is not None else {}),
        },
        graph_param_bytes=meta_graph.get("param_bytes"),
        input_bytes=int(meta_graph.get("input_bytes", 0) or 0),
    )


def load_graph(path: str | os.PathLike, *, name: str | None = None) -> Graph:
    """Load a training graph from networkx node-link JSON (Checkmate or Moccasin flavour).

    Args:
      path: the JSON file.
      name: the graph's name; default: the file name without ``.json`` (the label inside the
        file is kept in ``graph.meta["graph_name"]``, the path in ``graph.meta["source"]``).

    Returns:
      A :class:`~remat.Graph` in the file's node order (``graph.order``, else a topological
      order that keeps a topologically sorted file's order). ``out_bytes`` = ``cost_ram`` /
      ``out_cost`` (bytes); ``time_s`` = ``cost_cpu`` / ``duration`` (the file's profiled units,
      see ``meta["cost_unit"]``); ``param_bytes`` = ``param_cost``.

    Raises:
      InvalidGraphError: unreadable JSON, a cycle, a missing or negative attribute (the error
        names the node).
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidGraphError(f"{os.fspath(path)} is not valid JSON: {exc}") from None
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return graph_from_node_link(data, name=name or stem, source=os.fspath(path))
