"""OLLA across the zoo: node reordering and arena layouts (Steiner et al., Figs. 7, 8, 9, 11).

For every ``remat.zoo`` model (small batch), on the training graph at equation granularity
(``stages="eqn"``, one node per Jaxpr equation, the granularity of the paper's operator graphs)
and at module granularity (``stages="auto"``):

* peak of the program's (Jaxpr) order vs OLLA's order (:func:`policies.olla.olla_order`, eq. 14;
  the exact ILP where it has at most 3000 binaries, else the neighbourhood search), with the
  ILP's status, gap, proven lower bound and solve time;
* XLA's own schedule: ``temp_size_in_bytes`` (and output bytes) of
  ``jax.jit(jax.value_and_grad(loss)).lower(...).compile().memory_analysis()`` with
  ``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`` (set below before JAX starts);
  XLA fuses elementwise ops, so its temp is not the same quantity as the graph's live bytes
  (which count every equation's output) and the comparison is indicative only;
* arena sizes of OLLA's order under on-demand first fit, best fit, greedy-by-size, OLLA's
  address ILP (eq. 15, warm-started from the best of several greedy layouts, recorded as
  ``warm_layout``/``warm_arena_kib``) and the max-live bound, plus first/best fit on the
  program order.

Sizes are KiB (1024 bytes), times seconds.  Command that made
``experiments/results/olla_layout.csv`` and ``olla_layout.png`` (next to this script, not
committed)::

    python -m experiments.figures.olla_layout

``--quick`` runs three small models with 10 s limits into a temporary CSV; ``--plot-only``
redraws the PNG from the CSV.
"""

from __future__ import annotations

import os

FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
if FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts (see docs/architecture.md)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()

import argparse  # noqa: E402
import csv  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(HERE), "results")
CSV = os.path.join(RESULTS, "olla_layout.csv")
PNG = os.path.join(HERE, "olla_layout.png")
MODELS = ("mlp", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "squeezenet", "unet",
          "bert_small", "gpt2_small")
QUICK = ("mlp", "vgg16", "squeezenet")
FIELDS = ["model", "stages", "batch_size", "nodes", "edges", "program_peak_kib",
          "olla_peak_kib", "peak_reduction_pct", "order_lower_bound_kib", "order_status",
          "order_gap", "order_method", "order_binaries", "order_time_s", "xla_temp_kib",
          "xla_output_kib", "program_first_fit_kib", "program_best_fit_kib", "first_fit_kib",
          "best_fit_kib", "greedy_by_size_kib", "warm_arena_kib", "warm_layout", "olla_arena_kib",
          "max_live_kib",
          "olla_fragmentation_pct", "address_status", "address_gap", "address_pairs",
          "address_time_s", "extract_s", "xla_compile_s"]


def kib(b: float) -> float:
    return round(float(b) / 1024.0, 3)


def xla_memory(loss, params, batch) -> tuple[int, int, float]:
    """``(temp bytes, output bytes, compile seconds)`` of the compiled training step."""
    import jax

    t0 = time.perf_counter()
    ma = jax.jit(jax.value_and_grad(loss)).lower(params, batch).compile().memory_analysis()
    return int(ma.temp_size_in_bytes), int(ma.output_size_in_bytes), time.perf_counter() - t0


def arenas(graph, plan) -> dict[str, int]:
    from remat.core import layout

    lt = layout.lifetimes(plan.validate(graph))
    out = {"max_live": layout.max_live_lower_bound(lt.intervals, lt.sizes)}
    for name in ("first_fit", "best_fit", "greedy_by_size"):
        out[name] = layout.arena_size(layout.PLACEMENTS[name](lt.intervals, lt.sizes), lt.sizes)
    return out


