"""Checkmate Figure 4 style: compute overhead vs memory budget, every classic policy.

For vgg16, resnet50 and unet from ``remat.zoo`` (extracted with ``remat.extract`` and int-k
stages), sweeps memory budgets from the recompute-all peak (the smallest any policy here
reaches) to the checkpoint-all peak and records, per (model, policy, budget), the simulated peak
and the compute overhead (compute time over checkpoint-all's, graph cost model of the ``host``
profile).  Budget-aware policies (SqrtN and Chen's greedy with a budget, Griewank with its slot
count from the budget, ChainDP, Checkmate MILP and LP rounding) are run at every budget; the
fixed baselines (checkpoint-all, recompute-all, the four ``jax.checkpoint_policies``, SqrtN's
default, Griewank log n) once, plotted as points at their own peak.  ChainDP and Griewank need a
chain: they report ``error`` on graphs whose stages do not form one (unet's skip connections).

Command that made ``experiments/results/budget_sweep.csv``::

    XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander \\
        python -m experiments.figures.budget_sweep

``--quick`` runs 4 budgets on vgg16 only, without the exact MILP, into a temporary CSV.  One PNG
per model is written next to this script (``budget_sweep_<model>.png``, not committed).
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(HERE), "results")
CSV = os.path.join(RESULTS, "budget_sweep.csv")

# model -> (batch size, int-k stages); resnet50 at k = 12 keeps its blocks whole (a chain)
MODELS = {"vgg16": (32, 16), "resnet50": (4, 12), "unet": (4, 16)}
N_BUDGETS = 10
FIELDS = ["model", "stages", "n_nodes", "policy", "budget_frac", "budget_bytes", "peak_bytes",
          "no_remat_peak_bytes", "overhead", "compute_time_s", "recomputations", "status", "gap",
          "solve_time_s", "min_feasible_bytes", "error"]


def load(model: str):
    import remat

    bs, k = MODELS[model]
    loss, params, batch = remat.zoo.get(model, batch_size=bs)
    g = remat.extract(loss, params, batch, stages=k)
    return g, k


def fixed_policies() -> dict:
    import policies as P

    out = {"checkpoint_all": P.CheckpointAll(), "recompute_all": P.RecomputeAll(),
           "sqrtn": P.SqrtN(), "griewank_logn": P.Griewank()}
    for w in ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
              "everything_saveable"):
        out[f"jax_{w}"] = P.JaxPolicy(which=w)
    return out


def budget_policies(quick: bool) -> dict:
    import policies as P

    out = {"sqrtn_budget": P.SqrtN(), "chen_greedy": P.SqrtN(mode="greedy"),
           "griewank": P.Griewank(), "chain_dp": P.ChainDP()}
    if hasattr(P, "Checkmate"):
        out["checkmate_lp"] = P.Checkmate(relax="lp", time_limit=60)
        if not quick:
            out["checkmate"] = P.Checkmate(time_limit=120, mip_gap=1e-4)
    return out


def run(models, n_budgets: int, quick: bool, out: str) -> list[dict]:
    import remat
    from experiments.harness import evaluate

    rows = []
    for model in models:
        t0 = time.perf_counter()
        g, k = load(model)
        peak = g.no_remat_peak()
        low = remat.simulate(g, fixed_policies()["recompute_all"].plan(g)).peak_bytes
        print(f"{model}: {g.summary()} [extract {time.perf_counter() - t0:.1f}s]", flush=True)
        base = {"model": model, "stages": k, "n_nodes": g.n}
        for name, pol in fixed_policies().items():
            r = evaluate(g, pol, None, model=model, policy_name=name)
            rows.append({**base, **r, "budget_frac": ""})
        fracs = np.linspace(low / peak, 1.0, n_budgets)
        for name, pol in budget_policies(quick).items():
            for f in fracs:
                b = int(np.ceil(f * peak))
                r = evaluate(g, pol, b, model=model, policy_name=name)
                rows.append({**base, **r, "budget_frac": round(float(f), 4)})
            print(f"  {name} done [{time.perf_counter() - t0:.1f}s]", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return rows


def plot(rows: list[dict], models, fig_dir: str = HERE) -> None:
    """One PNG per model: overhead (x) against peak (x checkpoint-all, MiB on the top axis);
    budget-aware policies as step lines, fixed baselines as points, each in the style of
    ``experiments.plotstyle`` (variants such as ``chen_greedy`` in their policy's colour, open
    markers and broken lines); identical fixed points are annotated ``n identical``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    for model in models:
        rs = [r for r in rows if r["model"] == model and r.get("peak_bytes") not in ("", None)]
        if not rs:
            continue
        peak = float(rs[0]["no_remat_peak_bytes"])
        fig, ax = plt.subplots(figsize=(9, 4.5))
        names = list(dict.fromkeys(r["policy"] for r in rs))
        fixed = []  # (name, x, y) of the fixed baselines
        for name in names:
            pts = sorted((float(r["peak_bytes"]) / peak, float(r["overhead"]))
                         for r in rs if r["policy"] == name)
            if not pts:
                continue
            x, y = zip(*pts)
            if all(r["budget_frac"] == "" for r in rs if r["policy"] == name):
                ax.scatter(x, y, s=45, zorder=3, **ps.scatter_kw(name))
                fixed += [(name, xi, yi) for xi, yi in pts]
            else:
                ax.plot(x, y, **ps.line_kw(name, drawstyle="steps-post", ms=4,
                                           linewidth=2.5 if name == "chain_dp" else 1.2))
        ps.annotate_identical(ax, [f[0] for f in fixed], [f[1] for f in fixed],
                              [f[2] for f in fixed])
        ax.set_xlabel("peak activation memory (x checkpoint-all peak)")
        ax.set_ylabel("compute overhead vs checkpoint-all (x)")
        top = ax.secondary_xaxis("top", functions=(lambda f, p=peak: f * p / ps.MIB,
                                                   lambda m, p=peak: m * ps.MIB / p))
        top.set_xlabel("peak activation memory (MiB)", fontsize=8)
        top.tick_params(labelsize=7)
        ax.set_title(f"{model}: overhead vs memory budget", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(alpha=0.3)
        fig.tight_layout()
        os.makedirs(fig_dir, exist_ok=True)
        fig.savefig(os.path.join(fig_dir, f"budget_sweep_{model}.png"), dpi=120)
        plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 budgets, vgg16 only, no exact MILP")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fig-dir", default=HERE, help="folder for the PNGs")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNGs from the CSV")
    args = ap.parse_args(argv)
    models = ["vgg16"] if args.quick else list(MODELS)
    out = args.out or (os.path.join(RESULTS, "tmp", "budget_sweep_quick.csv") if args.quick else CSV)
    if args.plot_only:
        with open(out, newline="") as fh:
            plot(list(csv.DictReader(fh)), models, args.fig_dir)
        return
    rows = run(models, 4 if args.quick else N_BUDGETS, args.quick, out)
    plot(rows, models, args.fig_dir)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
