"""Sweeps over (model, policy, budget) with one tidy CSV row each, resumable.

``sweep(models, policies, budgets, out=...)`` writes a row as soon as it is finished, so an
interrupted sweep keeps every finished row, and a re-run skips the rows already in ``out``.
"""

from __future__ import annotations

import csv
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from remat.errors import InfeasibleBudgetError, NotApplicableError, RematError

FIELDS = [
    "model", "policy", "budget_spec", "budget_bytes", "no_remat_peak_bytes", "status",
    "peak_bytes", "overhead", "compute_time_s", "energy_j", "recomputations", "solve_time_s",
    "gap", "min_feasible_bytes", "error",
]


def _key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row["model"]), str(row["policy"]), str(row["budget_spec"]))


def read_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """Rows already in a results CSV (empty list when the file does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def evaluate(graph, policy, budget, *, device=None, model: str = "", policy_name: str = "") -> dict:
    """Plan ``graph`` with ``policy`` at ``budget`` and simulate; never raises for a typed error
    (the row records it)."""
    import remat

    row: dict[str, Any] = {
        "model": model or graph.name,
        "policy": policy_name or getattr(policy, "name", type(policy).__name__),
        "budget_spec": str(budget),
        "no_remat_peak_bytes": graph.no_remat_peak(),
    }
    try:
        row["budget_bytes"] = remat.resolve_budget(budget, graph)
        t0 = time.perf_counter()
        plan = policy.plan(graph, budget=budget)
        wall = time.perf_counter() - t0
        rep = remat.simulate(graph, plan, device=device)
        row.update(
            status=plan.meta.get("status", "unknown"),
            peak_bytes=rep.peak_bytes,
            overhead=rep.overhead,
            compute_time_s=rep.compute_time_s,
            energy_j=rep.energy_j,
            recomputations=rep.recomputations,
            solve_time_s=plan.meta.get("solve_time_s", wall),
            gap=plan.meta.get("gap", ""),
        )
    except InfeasibleBudgetError as exc:
        row.update(status="infeasible", min_feasible_bytes=exc.min_feasible_bytes, error=str(exc))
    except NotApplicableError as exc:  # another kind of graph, not a failure
        row.update(status="n/a", error=str(exc))
    except RematError as exc:
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # recorded, never silently dropped
        row.update(status="crash", error=f"{type(exc).__name__}: {exc} | {traceback.format_exc(limit=2)}")
    return row


def sweep(
    models: Mapping[str, Callable[[], Any]] | Iterable[tuple[str, Any]],
    policies: Mapping[str, Any],
    budgets: Sequence[Any],
    *,
    out: str | os.PathLike,
    device=None,
    progress: bool = True,
) -> list[dict]:
    """Run every (model, policy, budget) and append one row each to the CSV ``out``.

    Args:
      models: name -> Graph, or name -> zero-argument callable returning a Graph (built lazily,
        only if some row of that model is missing).
      policies: name -> Policy object.
      budgets: budget specs (bytes, ``"60%"``, ``"512MiB"``).
      out: CSV path; existing rows are kept and skipped (resume).
      device: optional device profile for ``remat.simulate``.

    Returns:
      All rows of ``out`` after the sweep (old and new) as dicts.
    """
    from tqdm.auto import tqdm

    items = list(models.items()) if isinstance(models, Mapping) else list(models)
    done = {_key(r) for r in read_rows(out)}
    todo = [
        (m, p, b) for m, _ in items for p in policies for b in budgets if (m, p, str(b)) not in done
    ]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    new_file = not os.path.exists(out)
    graphs: dict[str, Any] = {}
    with open(out, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        if new_file:
            writer.writeheader()
        for m, p, b in tqdm(todo, disable=not progress, desc="sweep"):
            if m not in graphs:
                src = dict(items)[m]
                graphs[m] = src() if callable(src) else src
            row = evaluate(graphs[m], policies[p], b, device=device, model=m, policy_name=p)
            writer.writerow(row)
            f.flush()
    return read_rows(out)
