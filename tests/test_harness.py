"""The sweep harness keeps finished rows and resumes; the CLI runs end to end on a graph file."""

import csv

import policies
import remat
from experiments import cli
from experiments.harness import read_rows, sweep


class _CountingPolicy:
    name = "counting"

    def __init__(self):
        self.calls = 0

    def plan(self, graph, budget=None):
        self.calls += 1
        return policies.get("checkpoint_all").plan(graph, budget=budget)


def test_sweep_resumes_and_records_infeasible(tmp_path):
    out = tmp_path / "rows.csv"
    g = remat.chain_graph(6, sizes=1)
    pol = _CountingPolicy()
    rows = sweep({"chain": g}, {"counting": pol}, ["100%", "50%"], out=out, progress=False)
    assert pol.calls == 2
    by_budget = {r["budget_spec"]: r for r in rows}
    assert by_budget["100%"]["status"] == "optimal"
    assert int(by_budget["100%"]["peak_bytes"]) == g.no_remat_peak()
    assert by_budget["50%"]["status"] == "infeasible"
    assert int(float(by_budget["50%"]["min_feasible_bytes"])) == g.no_remat_peak()
    # a second run finds every row done and calls nothing
    sweep({"chain": lambda: 1 / 0}, {"counting": pol}, ["100%", "50%"], out=out, progress=False)
    assert pol.calls == 2
    # an interrupted file (one row) is completed, not rewritten
    with open(out) as f:
        first = list(csv.DictReader(f))[:1]
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(first[0]))
        w.writeheader()
        w.writerows(first)
    sweep({"chain": g}, {"counting": pol}, ["100%", "50%"], out=out, progress=False)
    assert pol.calls == 3
    assert len(read_rows(out)) == 2


