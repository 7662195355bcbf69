"""The smallest budget of each published graph, decided, not estimated.

For every published Checkmate/Moccasin benchmark graph (Jain et al. 2020; Bartan et al. 2023;
read from the folder ``GRAPHS``, outside the repository, which does not hold the graphs) the
smallest number of bytes within which *some* schedule runs it (any order, any recomputation;
remat's replay semantics) is found by bisection with :func:`solvers.pebbling_search.decide`,
each probe a witness (feasible) or a proof (infeasible):

* the lower end starts at the largest single-step need minus one (trivially infeasible: some
  node's inputs plus output exceed it), the upper at the no-remat peak (feasible);
* the single-step need itself is probed first (on layered DAGs it is often the answer);
* a probe that reaches ``--probe-time`` seconds or ``--probe-states`` states is ``unknown``;
  the bisection then narrows only the feasible end (between that budget and the smallest
  feasible one) and the row reports the bracket it proved.

Each row: ``min_step_bytes``, ``infeasible_at`` (the largest budget proven infeasible),
``feasible_at`` (the smallest budget with a witness), ``exact`` (they differ by one byte),
the budget multipliers ``m`` they correspond to (over the no-remat peak), probes and their
outcomes, seconds, and the witness plan's overhead at ``feasible_at`` (run order pruned by
:func:`~solvers.pebbling_search.prune_recomputation`; compute over each node once).

    python -m experiments.min_budget [--graphs n250 ...] [--probe-time 60] [--probe-states 2000000]

Writes ``experiments/results/min_budget.csv`` (a rerun skips graphs already in it; ``--force``
recomputes them).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "min_budget.csv"
GRAPHS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "checkmate-graphs"
FIELDS = ["graph", "n", "no_remat_peak_bytes", "min_step_bytes", "infeasible_at", "feasible_at",
          "exact", "m_infeasible", "m_feasible", "probes", "outcomes", "seconds",
          "witness_overhead", "probe_time_s", "probe_states"]


def smallest_budget(graph, *, probe_time: float, probe_states: int) -> dict:
    """Bisection for the smallest feasible budget of ``graph`` (module docstring).

    Returns a dict of the row's fields except ``graph``/``probe_*``.

    Raises:
      RematError: ``probe_time <= 0`` or ``probe_states < 1`` (from :func:`decide`).
      SolverError: no witness at the no-remat peak (the limits are too small).
    """
    from remat.core.errors import SolverError
    from solvers.bounds import frontier_lower_bound
    from solvers.pebbling_search import decide, prune_recomputation

    t0 = time.perf_counter()
    sz = np.asarray(graph.sizes, dtype=np.int64)
    need = frontier_lower_bound(sz, graph.edge_array)
    peak = int(graph.no_remat_peak())
    lo, hi, best = need - 1, None, None
    outcomes = []

    def probe(b: int):
        d = decide(graph.preds, graph.sizes, b, max_states=probe_states, time_limit=probe_time)
        outcomes.append(f"{b}:{d.status}")
        return d

    d = probe(need)
    if d.status == "feasible":
        hi, best = need, d
    elif d.status == "infeasible":
        lo = need
    if hi is None:
        d = probe(peak)
        if d.status != "feasible":  # every node once in index order fits its no-remat peak
            raise SolverError(f"no witness at the no-remat peak {peak} B: {d.status}")
        hi, best = peak, d
        # largest undecided budget below hi: no bisection below it, only above
        top_unknown = need if outcomes[0].endswith("unknown") else lo
        while hi - max(lo, top_unknown) > 1:
            mid = (max(lo, top_unknown) + hi) // 2
            d = probe(mid)
            if d.status == "unknown":
                top_unknown = mid  # keep narrowing the feasible end above it
            elif d.status == "feasible":
                hi, best = mid, d
            else:
                lo = mid
    seq = prune_recomputation(best.schedule, graph.preds, graph.sizes, graph.costs, hi)
    costs = np.asarray(graph.costs, dtype=float)
    return dict(n=graph.n, no_remat_peak_bytes=peak, min_step_bytes=need, infeasible_at=lo,
                feasible_at=hi, exact=hi - lo == 1, m_infeasible=round(lo / peak, 6),
                m_feasible=round(hi / peak, 6), probes=len(outcomes),
                outcomes=" ".join(outcomes), seconds=round(time.perf_counter() - t0, 1),
                witness_overhead=round(float(costs[seq].sum() / costs.sum()), 4))


def main(argv=None) -> None:
    from remat.core.graph_io import load_graph

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-dir", type=Path, default=GRAPHS)
    ap.add_argument("--graphs", nargs="*", default=None, help="substrings of file names to keep")
    ap.add_argument("--probe-time", type=float, default=60.0)
    ap.add_argument("--probe-states", type=int, default=2_000_000)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    rows = []
    if a.out.exists():
        with a.out.open() as f:
            rows = list(csv.DictReader(f))
    files = sorted(a.bench_dir.glob("*.json"))
    if a.graphs:
        files = [f for f in files if any(s in f.name for s in a.graphs)]
    for f in files:
        name = f.stem
        if any(r["graph"] == name for r in rows) and not a.force:
            continue
        g = load_graph(f)
        row = dict(graph=name, **smallest_budget(g, probe_time=a.probe_time,
                                                  probe_states=a.probe_states),
                   probe_time_s=a.probe_time, probe_states=a.probe_states)
        print(row, flush=True)
        rows = [r for r in rows if r["graph"] != name] + [row]
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
