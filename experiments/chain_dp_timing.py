"""ChainDP solve time versus chain length (random heterogeneous chains, budget 50 % of the
no-remat peak), with and without anchor dropping; writes ``experiments/results/chain_dp_timing.csv``.

Command that made the CSV (2-core CPU, nothing else running)::

    /work/venv/bin/python -m experiments.chain_dp_timing

``--quick`` stops at 50 stages.  Each row: forward stages ``K``, memory levels actually used,
whether the memory was rounded, wall time of ``solvers.chain_dp.solve_chain`` and the
schedule's cost over checkpoint-all's.
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CSV = os.path.join(HERE, "results", "chain_dp_timing.csv")


def main(argv=None) -> None:
    import remat
    from policies.chain_dp import chain_problem
    from solvers.chain_dp import solve_chain

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="stop growing K past this")
    args = ap.parse_args(argv)
    sizes_K = [10, 25, 50] if args.quick else [10, 25, 50, 100, 200, 400, 1000]
    rng = np.random.default_rng(0)
    rows = []
    for drop in (True, False):
        for K in sizes_K:
            if drop and K > 32:
                continue
            g = remat.chain_graph(K, sizes=rng.integers(1, 100, K), fwd_costs=rng.uniform(1, 3, K))
            prob = chain_problem(g)[0]
            B = int(0.5 * g.no_remat_peak())
            t0 = time.perf_counter()
            sol = solve_chain(prob, B, drop_anchors=drop)
            wall = time.perf_counter() - t0
            rows.append({"K": prob.K, "M": prob.M, "drop_anchors": drop, "levels": B // sol.unit,
                         "exact": sol.exact, "solve_s": round(wall, 3),
                         "overhead": round(sol.cost / float(g.costs.sum()), 4)})
            print(rows[-1], flush=True)
            if wall > args.max_seconds:
                break
    if not args.quick:
        with open(CSV, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {CSV}")


if __name__ == "__main__":
    main()
