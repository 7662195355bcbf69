"""Solver benchmark on the published Checkmate graphs and Moccasin's random layered DAGs.

Length: a benchmark script, kept whole so that one file shows every method, the consistency
checks of its results and the table it writes.

For every published Checkmate/Moccasin benchmark graph (Jain et al. 2020; Bartan et al. 2023;
read from ``$REMAT_BENCHMARKS``, by default the folder ``DEFAULT_BENCH`` outside the repository,
which does not hold the graphs) and every budget multiplier ``m`` (default 0.9,
0.8, 0.7, 0.6), the budget is the peers' rule ``ceil(m * no_remat_peak)`` bytes
(:meth:`remat.Graph.no_remat_peak`, as in Moccasin's benchmark script), and three methods run:

* ``milp``: the exact Checkmate MILP, ``policies.Checkmate(time_limit=T)``;
* ``lp``: LP relaxation plus rounding, ``policies.Checkmate(relax="lp", time_limit=T)``;
* ``reorder``: ``policies.Checkmate(order="min_peak", lns=True, time_limit=T)``: the graph
  relabelled by OLLA's low-peak topological order (a quarter of the time), then Checkmate's
  anytime search in that order; its bound holds for frontier-form schedules in that order (with
  overhead 1.000 it is the absolute bound);
* ``heuristic``: every registered heuristic among ``--heuristics`` (SqrtN, greedy, ChainDP, ...)
  that applies to the graph; the row keeps the cheapest whose plan fits the budget.

For each returned plan the harness recomputes, from the plan's R/S matrices alone:
``objective`` = sum over executions of the node's cost (profiled units), ``overhead`` =
objective / cost of running every node once, and ``peak_bytes`` by
:func:`remat.core.schedule.replay` (which shares no code with the MILP builder), and checks
``peak_bytes <= budget`` (``status`` = ``ok`` or ``over_budget``; an illegal plan is
``invalid_plan``).  A budget below the largest single step's need (a node's output plus its
inputs, ``min_step_bytes``) is reported as ``infeasible_proven`` without calling a solver.
Solver infeasibility (:class:`~remat.core.errors.InfeasibleBudgetError`) is ``infeasible`` with the
solver's ``min_feasible_bytes``; every other exception is recorded in ``status``/``error``.
Each instance runs in a child process with a hard wall-clock limit (``--hard-timeout``,
``killed_wallclock``) and an address-space limit (``--mem-limit-gb``; ``crashed`` when the child
dies), so one instance can never stop the sweep.

Rows are appended (and flushed) as each instance finishes; a re-run skips finished
(graph, m, method) rows, so an interrupted sweep loses nothing.  Rows with status
``unavailable`` (policy not registered) or ``skipped`` (``--max-nodes``) are retried.

Commands that made ``experiments/results/published_benchmark.csv`` and its summary
``published_benchmark.md`` (2-core CPU shared with other jobs, load average 7-10, HiGHS 1.15;
run in this order, each resuming the same CSV; the ``.md`` header repeats them and the CSV's ``command`` column says which made each row)::

    P="python -m experiments.solver_benchmark_published --time-limit 60"
    $P --max-nodes 400              # interrupted after MobileNet (time), then:
    $P --hard-timeout 240 --graphs ResNet50 --mults 0.9 0.8
    $P --hard-timeout 240 --graphs n250 --mults 0.9 0.8
    $P --hard-timeout 240 --graphs ResNet50 n250 --mults 0.7 0.6
    $P --hard-timeout 240 --methods heuristic --force    # once SqrtN/Griewank had landed
    $P --hard-timeout 240 --graphs n500 --mults 0.9 0.8 --methods milp lp
    $P --hard-timeout 240 --graphs n1000 --mults 0.9 --methods milp lp --mem-limit-gb 10
    $P --hard-timeout 240 --graphs n500 --mults 0.7 0.6 --methods milp lp

Then, once ``pebbling``, the pebbling bound and the DAG-heuristic warm starts had landed::

    $P --hard-timeout 1200 --graphs random_layered --methods heuristic --force --proof-time 60
    $P --hard-timeout 1500 --graphs random_layered --methods heuristic --retry-failed --proof-time 60
    $P --hard-timeout 400 --graphs random_layered_n100_ random_layered_n500_ --methods milp lp --force

(the first of these was stopped after n = 500, m = 0.8; the second re-ran the rows without a
plan with the then-current code.  MILP/LP on random_layered_n1000 at m < 0.9 was not attempted:
at m = 0.9 both solves exceeded the 10 GiB address-space limit while building the model.)

Once the greedy low-peak orders (``solvers.order_search``) and peak shaving (``peak_shave``,
also a Checkmate warm start) had landed, the random layered rows of both methods were re-run
(the two sweeps concurrently on the 2-core machine)::

    $P --time-limit 120 --hard-timeout 400 --graphs random_layered --methods reorder --force
    $P --hard-timeout 1500 --graphs random_layered --methods heuristic --force --proof-time 60

Then the heuristic rows of the other graphs (``peak_shave`` among them now), the rows still
short of a proof at the protocol's 300 s where time allowed, and the random layered heuristic
rows at m = 0.9/0.8 again, now recording the chosen policy's own time (``policy_wall_s``; the
first command ran before that column existed), one after the other on the 2-core machine::

    NR="VGG16 VGG19 vgg_unet fcn_8 segnet MobileNet ResNet50"
    $P --hard-timeout 1200 --graphs $NR --methods heuristic --force --proof-time 60
    P3="python -m experiments.solver_benchmark_published --time-limit 300 --hard-timeout 1020"
    $P3 --graphs ResNet50 --mults 0.8 0.7 0.6 --methods milp --force
    $P3 --graphs MobileNet --mults 0.6 --methods milp --force
    $P3 --graphs random_layered_n250_ --mults 0.6 --methods reorder --force
    $P3 --graphs random_layered_n500_ random_layered_n1000_ --mults 0.9 0.8 --methods reorder --force
    $P3 --graphs random_layered_n100_ --mults 0.7 0.6 --methods milp --force
    RL="random_layered_n500_ random_layered_n1000_ random_layered_n100_ random_layered_n250_"
    $P --hard-timeout 1500 --graphs $RL --mults 0.9 0.8 --methods heuristic --force --proof-time 60

Once ``Pebbling`` had the complete witness search (:mod:`solvers.pebbling_search`; it decided
n = 250 at m = 0.6, the last open instance), the random layered heuristic rows at m = 0.7/0.6::

    $P --hard-timeout 1500 --graphs random_layered --mults 0.7 0.6 --methods heuristic --force --proof-time 60

Once ChainDP had its level portfolio and plans were pruned in both orders
(:func:`solvers.pebbling_search.prune_best`), the heuristic rows of the network graphs and of
n = 100 / 250 (n = 500 / 1000 were not re-run: their pebbling rows take minutes)::

    $P --hard-timeout 1200 --graphs $NR random_layered_n100_ random_layered_n250_ --methods heuristic --force --proof-time 60

Once the MILP's memory chain was added lazily (and repaired), before path cuts, the MILP rows at
m = 0.9 / 0.8 of the network graphs and n = 100, ResNet-50 with 120 s::

    $P --hard-timeout 240 --graphs VGG16 VGG19 vgg_unet fcn_8 segnet MobileNet random_layered_n100_ --mults 0.9 0.8 --methods milp --force
    python -m experiments.solver_benchmark_published --time-limit 120 --hard-timeout 400 --graphs ResNet50 --mults 0.9 0.8 --methods milp --force

The full protocol (300 s per solve, every graph) is the default:

    python -m experiments.solver_benchmark_published
"""

