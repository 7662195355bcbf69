"""ChainDP solve time versus chain length: exact mode (anchor drops up to K = 25, a Python loop
over states) and the vectorised fast mode (all first checkpoints, or ``max_first`` of them),
on random heterogeneous chains (``remat.chain_graph(L)``, ``n = 2L + 1`` nodes, sizes uniform
in 1..99 bytes, forward costs in [1, 3], backward = 2 x forward), budget 50 % of the no-remat
peak; writes ``experiments/results/chain_dp_timing.csv``.

``default`` rows are ``ChainDP(budget=B)`` with no option (the exact mode up to 32 forward
values; beyond, the compiled fast mode over the level portfolio of
:func:`solvers.chain_dp.level_portfolio`, each plan polished), ``default-mib30`` the same on
chains with sizes 1..8 MiB at 30 % of the no-remat peak (the chain of issue 18).  The numba
kernels are loaded (or compiled, the first time) before the first timing; that cold start is
printed.  ``levels`` is the budget over the chosen plan's memory unit.  How close these plans
are to the persistent optimum computed without rounding: ``experiments/chain_dp_levels.py``.

Command that made the CSV (2-core CPU shared with other jobs: the 1-minute load average is
recorded next to each timing, and process CPU time next to wall time)::

    nice -n 10 python -m experiments.chain_dp_timing

``--quick`` stops at 50 layers; ``--repeats`` (default 7) runs ``plan()`` that many times
on the rows of the default modes and records the median and the slowest run (the first is
``wall_s``/``cpu_s``).  Each row: layers ``L`` (forward values ``K = L``, backward
nodes ``M = L + 1``), mode, ``max_first``, memory levels, whether the DP was exact (no rounding,
no cut), wall and CPU seconds of ``ChainDP(...).plan(graph)`` (chain detection, DP, plan
building and the replay check included), the replayed peak over the budget and the schedule's
compute over checkpoint-all's.  A configuration stops growing L once a run takes longer than
``--max-seconds`` of wall time.
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CSV = os.path.join(HERE, "results", "chain_dp_timing.csv")

# (mode, max_first, max_levels, largest L); None levels = the mode's default
CONFIGS = [
    ("exact", None, None, 25),  # anchor drops on (K <= 32)
    ("exact-nodrop", None, None, 50),
    ("default", None, None, 1000),  # ChainDP(budget=B): compiled fast mode, every first checkpoint
    ("default-mib30", None, None, 1000),  # the chain: sizes 1..8 MiB, budget 30 %
]


def _warm_up() -> float:
    """Load (or compile) the numba kernels on a tiny chain; returns seconds (cold start)."""
    import remat
    from policies.chain_dp import ChainDP

    t0 = time.perf_counter()
    ChainDP(budget="80%", mode="fast").plan(remat.chain_graph(4, sizes=2))
    dt = time.perf_counter() - t0
    print(f"kernel load/compile: {dt:.2f} s", flush=True)
    return dt


def main(argv=None) -> None:
    import remat
    from policies.chain_dp import ChainDP
    from remat.core.errors import InfeasibleBudgetError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=90.0, help="stop growing L past this")
    ap.add_argument("--repeats", type=int, default=7,
                    help="plan() runs per row of the default modes (median and slowest kept)")
    args = ap.parse_args(argv)
    sizes_L = [10, 25, 50] if args.quick else [10, 25, 50, 100, 200, 500, 1000]
    _warm_up()
    rows = []
    for mode, max_first, levels, Lmax in CONFIGS:
        for L in sizes_L:
            if L > Lmax:
                break
            rng = np.random.default_rng(L)
            if mode == "default-mib30":
                g = remat.chain_graph(L, sizes=rng.integers(1, 9, L) * 2**20,
                                      fwd_costs=rng.uniform(1, 3, L))
                B = int(0.3 * g.no_remat_peak())
            else:
                g = remat.chain_graph(L, sizes=rng.integers(1, 100, L),
                                      fwd_costs=rng.uniform(1, 3, L))
                B = int(0.5 * g.no_remat_peak())
            if mode.startswith("default"):
                kw = {}
            elif mode == "exact-nodrop":
                kw = {"mode": "exact", "max_levels": levels}
            else:
                kw = {"mode": mode, "max_levels": levels, "max_first": max_first}
            pol = ChainDP(budget=B, **kw)
            if mode == "exact-nodrop":
                import solvers.chain_dp.exact as sc

                old = sc.use_drop
                sc.use_drop = lambda p, d: False  # persistent class only, as the fast mode
            load = os.getloadavg()[0]
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                plan = pol.plan(g)
            except InfeasibleBudgetError as e:  # 30 % of a short chain's peak can be too little
                print({"L": L, "mode": mode, "infeasible": True,
                       "min_feasible_over_budget": round(e.min_feasible_bytes / B, 3)}, flush=True)
                continue
            finally:
                if mode == "exact-nodrop":
                    sc.use_drop = old
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            walls = [wall]
            for _ in range(args.repeats - 1 if mode.startswith("default") else 0):
                t1 = time.perf_counter()
                pol.plan(g)
                walls.append(time.perf_counter() - t1)
            rep = remat.simulate(g, plan)
            rows.append({
                "L": L, "n_nodes": g.n, "mode": mode, "max_first": max_first or "",
                "levels": B // int(plan.meta["dp_unit"]), "exact": plan.meta["exact"],
                "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "runs": len(walls),
                "wall_median_s": round(float(np.median(walls)), 3),
                "wall_max_s": round(max(walls), 3),
                "load1": round(load, 2), "load1_after": round(os.getloadavg()[0], 2),
                "peak_over_budget": round(rep.peak_bytes / B, 4),
                "overhead": round(rep.overhead, 4),
                "slack_levels": plan.meta.get("dp_slack_levels", ""),
            })
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
