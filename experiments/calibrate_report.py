"""How long ``remat.devices.calibrate()`` takes and what it measures, and a plan made with the
measured profile (issue #33, item 4).

    python experiments/calibrate_report.py [--out experiments/results/calibrate_cpu.json]
        [--backend NAME] [--depth 8 --width 512 --batch 256]

Writes one JSON, one entry per JAX version under ``"runs"`` (a run adds to the file): the
machine (jax, Python, platform, device kind, CPUs, load average), the first call's wall time
(the claim: under 10 s on a 2-core CPU; the backend's start-up included, ``import jax`` not)
and the cached second call's, every field of the measured profile and its ``calibration``
pairs, the datasheet H100/A100 profiles' summaries, and an MLP (default 8 layers, width 512,
batch 256) extracted with
``device=calibrate()`` and planned by Checkmate at 60%: the graph's device, its modelled step
time (sum of node times) next to the measured time of ``jax.jit(jax.value_and_grad(loss))``
on the same backend, and the plan's modelled time and overhead.

Command that made ``experiments/results/calibrate_cpu.json`` (its default ``--out``), run once
in each JAX environment (jax 0.12.0.1 and jax 0.8.0), each run adding its entry::

    python experiments/calibrate_report.py --out experiments/results/calibrate_cpu.json

Shown on ``docs/results/compiled_memory.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import policies
import remat
from remat import devices

ROOT = Path(__file__).resolve().parent


def mlp(depth: int = 8, width: int = 512, batch: int = 256):
    """``(loss, params, batch)``: a ReLU MLP with one named scope per layer."""
    ks = jax.random.split(jax.random.PRNGKey(0), depth + 2)
    params = [(jax.random.normal(ks[i], (width, width)) / np.sqrt(width), jnp.zeros(width))
              for i in range(depth)]
    data = {"x": jax.random.normal(ks[-2], (batch, width)),
            "y": jax.random.normal(ks[-1], (batch, width))}

    def loss(params, data):
        h = data["x"]
        for i, (w, b) in enumerate(params):
            with jax.named_scope(f"layer{i}"):
                h = jax.nn.relu(h @ w + b)
        return jnp.mean((h - data["y"]) ** 2)

    return loss, params, data


def measured_step_s(loss, params, data, repeats: int = 20) -> float:
    step = jax.jit(jax.value_and_grad(loss))
    jax.block_until_ready(step(params, data))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, data))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "calibrate_cpu.json"))
    ap.add_argument("--backend", default=None)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)

    dev = jax.devices(args.backend)[0] if args.backend else jax.devices()[0]
    t0 = time.perf_counter()
    prof = devices.calibrate(backend=args.backend)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = devices.calibrate(backend=args.backend)
    cached_s = time.perf_counter() - t0
    print(f"calibrate(): {first_s:.2f} s (cached call {cached_s * 1e6:.1f} us)")
    print(prof.summary())

    loss, params, data = mlp(args.depth, args.width, args.batch)
    g = remat.extract(loss, params, data, device=prof)
    t_nodes, _ = prof.node_costs(g)
    plan = policies.get("checkmate", budget="60%", time_limit=120.0).plan(g)
    rep = remat.simulate(g, plan)
    base = remat.simulate(g, policies.get("checkpoint_all").plan(g))
    step_s = measured_step_s(loss, params, data)
    others = {name: float(devices.get(name).node_costs(g)[0].sum())
              for name in ("h100-sxm", "a100-sxm4-80gb")}
    fields = {f.name: getattr(prof, f.name) for f in dataclasses.fields(prof)
              if f.name not in ("calibration", "source")}
    out = {
        "command": " ".join(["python experiments/calibrate_report.py", *(argv or [])]),
        "machine": {
            "jax": jax.__version__, "python": platform.python_version(),
            "platform": dev.platform, "device_kind": str(dev.device_kind),
            "cpus": os.cpu_count(), "loadavg_1min": round(os.getloadavg()[0], 2),
        },
        "calibrate_first_call_s": round(first_s, 3),
        "calibrate_cached_call_s": cached_s,
        "cached_is_same_object": again is prof,
        "under_10_s": first_s < 10.0,
        "profile": fields,
        "calibration": dict(prof.calibration),
        "source": prof.source,
        "summary": prof.summary(),
        "for_backend": devices.for_backend(args.backend).name,
        "datasheet_profiles": {n: devices.get(n).summary() for n in ("h100-sxm", "a100-sxm4-80gb")},
        "plan": {
            "model": f"MLP depth {args.depth}, width {args.width}, batch {args.batch} (ReLU, "
                     "MSE), extract(device=calibrate())",
            "graph_nodes": g.n,
            "graph_device": g.meta["device"],
            "node_times_equal_profile": bool(np.array_equal(g.costs, t_nodes)),
            "modelled_step_s": float(t_nodes.sum()),
            "measured_jit_step_s": step_s,
            "modelled_step_s_on": others,
            "policy": "checkmate", "budget": "60%",
            "status": plan.meta.get("status"),
            "peak_bytes": rep.peak_bytes, "no_remat_peak_bytes": base.peak_bytes,
            "modelled_plan_s": rep.compute_time_s, "overhead": rep.overhead,
        },
    }
    # one file, one entry per JAX version (the CPU results of both supported ends side by side)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = {}
    if path.exists():
        try:
            runs = json.loads(path.read_text()).get("runs", {})
        except (json.JSONDecodeError, AttributeError):
            runs = {}
    runs[f"jax-{jax.__version__}"] = out
    path.write_text(json.dumps({"runs": dict(sorted(runs.items()))}, indent=1) + "\n")
    print(json.dumps(out["plan"], indent=1))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