from __future__ import annotations

import argparse
import csv
import datetime
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BENCH = Path(
    os.environ.get("REMAT_BENCHMARKS", ROOT / ".." / "shared" / "benchmarks" / "checkmate-graphs")
)
DEFAULT_OUT = ROOT / "experiments" / "results" / "published_benchmark.csv"
METHODS = ("milp", "lp", "reorder", "heuristic")
DEFAULT_HEURISTICS = (
    "sqrtn", "sqrt_n", "chen_sqrtn", "greedy", "chen_greedy", "chain_dp", "griewank", "revolve",
    "greedy_remat", "pebbling", "peak_shave",
)
# a coarser search for the heuristics' own minimum budget when they fail (bisection runs)
HEURISTIC_OPTIONS: dict[str, dict[str, Any]] = {
    "pebbling": {"search_rtol": 0.01, "search_time_s": 120.0},
    "greedy_remat": {"search_rtol": 0.01},
}
RETRY_STATUSES = {"unavailable", "skipped"}
FIELDS = [
    "graph", "n", "edges", "m", "budget_bytes", "no_remat_peak_bytes", "min_step_bytes",
    "method", "policy", "status", "solver_status", "objective", "no_remat_objective", "overhead",
    "peak_bytes", "peak_over_budget", "peak_ok", "gap", "solve_time_s", "wall_s",
    "min_feasible_bytes", "recomputations", "steps", "time_limit_s", "error", "detail",
    "finished_at", "command", "plan_order", "policy_wall_s",
]