def test_cli_compare_on_graph_file(tmp_path, capsys):
    g = remat.chain_graph(5, sizes=[1, 2, 3, 2, 1])
    path = tmp_path / "chain.json"
    g.to_json(path)
    png = tmp_path / "cmp.png"
    rc = cli.main(["compare", str(path), "--budget", "100%", "--plot", str(png), "--time-limit", "10"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "checkpoint_all" in out and "optimal" in out
    assert png.exists() and png.stat().st_size > 1000


def test_cli_reports_typed_errors(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    rc = cli.main(["plan", str(path), "--policy", "checkpoint_all"])
    assert rc == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_a_policy_that_does_not_apply_is_a_row_marked_na():
    from experiments.harness import evaluate

    dag = remat.make_graph(["a", "b", "c", "gc", "ga"], [(0, 1), (0, 2), (1, 2), (2, 3), (1, 3),
                                                       (3, 4), (0, 4)],
                           out_bytes=[1] * 5, time_s=[1.0] * 5,
                           is_backward=[False] * 3 + [True] * 2)
    row = evaluate(dag, policies.ChainDP(), "90%")
    assert row["status"] == "n/a" and "not a chain" in row["error"]


# --------------------------------------------------------------------------- tidy rows, Parquet
def test_sweep_rows_are_tidy_and_parquet_matches_csv(tmp_path):
    """One row per (model, batch, policy, budget, device); the simulated columns are those of
    ``remat.simulate`` on the policy's own plan; the Parquet file holds the same typed rows."""
    pq = __import__("pytest").importorskip("pyarrow.parquet")
    from experiments.harness import DETERMINISTIC, FIELDS

    g = remat.chain_graph(8, sizes=[1, 2, 3, 4, 4, 3, 2, 1])
    names = ["checkpoint_all", "sqrtn", "poet"]
    rows = sweep({"chain": g}, names, ["100%", "70%"], devices=[None, "cortex-m4"],
                 batch_sizes=[2], out=tmp_path / "rows.parquet", formats=["csv", "parquet"],
                 progress=False)
    assert len(rows) == 3 * 2 * 2
    assert len({tuple(r[k] for k in ("model", "batch_size", "policy", "budget_spec", "device"))
                for r in rows}) == len(rows)
    for r in rows:
        if r["status"] in ("infeasible", "n/a"):
            continue
        dev = remat.devices.get(r["device"]) if r["device"] else None
        pol = policies.get(r["policy"], **({"device": dev} if dev and r["policy"] == "poet" else {}))
        rep = remat.simulate(g, pol.plan(g, budget=r["budget_spec"]), device=dev)
        assert r["peak_bytes"] == rep.peak_bytes <= r["budget_bytes"]
        assert r["energy_j"] == rep.energy_j and r["bytes_paged"] == rep.bytes_paged
        assert r["paging_time_s"] == rep.paging_time_s
    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.column_names == FIELDS
    back = table.to_pylist()
    key = lambda r: (r["policy"], r["budget_spec"], r["device"])  # noqa: E731
    assert sorted(([r[k] for k in DETERMINISTIC] for r in back), key=str) == \
        sorted(([r[k] for k in DETERMINISTIC] for r in rows), key=str)
    assert {key(r) for r in back} == {key(r) for r in rows}


# --------------------------------------------------------------------------- kill and resume
_KILL_SCRIPT = '''
import os, sys, time, uuid
import policies, remat
from experiments.harness import sweep

class Slow:
    name = "slow"
    def __init__(self, inner, marks):
        self.inner, self.marks = inner, marks
    def plan(self, graph, budget=None):
        hold = int(os.environ.get("HOLD_AFTER", "0"))
        if hold and len(os.listdir(self.marks)) >= hold:
            time.sleep(3600)  # this plan call never ends: the parent kills the sweep here
        open(os.path.join(self.marks, f"{self.inner}@{budget}@{uuid.uuid4().hex}"), "w").close()
        return policies.get(self.inner).plan(graph, budget=budget)

marks, out = sys.argv[1], sys.argv[2]
g = remat.chain_graph(6, sizes=[1, 2, 3, 3, 2, 1])
pols = {p: Slow(p, marks) for p in ("checkpoint_all", "sqrtn", "recompute_all")}
sweep({"chain": g}, pols, ["100%", "90%", "80%", "70%"], out=out, progress=False)
'''


def _marks(d):
    """(policy, budget) of every plan call recorded in directory ``d`` (a list: repeats kept)."""
    import os

    return [tuple(n.split("@")[:2]) for n in os.listdir(d)]


def test_sweep_killed_midway_resumes_without_recomputing_or_losing_rows(tmp_path):
    """SIGKILL a sweep process while its fourth plan call hangs (3 rows on disk, whatever the
    machine's speed: the call never returns); the re-run computes only the rows that are
    missing (counted by marker files written by each plan call) and ends with every row
    exactly once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers.limits import SAFETY_S

    script = tmp_path / "kill_sweep.py"
    script.write_text(_KILL_SCRIPT)
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "rows.csv"
    env = {**os.environ, "HOLD_AFTER": "3", "XLA_FLAGS": "",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), str(marks), str(out)], env=env)
    t0 = time.time()
    while len(read_rows(out)) < 3 and proc.poll() is None and time.time() - t0 < SAFETY_S:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = read_rows(out)
    assert len(first) == 3, "the sweep was not killed midway"
    done = {(r["policy"], r["budget_spec"]) for r in first}
    before = len(_marks(marks))
    env["HOLD_AFTER"] = "0"
    subprocess.run([sys.executable, str(script), str(marks), str(out)], env=env, check=True)
    calls = _marks(marks)
    rerun = len(calls) - before  # plan calls of the resumed run
    final = read_rows(out)
    keys = [(r["policy"], r["budget_spec"]) for r in final]
    assert len(keys) == len(set(keys)) == 12  # nothing lost, nothing doubled
    assert rerun == 12 - len(done)  # only the missing rows were planned again
    # a finished row's plan was called once in all (the killed run), never again
    from collections import Counter

    counts = Counter(calls)
    assert all(counts[k] == 1 for k in done)


def test_missing_extra_is_a_typed_one_line_error(tmp_path, monkeypatch):
    import sys

    import pytest

    from remat.core.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    g = remat.chain_graph(4, sizes=1)
    with pytest.raises(MissingDependencyError, match=r'pip install -e "\.\[cluster\]"') as e:
        sweep({"c": g}, ["checkpoint_all"], ["100%"], out=tmp_path / "r.csv", backend="ray",
              progress=False)
    assert "\n" not in str(e.value) and e.value.extra == "cluster"
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingDependencyError, match="pyarrow"):
        sweep({"c": g}, ["checkpoint_all"], ["100%"], out=tmp_path / "r.parquet", progress=False)


def test_policies_get_threads_and_time_limit_and_quick_trims_the_grid(tmp_path):
    from experiments.harness import configure_policy

    p = configure_policy("checkmate", threads=1, time_limit=3.0)
    assert p.threads == 1 and p.time_limit == 3.0
    q = configure_policy(policies.get("checkmate", time_limit=50.0), threads=1, time_limit=3.0)
    assert q.threads == 1 and q.time_limit == 3.0
    assert configure_policy("sqrtn", threads=1, time_limit=3.0).name == "sqrtn"
    g = remat.chain_graph(5, sizes=1)
    rows = sweep({"c": g}, ["checkpoint_all"], ["100%", "95%", "90%", "85%", "80%"],
                 devices=["cortex-m4", "rtx-3090"], quick=True, out=tmp_path / "q.csv",
                 progress=False)
    assert sorted(r["budget_spec"] for r in rows) == ["100%", "80%", "90%"]
    assert {r["device"] for r in rows} == {"cortex-m4"}


def test_a_truncated_last_line_and_an_old_header_are_repaired(tmp_path):
    """A process killed while writing leaves half a line: it is dropped and recomputed; a file
    with the old columns is moved to the current ones, its rows kept."""
    out = tmp_path / "rows.csv"
    g = remat.chain_graph(6, sizes=1)
    pol = _CountingPolicy()
    sweep({"chain": g}, {"counting": pol}, ["100%", "90%", "80%"], out=out, progress=False)
    text = out.read_text()
    out.write_text(text[: len(text) - 20])  # cut into the last row
    assert len(read_rows(out)) == 3  # csv reads the half row as a row
    rows = sweep({"chain": g}, {"counting": pol}, ["100%", "90%", "80%"], out=out, progress=False)
    assert pol.calls == 4 and len(rows) == 3
    assert sorted(r["budget_spec"] for r in rows) == ["100%", "80%", "90%"]
    old = ["model", "policy", "budget_spec", "status"]
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old, extrasaction="ignore")
        w.writeheader()
        w.writerow({"model": "chain", "policy": "counting", "budget_spec": "100%",
                    "status": "optimal", "batch_size": "", "device": ""})
    rows = sweep({"chain": g}, {"counting": pol}, ["100%", "90%"], out=out, progress=False)
    assert pol.calls == 5 and len(rows) == 2


# --------------------------------------------------------------------------- the executor column
def _tiny_mlp(batch_size=4):
    return remat.zoo.get("mlp", batch_size=batch_size, depth=6, width=32)


class _Named:
    """A registry policy under its own name, counting ``plan`` calls."""

    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner, 0

    def plan(self, graph, budget=None):
        self.calls += 1
        return policies.get(self.inner).plan(graph, budget=budget)


def test_sweep_execute_fills_the_measured_peak_and_checks_gradients(tmp_path):
    """``execute=True``: every feasible row of a model given with its function has the
    executor's measured peak, equal to a direct ``remat.execute`` of the same plan, lower for
    chain_dp at a tight budget (80%: 70% is infeasible) than for checkpoint-all, and gradients
    equal to ``jax.value_and_grad``'s.  An infeasible row and a sweep without ``execute`` leave
    the columns blank."""
    from experiments.harness import build_model

    rows = sweep({"mlp": _tiny_mlp}, ["checkpoint_all", "chain_dp"], ["100%", "80%"],
                 batch_sizes=[4], residuals=False, execute=True, out=tmp_path / "x.csv",
                 progress=False)
    by = {(r["policy"], r["budget_spec"]): r for r in rows}
    assert by[("checkpoint_all", "80%")]["status"] == "infeasible"
    assert by[("checkpoint_all", "80%")]["executor_peak_bytes"] is None
    done = [r for r in rows if r["status"] != "infeasible"]
    assert len(done) == 3 and all(r["error"] is None for r in done)
    assert all(r["executor_grad_max_rel_err"] < 1e-5 for r in done)
    full, tight = by[("checkpoint_all", "100%")], by[("chain_dp", "80%")]
    assert tight["executor_peak_bytes"] < full["executor_peak_bytes"]
    assert tight["recomputations"] > 0
    g, (_, args) = build_model(_tiny_mlp, 4)
    for r in done:
        plan = policies.get(r["policy"]).plan(g, budget=r["budget_spec"])
        _, _, stats = remat.execute(g, plan, *args)
        assert r["executor_peak_bytes"] == stats.peak_bytes
        # graphs from remat.extract: node sizes are the executor's buffers, so the measured
        # peak equals the simulated one (the perturbed test below tells the columns apart)
        assert r["executor_peak_bytes"] == r["peak_bytes"]
    plain = sweep({"mlp": _tiny_mlp}, ["checkpoint_all"], ["100%"], batch_sizes=[4],
                  out=tmp_path / "plain.csv", progress=False)
    assert plain[0]["executor_peak_bytes"] is None and plain[0]["peak_bytes"] is not None


def test_executor_columns_come_from_the_executor_and_flag_wrong_gradients(tmp_path,
                                                                         monkeypatch):
    """An executor that reports 8 bytes more and returns gradients 1.5x too large: the row
    shows exactly that (so the column is not the simulated peak, and a wrong plan's
    gradients would show in ``executor_grad_max_rel_err``)."""
    import dataclasses

    import jax

    real = remat.execute
    seen = []

    def skewed(graph, plan, *args, **kw):
        value, grads, stats = real(graph, plan, *args, **kw)
        seen.append(stats.peak_bytes)
        return (value, jax.tree.map(lambda a: 1.5 * a, grads),
                dataclasses.replace(stats, peak_bytes=stats.peak_bytes + 8))

    monkeypatch.setattr(remat, "execute", skewed)
    (row,) = sweep({"mlp": _tiny_mlp}, ["chain_dp"], ["80%"], batch_sizes=[4],
                   residuals=False, execute=True, out=tmp_path / "s.csv", progress=False)
    assert seen and row["executor_peak_bytes"] == seen[0] + 8 == row["peak_bytes"] + 8
    assert abs(row["executor_grad_max_rel_err"] - 0.5) < 1e-5


def test_a_store_with_the_old_columns_resumes_with_executor_columns(tmp_path):
    """A CSV written before the executor columns existed: its rows are kept (not re-planned,
    the new columns blank) and the missing rows are added with them filled."""
    from experiments.harness import FIELDS

    out = tmp_path / "rows.csv"
    pol = _Named("chain_dp")
    sweep({"mlp": _tiny_mlp}, {"chain_dp": pol}, ["100%"], batch_sizes=[4], residuals=False,
          out=out, progress=False)
    new = ("executor_peak_bytes", "executor_grad_max_rel_err")
    old_fields = [k for k in FIELDS if k not in new]
    rows = read_rows(out)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    rows = sweep({"mlp": _tiny_mlp}, {"chain_dp": pol}, ["100%", "80%"], batch_sizes=[4],
                 residuals=False, execute=True, out=out, progress=False)
    assert pol.calls == 2 and len(rows) == 2
    with open(out, newline="") as f:
        assert next(csv.reader(f)) == FIELDS
    by = {r["budget_spec"]: r for r in rows}
    assert by["100%"]["executor_peak_bytes"] is None  # kept as it was
    assert by["80%"]["executor_peak_bytes"] == by["80%"]["peak_bytes"] > 0
    assert by["80%"]["executor_grad_max_rel_err"] < 1e-5
