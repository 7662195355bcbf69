"""Regression check of a refactor against the committed published-benchmark results.

Re-plans every deterministic row of ``experiments/results/published_benchmark.csv`` with the
current code and compares the objective (compute cost of the plan) and the replayed peak with
the committed values, or (``--reference``) with this script's own output from another commit
(the published rows predate some ChainDP changes, so the reference run is the fair one):

* heuristic rows that found a plan (``sqrtn``, ``chain_dp``, ``greedy_remat``, ``pebbling``):
  deterministic, so objective and peak must be equal;
* exact-MILP rows proven ``optimal`` within ``--max-solve-s`` seconds: "optimal" means within
  the MILP's relative gap (1e-4), so the objectives must agree within that; the plan itself may
  differ among optima;
* LP-rounding and time-limited rows depend on the solver's timing and are not compared.

It is the "behaviour unchanged" check of a refactor: a row that differs is either explained
by timing (a reference run that hit a time limit) or is a change of behaviour.  Commands that produced ``experiments/results/refactor_check.csv``, the check of the
layering refactor (reference: the code at its start, commit 5ab16ef, checked out in a worktree
with this script copied in; then the code after it, fb16233's library with this script as of
9e95684)::

    git worktree add /tmp/ref 5ab16ef && cp experiments/refactor_check.py /tmp/ref/experiments/
    (cd /tmp/ref && PYTHONPATH=/tmp/ref python -m experiments.refactor_check --out /tmp/ref.csv)
    python -m experiments.refactor_check --reference /tmp/ref.csv \\
        --out experiments/results/refactor_check.csv

(An earlier run, against commit 4ad1f4b before the contract/solver/event refactor, gave 48 of
48 rows identical; its CSV was replaced by this one.)  Shown on
``docs/results/published_graphs.md``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from experiments.solver_benchmark_published import DEFAULT_BENCH, HEURISTIC_OPTIONS

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["graph", "m", "method", "policy", "budget_bytes", "objective_before", "objective_after",
          "peak_before", "peak_after", "status_after", "error", "same", "wall_s"]


def rows_to_check(path: Path, max_solve_s: float, max_nodes: int) -> list[dict]:
    out = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok" or int(r["n"]) > max_nodes:
                continue
            if r["method"] == "heuristic" and r["policy"] in HEURISTIC_POLICIES:
                out.append(r)
            elif (r["method"] == "milp" and r["solver_status"] == "optimal"
                  and float(r["solve_time_s"] or 1e9) <= max_solve_s):
                out.append(r)
    return out


HEURISTIC_POLICIES = ("sqrtn", "chain_dp", "greedy_remat", "pebbling")


def check(r: dict, bench: Path, time_limit: float) -> dict:
    import policies
    import remat
    from remat.core.errors import RematError

    g = remat.load_graph(bench / f"{r['graph']}.json")
    b = int(r["budget_bytes"])
    if r["method"] == "milp":
        pol = policies.get("checkmate", time_limit=time_limit)
    else:
        pol = policies.get(r["policy"], **HEURISTIC_OPTIONS.get(r["policy"], {}))
    t0 = time.perf_counter()
    try:
        p = pol.plan(g, budget=b)
    except RematError as e:  # a refusal is a result too: it must reproduce, message and all
        err = f"{type(e).__name__}: {e}"
        return dict(graph=r["graph"], m=r["m"], method=r["method"], policy=r["policy"],
                    budget_bytes=b, objective_before=r["objective"], objective_after="",
                    peak_before=r["peak_bytes"], peak_after="", status_after="error", error=err,
                    same=err == r.get("error", ""), wall_s=round(time.perf_counter() - t0, 2))
    wall = time.perf_counter() - t0
    obj = float(p.compute_counts() @ g.costs)
    peak = remat.simulate(g, p).peak_bytes
    rtol = 1e-4 if r["method"] == "milp" else 1e-9
    if r.get("error"):
        before, same = r["objective"], False
    else:
        before = float(r["objective"])
        same = abs(obj - before) <= rtol * max(1.0, abs(before))
        if r["method"] == "heuristic":
            same = same and peak == int(r["peak_bytes"])
    return dict(graph=r["graph"], m=r["m"], method=r["method"], policy=r["policy"],
                budget_bytes=b, objective_before=before, objective_after=obj,
                peak_before=r["peak_bytes"] if r.get("error") else int(r["peak_bytes"]),
                peak_after=peak,
                status_after=p.meta["status"], error="", same=same, wall_s=round(wall, 2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(ROOT / "experiments" / "results" /
                                             "published_benchmark.csv"))
    ap.add_argument("--bench-dir", default=str(DEFAULT_BENCH))
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "refactor_check.csv"))
    ap.add_argument("--reference", default=None,
                    help="this script's CSV from another commit to compare with")
    ap.add_argument("--max-solve-s", type=float, default=30.0)
    ap.add_argument("--max-nodes", type=int, default=1000)
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args(argv)
    bench = Path(args.bench_dir)
    if not bench.exists():
        print(f"no benchmark graphs at {bench}", file=sys.stderr)
        return 2
    rows = []
    todo = rows_to_check(Path(args.results), args.max_solve_s, args.max_nodes)
    if args.reference:  # compare with another commit's run of this script
        with open(args.reference) as f:
            ref = {(r["graph"], r["m"], r["method"]): r for r in csv.DictReader(f)}
        todo = [dict(r, objective=ref[k]["objective_after"], peak_bytes=ref[k]["peak_after"],
                     error=ref[k].get("error", ""))
                for r in todo if (k := (r["graph"], r["m"], r["method"])) in ref]
    for r in todo:
        row = check(r, bench, args.time_limit)
        rows.append(row)
        print(f"{row['graph'][:32]:32} m={row['m']} {row['method']:9} {row['policy']:12} "
              f"{row['objective_before']} -> {row['objective_after'] or row['error'][:60]} "
              f"peak {row['peak_before']} -> {row['peak_after']} "
              f"{'same' if row['same'] else 'DIFFERENT'} ({row['wall_s']} s)", flush=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    diff = [r for r in rows if not r["same"]]
    print(f"{len(rows) - len(diff)}/{len(rows)} rows reproduce the committed results")
    return 0 if not diff else 1


if __name__ == "__main__":
    sys.exit(main())
