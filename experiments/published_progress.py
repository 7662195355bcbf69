"""Issue 18's time clause on the published graphs: per instance, the fastest plan within 5 % of
its bound now, against the wall time the best plan took in an earlier benchmark run.

For every (graph, m) instance at the budget multipliers asked for (default m = 0.9 and 0.8) it
compares two result tables of :mod:`experiments.solver_benchmark_published` (``before`` and
``now``, same columns):

* ``before``: the cheapest fitting plan (replayed peak within the budget), its method and the
  wall time of that row (what a user waited for the best answer then), and the wall time of
  every method run on the instance together.
* ``now``: the cheapest fitting plan, and the *fastest* row whose plan qualifies: a
  program-order plan within ``tol`` of the instance's proven bound, or proven optimal; a plan
  made in another order (reorder rows, heuristic plans with a ``plan_order``) within ``tol`` of
  overhead 1.0, the bound every order shares (each node runs at least once).  The bound of a
  program-order plan is ``max(1, best overhead x (1 - gap))`` over the program-order MILP and LP
  rows (a gap is proven by the solver).
* ``half_time``: whether that fastest qualifying row took at most half the ``before`` best
  row's wall time (empty when ``before`` had no fitting plan).

Wall times are those recorded in the tables (2-core CPU shared with other jobs).  A heuristic
row runs every heuristic in turn; its time here is the chosen policy's own (``policy_wall_s``)
where the table records it, else the whole row's (older tables).  Command that wrote ``published_progress.csv``::

    git show 21a69fe:experiments/results/published_benchmark.csv > /tmp/before.csv
    python -m experiments.published_progress --before /tmp/before.csv

(21a69fe is the benchmark the issue measured.)
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NOW = HERE / "results" / "published_benchmark.csv"
OUT = HERE / "results" / "published_progress.csv"
REQUIRED = ("graph", "n", "m", "method", "status", "overhead", "wall_s")
FIELDS = ["graph", "n", "m", "before_best_overhead", "before_best_method", "before_best_wall_s",
          "before_all_methods_wall_s", "now_best_overhead", "now_best_method", "now_best_wall_s",
          "bound_overhead", "now_fastest_method", "now_fastest_overhead", "now_fastest_wall_s",
          "qualifies", "half_time"]


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fits(r: dict[str, str]) -> bool:
    return r.get("status") == "ok" and str(r.get("peak_ok")) == "True" and _num(r.get("overhead")) is not None


def _label(r: dict[str, str]) -> str:
    pol = r.get("policy") or ""
    return f"{r['method']} ({pol})" if pol and r["method"] == "heuristic" else r["method"]


def wall(r: dict[str, str]) -> float | None:
    """Seconds a user waits for the row's plan: a heuristic row's chosen policy alone
    (``policy_wall_s``) where recorded, else the row's ``wall_s``."""
    own = _num(r.get("policy_wall_s"))
    return own if own is not None else _num(r.get("wall_s"))


def _program_order(r: dict[str, str]) -> bool:
    """Whether the row's plan runs the nodes in the graph's order (column ``plan_order``;
    rows older than that column: every method but ``reorder``)."""
    order = r.get("plan_order") or ("min_peak" if r["method"] == "reorder" else "program")
    return order == "program"


def instance_bound(rows: Sequence[dict[str, str]]) -> float:
    """Largest proven lower bound on a program-order plan's overhead among ``rows`` (one
    instance): ``overhead x (1 - gap)`` of its MILP and LP rows, and 1.0."""
    lb = 1.0
    for r in rows:
        if r["method"] in ("milp", "lp") and _fits(r) and _num(r.get("gap")) is not None:
            lb = max(lb, float(r["overhead"]) * (1.0 - max(0.0, float(r["gap"]))))
    return lb


def qualifies(r: dict[str, str], bound: float, tol: float) -> bool:
    """A fitting plan within ``tol`` of its bound (``bound`` for program-order plans, 1.0 for
    plans made in another order), or a program-order MILP plan proven optimal."""
    if not _fits(r):
        return False
    ov = float(r["overhead"])
    if _program_order(r):
        return ov <= (1.0 + tol) * bound * (1 + 1e-12) or (
            r["method"] == "milp" and r.get("solver_status") == "optimal")
    return ov <= (1.0 + tol) * (1 + 1e-12)


