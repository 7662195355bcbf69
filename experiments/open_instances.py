"""What the search reached on each published instance left ``open``.

An instance of ``experiments/results/published_benchmark.csv`` is open when no method found a
plan within its budget and no proof says none exists.  For each one this records the two
bounds between which the answer lies, each with how it was obtained:

* **memory floor** (a proof, any order, any recomputation): the largest budget ``B`` for which
  the pebbling lower bound of :mod:`solvers.pebbling_bound` proves that every schedule peaks
  above ``B`` bytes, found by bisection between the single-step need (trivially proven) and the
  instance's budget, each probe with ``--proof-time`` seconds.  A probe that finds no proof is
  treated as "not proven" (the search is incomplete, so the floor is a valid bound, not
  necessarily the best one).
* **best plan**: the smallest replayed peak of any plan found for the graph by the benchmark's
  methods (heuristics' ``min_feasible_bytes``, LP rounding's "smallest peak found") or by peak
  shaving in ``--shave-orders`` greedy low-peak orders (:func:`shaved_peak`).
* **program order** (a proof for that order only): Checkmate's LP relaxation without the
  memory chain (dependencies, carries, start-of-step and frontier rows; every one holds for
  every frontier schedule of the program order) at the budget.  ``infeasible`` proves that no
  plan in the program order fits; otherwise its optimum is a lower bound on the cost (overhead)
  of any such plan.

    python -m experiments.open_instances [--proof-time 20] [--steps 10] [--lp-time 120]
                                         [--shave-orders 16]

Writes ``experiments/results/open_instances.csv``; a rerun skips instances already in it
(``--force`` recomputes).  Command that made the committed file (its one row, n = 250 at
m = 0.6, was the last open instance before :mod:`solvers.pebbling_search` decided it; the
benchmark has none open now, so a rerun finds nothing to do)::

    python -m experiments.open_instances --proof-time 15 --steps 8 --lp-time 90 \\
        --shave-orders 16 --force

Shown on ``docs/results/published_graphs.md``.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
BENCH_CSV = RESULTS / "published_benchmark.csv"
OUT = RESULTS / "open_instances.csv"
GRAPHS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "checkmate-graphs"
FIELDS = ["graph", "n", "m", "budget_bytes", "min_step_bytes", "memory_floor_bytes",
          "floor_probes", "floor_seconds", "best_peak_bytes", "best_peak_source",
          "lp_status", "lp_bound_overhead", "lp_seconds", "finished_at"]

_PEAK = re.compile(r"smallest peak found is (\d+) bytes")


def open_instances(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
    """``(graph, m)`` of the instances with no fitting plan and no infeasibility proof."""
    by: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        by.setdefault((r["graph"], r["m"]), []).append(r)
    return [k for k, rs in by.items()
            if not any(r["status"] in ("ok", "infeasible_proven") for r in rs)]


def best_peak(rows: list[dict[str, str]]) -> tuple[int | None, str]:
    """Smallest peak (bytes) of any plan the benchmark's rows report for one instance."""
    cands: list[tuple[int, str]] = []
    for r in rows:
        if r.get("min_feasible_bytes"):
            cands.append((int(float(r["min_feasible_bytes"])), f"{r['method']} ({r['policy']})"))
        m = _PEAK.search(r.get("error", "") or "")
        if m:
            cands.append((int(m.group(1)), f"{r['method']} ({r['policy']})"))
    return min(cands) if cands else (None, "")


def memory_floor(preds, sizes, lo: int, hi: int, *, proof_time: float, steps: int
                 ) -> tuple[int, int, float]:
    """Largest budget in ``[lo, hi)`` proven infeasible by bisection (``lo`` must be proven).

    Returns ``(bytes, probes, seconds)``: every schedule of the graph peaks above ``bytes``.

    Raises:
      BudgetFormatError: ``lo``/``hi`` not integers with ``-1 <= lo < hi``.
      RematError: ``proof_time <= 0`` or ``steps < 0``.
    """
    from remat.core.errors import BudgetFormatError, RematError
    from solvers.pebbling_bound import prove_infeasible

    if int(lo) != lo or int(hi) != hi or not -1 <= lo < hi:
        raise BudgetFormatError(f"need integer bytes -1 <= lo < hi, got lo={lo!r}, hi={hi!r}")
    if not proof_time > 0 or int(steps) != steps or steps < 0:
        raise RematError(f"need proof_time > 0 and steps >= 0, got {proof_time!r}, {steps!r}")
    lo, hi = int(lo), int(hi)

    t0, probes = time.perf_counter(), 0
    for _ in range(steps):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        probes += 1
        if prove_infeasible(preds, sizes, mid, time_limit=proof_time).proven:
            lo = mid
        else:
            hi = mid
    return lo, probes, time.perf_counter() - t0


