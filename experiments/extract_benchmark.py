"""Extraction time per zoo model (``remat.extract`` on abstract arguments, default sizes).

Writes ``experiments/results/extract_timing.json``: one record per model with the batch size,
the stage option, node counts, flattened equation count, wall seconds of ``jax.make_jaxpr`` alone
and of the whole ``remat.extract`` (median of ``--repeats``, first call excluded when
``--repeats > 1``), and forward / backward GFLOPs.  With ``--check-flops`` it also compiles the
forward loss with XLA and records ``cost_analysis()["flops"]`` and the ratio (slow for big models).

Made with::

    /work/venv/bin/python experiments/extract_benchmark.py --repeats 2

The acceptance bar: ``resnet50`` at batch 32 extracts in under 30 s on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax

import remat
import remat.zoo as zoo

BATCH = {
    "mlp": 32,
    "vgg16": 32,
    "resnet18": 32,
    "resnet50": 32,
    "mobilenet_v2": 32,
    "squeezenet": 32,
    "unet": 8,
    "bert_small": 8,
    "gpt2_small": 8,
}

OUT = os.path.join(os.path.dirname(__file__), "results", "extract_timing.json")


def bench(name: str, batch: int, repeats: int, stages, check_flops: bool) -> dict:
    loss_fn, params, data = zoo.get(name, batch_size=batch, abstract=True)
    t_jaxpr = []
    t_extract = []
    g = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.make_jaxpr(jax.value_and_grad(loss_fn))(params, data)
        t_jaxpr.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        g = remat.extract(loss_fn, params, data, stages=stages)
        t_extract.append(time.perf_counter() - t0)
    use = slice(1, None) if repeats > 1 else slice(None)
    rec = {
        "model": name,
        "batch_size": batch,
        "stages": str(stages),
        "forward_nodes": len(g.forward_nodes),
        "backward_nodes": len(g.backward_nodes),
        "edges": len(g.edges),
        "eqns": g.meta["n_eqns"],
        "make_jaxpr_s": round(statistics.median(t_jaxpr[use]), 3),
        "extract_s": round(statistics.median(t_extract[use]), 3),
        "extract_first_s": round(t_extract[0], 3),
        "forward_gflop": round(sum(v.flops for v in g.forward_nodes) / 1e9, 4),
        "backward_gflop": round(sum(v.flops for v in g.backward_nodes) / 1e9, 4),
        "no_remat_peak_mib": round(g.no_remat_peak() / 2**20, 2),
        "param_mib": round(g.param_bytes / 2**20, 2),
    }
    if check_flops:
        c = jax.jit(loss_fn).lower(params, data).compile().cost_analysis()
        c = c[0] if isinstance(c, (list, tuple)) else c
        rec["xla_forward_gflop"] = round(c["flops"] / 1e9, 4)
        rec["flop_ratio"] = round(sum(v.flops for v in g.forward_nodes) / c["flops"], 4)
    return rec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=sorted(BATCH))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--stages", default="auto")
    ap.add_argument("--check-flops", action="store_true")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    stages = int(args.stages) if args.stages.isdigit() else args.stages
    records = []
    for name in args.models:
        rec = bench(name, BATCH.get(name, 8), args.repeats, stages, args.check_flops)
        print(json.dumps(rec), flush=True)
        records.append(rec)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    meta = {
        "jax": jax.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_avg_1min": os.getloadavg()[0],
        "command": "python experiments/extract_benchmark.py "
        + " ".join(f"{k}={v}" for k, v in vars(args).items() if k != "out"),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "models": records}, f, indent=1)


if __name__ == "__main__":
    main()
