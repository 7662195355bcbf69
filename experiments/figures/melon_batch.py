"""Melon Fig. 8 / Fig. 14 style: under a fixed phone memory budget, the maximum batch size each
method trains and the modelled throughput (samples/s) it gets there, on the ``pixel-4``
profile (Snapdragon 855, the SoC of Melon's Note10; :mod:`remat.devices`).

Methods (all on the stage graph of the zoo model, all laid out in one pool whose size is what
the budget caps):

* ``checkpoint_all``: no recomputation, on-demand first-fit pool (vanilla sequential allocator);
* ``sqrtn``: Chen et al.'s √n segments (:class:`policies.SqrtN`), on-demand first-fit pool;
* ``pool_only``: no recomputation, Melon's lifetime-aware pool (``Melon(budget=None)``);
* ``recompute_only``: ``Melon(microbatch=False)``: TPS progressive recomputation + pool;
* ``melon``: full Melon (micro-batching too when the model has no BatchNorm; with BatchNorm it
  is recomputation only, the plan's ``meta["microbatch_reason"]`` says so).

For each batch of the grid and each method, the plan is made at the budget (bytes of pool); a
batch "fits" when a plan exists whose pool (``max(offset + size)``) is within the budget.
Modelled iteration time = micro-batches × Σ over the plan's computations (recomputations
included) of the node's pixel-4 time (``DeviceProfile.node_costs``, roofline: FLOPs at 20
GFLOP/s, bytes at 34.1 GB/s); throughput = batch / iteration time.  Weights and optimizer state
are outside the budget (the paper's pool holds activations, gradients and temporaries).

Writes ``experiments/results/melon_batch.csv`` (one row per model × method × batch: fits,
pool bytes, microbatches, recomputed node count, time, throughput) and
``figures/melon_batch.png`` (max batch versus throughput, one panel per model).

    python experiments/figures/melon_batch.py           # 224x224, pool budget 3 GiB
    python experiments/figures/melon_batch.py --quick   # 32x32, pool budget 32 MiB, < 2 min

The full budget, 3 GiB, is half of the Pixel 4's 6 GiB (Melon's artifact hands its planner
3800 MB on a 6 GB phone, pool plus framework).  Quick mode uses 32x32 images (CIFAR's own size)
and a 32 MiB pool, which puts the batch sizes in the same range.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

import policies
import remat
from experiments.tables import write_rows
from policies.melon import Melon
from remat.core.errors import InfeasibleBudgetError, RematError
from remat.core.layout import allocate
from remat.devices import get as get_device
from remat.planning import planning_context

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "melon_batch.csv"
PNG = ROOT / "figures" / "melon_batch.png"
MODELS = ("mobilenet_v2", "squeezenet")
METHODS = ("checkpoint_all", "sqrtn", "pool_only", "recompute_only", "melon")
FULL = dict(image_size=224, budget=3 * 2**30,
            batches=(8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384))
QUICK = dict(image_size=32, budget=32 * 2**20, batches=(8, 16, 32, 48, 64, 96, 128, 192))


def _plan(method: str, g, fn, args, budget: int):
    """``(plan, graph the plan's columns refer to)`` or ``None`` when nothing fits."""
    if method in ("checkpoint_all", "sqrtn"):
        base = (policies.checkpoint_all_plan(g) if method == "checkpoint_all"
                else policies.get("sqrtn").plan(g))
        p = allocate(g, base, "first_fit")
        return (p, g) if p.meta["arena_bytes"] <= budget else None
    if method == "pool_only":
        p = Melon().plan(g)
        return (p, g) if p.meta["arena_bytes"] <= budget else None
    pol = Melon(budget=budget, microbatch=(method == "melon"), search_time_s=0.5)
    ctx = planning_context(fn, args, g) if method == "melon" else None
    try:
        p = pol.plan(g, ctx=ctx) if ctx is not None else pol.plan(g)
    except (InfeasibleBudgetError, RematError):
        return None
    sub = ctx.graph_at(p.microbatches) if p.microbatches > 1 else g
    return p, sub


def rows(models=MODELS, image_size=FULL["image_size"], budget=FULL["budget"],
         batches=FULL["batches"], device: str = "pixel-4"):
    """One dict per (model, method, batch); a method stops at its first batch that fails."""
    dev = get_device(device)
    for name in models:
        alive = set(METHODS)
        for bs in batches:
            if not alive:
                break
            fn, params, batch = remat.zoo.get(name, batch_size=bs, image_size=image_size)
            g = dev.with_costs(remat.extract(fn, params, batch))
            for method in METHODS:
                if method not in alive:
                    continue
                t0 = time.perf_counter()
                got = _plan(method, g, fn, (params, batch), budget)
                r = dict(model=name, image_size=image_size, budget_bytes=budget,
                         batch_size=bs, method=method, fits=got is not None, pool_bytes=None,
                         microbatches=None, computations=None, iter_s=None, samples_per_s=None,
                         method_note="", plan_s=None)
                if got is None:
                    alive.discard(method)
                else:
                    p, sub = got
                    t_node, _ = dev.node_costs(sub)
                    it = float(p.microbatches * (p.R.sum(axis=0) * t_node).sum())
                    r.update(pool_bytes=int(p.meta["arena_bytes"]), microbatches=p.microbatches,
                             computations=int(p.R.sum()) * p.microbatches, iter_s=round(it, 5),
                             samples_per_s=round(bs / it, 4),
                             method_note=str(p.meta.get("method", "")))
                r["plan_s"] = round(time.perf_counter() - t0, 3)
                yield r


def plot(data: list[dict], path: pathlib.Path) -> None:
    """Per model: every fitting (throughput, batch) point per method, the max batch marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    models = list(dict.fromkeys(r["model"] for r in data))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        best = []  # (method, throughput, batch) of each method's largest fitting batch
        for meth in METHODS:
            pts = [(r["samples_per_s"], r["batch_size"]) for r in data
                   if r["model"] == m and r["method"] == meth and r["fits"]]
            if not pts:
                continue
            x, y = zip(*pts)
            ax.plot(x, y, **ps.line_kw(meth, ms=4, lw=1.0, alpha=0.8))
            j = int(np.argmax(y))
            ax.plot([x[j]], [y[j]], **ps.line_kw(meth, ms=10, label=None, mec="k", mew=0.6))
            best.append((meth, x[j], y[j]))
        if best:
            ps.annotate_identical(ax, *zip(*best), xytext=(9, -2), ha="left", va="top")
        sub = next(r for r in data if r["model"] == m)
        ax.set_title(f"{m}, {sub['image_size']}px, pool budget {sub['budget_bytes'] / 2**20:.0f}"
                     " MiB, pixel-4", fontsize=9)
        ax.set_xlabel("modelled throughput (samples/s)")
        ax.set_ylabel("batch size (samples; largest that fits marked)")
        ax.invert_xaxis()
    axes[0][0].legend(fontsize=8)
    ps.save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32x32 images, 32 MiB budget")
    ap.add_argument("--out", type=pathlib.Path, default=OUT, help="CSV path")
    ap.add_argument("--png", type=pathlib.Path, default=PNG, help="PNG path")
    a = ap.parse_args(argv)
    data = list(rows(**(QUICK if a.quick else FULL)))
    write_rows(a.out, data)
    plot(data, a.png)
    for r in data:
        if r["fits"]:
            print(f"{r['model']:13s} bs={r['batch_size']:<4d} {r['method']:15s} "
                  f"pool={r['pool_bytes'] / 2**20:8.1f}MiB k={r['microbatches']} "
                  f"ops={r['computations']:<5d} {r['samples_per_s']:8.3f} samples/s "
                  f"({r['method_note']}, {r['plan_s']:.1f}s)")
    for m in dict.fromkeys(r["model"] for r in data):
        for meth in METHODS:
            ok = [r for r in data if r["model"] == m and r["method"] == meth and r["fits"]]
            best = max(ok, key=lambda r: r["batch_size"]) if ok else None
            print(f"max batch {m:13s} {meth:15s} "
                  + (f"{best['batch_size']:4d} at {best['samples_per_s']:.3f} samples/s"
                     if best else "none"))



if __name__ == "__main__":
    main()
