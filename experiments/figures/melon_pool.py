"""Melon Fig. 6 / §2 "up to 42% waste": pool size and fragmentation of on-demand (first-fit at
allocation time), large-first (greedy by size) and lifetime-aware (Melon, best-fit and
lowest-address variants) placements versus the max-live lower bound, on the checkpoint-all
event program of zoo models.

Writes ``experiments/results/melon_pool.csv`` (one row per model × batch × placement: pool and
bound in bytes, fragmentation ``pool / bound - 1``, waste ``1 - bound / pool``).

    python experiments/figures/melon_pool.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import pathlib

import policies
import remat
from remat.layout import lifetimes
from solvers.melon_pool import COMPARED, pool_report

OUT = pathlib.Path(__file__).resolve().parents[1] / "results" / "melon_pool.csv"
MODELS = ("mobilenet_v2", "squeezenet", "resnet50")


def rows(models=MODELS, batches=(2, 4, 8), image_size: int = 64):
    """One dict per (model, batch, placement)."""
    for name in models:
        for bs in batches:
            fn, params, batch = remat.zoo.get(name, batch_size=bs, image_size=image_size)
            g = remat.extract(fn, params, batch)
            lt = lifetimes(policies.checkpoint_all_plan(g).validate(g))
            for placement, fnp in COMPARED.items():
                _, rep = pool_report(lt.intervals, lt.sizes, fnp)
                yield dict(model=name, batch_size=bs, image_size=image_size, nodes=g.n,
                           placement=placement, pool_bytes=rep.pool_bytes,
                           lower_bound_bytes=rep.lower_bound_bytes,
                           fragmentation=round(rep.fragmentation, 5), waste=round(rep.waste, 5))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch sizes 2 and 4, 32x32 images")
    a = ap.parse_args(argv)
    kw = dict(batches=(2, 4), image_size=32) if a.quick else {}
    data = list(rows(**kw))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    for r in data:
        print(f"{r['model']:13s} bs={r['batch_size']:<3d} {r['placement']:22s} "
              f"pool={r['pool_bytes']:>11d} bound={r['lower_bound_bytes']:>11d} "
              f"frag={r['fragmentation']:.3f}")


if __name__ == "__main__":
    main()
