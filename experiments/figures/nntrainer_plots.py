"""NNTrainer figures from the result tables (no computation of their own).

* ``figures/nntrainer_planners.png``: arena of every planner over the max-live lower bound, per
  graph (``table=planner`` rows of ``experiments/results/nntrainer_planners.csv``): NNTrainer's
  basic, optimized V1 and V3, first-fit, Melon's pool and OLLA's address ILP.
* ``figures/nntrainer_swap.png``: peak memory vs modelled latency overhead of vgg16 (batch 64,
  32x32x3) with no swap, proactive (k = 1, 2) and on-demand swap, simulated and measured by the
  executor (``experiments/results/nntrainer_vgg16.csv``), with the lower bounds and the paper's
  points (Sec. 5.2: 181 / 71 / 51 MiB at +0 / +20.1 / +35.5 %, bound 32.14 MiB; the paper's
  peaks include an 11 MiB framework baseline, ours count intermediate values only).

    python experiments/figures/nntrainer_plots.py
"""

from __future__ import annotations

import argparse
import csv
import pathlib

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import plotstyle as ps  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
RES = ROOT / "experiments" / "results"
FIG = ROOT / "figures"
MIB = 2**20
PLANNERS = (("basic", "NNTrainer basic"), ("optimized_v1", "NNTrainer optimized V1"),
            ("optimized_v3", "NNTrainer V3 (first gap)"), ("first_fit", "first-fit"),
            ("melon", "Melon pool"), ("olla", "OLLA address ILP"))


def _rows(name: str, res: pathlib.Path = RES) -> list[dict]:
    with open(res / name, newline="") as f:
        return list(csv.DictReader(f))


def planners_figure(res: pathlib.Path = RES, fig_dir: pathlib.Path = FIG) -> pathlib.Path:
    rows = [r for r in _rows("nntrainer_planners.csv", res) if r["table"] == "planner"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    w = 0.8 / len(PLANNERS)
    for k, (v, label) in enumerate(PLANNERS):
        ys, xs = [], []
        for m, model in enumerate(models):
            r = next((r for r in rows if r["model"] == model and r["variant"] == v), None)
            if r is not None:
                xs.append(m + (k - (len(PLANNERS) - 1) / 2) * w)
                ys.append(int(r["arena_bytes"]) / int(r["bound_bytes"]))
        ax.bar(xs, ys, w, **ps.bar_kw(v, label=label))
    ax.axhline(1.0, color="k", lw=1, ls="--", label="max-live lower bound")
    labels = []
    for model in models:
        r = next(r for r in rows if r["model"] == model)
        labels.append(f"{model}\n(batch {r['batch_size']}, bound {int(r['bound_bytes']) / MIB:.1f} MiB)")
    ax.set_xticks(np.arange(len(models)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    ax.set_ylabel("arena / max-live lower bound (x, log)")
    ax.set_title("Planner arenas on checkpoint-all lifetimes (zoo stage graphs) and NNTrainer's EO model")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = fig_dir / "nntrainer_planners.png"
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def swap_figure(res: pathlib.Path = RES, fig_dir: pathlib.Path = FIG) -> pathlib.Path:
    rows = _rows("nntrainer_vgg16.csv", res)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    # every point is a plan of the nntrainer policy: its style for ours, black for the
    # executor's measurement, open grey for the paper's numbers; bounds in greys
    nnt = ps.style("nntrainer")
    for r in rows:
        x = 100 * float(r["latency_overhead"])
        ax.scatter(x, int(r["sim_peak_bytes"]) / MIB, marker=nnt["marker"], s=120,
                   color=nnt["color"], edgecolors="k", linewidths=0.5, zorder=2)
        ax.scatter(x, int(r["exec_peak_bytes"]) / MIB, marker="x", s=30, color="k", zorder=3)
        ax.annotate(r["variant"], (x, int(r["sim_peak_bytes"]) / MIB), textcoords="offset points",
                    xytext=(6, 4), fontsize=8)
    ax.scatter([], [], marker=nnt["marker"], color=nnt["color"], edgecolors="k", linewidths=0.5,
               label="ours (nntrainer policy), simulated peak")
    ax.scatter([], [], marker="x", color="k", label="ours, executor-measured peak")
    paper = [(0.0, 181, "no swap"), (20.1, 71, "proactive"), (35.5, 51, "on-demand")]
    ax.scatter([p[0] for p in paper], [p[1] for p in paper], marker="s", facecolors="none",
               edgecolors="0.4", s=50, label="paper (incl. 11 MiB baseline)")
    r0 = rows[0]
    for key, label, color, ls in (("stage_bound_bytes", "bound, this stage graph", "k", "--"),
                                  ("eo_bound_bytes", "bound, EO model (fc 4096)", "0.35", "-."),
                                  ("eo_c2cd_paper_bytes", "bound, paper's c2:CD (32.14 MiB)",
                                   "0.55", ":")):
        ax.axhline(int(r0[key]) / MIB, ls=ls, lw=1, color=color, label=label)
    ax.set_xlabel("modelled latency overhead vs no swap (%)")
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(f"vgg16, batch {r0['batch_size']}, 32x32x3: swap variants (pixel-4 profile)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = fig_dir / "nntrainer_swap.png"
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", type=pathlib.Path, default=RES,
                    help="folder holding nntrainer_planners.csv and nntrainer_vgg16.csv")
    ap.add_argument("--fig-dir", type=pathlib.Path, default=FIG, help="folder for the PNGs")
    ap.add_argument("--which", choices=("planners", "swap", "both"), default="both")
    a = ap.parse_args(argv)
    if a.which in ("planners", "both"):
        print(planners_figure(a.results_dir, a.fig_dir))
    if a.which in ("swap", "both"):
        print(swap_figure(a.results_dir, a.fig_dir))


if __name__ == "__main__":
    main()
