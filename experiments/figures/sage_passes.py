"""Sage §3.2 graph passes: memory and FLOP effect of operator fusion and subgraph reduction
(:mod:`remat.passes`) per zoo model.

For each model the per-equation training graph (``stages="eqn"``: every value materialised,
Sage's unoptimised graph) is fused (:func:`remat.passes.fuse`) and then reduced
(:func:`remat.passes.reduce_subgraphs`, K_w = K_h = 5); the no-remat peak
(:meth:`remat.Graph.no_remat_peak`, bytes) and the FLOPs of one training step are reported for
each, with the executable ``stages="sage"`` and ``stages="auto"`` graphs for reference.  Models
are traced with abstract arrays (shapes only), so full sizes cost nothing to run.

Writes ``experiments/results/sage_passes.csv``:

    python experiments/figures/sage_passes.py           # full-size models, batch 32, ~1 min
    python experiments/figures/sage_passes.py --quick   # small sizes, batch 4, ~10 s
"""

from __future__ import annotations

import argparse
import pathlib
import time

import remat
from experiments.tables import write_rows
from remat import passes

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
        r = passes.pass_report(f, p, b)
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