# ----------------------------------------------------------------------------- measurements
def min_step_bytes(graph) -> int:
    """Largest single-step need: ``max_v out_bytes[v] + sum(out_bytes[u] for u in preds(v))``.

    No schedule under the replay model can run node ``v`` with less resident memory, so a
    budget below this is provably infeasible (Moccasin ``util.max_degree_ram``).
    """
    from solvers.bounds import frontier_lower_bound

    return frontier_lower_bound(graph.sizes, graph.edge_array)


def measure_plan(graph, plan, budget: int) -> dict[str, Any]:
    """Objective, overhead and replayed peak of ``plan`` (computed here from R/S alone)."""
    from remat.core.errors import InvalidPlanError
    from remat.core.schedule import replay

    counts = plan.R.sum(axis=0).astype(np.int64)
    costs = graph.costs
    objective = float(counts @ costs)
    base = float(costs.sum())
    row: dict[str, Any] = {
        "solver_status": plan.meta.get("status", ""),
        "objective": objective,
        "no_remat_objective": base,
        "overhead": objective / base if base > 0 else 1.0,
        "recomputations": int(counts.sum() - graph.n),
        "steps": int(plan.R.shape[0]),
        "gap": plan.meta.get("gap", ""),
        "solve_time_s": plan.meta.get("solve_time_s", ""),
        # the execution order the plan was made in: "program", or a low-peak order
        # (Checkmate's "min_peak", peak_shave's "greedyK"); mapped back to the graph either way
        "plan_order": str(plan.meta.get("order") or "program"),
    }
    try:
        plan.validate(graph)
        peak = replay(graph, plan, strict=True).peak_bytes
    except InvalidPlanError as exc:
        row.update(status="invalid_plan", error=f"InvalidPlanError: {exc}")
        return row
    row.update(
        peak_bytes=int(peak),
        peak_over_budget=peak / budget if budget else "",
        peak_ok=bool(peak <= budget),
        status="ok" if peak <= budget else "over_budget",
    )
    return row


def _not_applicable_types() -> tuple[type[BaseException], ...]:
    """Errors meaning "this graph is outside the policy's scope".  The benchmark graphs passed
    the loader's validation, so an ``InvalidGraphError`` from ``plan`` (ChainDP on a non-chain)
    is such an error too, as is any ``remat.errors`` class named ``*NotApplicable*``."""
    from remat.core import errors

    names = [n for n in dir(errors) if "NotApplicable" in n or "UnsupportedGraph" in n]
    found = tuple(getattr(errors, n) for n in names if isinstance(getattr(errors, n), type))
    return (errors.InvalidGraphError, *found)


def register_all_policies() -> list[str]:
    """Import every module of the ``policies`` package so each registers itself, even the ones
    ``policies/__init__.py`` does not import yet; return ``policies.available()``."""
    import importlib
    import pkgutil

    import policies

    for mod in pkgutil.iter_modules(policies.__path__):
        try:
            importlib.import_module(f"policies.{mod.name}")
        except Exception as exc:  # noqa: BLE001 - a broken policy must not stop the sweep
            print(f"warning: policies.{mod.name} does not import: {exc}", file=sys.stderr)
    return policies.available()


def _make(name: str, **options):
    import policies

    known = policies.option_names(name)
    return policies.get(name, **{k: v for k, v in options.items() if k in known})


