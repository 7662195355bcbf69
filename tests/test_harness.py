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
