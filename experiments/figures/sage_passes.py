"""Sage §3.2 graph passes: memory and FLOP effect of operator fusion and subgraph reduction
(:mod:`remat.core.passes`) per zoo model.

For each model the per-equation training graph (``stages="eqn"``: every value materialised,
Sage's unoptimised graph) is fused (:func:`remat.core.passes.fuse`) and then reduced
(:func:`remat.core.passes.reduce_subgraphs`, K_w = K_h = 5); the no-remat peak
(:meth:`remat.Graph.no_remat_peak`, bytes) and the FLOPs of one training step are reported for
each, with the executable ``stages="sage"`` and ``stages="auto"`` graphs for reference.  Models
are traced with abstract arrays (shapes only), so full sizes cost nothing to run.

Writes ``experiments/results/sage_passes.csv``:

    python experiments/figures/sage_passes.py           # full-size models, batch 32, ~1 min
    python experiments/figures/sage_passes.py --quick   # small sizes, batch 4, ~10 s
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import remat
from experiments.tables import write_rows
from remat.core import passes
from remat.extraction import extract

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "sage_passes.csv"

FULL = {
    "mlp": dict(),
    "resnet50": dict(),
    "mobilenet_v2": dict(),
    "bert_small": dict(dropout=0.0),
    "gpt2_small": dict(dropout=0.0),
}
QUICK = {
    "mlp": dict(depth=4, width=64),
    "resnet50": dict(image_size=32, width=8, stage_sizes=(1, 1, 1, 1)),
    "bert_small": dict(hidden=64, num_layers=2, num_heads=2, seq_len=16, vocab_size=256,
                       dropout=0.0),
}


@dataclasses.dataclass(frozen=True)
class PassReport:
    """Memory and FLOP effect of Sage's graph passes on one function.

    Attributes (bytes are no-remat peaks, :meth:`Graph.no_remat_peak`; FLOPs per training step):
      unfused_nodes, unfused_peak_bytes, unfused_flops: ``stages="eqn"`` (every equation a node,
        every value materialised: Sage's unoptimised CO graph).
      fused_nodes, fused_peak_bytes, fused_flops: :func:`remat.core.passes.fuse` of that graph (``fused_nodes``:
        its fusion groups, the kernels).
      reduced_nodes, reduced_peak_bytes, reduced_flops, reduced_removed: fusion + subgraph
        reduction (:func:`remat.core.passes.reduce_subgraphs`; ``reduced_removed`` groups recomputed inline,
        ``reduced_nodes`` the groups left).
      stage_nodes, stage_peak_bytes: the executable ``stages="sage"`` graph (forward fusion
        groups as stages, backward mirrors); auto_nodes, auto_peak_bytes: ``stages="auto"``.
    """

    unfused_nodes: int
    unfused_peak_bytes: int
    unfused_flops: float
    fused_nodes: int
    fused_peak_bytes: int
    fused_flops: float
    reduced_nodes: int
    reduced_peak_bytes: int
    reduced_flops: float
    reduced_removed: int
    stage_nodes: int
    stage_peak_bytes: int
    auto_nodes: int
    auto_peak_bytes: int


def pass_report(fn: Callable, *args: Any, argnums: int | Sequence[int] = 0,
                k_w: int = passes.K_W, k_h: int = passes.K_H) -> PassReport:
    """Extract ``fn`` per equation, fuse and reduce it; extract ``stages="sage"`` and
    ``"auto"`` for reference."""
    eq = extract(fn, *args, stages="eqn", argnums=argnums)
    fu = passes.fuse(eq)
    red, removed = passes.reduce_subgraphs(fu, k_w=k_w, k_h=k_h)
    groups = int(fu.meta["fusion_labels"].max()) + 1 if fu.n else 0
    st = extract(fn, *args, stages="sage", argnums=argnums)
    au = extract(fn, *args, stages="auto", argnums=argnums)
    return PassReport(
        eq.n, eq.no_remat_peak(), float(eq.flops_array.sum()),
        groups, fu.no_remat_peak(), float(fu.flops_array.sum()),
        groups - removed, red.no_remat_peak(), float(red.flops_array.sum()), removed,
        st.n, st.no_remat_peak(), au.n, au.no_remat_peak())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    models = QUICK if a.quick else FULL
    B = 4 if a.quick else 32
    rows = []
    for name, opts in models.items():
        t0 = time.perf_counter()
        f, p, b = remat.zoo.get(name, batch_size=B, abstract=True, **opts)
        r = pass_report(f, p, b)
        row = {"model": name, "batch": B, **{k: getattr(r, k) for k in r.__dataclass_fields__}}
        row["fusion_peak_change"] = r.fused_peak_bytes / r.unfused_peak_bytes - 1
        row["reduction_peak_change"] = r.reduced_peak_bytes / r.unfused_peak_bytes - 1
        row["reduction_flop_change"] = r.reduced_flops / r.unfused_flops - 1
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{name}: unfused {r.unfused_peak_bytes / 2**20:.1f} MiB, fused "
              f"{r.fused_peak_bytes / 2**20:.1f} MiB ({row['fusion_peak_change']:+.1%}), reduced "
              f"{r.reduced_peak_bytes / 2**20:.1f} MiB ({row['reduction_peak_change']:+.1%}, "
              f"FLOPs {row['reduction_flop_change']:+.2%})", flush=True)
    print("wrote", write_rows(a.out, rows, float_format=".4g"))


if __name__ == "__main__":
    main()