def progress_rows(before: Sequence[dict[str, str]], now: Sequence[dict[str, str]],
                  mults: Sequence[float] = (0.9, 0.8), tol: float = 0.05) -> list[dict[str, Any]]:
    """One row per (graph, m) of ``now`` with ``m`` in ``mults`` (see the module docstring).

    Raises:
      RematError: ``tol`` negative, or a row without one of the benchmark's key columns.
    """
    from remat.core.errors import RematError

    if not tol >= 0:
        raise RematError(f"tol must be >= 0, got {tol!r}")
    for which, rows in (("before", before), ("now", now)):
        for r in rows:
            missing = [c for c in REQUIRED if c not in r]
            if missing:
                raise RematError(f"{which} table: row without column(s) {missing} "
                                 f"(not a published_benchmark.csv?)")
    def group(rows):
        out: dict[tuple[str, float], list[dict[str, str]]] = {}
        for r in rows:
            out.setdefault((r["graph"], round(float(r["m"]), 6)), []).append(r)
        return out

    b_by, n_by = group(before), group(now)
    res = []
    for (g, m), rs in sorted(n_by.items(), key=lambda kv: (int(kv[1][0]["n"]), kv[0][0], -kv[0][1])):
        if not any(abs(m - x) < 1e-9 for x in mults):
            continue
        brs = b_by.get((g, m), [])
        bfit = [r for r in brs if _fits(r)]
        bbest = min(bfit, key=lambda r: float(r["overhead"])) if bfit else None
        nfit = [r for r in rs if _fits(r)]
        nbest = min(nfit, key=lambda r: float(r["overhead"])) if nfit else None
        bound = instance_bound(rs)
        q = [r for r in rs if qualifies(r, bound, tol) and wall(r) is not None]
        fast = min(q, key=wall) if q else None
        row: dict[str, Any] = {"graph": g, "n": rs[0]["n"], "m": m, "bound_overhead": round(bound, 6),
                               "qualifies": fast is not None}
        if bbest is not None:
            row.update(before_best_overhead=round(float(bbest["overhead"]), 6),
                       before_best_method=_label(bbest),
                       before_best_wall_s=round(wall(bbest) or 0.0, 2))
        row["before_all_methods_wall_s"] = round(sum(_num(r.get("wall_s")) or 0.0 for r in brs), 2)
        if nbest is not None:
            row.update(now_best_overhead=round(float(nbest["overhead"]), 6),
                       now_best_method=_label(nbest), now_best_wall_s=round(wall(nbest) or 0.0, 2))
        if fast is not None:
            row.update(now_fastest_method=_label(fast),
                       now_fastest_overhead=round(float(fast["overhead"]), 6),
                       now_fastest_wall_s=round(wall(fast), 2))
            if bbest is not None and wall(bbest):
                row["half_time"] = wall(fast) <= 0.5 * wall(bbest)
        res.append(row)
    return res


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="an earlier published_benchmark.csv")
    ap.add_argument("--now", type=Path, default=NOW)
    ap.add_argument("--mults", nargs="*", type=float, default=[0.9, 0.8])
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    from experiments.solver_benchmark_published import read_rows
    from remat.core.errors import RematError

    for path in (a.before, a.now):
        if not path.is_file():
            raise RematError(f"no benchmark table at {path}")
    rows = progress_rows(read_rows(a.before), read_rows(a.now), a.mults, a.tol)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print("| graph | m | before: best (wall) | now: fastest within tol (wall) | half time |")
    print("|---|---:|---|---|---|")
    for r in rows:
        b = (f"{r['before_best_overhead']:.4f} {r['before_best_method']} ({r['before_best_wall_s']:.1f} s)"
             if "before_best_overhead" in r else "no plan")
        n = (f"{r['now_fastest_overhead']:.4f} {r['now_fastest_method']} ({r['now_fastest_wall_s']:.1f} s)"
             if r["qualifies"] else "none")
        print(f"| {r['graph']} | {r['m']} | {b} | {n} | {r.get('half_time', '')} |")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
