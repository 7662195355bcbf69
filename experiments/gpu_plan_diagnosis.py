"""What two drop-in plans of one model recompute, and how fast each runs, on the device at hand.

For the GPU benchmark's ``gpt2_small`` (full size) the drop-in's plan at 50 % ran slower than
its plan at 25 % on an H200 although it runs fewer jaxpr FLOPs
(``experiments/results/gpu_hierarchical_h200_rerun.csv``).  This script plans ``--policy`` at
each ``--budgets`` percentage through ``remat.value_and_grad`` (the compiled-budget loop, on the
device's calibrated profile), then per plan writes one JSON line: the compiled temp, the
median step time, the jaxpr FLOPs, XLA's ``cost_analysis()`` FLOPs and bytes accessed, the
plan's modelled cost, and what it recomputes (forward nodes run twice or more): their FLOPs,
output bytes and modelled time, split into nodes that hold a contraction (``dot_general`` /
``conv_general_dilated``) and the rest.  The first line is the calibrated profile.

On the H200 (device machine, highspy carried as a wheel on ``PYTHONPATH``)::

    python -m experiments.gpu_plan_diagnosis --model gpt2_small --budgets 25 50 \\
        --out $OUT/diagnosis.jsonl

Lines are written as they are made (a cut-off run keeps them).  The command above made
``experiments/results/gpu_plan_diagnosis_h200.jsonl`` (its ``$OUT/diagnosis.jsonl`` copied under
that name); shown on ``docs/results/hierarchical.md``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings


def _time_ms(compiled, args, steps: int) -> float:
    """Median step time over ``steps`` steps after one warm-up, ms."""
    from experiments.apply_benchmark import _median_time

    return 1e3 * _median_time(compiled, args, steps)


def _cost(compiled) -> dict:
    try:
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        return {"xla_flops": float(ca.get("flops", 0.0)),
                "xla_bytes_accessed": float(ca.get("bytes accessed", 0.0))}
    except Exception:  # noqa: BLE001 - a backend without the analysis
        return {}


def recomputed(app) -> dict:
    """FLOPs, output bytes and modelled time of the forward nodes the plan runs more than once
    (each extra run counted), split by whether the node holds a contraction."""
    import numpy as np

    g, plan = app.graph, app.plan
    runs = np.asarray(plan.R).sum(axis=0)
    prims = (g.meta or {}).get("node_primitives") or [()] * g.n
    out = {k: {"flops": 0.0, "bytes": 0.0, "time_s": 0.0, "nodes": 0}
           for k in ("contraction", "other")}
    for i, nd in enumerate(g.nodes):
        extra = int(runs[i]) - 1
        if nd.is_backward or extra <= 0:
            continue
        k = ("contraction" if any(p in ("dot_general", "conv_general_dilated")
                                  for p in prims[i]) else "other")
        out[k]["flops"] += extra * float(nd.flops)
        out[k]["bytes"] += extra * float(nd.out_bytes)
        out[k]["time_s"] += extra * float(nd.time_s)
        out[k]["nodes"] += 1
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2_small")
    ap.add_argument("--size", default="full")
    ap.add_argument("--policy", default="hierarchical")
    ap.add_argument("--budgets", nargs="+", type=float, default=[25.0, 50.0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import jax

    import remat
    from experiments.bench_models import build
    from remat import devices
    from remat.flops import jaxpr_flops

    warnings.simplefilter("ignore")
    with open(args.out, "w") as f:
        def emit(row):
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row)[:400], flush=True)

        prof = devices.for_backend()
        emit({"profile": prof.summary(), "flops_per_s": prof.flops_per_s,
              "matmul_flops_per_s": prof.matmul_flops_per_s,
              "memory_bandwidth": prof.memory_bandwidth, "launch_s": prof.launch_s,
              "jax": jax.__version__, "device": jax.devices()[0].device_kind})
        m = build(args.model, args.size)
        xs = jax.device_put((m.params, m.batch))
        step = jax.value_and_grad(m.loss)
        base = jax.jit(step).lower(*xs).compile()
        base_row = {"policy": "none", "temp_bytes": int(base.memory_analysis().temp_size_in_bytes),
                    "step_ms": _time_ms(base, xs, args.steps),
                    "jaxpr_flops": jaxpr_flops(jax.make_jaxpr(step)(*xs)), **_cost(base)}
        emit(base_row)
        del base
        for b in args.budgets:
            t0 = time.perf_counter()
            vg = remat.value_and_grad(m.loss, args.policy, budget=f"{b:g}%")
            app = vg.applied(*xs)
            plan_s = time.perf_counter() - t0
            compiled = jax.jit(vg).lower(*xs).compile()
            temp = int(compiled.memory_analysis().temp_size_in_bytes)
            ms = _time_ms(compiled, xs, args.steps)
            emit({"policy": args.policy, "budget": b, "plan_s": plan_s, "temp_bytes": temp,
                  "temp_x": temp / base_row["temp_bytes"], "step_ms": ms,
                  "step_overhead": ms / base_row["step_ms"] - 1.0,
                  "jaxpr_flops": jaxpr_flops(jax.make_jaxpr(vg)(*xs)), **_cost(compiled),
                  "compute_cost": app.plan.meta.get("compute_cost"),
                  "no_remat_cost": float(sum(nd.time_s for nd in app.graph.nodes)),
                  "peak_bytes": app.plan.meta.get("peak_bytes"),
                  "recomputed": recomputed(app),
                  "regions": len(app.plan.meta.get("regions") or ()),
                  "compiles": sum(1 for r in app.rounds
                                  if r.compiled_temp is not None and not r.reused)})
            del compiled


if __name__ == "__main__":
    main()
