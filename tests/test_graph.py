"""Graph construction, validation and the checkpoint-all peak against hand counts."""

import networkx as nx
import numpy as np
import pytest

import policies
import remat
from remat.core.errors import InvalidGraphError


@pytest.mark.parametrize("L", [1, 2, 5, 16])
def test_chain_checkpoint_all_peak_is_L_plus_2_units(L):
    # Hand count: at the first backward step f_0..f_{L-1}, the loss output and b_{L-1} are live.
    g = remat.chain_graph(L, sizes=1)
    assert g.no_remat_peak() == L + 2
    assert remat.simulate(g, policies.checkpoint_all_plan(g)).peak_bytes == L + 2


def test_chain_heterogeneous_peak_hand_count():
    # sizes f0=5, f1=1, f2=3; loss has size 3 (= f2).  Step by step (node: live set):
    #  f0: {f0}=5; f1: {f0,f1}=6; f2: 9; loss: 12; b2 (reads loss, f2, f1): 12+3=15;
    #  b1 (reads b2, f1, f0): f0,f1,b2,b1 = 5+1+3+1 = 10; b0 (reads b1, f0): f0,b1,b0 = 11.
    g = remat.chain_graph(3, sizes=[5, 1, 3])
    assert g.no_remat_peak() == 15
    rep = remat.simulate(g, policies.checkpoint_all_plan(g))
    assert rep.peak_bytes == 15
    assert list(rep.timeline["live_bytes"]) == [5, 6, 9, 12, 15, 10, 11]
    assert rep.overhead == pytest.approx(1.0)


def test_chain_structure():
    g = remat.chain_graph(3)
    assert [v.name for v in g.nodes] == ["f0", "f1", "f2", "loss", "b2", "b1", "b0"]
    assert g.is_chain()
    assert g.preds[g.n - 1] == (0, 5)  # b0 reads f0 and b1
    assert g.nodes[4].forward_index == 2
    assert len(g.forward_nodes) == 4 and len(g.backward_nodes) == 3


def test_graph_rejects_backward_edges_and_negative_sizes():
    with pytest.raises(InvalidGraphError, match="backwards"):
        remat.make_graph(["a", "b"], [(1, 0)], out_bytes=[1, 1], time_s=[1, 1])
    with pytest.raises(InvalidGraphError, match="negative"):
        remat.make_graph(["a", "b"], [(0, 1)], out_bytes=[1, -1], time_s=[1, 1])


def test_networkx_round_trip_keeps_everything():
    g = remat.chain_graph(4, sizes=[1, 2, 3, 4], fwd_costs=[1.0, 2.0, 3.0, 4.0])
    nxg = g.to_networkx()
    assert isinstance(nxg, nx.DiGraph)
    assert nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_edges() == len(g.edges)
    back = remat.Graph.from_networkx(nxg)
    assert back.nodes == g.nodes
    assert back.edges == g.edges
    assert np.array_equal(back.sizes, g.sizes)
