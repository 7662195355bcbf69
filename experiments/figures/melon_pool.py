"""Melon Fig. 6 / §2 "up to 42% waste": pool size and fragmentation of on-demand (first-fit at
allocation time), large-first (greedy by size), the paper's lifetime-aware greedy (longest
lifetime first; best-fit as in the artifact and lowest-address as in the paper's wording), the
lifetime-aware greedy refined by local search (seeded from the greedy only), and Melon's pool as
the policy uses it (the refinement with on-demand's layout as an extra guard seed), versus the
max-live lower bound, on the checkpoint-all event program of zoo models (stage granularity).

Writes ``experiments/results/melon_pool.csv`` (one row per model × batch × placement: pool and
bound in bytes, fragmentation ``pool / bound - 1``, waste ``1 - bound / pool``, placement time in
seconds) and ``figures/melon_pool.png`` (fragmentation per placement and batch size, one panel
per model; the lower bound is 0 %).

    python experiments/figures/melon_pool.py           # ~3 min on 2 cores
    python experiments/figures/melon_pool.py --quick   # 32x32, batch 2/4, stage graphs, ~20 s

Full mode: 32x32 images (CIFAR, batch 2/8/32/128) and 224x224 (the paper's resized CIFAR-100,
batch 8/32/128), each on the stage graph ``remat.extract`` gives by default (``stages="auto"``,
what the policies plan on) and on the equation-level graph (``stages="eqn"``, closest to MNN's
op-level graph of ~1,800 tensors the paper measured).
"""

from __future__ import annotations

import argparse
import pathlib
import time

import policies
import remat
from experiments.tables import write_rows
from remat.core.layout import lifetimes
from solvers.melon_pool import COMPARED, pool_report

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "melon_pool.csv"
PNG = ROOT / "figures" / "melon_pool.png"
MODELS = ("mobilenet_v2", "squeezenet", "resnet50")


FULL = dict(sizes=((32, 2), (32, 8), (32, 32), (32, 128), (224, 8), (224, 32), (224, 128)),
            stages=("auto", "eqn"))
QUICK = dict(sizes=((32, 2), (32, 4)), stages=("auto",))


def rows(models=MODELS, sizes=FULL["sizes"], stages=FULL["stages"]):
    """One dict per (stage granularity, model, (image size, batch), placement)."""
    for st in stages:
        for name in models:
            for image_size, bs in sizes:
                yield from _rows_one(name, bs, image_size, st)


def _rows_one(name: str, bs: int, image_size: int, stages: str):
    fn, params, batch = remat.zoo.get(name, batch_size=bs, image_size=image_size)
    g = remat.extract(fn, params, batch, stages=stages)
    lt = lifetimes(policies.checkpoint_all_plan(g).validate(g))
    for placement, fnp in COMPARED.items():
        t0 = time.perf_counter()
        _, rep = pool_report(lt.intervals, lt.sizes, fnp)
        yield dict(stages=stages, model=name, batch_size=bs, image_size=image_size, nodes=g.n,
                   allocations=len(lt.sizes), placement=placement, pool_bytes=rep.pool_bytes,
                   lower_bound_bytes=rep.lower_bound_bytes,
                   fragmentation=round(rep.fragmentation, 5), waste=round(rep.waste, 5),
                   place_s=round(time.perf_counter() - t0, 4))


def plot(data: list[dict], path: pathlib.Path) -> None:
    """Grouped bars: fragmentation (%) of each placement per batch size, one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps  # layout strategies and Melon's pool: fixed colours

    models = list(dict.fromkeys(r["model"] for r in data))
    stages = list(dict.fromkeys(r["stages"] for r in data))
    names = list(dict.fromkeys(r["placement"] for r in data))
    fig, axes = plt.subplots(len(stages), len(models), figsize=(5.5 * len(models),
                                                                3.8 * len(stages)), squeeze=False)
    w = 0.8 / len(names)
    for row, st in zip(axes, stages):
        for ax, m in zip(row, models):
            sub = [r for r in data if r["model"] == m and r["stages"] == st]
            keys = list(dict.fromkeys((r["image_size"], r["batch_size"]) for r in sub))
            for j, nm in enumerate(names):
                ys = [100 * next(r["fragmentation"] for r in sub
                                 if (r["image_size"], r["batch_size"]) == k
                                 and r["placement"] == nm) for k in keys]
                ax.bar([i + (j - (len(names) - 1) / 2) * w for i in range(len(keys))], ys, w,
                       **ps.bar_kw(nm))
            bounds = [next(r["lower_bound_bytes"] for r in sub
                           if (r["image_size"], r["batch_size"]) == k) for k in keys]
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels([f"{im}px bs{b}\n{lb / 2**20:.0f}MiB"
                                for (im, b), lb in zip(keys, bounds)], fontsize=7)
            ax.set_title(f"{m}, stages={st} ({sub[0]['allocations']} allocations)", fontsize=9)
            ax.set_ylabel("fragmentation: pool / max-live bound - 1 (%)", fontsize=8)
            ax.axhline(0, color="k", lw=0.8)
    axes[0][0].legend(fontsize=7)
    ps.save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="batch sizes 2 and 4, 32x32 images, stage graphs only")
    ap.add_argument("--out", type=pathlib.Path, default=OUT, help="CSV path")
    ap.add_argument("--png", type=pathlib.Path, default=PNG, help="PNG path")
    a = ap.parse_args(argv)
    data = list(rows(**(QUICK if a.quick else FULL)))
    write_rows(a.out, data)
    plot(data, a.png)
    for r in data:
        print(f"{r['stages']:4s} {r['model']:13s} {r['image_size']:3d}px bs={r['batch_size']:<4d} "
              f"A={r['allocations']:<5d} {r['placement']:23s} "
              f"pool={r['pool_bytes']:>12d} bound={r['lower_bound_bytes']:>12d} "
              f"frag={r['fragmentation']:.4f} waste={r['waste']:.4f} {r['place_s']:.2f}s")
    for nm in dict.fromkeys(r["placement"] for r in data):
        worst = max((r for r in data if r["placement"] == nm), key=lambda r: r["waste"])
        print(f"max waste {nm:23s} {100 * worst['waste']:6.2f}% ({worst['model']}, "
              f"stages={worst['stages']}, {worst['image_size']}px, bs {worst['batch_size']})")


if __name__ == "__main__":
    main()
