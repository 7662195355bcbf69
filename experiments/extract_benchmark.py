"""Extraction time per zoo model (``remat.extract`` on abstract arguments, default sizes).

Writes ``experiments/results/extract_timing.json``: one record per model with the batch size,
the stage option, node counts, flattened equation count, wall seconds of ``jax.make_jaxpr`` alone
and of the whole ``remat.extract`` (median of ``--repeats``, first call excluded when
``--repeats > 1``), and forward / backward GFLOPs.  With ``--check-flops`` it also compiles the
forward loss with XLA and records ``cost_analysis()["flops"]`` and the ratio (slow for big models).

Made with::

    python experiments/extract_benchmark.py --repeats 2 --check-flops

``--executor`` instead runs :func:`remat.execute` on a few zoo models under several policies'
plans and writes ``experiments/results/executor_vs_simulator.json``: simulated peak
(``remat.simulate``), the executor's bookkeeping and measured (``jax.live_arrays``) peaks, the
largest gradient error against ``jax.value_and_grad`` and the wall time.  Made with::

    XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander \\
        python experiments/extract_benchmark.py --executor

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
EXEC_OUT = os.path.join(os.path.dirname(__file__), "results", "executor_vs_simulator.json")

EXEC_MODELS = {
    "mlp": dict(batch_size=256),
    "resnet18": dict(batch_size=8),
    "vgg16": dict(batch_size=8),
    "bert_small": dict(batch_size=2, seq_len=32),
    "gpt2_small": dict(batch_size=2, seq_len=32),
    "resnet50": dict(batch_size=2, image_size=64),
    "mobilenet_v2": dict(batch_size=2, image_size=64),
    "squeezenet": dict(batch_size=2, image_size=64),
    "unet": dict(batch_size=2, image_size=64),
}
EXEC_POLICIES = ["checkpoint_all", "sqrtn", "recompute_all"]


def executor_check() -> list[dict]:
    """Run each policy's plan with the executor and compare with the simulator and JAX."""
    import numpy as np

    import policies

    rows = []
    for name, opts in EXEC_MODELS.items():
        loss_fn, params, data = zoo.get(name, **opts)
        g = remat.extract(loss_fn, params, data)
        rv, rg = jax.jit(jax.value_and_grad(loss_fn))(params, data)
        for pol in EXEC_POLICIES:
            try:
                plan = policies.get(pol).plan(g)
            except Exception as e:  # noqa: BLE001 - record why a policy has no plan here
                rows.append({"model": name, "policy": pol, "error": f"{type(e).__name__}: {e}"})
                continue
            sim = remat.simulate(g, plan)
            value, grads, st = remat.execute(g, plan, params, data)
            err = max(
                float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(rg))
            )
            rows.append({
                "model": name,
                "nodes": g.n,
                "policy": pol,
                "stage_runs": st.stage_runs,
                "sim_peak_mib": round(sim.peak_bytes / 2**20, 3),
                "exec_bookkeeping_peak_mib": round(st.peak_bytes_bookkeeping / 2**20, 3),
                "exec_measured_peak_mib": round(st.peak_bytes / 2**20, 3),
                "measured_over_sim": round(st.peak_bytes / max(sim.peak_bytes, 1), 4),
                "max_abs_grad_err": err,
                "value_err": abs(float(value) - float(rv)),
                "wall_s": round(st.wall_s, 2),
            })
            print(json.dumps(rows[-1]), flush=True)
    return rows


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
    ap.add_argument("--executor", action="store_true", help="executor vs simulator check instead")
    args = ap.parse_args(argv)
    if args.executor:
        rows = executor_check()
        os.makedirs(os.path.dirname(EXEC_OUT), exist_ok=True)
        with open(EXEC_OUT, "w") as f:
            json.dump({"meta": {"jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", "")},
                       "runs": rows}, f, indent=1)
        return
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
