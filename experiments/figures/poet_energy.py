"""POET Figure-4-style ablation: training energy vs device-memory budget for remat-only,
paging-only and POET (remat + paging), on the zoo's ResNet-18 and VGG16 (CIFAR, batch 1, as in
POET) for the Cortex-A72 and Cortex-M4 profiles, with checkpoint-all and SqrtN as points.

Energy is modelled, not measured: per-node compute energy from the device profile
(``DeviceProfile.node_costs``, FLOPs from the extracted graph) and POET's per-move paging energy
(latency + bytes / bandwidth, storage power) from ``page_in_cost``/``page_out_cost``.  One
training iteration; budgets are activation bytes (parameters excluded, the project's rule),
spaced between the frontier floor ``max_t(M_t + sum of its inputs)`` and the checkpoint-all peak.

For every budget: remat-only and paging-only are solved first, then POET is warm-started from the
better of the two, so POET is never worse than either ablation's returned schedule; every point
records its MILP status and gap, solve time and the replayed peak (checked <= budget).

Command that made ``experiments/results/poet_energy.csv``::

    XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander \\
        python -m experiments.figures.poet_energy

(``--quick`` runs a 3-budget subset on ResNet-18 / Cortex-M4 only; the PNG goes next to this
script and is not committed.)
"""

from __future__ import annotations

import argparse
import csv
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(HERE), "results")
CSV = os.path.join(RESULTS, "poet_energy.csv")
PNG = os.path.join(HERE, "poet_energy.png")

MODELS = {"resnet18": 16, "vgg16": 20}  # int-k forward stages (MILPs of 28-33 steps)
DEVICES = ("cortex-a72", "cortex-m4")
FRACS = (1.0, 0.85, 0.7, 0.55, 0.4, 0.25, 0.15, 0.05)  # of the way from the floor to the peak
FIELDS = ["model", "device", "stages", "n_nodes", "config", "budget_frac", "budget_bytes",
          "peak_bytes", "no_remat_peak_bytes", "floor_bytes", "energy_j", "compute_energy_j",
          "paging_energy_j", "baseline_energy_j", "runtime_s", "baseline_time_s",
          "recomputations", "page_outs", "page_ins", "bytes_paged", "status", "gap",
          "solve_time_s", "warm_start", "error"]


def load_graph(model: str, k: int):
    """Extract the training graph of a zoo model at batch 1 with ``k`` forward stages."""
    import remat

    loss, params, batch = remat.zoo.get(model, batch_size=1)
    return remat.extract(loss, params, batch, stages=k, name=model)


def _row(model, dev, k, g, config, frac, budget, floor, plan=None, rep=None, err=""):
    row = {"model": model, "device": dev, "stages": k, "n_nodes": g.n, "config": config,
           "budget_frac": frac, "budget_bytes": budget, "no_remat_peak_bytes": g.no_remat_peak(),
           "floor_bytes": floor, "error": err}
    if plan is not None:
        m = plan.meta
        row.update(
            peak_bytes=rep.peak_bytes, energy_j=rep.energy_j,
            compute_energy_j=rep.energy_j - rep.paging_energy_j,
            paging_energy_j=rep.paging_energy_j, runtime_s=rep.compute_time_s,
            recomputations=rep.recomputations,
            page_outs=int(plan.page_out.sum()) if plan.page_out is not None else 0,
            page_ins=int(plan.page_in.sum()) if plan.page_in is not None else 0,
            bytes_paged=rep.bytes_paged, status=m.get("status"), gap=m.get("gap", 0.0),
            solve_time_s=m.get("solve_time_s", 0.0), warm_start=m.get("warm_start", ""),
            baseline_energy_j=m.get("baseline_energy_j", ""),
            baseline_time_s=m.get("baseline_time_s", ""))
    return row