def program_order_lp(graph, budget: int, time_limit: float) -> tuple[str, float, float]:
    """``(status, overhead bound, seconds)`` of the chain-free LP relaxation at ``budget``.

    Raises:
      BudgetFormatError: a negative or fractional ``budget``.
      RematError: ``time_limit <= 0``.
    """
    import dataclasses

    from remat.core.errors import BudgetFormatError, RematError, SolverTimeoutError

    if int(budget) != budget or budget < 0:
        raise BudgetFormatError(f"budget must be non-negative integer bytes, got {budget!r}")
    if not time_limit > 0:
        raise RematError(f"time_limit must be positive, got {time_limit!r}")
    from solvers.checkmate import CheckmateProblem
    from solvers.checkmate.formulation import Formulation, add_checkmate_core
    from solvers.milp import MilpModel

    prob = CheckmateProblem(graph.n, graph.edge_array, graph.costs, graph.sizes, int(budget))
    t0 = time.perf_counter()
    model = MilpModel("checkmate_lp_open")
    v = add_checkmate_core(model, prob, budget=int(budget), formulation=dataclasses.replace(
        Formulation(), memory_chain=False))
    try:
        sol = model.solve("highs", time_limit=time_limit, relax=True)
    except SolverTimeoutError:
        return "time_limit", math.nan, time.perf_counter() - t0
    secs = time.perf_counter() - t0
    if sol.status == "infeasible":
        return "infeasible", math.nan, secs
    if sol.status != "optimal":
        return sol.status, math.nan, secs
    return "optimal", sol.objective * v.cost_unit / float(graph.costs.sum()), secs


def shaved_peak(graph, budget: int, orders: int, *, time_limit: float = 20.0
                ) -> tuple[int | None, str, list[int] | None, tuple[tuple[int, ...], ...] | None]:
    """Lowest peak (bytes) :func:`solvers.peak_shave.shave_peak` reaches at ``budget`` in the
    ``orders`` lowest-peak distinct greedy orders (:func:`solvers.order_search.greedy_orders`,
    ``max(32, 4 * orders)`` restarts; more than the ``peak_shave`` policy's 3, whose result the
    benchmark rows hold).  Returns ``(peak, source, order, steps)``: the order (graph node
    indices) and the frontier-form steps of the relabelled graph that reach it, or ``None``s
    when ``orders`` is 0.  Raises :class:`~remat.core.errors.RematError` for negative ``orders``;
    a bad budget or time limit raises :func:`~solvers.peak_shave.shave_peak`'s typed errors."""
    from policies.reorder import relabel
    from remat.core.errors import RematError
    from solvers.order_search import greedy_orders
    from solvers.peak_shave import shave_peak

    if orders < 0:
        raise RematError(f"orders must be >= 0 (0: none), got {orders!r}")
    if orders == 0:
        return None, "", None, None
    cands = greedy_orders(graph.sizes, graph.edge_array, restarts=max(32, 4 * orders))[:orders]
    found = []
    for k, (order, _) in enumerate(cands):
        g2 = relabel(graph, order)
        r = shave_peak(g2.sizes, g2.costs, g2.edge_array, budget, time_limit=time_limit)
        found.append((int(r.peak_bytes), k, list(order), r.steps))
    peak, k, order, steps = min(found, key=lambda f: (f[0], f[1]))
    return peak, f"peak_shave in greedy order {k} of {len(cands)}", order, steps


def analyse(graph_path: Path, rows: list[dict[str, str]], *, proof_time: float, steps: int,
            lp_time: float, shave_orders: int = 0) -> dict[str, Any]:
    """One open instance's row of :data:`FIELDS`."""
    import remat
    from experiments.solver_benchmark_published import min_step_bytes

    g = remat.load_graph(graph_path)
    budget = int(rows[0]["budget_bytes"])
    step = min_step_bytes(g)
    floor, probes, fsecs = memory_floor(g.preds, g.sizes, step - 1, budget,
                                        proof_time=proof_time, steps=steps)
    peak, src = best_peak(rows)
    speak, ssrc, _, _ = shaved_peak(g, budget, shave_orders)
    if speak is not None and (peak is None or speak < peak):
        peak, src = speak, ssrc
    lp_status, lp_bound, lp_secs = program_order_lp(g, budget, lp_time)
    return {"graph": rows[0]["graph"], "n": g.n, "m": rows[0]["m"], "budget_bytes": budget,
            "min_step_bytes": step, "memory_floor_bytes": floor, "floor_probes": probes,
            "floor_seconds": round(fsecs, 1), "best_peak_bytes": peak if peak else "",
            "best_peak_source": src, "lp_status": lp_status,
            "lp_bound_overhead": "" if math.isnan(lp_bound) else round(lp_bound, 5),
            "lp_seconds": round(lp_secs, 1),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", type=Path, default=BENCH_CSV)
    ap.add_argument("--graphs-dir", type=Path, default=GRAPHS)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--proof-time", type=float, default=20.0, help="seconds per pebbling probe")
    ap.add_argument("--steps", type=int, default=10, help="bisection probes per instance")
    ap.add_argument("--lp-time", type=float, default=120.0, help="seconds for the LP")
    ap.add_argument("--shave-orders", type=int, default=16,
                    help="greedy orders peak shaving tries for the best plan (0: rows only)")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    with open(args.bench, newline="") as f:
        rows = list(csv.DictReader(f))
    done: set[tuple[str, str]] = set()
    if args.out.exists() and not args.force:
        with open(args.out, newline="") as f:
            done = {(r["graph"], r["m"]) for r in csv.DictReader(f)}
    elif args.out.exists():
        args.out.unlink()
    for g, m in open_instances(rows):
        if (g, m) in done:
            print(f"{g} m={m}: done, skipped")
            continue
        inst = [r for r in rows if r["graph"] == g and r["m"] == m]
        row = analyse(args.graphs_dir / f"{g}.json", inst, proof_time=args.proof_time,
                      steps=args.steps, lp_time=args.lp_time, shave_orders=args.shave_orders)
        new = not args.out.exists()
        with open(args.out, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                w.writeheader()
            w.writerow(row)
        print(", ".join(f"{k}={row[k]}" for k in FIELDS[:-1]), flush=True)


if __name__ == "__main__":
    main()
