"""NNTrainer (Moon et al., ICSE-SEIP 2024) Figs. 12-13 and the planner comparison.

Writes ``experiments/results/nntrainer_planners.csv``, tidy rows of two tables:

* ``table=swap``: vgg16 (batch 64, 32x32x3, stage graph) under the ``nntrainer`` policy with no
  swap, proactive swap (lookahead 1 and 2) and on-demand swap: replayed peak bytes, planned arena
  bytes (``arena_bytes``, the policy's ``placement="auto"``: ``layout`` is ``nntrainer_v1``
  without swap, ``nntrainer_v3`` with swap) and the arena of ``nntrainer_v1`` on the same plan
  (``arena_v1_bytes``: it does not shrink with swap, see :mod:`policies.nntrainer`), bytes
  paged, modelled latency (s) and overhead vs no swap on the ``pixel-4`` profile (UFS flash),
  and the max-live bound of the no-swap schedule.  (Executed peaks of the same plans:
  ``nntrainer_vgg16.py``.)
* ``table=planner``: arena bytes of NNTrainer's planners (basic, optimized v1, v3), first-fit,
  Melon's pool and OLLA's address ILP (``policies.olla.olla_placement``, 10 s per graph, one
  thread; ``status`` its solver status) against the max-live lower bound, on the checkpoint-all
  allocations of zoo stage graphs, and on NNTrainer's own EO tensor model
  (:mod:`solvers.nntrainer_plan`) of the vgg16 layer chain (conv + in-place ReLU, max-pool,
  flatten view, FC), weights included.

    python experiments/figures/nntrainer_planners.py [--quick]
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

import policies
import remat
import solvers.melon_pool  # noqa: F401  (registers the "melon" placement)
from experiments.tables import write_rows
from remat.core.layout import PLACEMENTS, lifetimes, max_live_lower_bound, validate
from solvers.nntrainer_plan import (
    INPLACE,
    OTHER,
    PLANNERS,
    VIEW,
    WEIGHTED,
    LayerChain,
    lifespans,
    planner_table,
)

OUT = pathlib.Path(__file__).resolve().parents[1] / "results" / "nntrainer_planners.csv"
FIELDS = ("table", "model", "batch_size", "variant", "peak_bytes", "arena_bytes", "bound_bytes",
          "bytes_paged", "latency_s", "latency_overhead", "nodes", "layout", "arena_v1_bytes",
          "status")


def vgg16_chain(batch: int, size: int = 32, width: int = 64, fc: int = 4096,
                classes: int = 10) -> LayerChain:
    """VGG16 (CIFAR) as an NNTrainer layer chain: float32 bytes of each layer's output and
    weights, conv/FC :data:`WEIGHTED`, ReLU :data:`INPLACE`, max-pool :data:`OTHER`, flatten
    :data:`VIEW`."""
    cfg = [1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M"]
    out, wb, kind = [], [], []
    c, s = 3, size
    for v in cfg:
        if v == "M":
            s //= 2
            out.append(batch * s * s * c * 4)
            wb.append(0)
            kind.append(OTHER)
            continue
        co = v * width
        out += [batch * s * s * co * 4] * 2
        wb += [(9 * c * co + co) * 4, 0]
        kind += [WEIGHTED, INPLACE]
        c = co
    out.append(batch * s * s * c * 4)
    wb.append(0)
    kind.append(VIEW)
    d = s * s * c
    for i, o in enumerate((fc, fc, classes)):
        out.append(batch * o * 4)
        wb.append((d * o + o) * 4)
        kind.append(WEIGHTED)
        if i < 2:
            out.append(batch * o * 4)
            wb.append(0)
            kind.append(INPLACE)
        d = o
    return LayerChain(batch * size * size * 3 * 4, np.array(out), np.array(wb), np.array(kind))


def swap_rows(batch: int):
    """The ``table=swap`` rows for vgg16 at ``batch``."""
    fn, params, data = remat.zoo.get("vgg16", batch_size=batch, image_size=32, abstract=True)
    g = remat.extract(fn, params, data, stages="module")
    lt = lifetimes(policies.checkpoint_all_plan(g).validate(g))
    bound = max_live_lower_bound(lt.intervals, lt.sizes)
    variants = {"no_swap": dict(), "proactive_k1": dict(swap=True, lookahead=1),
                "proactive_k2": dict(swap=True, lookahead=2), "on_demand": dict(swap="on_demand")}
    for name, kw in variants.items():
        p = policies.get("nntrainer", device="pixel-4", **kw).plan(g)
        m = p.meta
        v1 = policies.get("nntrainer", device="pixel-4", placement="nntrainer_v1", **kw).plan(g)
        yield dict(table="swap", model="vgg16", batch_size=batch, variant=name,
                   peak_bytes=m["peak_bytes"], arena_bytes=m["arena_bytes"], bound_bytes=bound,
                   layout=m["layout"], arena_v1_bytes=v1.meta["arena_bytes"],
                   bytes_paged=m["bytes_paged"], latency_s=round(m["latency_s"], 6),
                   latency_overhead=round(m["latency_overhead"], 4), nodes=g.n)


def planner_rows(models, batch: int):
    """The ``table=planner`` rows: each placement's arena vs the bound."""
    from policies.olla import olla_placement

    olla = olla_placement(time_limit=10.0, threads=1)
    placements = {**PLANNERS, "melon": PLACEMENTS["melon"], "olla": olla}
    for name in models:
        opts = dict(image_size=32) if name in ("vgg16", "resnet18") else {}
        fn, params, data = remat.zoo.get(name, batch_size=batch, abstract=True, **opts)
        g = remat.extract(fn, params, data, stages="module")
        lt = lifetimes(policies.checkpoint_all_plan(g).validate(g))
        table = planner_table(lt.intervals, lt.sizes)
        for v, fnp in placements.items():
            arena = table.get(v)
            if arena is None:
                off = np.asarray(fnp(lt.intervals, lt.sizes))
                validate(lt.intervals, lt.sizes, off)
                arena = int((off + lt.sizes).max(initial=0))
            status = olla.last.status if v == "olla" else ""
            yield dict(table="planner", model=name, batch_size=batch, variant=v,
                       arena_bytes=arena, bound_bytes=table["bound"], nodes=g.n, status=status)
    t = lifespans(vgg16_chain(batch))
    table = planner_table(t.intervals, t.sizes)
    for v in PLANNERS:
        yield dict(table="planner", model="vgg16_eo_chain", batch_size=batch, variant=v,
                   arena_bytes=table[v], bound_bytes=table["bound"], nodes=len(t.names))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 8, fewer models")
    ap.add_argument("--out", type=pathlib.Path, default=OUT, help="CSV path")
    args = ap.parse_args(argv)
    batch = 8 if args.quick else 64
    models = ("mlp", "vgg16") if args.quick else ("mlp", "vgg16", "resnet18", "mobilenet_v2")
    rows = list(swap_rows(batch)) + list(planner_rows(models, 8 if args.quick else 16))
    write_rows(args.out, rows, fields=FIELDS)
    for r in rows:
        print({k: v for k, v in r.items() if v != ""})


if __name__ == "__main__":
    main()
