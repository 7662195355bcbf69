"""Toy graphs built by hand, whose program order is a bad one for memory."""

from __future__ import annotations

from remat.core.graph import make_graph


def fan_graph(k: int = 6):
    """``k`` big sources ``x_i`` (100 B), each read by a small ``y_i`` (1 B), summed by ``z``;
    numbered x_1..x_k, y_1..y_k, z: the program order holds every ``x`` at once (peak
    ``100 k + 1``), the order x_1, y_1, x_2, y_2, ... holds one (peak ~ ``100 + k + 1``)."""
    names = [f"x{i}" for i in range(k)] + [f"y{i}" for i in range(k)] + ["z"]
    edges = [(i, k + i) for i in range(k)] + [(k + i, 2 * k) for i in range(k)]
    sizes = [100] * k + [1] * k + [1]
    return make_graph(names, edges, out_bytes=sizes, time_s=[1.0] * (2 * k + 1))


def fan_and_skip_graph(k: int = 6, chain: int = 6):
    """:func:`fan_graph` (badly numbered) feeding a chain ``c_0 .. c_{chain-1}`` (60 B each)
    whose last node ``w`` also reads ``c_0``: holding ``c_0`` across the chain peaks at 180 B,
    recomputing it from ``z`` at 121 B, so a 130 B budget needs recomputation in any order."""
    names = [f"x{i}" for i in range(k)] + [f"y{i}" for i in range(k)] + ["z"]
    edges = [(i, k + i) for i in range(k)] + [(k + i, 2 * k) for i in range(k)]
    sizes = [100] * k + [1] * k + [1]
    z = 2 * k
    for j in range(chain):
        names.append(f"c{j}")
        edges.append((z if j == 0 else len(names) - 2, len(names) - 1))
        sizes.append(60)
    names.append("w")
    edges += [(len(names) - 2, len(names) - 1), (z + 1, len(names) - 1)]
    sizes.append(1)
    return make_graph(names, edges, out_bytes=sizes, time_s=[1.0] * len(names))
