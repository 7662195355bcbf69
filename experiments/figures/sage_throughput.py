"""Sage Figs. 9-11 style: modelled training throughput against the memory budget for
accumulation-first (Sage) and checkpoint-first hybrids, and DGC / DGA alone, on a phone profile
(``pixel-4``) and a desktop-GPU profile (``rtx-3090``).

Throughput is the policy's model (:mod:`policies.sage`): ``batch / (k * sum_i count_i *
max(roofline_i, launch_s))`` over the plan's compute counts on the graph at ``1/k`` of the
batch, per device (samples/s).  Nothing is executed, so the models run at full size from
abstract arrays: ResNet-50 (224 px, BatchNorm micro-batched as Sage does on phones:
``coupled="accumulate"``, ghost batch norm) and BERT-small (64 tokens, hidden 512, 4 layers,
dropout 0), batch 32.  Budgets run from the hybrid's minimum feasible budget to the no-remat
peak (log-spaced).  ``accumulate_first_mtp1`` is accumulation-first without the MTP guard
(``mtp=1``: accumulate down to one sample before checkpointing).  The paper finds
accumulation-first wins on phones and checkpoint-first on a desktop GPU;
``sage_throughput_summary`` lines (printed, and in the CSV as ``order="mean"`` rows with the
variant in ``method``) give each variant's mean throughput over the budgets where all three
fit.

Writes ``experiments/results/sage_throughput.csv`` and ``figures/sage_throughput.png``:

    python experiments/figures/sage_throughput.py           # ~2 min
    python experiments/figures/sage_throughput.py --quick   # smaller models, ~30 s
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

import remat
from experiments.tables import write_rows
from policies.sage import Sage
from remat.core.errors import InfeasibleBudgetError
from remat.planning import planning_context

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "sage_throughput.csv"
PNG = ROOT / "figures" / "sage_throughput.png"
DEVICES = ("pixel-4", "rtx-3090")
FULL = {"resnet50": dict(), "bert_small": dict(dropout=0.0)}
QUICK = {"resnet50": dict(image_size=64, width=32),
         "bert_small": dict(dropout=0.0, num_layers=2, hidden=256, num_heads=4)}
VARIANTS = {
    "accumulate_first": dict(order="accumulate_first"),
    "checkpoint_first": dict(order="checkpoint_first"),
    "accumulate_first_mtp1": dict(order="accumulate_first", mtp=1),
    "dgc": dict(accumulate=False),
    "dga": dict(checkpoint=False),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--points", type=int, default=12)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--png", type=pathlib.Path, default=PNG)
    a = ap.parse_args(argv)
    models = QUICK if a.quick else FULL
    rows = []
    for name, opts in models.items():
        f, p, b = remat.zoo.get(name, batch_size=32, abstract=True, **opts)
        g = remat.extract(f, p, b)
        ctx = planning_context(f, (p, b), g)
        for dev in DEVICES:
            base = dict(device=dev, coupled="accumulate")
            lo = Sage(**base).min_feasible_budget(g, ctx)
            budgets = np.unique(np.geomspace(lo, g.no_remat_peak(), a.points).astype(np.int64))
            mtp = Sage(**base).min_throughput_point(g, ctx)
            for var, vo in VARIANTS.items():
                pol = Sage(**base, **vo)
                for bud in budgets.tolist():
                    try:
                        pl = pol.plan(g, budget=int(bud), ctx=ctx)
                        thr = float(pl.meta["throughput_samples_per_s"])
                        k, method = int(pl.microbatches), pl.meta["method"]
                    except InfeasibleBudgetError:
                        thr, k, method = 0.0, 0, "infeasible"
                    rows.append(dict(model=name, device=dev, order=var, budget_bytes=int(bud),
                                     budget_frac=bud / g.no_remat_peak(), mtp=mtp,
                                     microbatches=k, method=method, throughput=thr))
            compared = ("accumulate_first", "checkpoint_first", "accumulate_first_mtp1")
            both = [r for r in rows if r["model"] == name and r["device"] == dev
                    and r["order"] in compared]
            ok = set.intersection(*[{r["budget_bytes"] for r in both if r["throughput"] > 0
                                     and r["order"] == v} for v in compared])
            for var in compared:
                mean = float(np.mean([r["throughput"] for r in both
                                      if r["order"] == var and r["budget_bytes"] in ok]))
                rows.append(dict(model=name, device=dev, order="mean", budget_bytes=0,
                                 budget_frac=0.0, mtp=mtp, microbatches=0, method=var,
                                 throughput=mean))
                print(f"sage_throughput_summary {name} {dev} MTP={mtp} {var}: mean "
                      f"{mean:.2f} samples/s", flush=True)
    print("wrote", write_rows(a.out, rows, float_format=".4g"))
    _plot(rows, list(models), a.png)


def _plot(rows, models, png: pathlib.Path = PNG) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps  # Sage's colour; its variants open / broken lines

    fig, axes = plt.subplots(len(models), len(DEVICES), figsize=(10, 3.4 * len(models)),
                             squeeze=False)
    for i, m in enumerate(models):
        for j, d in enumerate(DEVICES):
            ax = axes[i][j]
            for var in VARIANTS:
                rs = [r for r in rows if r["model"] == m and r["device"] == d
                      and r["order"] == var]
                ax.plot([r["budget_frac"] for r in rs], [r["throughput"] for r in rs],
                        **ps.line_kw(var, ms=4))
            mtp = rows[[r["model"] == m and r["device"] == d for r in rows].index(True)]["mtp"]
            ax.set_xscale("log")
            ax.set_title(f"{m} on {d} (MTP = micro-batch {mtp})", fontsize=9)
            ax.set_xlabel("memory budget (x no-remat peak)")
            ax.set_ylabel("modelled throughput (samples/s)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print("wrote", png)


if __name__ == "__main__":
    main()
