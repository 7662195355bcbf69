"""Melon Fig. 10 style: the cost of switching to a smaller budget's plan mid-iteration
(:meth:`policies.melon.Melon.adapt`: keep ``(A - C) ∩ B``, recompute ``B - (A - C)``, move the
kept tensors) versus stop-restart (rerun the new plan from its first op up to the same point),
at 25 / 50 / 75 % of the old plan's events, for a few budget shrinks.

Costs are modelled on the ``pixel-4`` profile (:mod:`remat.devices`, per-node roofline time):
recomputation (RC) = Σ time of the recomputed nodes; relayout (RL) = ``3 × moved bytes /
memcpy speed`` as in the artifact's script, with the memcpy speed the profile's memory bandwidth
(34.1 GB/s; the artifact's constant 22,238,208 reads as bytes per *millisecond* -- per second
it would make relayout dominate, against the paper's "RC dominates RL"); stop-restart = Σ time
of the new plan's computations before the resume point.  Overhead = (RC + RL) / stop-restart
(paper: 4.27-54.50 %).  Every row also checks the stitched plan (``Adaptation.stitched``): its
replayed live bytes and pool tops before the switch within the old budget and after it within
the new one (``within_budgets``).  RL is the paper's model (kept tensors moved to the new plan's
offsets); the stitched plan itself keeps them in place whenever the rest fits around them
(``stitch_layout == "in_place"``), so there RL is an upper bound.

Budgets are fractions of the model's checkpoint-all peak ``P`` (the paper's 6 -> 5 GB at BS 128
and 4 -> 3 GB at BS 64 are shrinks of 1/6 and 1/4 of budgets below the no-optimisation peak):
``0.9P -> 0.75P`` and ``0.8P -> 0.6P``.  Plans are ``Melon(microbatch=False)`` (adaptation
re-plans recomputation; both models have BatchNorm in the paper's Fig. 10 setting).

Writes ``experiments/results/melon_adapt.csv`` and ``figures/melon_adapt.png``.

    python experiments/figures/melon_adapt.py           # 224x224, batch 64
    python experiments/figures/melon_adapt.py --quick   # 32x32, batch 16
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

import remat
from experiments.tables import write_rows
from policies.melon import Melon
from remat.core.events import STEP
from remat.core.layout import lifetimes
from remat.devices import get as get_device

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "melon_adapt.csv"
PNG = ROOT / "figures" / "melon_adapt.png"
MODELS = ("mobilenet_v2", "squeezenet")
SHRINKS = ((0.9, 0.75), (0.8, 0.6))
PROGRESS = (0.25, 0.5, 0.75)


def _within(graph, ad, old_b: int, new_b: int) -> bool:
    """The stitched plan, re-checked from its events: live bytes and pool tops before the
    switch row within ``old_b``, from it on within ``new_b``."""
    st = ad.stitched
    ev = st.validate(graph)
    lt = lifetimes(ev)
    e_sw = int(np.flatnonzero(ev.kind == STEP)[ad.switch_step])
    work = ev.kind != STEP
    tops = st.offsets + lt.sizes
    return bool(ev.live[:e_sw][work[:e_sw]].max(initial=0) <= old_b
                and ev.live[e_sw:][work[e_sw:]].max(initial=0) <= new_b
                and tops[lt.intervals[:, 0] < e_sw].max(initial=0) <= old_b
                and tops[lt.intervals[:, 1] >= e_sw].max(initial=0) <= new_b)


def rows(models=MODELS, image_size: int = 224, batch_size: int = 64, device: str = "pixel-4"):
    """One dict per (model, shrink, progress)."""
    dev = get_device(device)
    for name in models:
        fn, params, batch = remat.zoo.get(name, batch_size=batch_size, image_size=image_size)
        g = dev.with_costs(remat.extract(fn, params, batch))
        P = g.no_remat_peak()
        pol = Melon(microbatch=False, search_time_s=2.0)
        for fo, fnew in SHRINKS:
            ob, nb = int(fo * P), int(fnew * P)
            old = pol.plan(g, budget=ob)
            for prog in PROGRESS:
                t0 = time.perf_counter()
                ad = pol.adapt(old, g, nb, prog, memcpy_bytes_per_s=dev.memory_bandwidth)
                yield dict(model=name, image_size=image_size, batch_size=batch_size,
                           old_budget_bytes=ob, new_budget_bytes=nb, old_frac=fo, new_frac=fnew,
                           progress=prog, switch_step=ad.switch_step, nodes=g.n,
                           kept=len(ad.kept), dumped=len(ad.dumped),
                           recomputed=len(ad.recompute), relayout_bytes=ad.relayout_bytes,
                           recompute_s=round(ad.recompute_s, 6), relayout_s=round(ad.relayout_s, 6),
                           stop_restart_s=round(ad.stop_restart_s, 6),
                           overhead=round(ad.overhead, 5),
                           stitch_layout=ad.stitched.meta["stitch_layout"],
                           within_budgets=_within(g, ad, ob, nb),
                           adapt_s=round(time.perf_counter() - t0, 3))


def plot(data: list[dict], path: pathlib.Path) -> None:
    """Stacked bars RC + RL (% of stop-restart) per progress, grouped by model and shrink."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    groups = list(dict.fromkeys((r["model"], r["old_frac"], r["new_frac"]) for r in data))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.6), squeeze=False,
                             sharey=True)
    for ax, (m, fo, fn) in zip(axes[0], groups):
        sub = [r for r in data if (r["model"], r["old_frac"], r["new_frac"]) == (m, fo, fn)]
        x = np.arange(len(sub))
        rc = [100 * r["recompute_s"] / r["stop_restart_s"] if r["stop_restart_s"] else 0
              for r in sub]
        rl = [100 * r["relayout_s"] / r["stop_restart_s"] if r["stop_restart_s"] else 0
              for r in sub]
        # Melon's colour; moving memory hatched, as paging is in ``plotstyle.cost_bars``
        ax.bar(x, rc, **ps.bar_kw("melon", label="recompute (RC)"))
        ax.bar(x, rl, bottom=rc, **ps.bar_kw("melon", label="relayout (RL)", hatch="////",
                                             alpha=0.6))
        ax.axhline(100, color="k", ls="--", lw=0.8, label="stop-restart")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{int(100 * r['progress'])}%" for r in sub])
        ax.set_title(f"{m}\n{fo:.2f}P -> {fn:.2f}P", fontsize=9)
        ax.set_xlabel("change at (% of the old plan's events)", fontsize=8)
    axes[0][0].set_ylabel("adaptation time (% of stop-restart time)")
    axes[0][0].legend(fontsize=7)
    ps.save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32x32 images, batch 16")
    ap.add_argument("--out", type=pathlib.Path, default=OUT, help="CSV path")
    ap.add_argument("--png", type=pathlib.Path, default=PNG, help="PNG path")
    a = ap.parse_args(argv)
    data = list(rows(**(dict(image_size=32, batch_size=16) if a.quick else {})))
    write_rows(a.out, data)
    plot(data, a.png)
    for r in data:
        print(f"{r['model']:13s} {r['old_frac']:.2f}P->{r['new_frac']:.2f}P "
              f"at {int(100 * r['progress']):2d}%: kept {r['kept']:3d} dumped {r['dumped']:3d} "
              f"recomputed {r['recomputed']:3d}  RC {r['recompute_s']:.4f}s "
              f"RL {r['relayout_s']:.4f}s restart {r['stop_restart_s']:.4f}s "
              f"overhead {100 * r['overhead']:6.2f}%  {r['stitch_layout']} "
              f"within={r['within_budgets']}")
    ov = [r["overhead"] for r in data if r["stop_restart_s"] > 0]
    print(f"overhead range {100 * min(ov):.2f}-{100 * max(ov):.2f}%, mean saving "
          f"{100 * (1 - float(np.mean(ov))):.2f}% (paper: 4.27-54.50%, 78.59%)")


if __name__ == "__main__":
    main()
