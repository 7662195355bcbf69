"""Anytime Checkmate (``Checkmate(lns=True)``, ``solvers/checkmate/lns.py``) on published graphs.

For each graph and budget multiplier ``m`` (budget ``ceil(m x no-remat peak)``, the Moccasin
rule) the policy picks its start (the cheapest fitting frontier-form candidate among its
heuristics, ChainDP, SqrtN, greedy_remat, pebbling and LP relaxation + rounding, which gets a
third of the time) and improves it by large-neighbourhood search (windows of steps and windows
of nodes re-solved by the MILP) until ``--time-limit`` seconds of wall time for the whole
``plan()``.  One row per instance: the start's source and overhead, final overhead (cost over
running every node once), proven lower bound, status, wall seconds, sub-solves; ``no_start``
when no candidate fits.  Peaks are replayed from the returned plan (``remat.simulate``) and
checked against the budget.

    python -m experiments.lns_published --graphs ResNet50 --mults 0.9 0.8 0.7 0.6 --time-limit 120
    python -m experiments.lns_published --graphs n100 n250 --mults 0.9 0.8 0.7 --time-limit 120 --keep

Writes ``experiments/results/lns_published.csv``.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

OUT = pathlib.Path(__file__).resolve().parent / "results" / "lns_published.csv"
BENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "checkmate-graphs"
FIELDS = ["graph", "nodes", "m", "budget_bytes", "start", "time_limit_s", "status",
          "start_overhead", "overhead", "lower_bound_overhead", "gap", "sub_solves",
          "peak_bytes", "wall_s"]


def main(argv=None) -> None:
    import remat
    from experiments.tables import write_rows
    from policies.checkmate import Checkmate
    from remat.core.errors import RematError
    from remat.core.graph_io import load_graph

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", default=["ResNet50", "n100"],
                    help="published graph names or name parts (ResNet50, n100, n250)")
    ap.add_argument("--mults", type=float, nargs="+", default=[0.9, 0.8, 0.7])
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    ap.add_argument("--keep", action="store_true",
                    help="keep the rows already in --out for other (graph, m) instances")
    a = ap.parse_args(argv)
    rows = []
    kept = []
    if a.keep and a.out.exists():
        import csv

        with a.out.open() as fh:
            kept = list(csv.DictReader(fh))
    for key in a.graphs:
        # a key names a whole "_"-separated part of the file name ("n100" is not "n1000")
        path = next(p for p in sorted(BENCH.glob("*.json"))
                    if key in p.stem.split("_") or p.stem.startswith(key))
        g = load_graph(path)
        base = float(g.costs.sum())
        for m in a.mults:
            b = math.ceil(m * g.no_remat_peak())
            row = dict(graph=path.stem, nodes=g.n, m=m, budget_bytes=b, time_limit_s=a.time_limit)
            t = time.perf_counter()
            try:
                plan = Checkmate(budget=b, lns=True, time_limit=a.time_limit).plan(g)
            except RematError as e:
                rows.append({**row, "status": type(e).__name__,
                             "wall_s": round(time.perf_counter() - t, 1)})
                print(rows[-1], flush=True)
                continue
            wall = time.perf_counter() - t
            meta = plan.meta
            rep = remat.simulate(g, plan)
            if rep.peak_bytes > b:
                raise SystemExit(f"{path.stem} m={m}: replayed peak {rep.peak_bytes} > {b}")
            start = meta.get("start_objective")
            rows.append({**row, "start": meta.get("warm_start"), "status": meta["status"],
                         "start_overhead": None if start is None else round(start / base, 4),
                         "overhead": round(rep.compute_time_s / base, 4),
                         "lower_bound_overhead": round(meta["lower_bound"] / base, 4),
                         "gap": round(meta["gap"], 4),
                         "sub_solves": len(meta.get("lns_steps", [])),
                         "peak_bytes": rep.peak_bytes, "wall_s": round(wall, 1)})
            print(rows[-1], flush=True)
    done = {(r["graph"], float(r["m"])) for r in rows}
    kept = [r for r in kept if (r["graph"], float(r["m"])) not in done]
    write_rows(a.out, kept + rows, fields=FIELDS)


if __name__ == "__main__":
    main()