def run_model(model: str, batch_size: int, stages: str, limit: float, xla) -> dict:
    import policies
    import remat
    from policies.olla import olla_order, olla_placement
    from remat.core import layout

    loss, params, batch = remat.zoo.get(model, batch_size=batch_size)
    t0 = time.perf_counter()
    g = remat.extract(loss, params, batch, stages=stages)
    extract_s = time.perf_counter() - t0
    program = policies.checkpoint_all_plan(g)
    prog = arenas(g, program)
    plan, sol = olla_order(g, time_limit=limit)
    ours = arenas(g, plan)
    pl = olla_placement(limit)
    placed = layout.allocate(g, plan, placement=pl)
    a = pl.last
    method = "exact" if "LNS" not in sol.message else "lns"
    return {
        "model": model, "stages": stages, "batch_size": batch_size, "nodes": g.n,
        "edges": len(g.edges), "program_peak_kib": kib(sol.warm_peak_bytes),
        "olla_peak_kib": kib(sol.peak_bytes),
        "peak_reduction_pct": round(100 * (1 - sol.peak_bytes / sol.warm_peak_bytes), 3),
        "order_lower_bound_kib": kib(sol.lower_bound), "order_status": sol.status,
        "order_gap": round(sol.gap, 5), "order_method": method,
        "order_binaries": sol.num_binaries,
        "order_time_s": round(sol.solve_time_s + sol.build_time_s, 2),
        "xla_temp_kib": kib(xla[0]), "xla_output_kib": kib(xla[1]),
        "program_first_fit_kib": kib(prog["first_fit"]),
        "program_best_fit_kib": kib(prog["best_fit"]), "first_fit_kib": kib(ours["first_fit"]),
        "best_fit_kib": kib(ours["best_fit"]), "greedy_by_size_kib": kib(ours["greedy_by_size"]),
        "warm_arena_kib": kib(a.warm_arena_bytes), "warm_layout": pl.warm_name,
        "olla_arena_kib": kib(placed.meta["arena_bytes"]), "max_live_kib": kib(ours["max_live"]),
        "olla_fragmentation_pct": round(100 * (a.arena_bytes / ours["max_live"] - 1), 4),
        "address_status": a.status, "address_gap": round(a.gap, 5),
        "address_pairs": a.num_pairs, "address_time_s": round(a.solve_time_s + a.build_time_s, 2),
        "extract_s": round(extract_s, 2), "xla_compile_s": round(xla[2], 2),
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    eqn = [r for r in rows if r["stages"] == "eqn"]
    names = [r["model"] for r in eqn]
    x = np.arange(len(eqn))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8.5))
    f = lambda key: np.array([float(r[key]) for r in eqn])  # noqa: E731
    base = f("program_peak_kib")
    w = 0.27
    ax1.bar(x - w, np.ones(len(x)), w, **ps.bar_kw("program_order", label="program (Jaxpr) order"))
    ax1.bar(x, f("olla_peak_kib") / base, w, **ps.bar_kw("olla", label="OLLA order"))
    ax1.bar(x + w, f("order_lower_bound_kib") / base, w, label="proven lower bound",
            color="white", edgecolor=ps.style("olla")["color"], hatch="...", linewidth=0.8)
    ax1.plot(x, f("xla_temp_kib") / base, "kD", label="XLA temp (own schedule, fused)")
    for i, r in enumerate(eqn):
        ax1.annotate(f"-{float(r['peak_reduction_pct']):.1f}%\n{r['order_status']}",
                     (x[i], float(r["olla_peak_kib"]) / base[i]), ha="center", va="bottom",
                     fontsize=7)
    ax1.set_xticks(x, [f"{n}\n{r['nodes']} nodes" for n, r in zip(names, eqn)], fontsize=8)
    ax1.set_ylabel("peak (x program-order peak)")
    ax1.set_title("Node reordering alone (equation-level training graphs, batch "
                  f"{eqn[0]['batch_size'] if eqn else '?'})")
    ax1.legend(fontsize=7, loc="upper left")
    bound = f("max_live_kib")
    w = 0.27
    for k, (key, lab, series) in enumerate([("first_fit_kib", "first fit", "first_fit"),
                                            ("best_fit_kib", "best fit", "best_fit"),
                                            ("olla_arena_kib", "OLLA addresses", "olla")]):
        ax2.bar(x + (k - 1) * w, f(key) / bound, w, **ps.bar_kw(series, label=lab))
    ax2.axhline(1.0, color="k", ls="--", lw=1, label="max-live bound")
    ax2.set_ylim(0.98, max(1.02, float((f("first_fit_kib") / bound).max()) + 0.02))
    ax2.set_xticks(x, names, fontsize=8)
    ax2.set_ylabel("arena (x max-live bound)")
    ax2.set_title("Arena of OLLA's order: on-demand first fit, best fit, OLLA's address ILP")
    ax2.legend(fontsize=8, ncol=4)
    ps.save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per phase")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the CSV")
    ap.add_argument("--out", default=None, help="CSV path (default: results, or a temp file "
                    "with --quick)")
    ap.add_argument("--png", default=None, help="PNG path (default: next to the CSV with "
                    "--quick, else next to this script)")
    args = ap.parse_args(argv)
    if args.plot_only:
        with open(CSV) as fh:
            plot(list(csv.DictReader(fh)), PNG)
        return
    models = args.models or (QUICK if args.quick else MODELS)
    limit = 10.0 if args.quick else args.time_limit
    out = args.out or (os.path.join(tempfile.gettempdir(), "olla_layout_quick.csv")
                       if args.quick else CSV)
    import remat

    rows = []
    for model in models:
        loss, params, batch = remat.zoo.get(model, batch_size=args.batch_size)
        xla = xla_memory(loss, params, batch)
        for stages in ("eqn", "auto"):
            r = run_model(model, args.batch_size, stages, limit, xla)
            rows.append(r)
            print(f"{model:13s} {stages:4s} n={r['nodes']:5d} program {r['program_peak_kib']:10.1f}"
                  f" olla {r['olla_peak_kib']:10.1f} KiB (-{r['peak_reduction_pct']:.2f}%, "
                  f"{r['order_status']}, {r['order_time_s']} s) xla temp {r['xla_temp_kib']:.1f}"
                  f" | ff {r['first_fit_kib']:.1f} bf {r['best_fit_kib']:.1f} olla "
                  f"{r['olla_arena_kib']:.1f} bound {r['max_live_kib']:.1f} "
                  f"({r['address_status']}, {r['address_time_s']} s)", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    plot(rows, args.png or (PNG if not args.quick else out.replace(".csv", ".png")))
    print("wrote", out)


if __name__ == "__main__":
    main()
