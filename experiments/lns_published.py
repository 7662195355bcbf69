"""Anytime Checkmate (LNS, ``solvers/checkmate/lns.py``) on the published random layered DAGs.

For each graph and budget multiplier ``m`` (budget ``ceil(m x no-remat peak)``, the Moccasin
rule) the start is the cheapest fitting frontier-form candidate of ``Checkmate``'s warm start
(its heuristics, ChainDP, SqrtN, greedy_remat, pebbling); LNS then runs for ``--time-limit`` s.
One row per instance: start and final overhead (cost over running every node once), lower
bound, status, wall seconds, number of sub-solves; ``no_start`` when no candidate fits.

    python experiments/lns_published.py [--graphs n100] [--mults 0.9 0.8 0.7] [--time-limit 60]

Writes ``experiments/results/lns_published.csv``.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

OUT = pathlib.Path(__file__).resolve().parent / "results" / "lns_published.csv"
BENCH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "checkmate-graphs"


def main(argv=None) -> None:
    from experiments.tables import write_rows
    from policies.checkmate import Checkmate
    from remat.graph_io import load_graph
    from solvers.checkmate import CheckmateProblem
    from solvers.checkmate.lns import solve_checkmate_lns

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", default=["n100"])
    ap.add_argument("--mults", type=float, nargs="+", default=[0.9, 0.8, 0.7])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    a = ap.parse_args(argv)
    rows = []
    for key in a.graphs:
        path = next(BENCH.glob(f"random_layered_{key}_*.json"))
        g = load_graph(path)
        base = float(g.costs.sum())
        for m in a.mults:
            b = math.ceil(m * g.no_remat_peak())
            P = CheckmateProblem.from_graph(g, b)
            t = time.perf_counter()
            warm, src, _ = Checkmate(budget=b)._warm_start(g, P)
            row = dict(graph=path.stem, nodes=g.n, m=m, budget_bytes=b, start=src,
                       time_limit_s=a.time_limit)
            if isinstance(warm, str):
                rows.append({**row, "status": "no_start"})
                print(rows[-1], flush=True)
                continue
            sol = solve_checkmate_lns(P, warm, time_limit=a.time_limit)
            rows.append({**row, "status": sol.status,
                         "start_overhead": round(sol.meta["start_objective"] / base, 4),
                         "overhead": round(sol.objective / base, 4),
                         "lower_bound_overhead": round(sol.lower_bound / base, 4),
                         "gap": round(sol.gap, 4), "sub_solves": len(sol.meta["lns_steps"]),
                         "wall_s": round(time.perf_counter() - t, 1)})
            print(rows[-1], flush=True)
    fields = ["graph", "nodes", "m", "budget_bytes", "start", "time_limit_s", "status",
              "start_overhead", "overhead", "lower_bound_overhead", "gap", "sub_solves", "wall_s"]
    write_rows(a.out, rows, fields=fields)


if __name__ == "__main__":
    main()