def run(models=MODELS, devices=DEVICES, fracs=FRACS, time_limit=60.0, out=CSV) -> list[dict]:
    import policies
    import remat
    from policies.poet import Poet, _frontier_lower_bound

    rows: list[dict] = []
    os.makedirs(os.path.dirname(out), exist_ok=True)
    f = open(out, "w", newline="")
    w = csv.DictWriter(f, fieldnames=FIELDS)
    w.writeheader()

    def emit(r):
        rows.append(r)
        w.writerow(r)
        f.flush()
        e = r.get("energy_j")
        print(f"{r['model']:9s} {r['device']:10s} {r['config']:12s} frac={r['budget_frac']!s:5s} "
              f"E={e if e in (None, '') else f'{e:.5g}'} {r.get('status', '')} "
              f"gap={r.get('gap', '')} t={r.get('solve_time_s', '')} {r['error'][:60]}",
              flush=True)

    for model, k in models.items():
        g = load_graph(model, k)
        peak, floor = g.no_remat_peak(), _frontier_lower_bound(g)
        for dev in devices:
            base = policies.get("checkpoint_all").plan(g)
            emit(_row(model, dev, k, g, "checkpoint_all", "", peak, floor,
                      base.with_meta(status="optimal", gap=0.0), remat.simulate(g, base, dev)))
            try:
                sq = policies.get("sqrtn").plan(g)
                emit(_row(model, dev, k, g, "sqrtn", "", int(remat.simulate(g, sq).peak_bytes),
                          floor, sq.with_meta(gap=0.0), remat.simulate(g, sq, dev)))
            except Exception as e:  # noqa: BLE001 - record, keep sweeping
                emit(_row(model, dev, k, g, "sqrtn", "", "", floor, err=f"{type(e).__name__}: {e}"))
            for frac in fracs:
                b = int(floor + frac * (peak - floor))
                got = {}
                for config, kw in (("remat_only", {"paging": False}),
                                   ("paging_only", {"remat": False})):
                    pol = Poet(device=dev, time_limit=time_limit, **kw)
                    try:
                        p = pol.plan(g, budget=b)
                        got[config] = p
                        emit(_row(model, dev, k, g, config, frac, b, floor, p,
                                  remat.simulate(g, p, dev)))
                    except Exception as e:  # noqa: BLE001
                        emit(_row(model, dev, k, g, config, frac, b, floor,
                                  err=f"{type(e).__name__}: {e}"))
                ok = [p for p in got.values()]
                warm = min(ok, key=lambda p: p.meta["energy_j"]) if ok else True
                pol = Poet(device=dev, time_limit=time_limit, warm_start=warm)
                try:
                    p = pol.plan(g, budget=b)
                    rep = remat.simulate(g, p, dev)
                    if rep.peak_bytes > b:
                        raise AssertionError(f"replayed peak {rep.peak_bytes} > budget {b}")
                    emit(_row(model, dev, k, g, "poet", frac, b, floor, p, rep))
                except Exception as e:  # noqa: BLE001
                    emit(_row(model, dev, k, g, "poet", frac, b, floor,
                              err=f"{type(e).__name__}: {e}"))
    f.close()
    return rows


def summarize(rows: list[dict]) -> dict:
    """Largest energy saving of POET over the better ablation at one budget (total energy and
    energy above checkpoint-all), and whether POET is never worse."""
    best = {"saving": 0.0, "saving_overhead": 0.0, "where": None, "never_worse": True}
    key = lambda r: (r["model"], r["device"], r["budget_frac"])  # noqa: E731
    by: dict = {}
    for r in rows:
        if r["config"] in ("poet", "remat_only", "paging_only") and r.get("energy_j") not in (None, ""):
            by.setdefault(key(r), {})[r["config"]] = r
    for kk, d in by.items():
        if "poet" not in d:
            continue
        abl = [d[c]["energy_j"] for c in ("remat_only", "paging_only") if c in d]
        if not abl:
            continue
        e, a = d["poet"]["energy_j"], min(abl)
        if e > a * (1 + 1e-9):
            best["never_worse"] = False
        base = d["poet"]["baseline_energy_j"]
        s = 1 - e / a
        so = 1 - (e - base) / (a - base) if a > base else 0.0
        if s > best["saving"]:
            best.update(saving=s, where=kk, saving_overhead=so)
        if so > best.get("max_saving_overhead", 0.0):
            best.update(max_saving_overhead=so, where_overhead=kk)
    return best


def read_csv(path: str = CSV) -> list[dict]:
    """Rows of a results CSV with numbers parsed (for ``--summarize``)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in ("energy_j", "baseline_energy_j", "budget_bytes", "peak_bytes"):
                if r.get(k) not in (None, ""):
                    r[k] = float(r[k])
            out.append(r)
    return out


def plot(rows: list[dict], path: str = PNG) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    panels = sorted({(r["model"], r["device"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (model, dev) in zip(axes[0], panels):
        rs = [r for r in rows if r["model"] == model and r["device"] == dev]
        # POET's colour; its two ablations open markers and broken lines (plotstyle)
        for config in ("remat_only", "paging_only", "poet"):
            pts = sorted((r["budget_bytes"] / 2**20, r["energy_j"]) for r in rs
                         if r["config"] == config and r.get("energy_j") not in (None, ""))
            if pts:
                ax.plot(*zip(*pts), **ps.line_kw(config, label=config.replace("_", "-"), ms=6))
        for config in ("checkpoint_all", "sqrtn"):
            pts = [(r["peak_bytes"] / 2**20, r["energy_j"]) for r in rs
                   if r["config"] == config and r.get("energy_j") not in (None, "")]
            if pts:
                ax.plot(*zip(*pts), **ps.line_kw(config, linestyle="none", ms=9, mec="k",
                                                 mew=0.5))
        ax.set_title(f"{model} / {dev}")
        ax.set_xlabel("activation memory budget (MiB)")
        ax.set_ylabel("energy per iteration (J)")
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default=CSV)
    ap.add_argument("--png", default=PNG)
    ap.add_argument("--summarize", action="store_true", help="only summarise/plot --out")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.summarize:
        rows = read_csv(a.out)
    elif a.quick:
        rows = run({"resnet18": 16}, ("cortex-m4",), (1.0, 0.5, 0.0), a.time_limit, a.out)
    else:
        rows = run(time_limit=a.time_limit, out=a.out)
    s = summarize(rows)
    plot(rows, a.png)
    print(f"POET never worse than the better ablation: {s['never_worse']}")
    print(f"largest energy saving over the better ablation: {100 * s['saving']:.2f}% of total "
          f"energy at {s['where']} ({100 * s['saving_overhead']:.1f}% of the energy above "
          f"checkpoint-all there; max over budgets {100 * s.get('max_saving_overhead', 0):.1f}% "
          f"at {s.get('where_overhead')})")
    print(f"wall {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

