"""remat.load_graph / Graph.to_json / Graph.to_networkx on the published Checkmate and Moccasin
graphs and on malformed files.

Expected values are read from the raw JSON with ``json`` (not through the loader).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pkgutil

import networkx as nx
import numpy as np
import pytest
from helpers.bench_graphs import FILES, needs_bench

import policies
import remat
from remat.core import errors
from remat.core.errors import InvalidGraphError

bench_files = pytest.mark.parametrize("path", FILES, ids=[p.stem[:24] for p in FILES])


def raw(path):
    """Independent parse: (order of ids, {id: (name, size, cost, backward)}, set of id edges)."""
    data = json.load(open(path))
    nodes = {}
    file_ids = []
    for nd in data["nodes"]:
        nid = nd["id"] if "id" in nd else nd["name"]
        file_ids.append(nid)
        if "cost_ram" in nd:
            nodes[nid] = (str(nd["name"]), nd["cost_ram"], nd["cost_cpu"], bool(nd["backward"]))
        else:
            nodes[nid] = (str(nd["name"]), nd["out_cost"], nd["duration"], False)
    edges = set()
    for link in data["links"]:
        s, d = (link["source"], link["target"]) if "source" in link else (link["0"], link["1"])
        edges.add((s, d))
    order = data.get("graph", {}).get("order")
    if order is None:
        # the Checkmate files are topologically sorted: the loader must keep file order
        pos = {u: i for i, u in enumerate(file_ids)}
        assert all(pos[s] < pos[d] for s, d in edges)
        order = file_ids
    return order, nodes, edges


def same_graph(a: remat.Graph, b: remat.Graph) -> None:
    assert a.nodes == b.nodes  # every Node field, exact floats
    assert a.edges == b.edges
    assert a.param_bytes == b.param_bytes
    assert a.input_bytes == b.input_bytes


# ------------------------------------------------------------------ published graphs
@needs_bench
@bench_files
def test_loads_with_order_costs_and_sizes(path):
    g = remat.load_graph(path)
    order, nodes, edges = raw(path)
    assert g.n == len(order)
    assert g.name == path.stem
    assert [v.name for v in g.nodes] == [nodes[u][0] for u in order]
    assert [v.out_bytes for v in g.nodes] == [nodes[u][1] for u in order]
    assert [v.time_s for v in g.nodes] == [float(nodes[u][2]) for u in order]
    assert [v.is_backward for v in g.nodes] == [nodes[u][3] for u in order]
    pos = {u: i for i, u in enumerate(order)}
    assert set(g.edges) == {(pos[s], pos[d]) for s, d in edges}
    assert len(g.edges) == len(edges)


@needs_bench
def test_all_published_graphs_present():
    stems = {p.stem.split("_b")[0].split("_n")[0] for p in FILES}
    for model in ("VGG16", "VGG19", "ResNet50", "MobileNet", "fcn_8_vgg", "segnet", "vgg_unet"):
        assert any(s.startswith(model) for s in stems), model
    assert sum(p.name.startswith("random_layered") for p in FILES) == 4


@needs_bench
@bench_files
def test_json_round_trip(path, tmp_path):
    g = remat.load_graph(path)
    out = tmp_path / "copy.json"
    g.to_json(out)
    g2 = remat.load_graph(out)
    same_graph(g, g2)
    assert g2.meta["graph_name"] == g.name
    assert g2.meta["cost_unit"] == g.meta["cost_unit"]
    # and the written file is plain node-link JSON that networkx itself reads
    h = nx.node_link_graph(json.load(open(out)), edges="links")
    assert h.number_of_nodes() == g.n and h.number_of_edges() == len(g.edges)


@needs_bench
@bench_files
def test_networkx_round_trip(path):
    g = remat.load_graph(path)
    h = g.to_networkx()
    assert isinstance(h, nx.DiGraph) and nx.is_directed_acyclic_graph(h)
    assert h.number_of_nodes() == g.n and h.number_of_edges() == len(g.edges)
    same_graph(g, remat.Graph.from_networkx(h))


def test_round_trips_keep_every_field(tmp_path):
    g = remat.make_graph(
        ["in", "mid", "loss", "g_mid"],
        [(0, 1), (1, 2), (2, 3), (0, 3)],
        out_bytes=[10, 20, 4, 20],
        time_s=[0.5, 1.25, 0.125, 2.5],
        is_backward=[False, False, False, True],
        flops=[1e3, 2e3, 10.0, 4e3],
        energy_j=[1e-6, 2e-6, 1e-8, 4e-6],
        param_bytes=[0, 64, 0, 0],
        forward_index=[None, None, None, 1],
        name="tiny",
        meta={"cost_unit": "s"},
        input_bytes=40,
    )
    g.to_json(tmp_path / "tiny.json")
    g2 = remat.load_graph(tmp_path / "tiny.json")
    same_graph(g, g2)
    assert g2.nodes[3].forward_index == 1
    assert g2.meta["cost_unit"] == "s"
    same_graph(g, remat.Graph.from_networkx(g.to_networkx()))


def test_moccasin_flavour_string_order_and_list_keyed_links(tmp_path):
    # Moccasin files: links keyed "0"/"1", graph.order gives the order (here not id order).
    data = {
        "directed": True,
        "multigraph": False,
        "graph": {"name": "m", "order": [0, 2, 1]},
        "nodes": [
            {"name": 0, "out_cost": 5, "duration": 1, "param_cost": 3},
            {"name": 1, "out_cost": 7, "duration": 2, "param_cost": 0},
            {"name": 2, "out_cost": 11, "duration": 0, "param_cost": 0},
        ],
        "links": [{"0": 0, "1": 2}, {"0": 2, "1": 1}, {"0": 0, "1": 1}],
    }
    (tmp_path / "m.json").write_text(json.dumps(data))
    g = remat.load_graph(tmp_path / "m.json")
    assert [v.name for v in g.nodes] == ["0", "2", "1"]
    assert [v.out_bytes for v in g.nodes] == [5, 11, 7]
    assert [v.param_bytes for v in g.nodes] == [3, 0, 0]
    assert g.edges == ((0, 1), (0, 2), (1, 2))
    # without graph.order: topological order, ties broken by file position
    del data["graph"]["order"]
    (tmp_path / "m2.json").write_text(json.dumps(data))
    assert [v.name for v in remat.load_graph(tmp_path / "m2.json").nodes] == ["0", "2", "1"]


# ------------------------------------------------------------------ malformed files
def checkmate_file(tmp_path, nodes=None, links=None, text=None):
    nodes = (
        nodes
        if nodes is not None
        else [
            {"id": 0, "name": "conv", "backward": False, "cost_cpu": 3, "cost_ram": 8},
            {"id": 1, "name": "relu", "backward": False, "cost_cpu": 1, "cost_ram": 8},
            {"id": 2, "name": "grad_conv", "backward": True, "cost_cpu": 6, "cost_ram": 8},
        ]
    )
    links = links if links is not None else [
        {"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 0, "target": 2}
    ]
    path = tmp_path / "bad.json"
    path.write_text(text if text is not None else json.dumps(
        {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}
    ))
    return path


def test_good_file_loads(tmp_path):
    g = remat.load_graph(checkmate_file(tmp_path))
    assert [v.name for v in g.nodes] == ["conv", "relu", "grad_conv"]
    assert g.nodes[2].is_backward and g.no_remat_peak() == 24


def base_nodes():
    return [
        {"id": 0, "name": "conv", "backward": False, "cost_cpu": 3, "cost_ram": 8},
        {"id": 1, "name": "relu", "backward": False, "cost_cpu": 1, "cost_ram": 8},
        {"id": 2, "name": "grad_conv", "backward": True, "cost_cpu": 6, "cost_ram": 8},
    ]


def with_node(i, **changes):
    nodes = base_nodes()
    nodes[i].update(changes)
    for k, v in changes.items():
        if v is ...:
            del nodes[i][k]
    return nodes


@pytest.mark.parametrize(
    "nodes,links,culprit",
    [
        (None, [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 2, "target": 0}], None),
        (with_node(1, cost_ram=...), None, "relu"),
        (with_node(2, cost_cpu=...), None, "grad_conv"),
        (with_node(1, cost_ram=-8), None, "relu"),
        (with_node(2, cost_cpu=-1), None, "grad_conv"),
        (with_node(1, cost_ram=float("nan")), None, "relu"),
        (with_node(1, cost_cpu=float("inf")), None, "relu"),
        (with_node(1, cost_ram=2.5), None, "relu"),
        (with_node(1, cost_ram="many"), None, "relu"),
        (None, [{"source": 0, "target": 1}, {"source": 1, "target": 7}], 7),
        (None, [{"source": 0, "target": 1}, {"source": 1, "target": 1}], "relu"),
        (None, [{"from": 0, "to": 1}], None),
        (base_nodes() + [dict(base_nodes()[0])], None, "conv"),
    ],
    ids=[
        "cycle", "missing-size", "missing-cost", "negative-size", "negative-cost", "nan-size",
        "inf-cost", "fractional-size", "non-numeric", "missing-node", "self-loop", "bad-link",
        "duplicate-id",
    ],
)
def test_bad_graphs_raise_invalid_graph_error_naming_the_node(tmp_path, nodes, links, culprit):
    with pytest.raises(InvalidGraphError) as e:
        remat.load_graph(checkmate_file(tmp_path, nodes, links))
    if culprit is not None:
        assert repr(culprit) in str(e.value)
        assert e.value.node == culprit


def test_cycle_message_names_its_nodes(tmp_path):
    links = [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 2, "target": 1}]
    with pytest.raises(InvalidGraphError) as e:
        remat.load_graph(checkmate_file(tmp_path, links=links))
    assert "relu" in str(e.value) and "grad_conv" in str(e.value)
    assert e.value.node in ("relu", "grad_conv")


@pytest.mark.parametrize(
    "text",
    ['{"nodes": [', "", "[1, 2, 3]", '{"nodes": []}', '{"nodes": [], "links": []}',
     '{"nodes": [{"id": 0, "name": "x"}], "links": []}', '{"nodes": 3, "links": []}'],
    ids=["truncated", "empty", "list", "no-links", "no-nodes", "no-flavour", "nodes-not-list"],
)
def test_unreadable_files(tmp_path, text):
    with pytest.raises(InvalidGraphError):
        remat.load_graph(checkmate_file(tmp_path, text=text))


def test_invalid_json_names_the_file(tmp_path):
    path = checkmate_file(tmp_path, text='{"nodes": [}')
    with pytest.raises(InvalidGraphError) as e:
        remat.load_graph(path)
    assert "bad.json" in str(e.value)


def test_bad_graph_order(tmp_path):
    nodes = [
        {"name": 0, "out_cost": 1, "duration": 1},
        {"name": 1, "out_cost": 1, "duration": 1},
    ]
    for order, culprit in (([1, 0], 1), ([0], None), ([0, 0], None), ("01", None)):
        path = tmp_path / "o.json"
        path.write_text(json.dumps(
            {"graph": {"order": order}, "nodes": nodes, "links": [{"0": 0, "1": 1}]}
        ))
        with pytest.raises(InvalidGraphError) as e:
            remat.load_graph(path)
        if culprit is not None:
            assert e.value.node == "1"


# ------------------------------------------------------------------ through simulate and policies
def not_applicable_errors() -> tuple[type[BaseException], ...]:
    """The typed errors a policy raises when a graph is outside its scope (e.g. ChainDP given a
    DAG, a scan planner given a graph without scans): ``NotApplicableError`` only (these graphs
    passed the loader's checks, so ``InvalidGraphError`` would be a wrong answer)."""
    return (errors.NotApplicableError,)


def _register_all() -> list[str]:
    # every policy module registers itself on import, also those policies/__init__ lacks so far
    for mod in pkgutil.iter_modules(policies.__path__):
        importlib.import_module(f"policies.{mod.name}")
    return policies.available()


POLICY_GRAPHS = ("VGG16_b256", "random_layered_n100")


def policy_graphs():
    gs = [remat.chain_graph(4, sizes=[4, 8, 8, 2], name="chain4")]
    gs += [remat.load_graph(p) for p in FILES if p.name.startswith(POLICY_GRAPHS)]
    return gs


@needs_bench
@bench_files
def test_loaded_graphs_simulate(path):
    g = remat.load_graph(path)
    r = remat.simulate(g, policies.checkpoint_all_plan(g))
    assert r.recomputations == 0 and r.overhead == pytest.approx(1.0)
    assert r.compute_time_s == pytest.approx(float(np.sum([v.time_s for v in g.nodes])))
    assert r.peak_bytes == g.no_remat_peak()


def make_policy(name: str):
    # keep exact solvers inside the test-time budget; the loose budget makes them easy (OLLA's
    # order search has nothing to gain there: a short limit keeps the suite fast)
    limit = 5 if name == "olla" else 20
    opts = {"time_limit": limit} if "time_limit" in policies.option_names(name) else {}
    return policies.get(name, **opts)


@pytest.mark.parametrize("name", _register_all())
def test_every_policy_gives_a_valid_plan_at_a_loose_budget(name):
    for g in policy_graphs():
        budget = g.no_remat_peak()  # loose: checkpoint-all fits exactly
        if getattr(type(make_policy(name)), "budget_kind", "live_bytes") == "arena_bytes":
            budget = int(1.25 * budget)  # the budget caps a pool layout: room for fragmentation
        try:
            plan = make_policy(name).plan(g, budget=budget)
        except not_applicable_errors():
            continue
        plan.validate(g)
        assert plan.R.shape[1] == g.n and plan.R.any(axis=0).all()
        rep = remat.simulate(g, plan)
        if plan.meta.get("budget") is not None:
            assert rep.peak_bytes <= budget, (name, g.name)
        assert rep.overhead >= 1.0 - 1e-9
        assert math.isfinite(rep.compute_time_s)


def test_node_fields_cover_the_json_writer():
    # every Node field must survive to_json (a new field without a writer would be lost)
    written = {"index", "name", "is_backward", "flops", "out_bytes", "time_s", "energy_j",
               "param_bytes", "forward_index", "workspace_bytes"}
    assert {f.name for f in dataclasses.fields(remat.Node)} == written
