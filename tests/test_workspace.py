"""Scratch memory of a depthwise convolution's weight gradient (:mod:`remat.workspace`):
against XLA:CPU's compiled temp, in the graph, the memory model and the hierarchical options."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat.compiled_budget import step_temp_bytes
from remat.core.graph import make_graph
from remat.workspace import eqn_workspace_bytes
from remat.xla_memory import predict_step_temp_bytes
from solvers.hierarchical import block_chain, block_options


def _depthwise(c: int, s: int = 2, b: int = 8):
    def loss(w, x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=c,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(jnp.tanh(y) ** 2)

    return loss, jnp.full((3, 3, 1, c), 0.1), jnp.linspace(-1, 1, b * s * s * c).reshape(b, s, s, c)


@pytest.mark.parametrize("c", [128, 240])
def test_the_workspace_is_what_the_compiled_step_allocates(c):
    """The weight gradient's dense ``[3, 3, C, C]`` product and its masked copy: the compiled
    temp of a step whose activations are a few KiB is the workspace, within the activations."""
    loss, w, x = _depthwise(c)
    jx = jax.make_jaxpr(jax.grad(loss))(w, x)
    ws = sum(eqn_workspace_bytes(e) for e in jx.eqns)
    assert ws == 2 * 9 * c * c * 4
    act = x.size * 4
    temp = step_temp_bytes(loss, (w, x))
    assert ws <= temp <= ws + 4 * act, (ws, temp)
    pred = predict_step_temp_bytes(loss, w, x)
    assert abs(pred - temp) <= 0.1 * temp, (pred, temp)


def test_only_batch_grouped_convolutions_on_the_cpu_have_one():
    loss, w, x = _depthwise(16)
    eqns = [e for e in jax.make_jaxpr(jax.grad(loss))(w, x).eqns
            if e.primitive.name == "conv_general_dilated"]
    groups = sorted(int(e.params["batch_group_count"]) for e in eqns)
    assert groups == [1, 16]
    assert [eqn_workspace_bytes(e) > 0 for e in eqns] == [
        int(e.params["batch_group_count"]) > 1 for e in eqns]
    assert all(eqn_workspace_bytes(e, "gpu") == 0 for e in eqns)
    from remat.core.errors import ExtractionError

    with pytest.raises(ExtractionError):
        eqn_workspace_bytes("conv_general_dilated")


def test_extraction_puts_it_on_the_weight_gradient_node_only():
    loss, w, x = _depthwise(64)
    g = remat.extract(loss, w, x, stages="eqn")
    ws = g.workspace
    assert ws.shape == (g.n,)
    (i,) = np.flatnonzero(ws)
    assert g.nodes[i].is_backward and ws[i] == 2 * 9 * 64 * 64 * 4
    assert g.meta["node_primitives"][i] == ("conv_general_dilated",)
    # a graph without the field (loaded, hand-built) has none
    h = make_graph(["a", "b"], [(0, 1)], out_bytes=[4, 4], time_s=[1.0, 1.0])
    assert not h.workspace.any()


def test_it_travels_with_its_node_through_a_reorder_and_a_file(tmp_path):
    """A node's scratch is the node's: a relabelled graph (another topological order) and a
    graph written and loaded again keep it on the same stage."""
    from policies.reorder import relabel

    diamond = make_graph(["a", "b", "c", "d"], [(0, 1), (0, 2), (1, 3), (2, 3)],
                         out_bytes=[4] * 4, time_s=[1.0] * 4, workspace_bytes=[0, 7, 0, 0])
    h = relabel(diamond, [0, 2, 1, 3])
    assert [v.name for v in h.nodes] == ["a", "c", "b", "d"]
    assert h.workspace.tolist() == [0, 0, 7, 0]
    loss, w, x = _depthwise(64)
    g = remat.extract(loss, w, x, stages="eqn")
    g.to_json(tmp_path / "g.json")
    back = remat.load_graph(tmp_path / "g.json")
    assert back.workspace.any()
    np.testing.assert_array_equal(back.workspace, g.workspace)


def test_a_negative_workspace_is_a_typed_error(tmp_path):
    import json

    from remat.core.errors import InvalidGraphError

    with pytest.raises(InvalidGraphError, match="negative workspace"):
        make_graph(["a", "b"], [(0, 1)], out_bytes=[4, 4], time_s=[1.0, 1.0],
                   workspace_bytes=[0, -1])
    g = make_graph(["a", "b"], [(0, 1)], out_bytes=[4, 4], time_s=[1.0, 1.0])
    g.to_json(tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    data["nodes"][1]["workspace_bytes"] = -8
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(InvalidGraphError, match="workspace_bytes"):
        remat.load_graph(tmp_path / "bad.json")


def test_a_blocks_backward_transient_counts_it():
    """The hierarchical options' backward transient holds the workspace while its node runs:
    the same graph without it gives transients smaller by at most that, and some smaller."""
    import dataclasses

    loss, w, x = _depthwise(64)
    g = remat.extract(loss, w, x, stages="eqn")
    bare = dataclasses.replace(g, nodes=tuple(dataclasses.replace(v, workspace_bytes=0)
                                              for v in g.nodes))
    ws = int(g.workspace.max())
    chain = block_chain(g)
    got = [block_options(g, blk).options for blk in chain.blocks]
    ref = [block_options(bare, blk).options for blk in chain.blocks]
    diffs = [a.bwd_transient - b.bwd_transient for oa, ob in zip(got, ref) for a, b in zip(oa, ob)]
    assert all(0 <= d <= ws for d in diffs) and max(diffs) > 0, diffs