def _run_policy(graph, name: str, budget: int, **options) -> dict[str, Any]:
    """Plan with one policy; classify every outcome into a row fragment."""
    from remat.core.errors import InfeasibleBudgetError, SolverTimeoutError

    t0 = time.perf_counter()
    try:
        plan = _make(name, **options).plan(graph, budget=budget)
    except InfeasibleBudgetError as exc:
        return {"status": "infeasible", "min_feasible_bytes": int(exc.min_feasible_bytes),
                "error": str(exc)[:300], "wall_s": time.perf_counter() - t0}
    except SolverTimeoutError as exc:
        return {"status": "timeout_no_incumbent", "error": str(exc)[:300],
                "gap": "", "wall_s": time.perf_counter() - t0}
    except _not_applicable_types() as exc:
        return {"status": "not_applicable", "error": f"{type(exc).__name__}: {exc}"[:300],
                "wall_s": time.perf_counter() - t0}
    except MemoryError:
        return {"status": "error", "error": "MemoryError (address-space limit)",
                "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # recorded, never silently dropped
        tb = traceback.format_exc(limit=3).replace("\n", " | ")
        return {"status": "error", "error": f"{type(exc).__name__}: {exc} || {tb}"[:600],
                "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    row = measure_plan(graph, plan, budget)
    row.update(policy=name, wall_s=wall)
    return row


def solve_instance(path: str, method: str, budget: int, time_limit: float,
                   heuristics: Sequence[str], proof_time: float = 120.0) -> dict[str, Any]:
    """One (graph, budget, method) instance; runs in the child process."""
    import remat

    graph = remat.load_graph(path)
    registered = set(register_all_policies())
    if method in ("milp", "lp", "reorder"):
        if "checkmate" not in registered:
            return {"status": "unavailable", "error": "policy 'checkmate' is not registered"}
        opts: dict[str, Any] = {"time_limit": time_limit}
        if method == "lp":
            opts["relax"] = "lp"
        if method == "reorder":
            opts.update(order="min_peak", lns=True)
        row = _run_policy(graph, "checkmate", budget, **opts)
        row["policy"] = "checkmate" + {"milp": "", "lp": "(relax=lp)",
                                       "reorder": "(order=min_peak, lns)"}[method]
        return row
    cands = [h for h in heuristics if h in registered]
    if not cands:
        return {"status": "unavailable",
                "error": f"none of {list(heuristics)} is registered ({sorted(registered)})"}
    tried, best, mins = [], None, []
    t0 = time.perf_counter()
    for name in cands:
        r = _run_policy(graph, name, budget, **HEURISTIC_OPTIONS.get(name, {}))
        if r.get("min_feasible_bytes") not in (None, ""):
            mins.append(int(r["min_feasible_bytes"]))
        desc = r["status"]
        if "overhead" in r and r["status"] in ("ok", "over_budget"):
            desc += f" overhead={r['overhead']:.4f} peak/budget={r.get('peak_over_budget', 0):.3f}"
        desc += f" ({r['wall_s']:.1f} s)"
        tried.append(f"{name}: {desc}")
        if r["status"] == "ok" and (best is None or r["objective"] < best["objective"]):
            best = r
    detail = "; ".join(tried)
    if best is not None:
        # wall_s: every heuristic of the row; policy_wall_s: the chosen one alone
        best = dict(best, detail=detail, policy_wall_s=best["wall_s"],
                    wall_s=time.perf_counter() - t0)
        return best
    # no heuristic fits: try to prove that no schedule at all fits (pebbling lower bound)
    if proof_time > 0:
        from solvers.pebbling_bound import prove_infeasible

        pr = prove_infeasible(graph.preds, graph.sizes, budget, time_limit=proof_time)
        if pr.proven:
            return {"status": "infeasible_proven", "policy": "pebbling_bound",
                    "wall_s": time.perf_counter() - t0,
                    "detail": (f"pebbling bound: every schedule that runs node "
                               f"{graph.nodes[pr.node].name!r} peaks above the budget "
                               f"({pr.states} search states, {pr.seconds:.1f} s); {detail}")}
        detail += (f"; pebbling bound: no proof ({pr.states} states, {len(pr.unknown_nodes)} "
                   f"nodes undecided, {pr.seconds:.0f} s)")
    # "heuristic_infeasible" (each policy's min_feasible_bytes is under its own restricted
    # schedule family, not a bound on the problem)
    return {"status": "heuristic_infeasible"
            if any("infeasible" in t or "over_budget" in t for t in tried) else "not_applicable", "detail": detail, "wall_s": time.perf_counter() - t0,
            "policy": ",".join(cands), **({"min_feasible_bytes": min(mins)} if mins else {})}


def _child(conn, mem_limit_gb, args) -> None:
    try:
        if mem_limit_gb:
            import resource

            lim = int(mem_limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        conn.send(solve_instance(*args))
    except BaseException as exc:  # noqa: BLE001 - report anything, even SystemExit
        conn.send({"status": "error", "error": f"{type(exc).__name__}: {exc}"[:600]})
    finally:
        conn.close()


def run_isolated(args: tuple, hard_timeout: float, mem_limit_gb: float | None) -> dict[str, Any]:
    """``solve_instance(*args)`` in a forked child with a wall-clock and memory limit."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, mem_limit_gb, args), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    send.close()
    result = None
    answered = recv.poll(hard_timeout)
    if answered:
        try:
            result = recv.recv()
        except EOFError:  # the child died without answering (killed for memory, abort, ...)
            result = None
    wall = time.perf_counter() - t0
    proc.join(10 if answered else 0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if not answered:
        return {"status": "killed_wallclock", "wall_s": wall,
                "error": f"no answer within the hard limit of {hard_timeout:.0f} s"}
    if result is None:
        return {"status": "crashed", "wall_s": wall,
                "error": f"child exited with code {proc.exitcode} (out of memory?)"}
    result.setdefault("wall_s", wall)
    return result


# ----------------------------------------------------------------------------- the sweep
def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _fmt_m(m: float) -> str:
    return f"{m:g}"


def instances(files: Sequence[Path], mults: Sequence[float], methods: Sequence[str]):
    """Yield (graph, path, m, method) smallest graph first, loosest budget first."""
    import remat

    graphs = sorted(((remat.load_graph(p), p) for p in files), key=lambda gp: (gp[0].n, gp[1].name))
    for g, p in graphs:
        for m in mults:
            for method in methods:
                yield g, p, m, method


def sweep(args) -> list[dict[str, str]]:
    from tqdm.auto import tqdm

    import remat

    files = sorted(Path(args.bench_dir).glob("*.json"))
    if args.graphs:
        files = [p for p in files if any(s in p.name for s in args.graphs)]
    if not files:
        raise SystemExit(f"no benchmark graphs under {args.bench_dir}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = read_rows(out)
    done = {(r["graph"], r["m"], r["method"]) for r in old if r["status"] not in RETRY_STATUSES}
    if args.force:
        done = set()
    elif args.retry_failed:
        done = {(r["graph"], r["m"], r["method"]) for r in old
                if r["status"] in ("ok", "infeasible", "infeasible_proven", "not_applicable")}
    todo = [i for i in instances(files, args.mults, args.methods)
            if (i[0].name, _fmt_m(i[2]), i[3]) not in done]
    # keep only the newest row per key in the file when re-running (rewrite without the stale ones)
    stale = {(i[0].name, _fmt_m(i[2]), i[3]) for i in todo}
    kept = [r for r in old if (r["graph"], r["m"], r["method"]) not in stale]
    header: list[str] = []
    if out.exists():
        with open(out, newline="") as f:
            header = next(csv.reader(f), [])
    if len(kept) != len(old) or not out.exists() or header != FIELDS:  # new columns: rewrite
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(kept)
    hard = args.hard_timeout or (3 * args.time_limit + 120)
    bar = tqdm(todo, desc="published benchmark", unit="inst", file=sys.stderr)
    for g, p, m, method in bar:
        bar.set_postfix_str(f"{g.name[:22]} m={_fmt_m(m)} {method}")
        budget = remat.resolve_budget(f"{_fmt_m(m)}x", g)
        need = min_step_bytes(g)
        row: dict[str, Any] = {
            "graph": g.name, "n": g.n, "edges": len(g.edges), "m": _fmt_m(m),
            "budget_bytes": budget, "no_remat_peak_bytes": g.no_remat_peak(),
            "min_step_bytes": need, "method": method, "time_limit_s": args.time_limit,
            "command": args.command,
        }
        if budget < need:
            row.update(status="infeasible_proven", wall_s=0.0, detail=(
                f"budget {budget} < largest single-step need {need} (no solver called)"))
        elif method in ("milp", "lp") and args.max_nodes and g.n > args.max_nodes:
            row.update(status="skipped", detail=f"n={g.n} > --max-nodes {args.max_nodes}")
        else:
            row.update(run_isolated((str(p), method, budget, args.time_limit,
                                     tuple(args.heuristics), args.proof_time),
                                    hard, args.mem_limit_gb))
        row["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with open(out, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore").writerow(row)
            f.flush()
            os.fsync(f.fileno())
        bar.write(f"{g.name[:30]:30s} m={_fmt_m(m)} {method:9s} {row.get('status')}"
                  f" overhead={row.get('overhead', '')} wall={float(row.get('wall_s') or 0):.1f}s")
    return read_rows(out)


# ----------------------------------------------------------------------------- summary
def _f(x: str, fmt: str = "{:.3f}") -> str:
    try:
        return fmt.format(float(x))
    except (TypeError, ValueError):
        return ""


def _bytes(x: str | int) -> str:
    b = int(float(x))
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b} B"


def _cell(r: dict[str, str] | None) -> str:
    if r is None:
        return "not run"
    st = r["status"]
    if st == "ok":
        s = f"{_f(r['overhead'])}"
        extra = []
        if r.get("solver_status") and r["solver_status"] not in ("optimal",):
            extra.append(r["solver_status"])
        if r.get("gap") not in ("", None) and _f(r["gap"], "{:.2%}") and float(r["gap"]) > 1e-6:
            extra.append(f"gap {_f(r['gap'], '{:.1%}')}")
        if r.get("policy") and r["method"] == "heuristic":
            extra.append(r["policy"])
        if r["method"] == "heuristic" and _f(r.get("policy_wall_s")):  # the chosen one alone
            extra.append(f"{_f(r['policy_wall_s'], '{:.1f}')} s of {_f(r['wall_s'], '{:.1f}')} s")
        else:
            extra.append(f"{_f(r['wall_s'], '{:.1f}')} s")
        return s + " (" + ", ".join(extra) + ")"
    if st in ("infeasible", "heuristic_infeasible") and r.get("min_feasible_bytes"):
        return f"{st} (min feasible {_bytes(r['min_feasible_bytes'])})"
    if st == "infeasible_proven":
        if r.get("policy") == "pebbling_bound":
            return "infeasible (proven: pebbling bound)"
        return "infeasible (proven: < single-step need)"
    why = f": {r['error'].split(' || ')[0][:60]}" if st in ("error", "crashed") and r.get("error") else ""
    return st + why + (f" ({_f(r.get('wall_s'), '{:.0f}')} s)" if r.get("wall_s") else "")


def summary_markdown(rows: list[dict[str, str]], header: str,
                     open_bounds: list[dict[str, str]] | None = None) -> str:
    by = {(r["graph"], r["m"], r["method"]): r for r in rows}
    keys = sorted({(r["graph"], int(r["n"]), r["m"]) for r in rows},
                  key=lambda k: (k[1], k[0], -float(k[2])))
    lines = [header, "",
             "Cells: overhead = compute of the plan / compute of running every node once "
             "(1.000 = no recomputation), solver status when not optimal, MILP gap, wall time. "
             "Peaks are replayed from each plan's R/S (`remat.core.schedule.replay`) and checked "
             "against the budget; `over_budget` marks a plan that does not fit. `not run`: no "
             "row for that instance in the CSV (not attempted by the commands above).", "",
             "Verdict: `feasible` (the cheapest fitting plan of any method), `infeasible` (a "
             "proof: budget below one node's need, or the pebbling lower bound of "
             "`solvers.pebbling_bound`, valid for any order and any recomputation), or `open`.",
             "",
             "| graph | n | m | budget | min step | MILP (exact) | LP rounding "
             "| reorder + LNS | best heuristic | verdict |",
             "|---|---:|---:|---:|---:|---|---|---|---|---|"]
    verdicts = {}
    for g, n, m in keys:
        any_row = next(r for r in rows if r["graph"] == g and r["m"] == m)
        verdicts[(g, m)] = v = verdict([by.get((g, m, k)) for k in METHODS])
        lines.append(
            f"| {g} | {n} | {m} | {_bytes(any_row['budget_bytes'])} | "
            f"{_bytes(any_row['min_step_bytes'])} | "
            + " | ".join(_cell(by.get((g, m, k))) for k in METHODS) + f" | {v} |")
    # aggregates
    lines.append("")
    kinds = [v.split(" ")[0] for v in verdicts.values()]
    lines.append(f"- instances: {len(kinds)}; feasible {kinds.count('feasible')}, proven "
                 f"infeasible {kinds.count('infeasible')}, open {kinds.count('open')}")
    for meth in METHODS:
        rs = [r for r in rows if r["method"] == meth]
        ok = [r for r in rs if r["status"] == "ok"]
        opt = [r for r in ok if r.get("solver_status") == "optimal"]
        lines.append(
            f"- {meth}: {len(rs)} rows, {len(ok)} feasible plans within budget"
            + (f" ({len(opt)} proven optimal)" if meth == "milp" else "")
            + (f", median overhead {np.median([float(r['overhead']) for r in ok]):.3f}" if ok else "")
            + ", other statuses: "
            + (", ".join(f"{s} {sum(r['status'] == s for r in rs)}"
                         for s in sorted({r['status'] for r in rs} - {'ok'})) or "none"))
    bad = [r for r in rows if r["status"] in ("over_budget", "invalid_plan")]
    lines.append(f"- plans whose replayed peak exceeds the budget or that are illegal: {len(bad)}"
                 + "".join(f"\n  - {r['graph']} m={r['m']} {r['method']}: {r['status']}"
                           for r in bad))
    lines.extend(contradictions(rows))
    lines.extend(open_bounds_section(open_bounds or [], verdicts))
    return "\n".join(lines) + "\n"


def open_bounds_section(bounds: list[dict[str, str]], verdicts: dict) -> list[str]:
    """Markdown lines for the open instances' bounds (``experiments/open_instances.py``)."""
    rows = [b for b in bounds if verdicts.get((b["graph"], b["m"]), "").startswith("open")]
    if not rows:
        return []
    out = ["", "What the open instances reached (`python -m experiments.open_instances` -> "
           "`open_instances.csv`): *floor* = the largest budget the pebbling lower bound proves "
           "too small for every schedule (any order, any recomputation; bisection from the "
           "single-step need); *best plan* = the smallest peak any method's plan reached; "
           "*program-order LP* = Checkmate's LP relaxation at the budget (`infeasible` proves "
           "that no plan in the program order fits; otherwise a lower bound on its overhead).",
           "", "| graph | m | budget | floor (proven) | best plan peak | program-order LP |",
           "|---|---:|---:|---:|---:|---|"]
    for b in rows:
        lp = b["lp_status"] + (f", overhead >= {float(b['lp_bound_overhead']):.3f}"
                               if b.get("lp_bound_overhead") else "") + f" ({b['lp_seconds']} s)"
        out.append(f"| {b['graph']} | {b['m']} | {_bytes(b['budget_bytes'])} | "
                   f"> {_bytes(b['memory_floor_bytes'])} ({b['floor_probes']} probes, "
                   f"{b['floor_seconds']} s) | {_bytes(b['best_peak_bytes']) if b['best_peak_bytes'] else '-'} "
                   f"| {lp} |")
    return out


def verdict(rs: Sequence[dict[str, str] | None]) -> str:
    """One instance's verdict from its method rows: ``feasible (overhead, method)`` for the
    cheapest plan that fits, ``infeasible (proof)``, or ``open``."""
    ok = [r for r in rs if r is not None and r["status"] == "ok"]
    if ok:
        b = min(ok, key=lambda r: float(r["objective"]))
        return f"feasible ({_f(b['overhead'])}, {b['method']})"
    proofs = [r for r in rs if r is not None and r["status"] == "infeasible_proven"]
    if proofs:
        kind = ("pebbling bound" if any(r.get("policy") == "pebbling_bound" for r in proofs)
                else "< single-step need")
        return f"infeasible ({kind})"
    return "open"


def contradictions(rows: list[dict[str, str]]) -> list[str]:
    """Infeasibility claims refuted by a plan that fits: an ``infeasible`` MILP/LP row whose
    ``min_feasible_bytes`` exceeds the peak of some ``ok`` plan (any method) on the same graph,
    or ``infeasible``/``infeasible_proven`` at a budget where another method found a plan."""
    out = []
    ok = [r for r in rows if r["status"] == "ok"]
    for r in rows:
        if r["status"] not in ("infeasible", "infeasible_proven"):
            continue
        if r["method"] == "heuristic" and r["status"] != "infeasible_proven":
            continue  # a heuristic's own minimum is not a claim about the problem
        same = [o for o in ok if o["graph"] == r["graph"]]
        claim = r.get("min_feasible_bytes") or ""
        refuting = [o for o in same if o["m"] == r["m"]]
        if claim:
            refuting += [o for o in same if float(o["peak_bytes"]) < float(claim)]
        if refuting:
            o = min(refuting, key=lambda o: float(o["peak_bytes"]))
            out.append(
                f"- contradiction: {r['graph']} m={r['m']} {r['method']} says {r['status']}"
                + (f" (min feasible {claim} B)" if claim else "")
                + f", but {o['method']} at m={o['m']} returned a plan peaking at "
                f"{o['peak_bytes']} B")
    if not out:
        out.append("- infeasibility claims refuted by a fitting plan: none")
    # a MILP that says "optimal" must not be beaten by LP rounding or a heuristic
    # (a reordered plan runs in another execution order, outside the fixed-order MILP's
    # schedule space: beating it is the point of reordering, listed apart)
    beaten, reordered = [], []
    for r in ok:
        if r["method"] != "milp" or r.get("solver_status") != "optimal":
            continue
        tol = float(r["objective"]) * (1e-4 + float(r.get("gap") or 0))
        for o in ok:
            if (o["graph"], o["m"]) == (r["graph"], r["m"]) and o["method"] != "milp" and (
                    float(o["objective"]) < float(r["objective"]) - tol):
                other_order = o["method"] == "reorder" or (o.get("plan_order") or "program") not in (
                    "program",)
                (reordered if other_order else beaten).append(
                    f"  - {r['graph']} m={r['m']}: {o['method']} {o['objective']} < "
                    f"MILP {r['objective']}")
    out.append(f"- 'optimal' MILP plans beaten by another method: {len(beaten)}")
    out += beaten
    out.append(f"- program-order MILP optima beaten by planning in a low-peak order (reorder, "
               f"or a heuristic's plan made in one, column plan_order): "
               f"{len(reordered)}")
    return out + reordered


def _git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-dir", default=str(DEFAULT_BENCH))
    ap.add_argument("--graphs", nargs="*", default=None, help="substrings of file names to keep")
    ap.add_argument("--mults", nargs="*", type=float, default=[0.9, 0.8, 0.7, 0.6])
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    ap.add_argument("--heuristics", nargs="*", default=list(DEFAULT_HEURISTICS))
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per MILP/LP solve")
    ap.add_argument("--proof-time", type=float, default=120.0,
                    help="seconds for the pebbling lower bound when no heuristic fits (0: off)")
    ap.add_argument("--hard-timeout", type=float, default=None,
                    help="wall-clock kill per instance (default 3 x time limit + 120 s)")
    ap.add_argument("--mem-limit-gb", type=float, default=12.0,
                    help="address-space limit of each solver process (0: none)")
    ap.add_argument("--max-nodes", type=int, default=0,
                    help="skip MILP/LP on graphs with more nodes (0: no limit)")
    ap.add_argument("--retry-failed", action="store_true",
                    help="re-run rows that ended in error/timeout/kill")
    ap.add_argument("--force", action="store_true",
                    help="re-run the selected instances even when finished (replaces their rows)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--md", default=None, help="markdown summary (default: --out with .md)")
    ap.add_argument("--summary-only", action="store_true", help="only rewrite the summary")
    args = ap.parse_args(argv)
    args.command = "python -m experiments.solver_benchmark_published " + " ".join(
        argv if argv is not None else sys.argv[1:])
    rows = read_rows(Path(args.out)) if args.summary_only else sweep(args)
    cmds = [c for c in dict.fromkeys(r.get("command", "") for r in rows) if c]  # file order
    from importlib.metadata import PackageNotFoundError, version

    try:
        hv = version("highspy")
    except PackageNotFoundError:
        hv = "not installed"
    header = (
        "# Solver benchmark on the published Checkmate / Moccasin graphs\n\n"
        f"Summary written {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC "
        f"(git {_git_rev()}, {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, highspy {hv}) from {len(rows)} rows made by: "
        + "; ".join(f"`{c.strip()}`" for c in cmds)
        + ".  Budget = ceil(m x no-remat peak) bytes (the Moccasin/Checkmate rule); the time "
        "limit of each solve is the CSV column `time_limit_s`; `hard` kills and skips are "
        "listed as such."
    )
    ob = Path(args.out).with_name("open_instances.csv")
    md = summary_markdown(rows, header, read_rows(ob) if ob.exists() else None)
    print(md)
    Path(args.md or Path(args.out).with_suffix(".md")).write_text(md)


if __name__ == "__main__":
    main()
