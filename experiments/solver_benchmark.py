"""Solver scaling benchmark: exact Checkmate MILP, LP relaxation + rounding, and ChainDP on chain
training graphs with random heterogeneous costs and sizes, at tight budgets.

For each number of graph nodes ("stages" in this project) n in ``--stages`` the graph is
``remat.chain_graph(L)`` with ``L = (n - 1) // 2`` layers (so ``n = 2L + 1``), layer output sizes
uniform in {1..8} MiB and forward costs uniform in [0.5, 2] (backward = 2x forward), seeded by L.
Budgets are fractions of the no-remat peak (the peers' rule, ``ceil(frac * peak)``).  Methods:

* ``milp``: :func:`solvers.checkmate.solve_checkmate` with its own heuristic warm start and the
  LP bound first; the time limit covers everything.
* ``milp_policy``: the ``Checkmate`` policy, whose warm start is the best of those heuristics and
  ChainDP's plan re-cut into frontier form; ``warm_start_time_s`` (ChainDP included) is part of
  ``solve_time_s`` and is deducted from the solver's limit (at least 1 s is left to it).
* ``lp_rounding``: :func:`solvers.checkmate.solve_checkmate_lp`.
* ``chain_dp``: the ``chain_dp`` policy (another module), when it exists.

Each row records the status, compute cost (``objective``), proven lower bound, relative gap to
it, wall time and the replayed peak; every plan is checked with ``Plan.validate`` and
``remat.simulate(...).peak_bytes <= budget`` before it is written.

Made with (2-core CPU; ``lp_rounding`` rows ran while another benchmark shared the machine,
``milp``/``milp_policy``/``chain_dp`` rows were re-run on a quiet machine, ``chain_dp`` with the
policy's current fast mode)::

    python -m experiments.solver_benchmark --stages 20 50 100 200 400 --fracs 0.3 0.5 \\
        --dp-stages 20 50 100 200 400 1000 --time-limit 60 --threads 2 \\
        --out experiments/results/solver_benchmark.csv

The CSV is resumable: rows already present (same n, frac, method) are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import math
import os
import time

import numpy as np

import policies
import remat
from remat.core.errors import InfeasibleBudgetError, RematError, SolverError

with contextlib.suppress(ImportError):  # registers "chain_dp" when that policy exists
    import policies.chain_dp  # noqa: F401

FIELDS = [
    "n_nodes", "layers", "frac", "budget_bytes", "no_remat_peak", "method", "status", "objective",
    "lower_bound", "gap", "overhead", "solve_time_s", "build_time_s", "peak_bytes", "warm_start",
    "warm_start_objective", "warm_start_time_s", "num_vars", "num_int_vars", "num_rows", "node_count", "note",
]


def chain(n_nodes: int) -> remat.Graph:
    L = (n_nodes - 1) // 2
    rng = np.random.default_rng(L)
    sizes = rng.integers(1, 9, L) * 2**20
    fc = rng.uniform(0.5, 2.0, L)
    return remat.chain_graph(L, sizes=sizes, fwd_costs=fc, name=f"chain{L}")


def _row(g, frac, b, method, **kw):
    r = {k: "" for k in FIELDS}
    r.update(n_nodes=g.n, layers=(g.n - 1) // 2, frac=frac, budget_bytes=b,
             no_remat_peak=g.no_remat_peak(), method=method)
    r.update(kw)
    return r


def _check(g, R, S, b):
    plan = remat.Plan(R=R, S=S)
    plan.validate(g)
    rep = remat.simulate(g, plan)
    if rep.peak_bytes > b:
        raise RuntimeError(f"plan exceeds the budget: {rep.peak_bytes} > {b}")
    return rep


def run_one(g, frac, method, time_limit, threads):
    from solvers.checkmate import (
        CheckmateProblem,
        CheckmateSolution,
        solve_checkmate,
        solve_checkmate_lp,
    )

    solve_checkmate_stub = CheckmateSolution(None, None, "", 0.0, 0.0, 0.0, 0, 0.0, 0.0)

    b = math.ceil(frac * g.no_remat_peak())
    base = float(g.costs.sum())
    P = CheckmateProblem.from_graph(g, b)
    t0 = time.perf_counter()
    try:
        if method == "milp":
            s = solve_checkmate(P, time_limit=time_limit, threads=threads)
        elif method == "milp_policy":
            # through the policy: its warm start is the best of the solver's heuristics and
            # ChainDP's plan re-cut into frontier form (when policies.chain_dp exists)
            pol = policies.get("checkmate", time_limit=time_limit, threads=threads)
            plan = pol.plan(g, budget=b)
            m = plan.meta
            s = dataclasses.replace(
                solve_checkmate_stub, R=plan.R, S=plan.S, status=m["status"],
                objective=m["objective"], lower_bound=m["lower_bound"], gap=m["gap"],
                peak_bytes=m["peak_bytes"], solve_time_s=m["solver_time_s"],
                build_time_s=m.get("build_time_s", 0.0), node_count=m["node_count"], meta=m)
        elif method == "lp_rounding":
            s = solve_checkmate_lp(P, time_limit=time_limit, threads=threads)
        elif method == "chain_dp":
            plan = policies.get("chain_dp").plan(g, budget=b)
            wall = time.perf_counter() - t0
            rep = _check(g, plan.R, plan.S, b)
            return _row(g, frac, b, method, status=plan.meta.get("status", ""),
                        objective=rep.compute_time_s, overhead=rep.compute_time_s / base,
                        solve_time_s=round(wall, 3), peak_bytes=rep.peak_bytes,
                        note=f"{plan.R.shape[0]} steps")
        else:
            raise ValueError(f"unknown method {method!r}")
    except InfeasibleBudgetError as e:
        return _row(g, frac, b, method, status="infeasible",
                    solve_time_s=round(time.perf_counter() - t0, 3),
                    note=f"min_feasible_bytes={int(e.min_feasible_bytes)}")
    except RematError as e:
        return _row(g, frac, b, method, status="error", note=f"{type(e).__name__}: {e}"[:200],
                    solve_time_s=round(time.perf_counter() - t0, 3))
    rep = _check(g, s.R, s.S, b)
    if abs(rep.compute_time_s - s.objective) > 1e-6 * max(1.0, s.objective):
        raise SolverError(
            f"{method}: reported objective {s.objective} != replayed compute {rep.compute_time_s}"
        )
    m = s.meta
    return _row(g, frac, b, method, status=s.status, objective=round(s.objective, 6),
                lower_bound=round(s.lower_bound, 6), gap=round(s.gap, 6),
                overhead=round(s.objective / base, 6),
                solve_time_s=round(time.perf_counter() - t0, 3),
                build_time_s=round(s.build_time_s, 3), peak_bytes=s.peak_bytes,
                warm_start=m.get("warm_start", "") or "",
                warm_start_objective=m.get("warm_start_objective", "") or "",
                warm_start_time_s=round(m.get("warm_start_time_s", 0.0), 3),
                num_vars=m.get("num_vars", ""), num_int_vars=m.get("num_int_vars", ""),
                num_rows=m.get("num_rows", ""), node_count=s.node_count,
                note=m.get("method", ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[20, 50, 100, 200, 400])
    ap.add_argument("--dp-stages", type=int, nargs="+", default=[20, 50, 100, 200, 400, 1000])
    ap.add_argument("--fracs", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--methods", nargs="+",
                    default=["milp", "milp_policy", "lp_rounding", "chain_dp"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="experiments/results/solver_benchmark.csv")
    a = ap.parse_args(argv)
    done = set()
    if os.path.exists(a.out):
        with open(a.out) as f:
            for r in csv.DictReader(f):
                done.add((int(r["n_nodes"]), float(r["frac"]), r["method"]))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    new = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        for method in a.methods:
            if method == "chain_dp":
                if "chain_dp" not in policies.available():
                    print("chain_dp policy not available; skipped")
                    continue
            stages = a.dp_stages if method == "chain_dp" else a.stages
            for n in stages:
                g = chain(n if n % 2 else n + 1)
                for frac in a.fracs:
                    if (g.n, frac, method) in done:
                        continue
                    row = run_one(g, frac, method, a.time_limit, a.threads)
                    w.writerow(row)
                    f.flush()
                    print(f"n={g.n:5d} frac={frac:.2f} {method:12s} {row['status']:10s} "
                          f"obj={row['objective']} lb={row['lower_bound']} gap={row['gap']} "
                          f"t={row['solve_time_s']}s", flush=True)


if __name__ == "__main__":
    main()
