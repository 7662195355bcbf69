"""Checkmate's exact MILP with HiGHS and with OR-Tools CP-SAT on the zoo models, at the CLI's
time limit.

For every zoo model (default batch, ``stages="auto"``: 34-102 nodes) and budget (50 % and 30 %
of the no-remat peak), ``Checkmate(budget=B, time_limit=T, solver=S)`` for ``S`` in ``highs``,
``cpsat`` (4 workers) and ``race``.  One row each: status, wall seconds of ``plan()`` (warm start included),
overhead (compute over running every node once) and proven lower bound over the same base.
Costs are modelled on the host and calibrated once per process, so both solvers of a row pair
see the same graph.  ``infeasible`` rows carry the smallest feasible budget.

    python -m experiments.cpsat_benchmark --time-limit 20
    python -m experiments.cpsat_benchmark --time-limit 20 --solvers race --keep

(``race``: both at once, first proof wins, :mod:`solvers.milp.backends.race`, what ``remat compare``
uses; ``--keep`` keeps the rows already in the CSV and skips finished (model, budget, solver)
rows.)  Writes ``experiments/results/cpsat_benchmark.csv``.  ``--solvers highs highs-full``
compares HiGHS with the memory chain added lazily (the default) and whole
(``lazy_memory=False``)::

    python -m experiments.cpsat_benchmark --solvers highs highs-full \\
        --out experiments/results/lazy_memory_zoo.csv

``race`` races the lazy HiGHS loop against CP-SAT on the whole model
(:mod:`solvers.checkmate.lazy_race`); ``race-full`` is the race on one model with the whole
chain (:mod:`solvers.milp.backends.race`, what ``race`` was before)::

    python -m experiments.cpsat_benchmark --solvers race race-full \\
        --out experiments/results/lazy_race_zoo.csv
"""

from __future__ import annotations

import argparse
import pathlib
import time

OUT = pathlib.Path(__file__).resolve().parent / "results" / "cpsat_benchmark.csv"
FIELDS = ["model", "nodes", "budget", "solver", "status", "wall_s", "overhead",
          "lower_bound_overhead", "gap", "time_limit_s", "note"]


def main(argv=None) -> None:
    import policies
    import remat
    from experiments.cli import DEFAULT_BATCH
    from experiments.tables import write_rows
    from remat.core.errors import RematError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None, help="zoo names (default: all)")
    ap.add_argument("--budgets", nargs="+", default=["50%", "30%"])
    ap.add_argument("--solvers", nargs="+", default=["highs", "cpsat", "race"])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    ap.add_argument("--keep", action="store_true", help="keep and skip rows already in --out")
    a = ap.parse_args(argv)
    rows = []
    if a.keep and a.out.exists():
        import csv

        with a.out.open() as fh:
            rows = list(csv.DictReader(fh))
    done = {(r["model"], r["budget"], r["solver"]) for r in rows}
    for name in a.models or remat.zoo.available():
        loss, params, batch = remat.zoo.get(name, batch_size=DEFAULT_BATCH.get(name, 8))
        g = remat.extract(loss, params, batch, stages="auto")
        base = float(g.costs.sum())
        for budget in a.budgets:
            for solver in a.solvers:
                if (name, budget, solver) in done:
                    continue
                row = dict(model=name, nodes=g.n, budget=budget, solver=solver,
                           time_limit_s=a.time_limit)
                t = time.perf_counter()
                # "highs-full" / "race-full": the whole memory chain (lazy_memory=False)
                kw = ({"solver": solver[:-len("-full")], "lazy_memory": False}
                      if solver.endswith("-full") else {"solver": solver})
                try:
                    p = policies.get("checkmate", budget=budget, time_limit=a.time_limit,
                                     **kw).plan(g)
                except RematError as e:
                    row.update(status=type(e).__name__, wall_s=round(time.perf_counter() - t, 2),
                               note=str(e)[:120])
                else:
                    m = p.meta
                    row.update(status=m["status"], wall_s=round(time.perf_counter() - t, 2),
                               overhead=round(m["objective"] / base, 5),
                               lower_bound_overhead=round(float(m["lower_bound"]) / base, 5),
                               gap=round(float(m["gap"]), 5), note=m.get("method", ""))
                rows.append(row)
                print(row, flush=True)
                write_rows(a.out, rows, fields=FIELDS)


if __name__ == "__main__":
    main()
