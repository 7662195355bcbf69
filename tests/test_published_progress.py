"""experiments.published_progress: which plan qualifies, which bound applies, which time counts."""

from __future__ import annotations

import csv

from experiments.published_progress import instance_bound, main, progress_rows, qualifies


def _row(method, overhead, wall, *, m="0.8", graph="g", status="ok", peak_ok="True", gap="",
         solver_status="", plan_order="", policy="", policy_wall_s=""):
    return {"graph": graph, "n": "10", "m": m, "method": method, "status": status,
            "peak_ok": peak_ok, "overhead": "" if overhead is None else str(overhead),
            "wall_s": str(wall), "gap": gap, "solver_status": solver_status,
            "plan_order": plan_order, "policy": policy, "policy_wall_s": policy_wall_s}


def test_bound_is_the_best_proven_program_order_bound_and_never_below_one():
    rows = [_row("milp", 1.20, 60, gap="0.01"), _row("lp", 1.25, 5, gap="0.02"),
            _row("heuristic", 1.1, 1)]
    assert abs(instance_bound(rows) - max(1.20 * 0.99, 1.25 * 0.98)) < 1e-12
    assert instance_bound([_row("heuristic", 1.3, 1)]) == 1.0
    # a plan that does not fit proves nothing
    assert instance_bound([_row("milp", 2.0, 1, gap="0", peak_ok="False")]) == 1.0


def test_another_order_is_held_to_the_order_free_bound():
    bound = 1.2
    assert qualifies(_row("heuristic", 1.25, 1), bound, 0.05)  # program order: 1.25 <= 1.26
    assert not qualifies(_row("reorder", 1.25, 1), bound, 0.05)  # reordered: 1.25 > 1.05
    assert not qualifies(_row("heuristic", 1.25, 1, plan_order="greedy2"), bound, 0.05)
    assert qualifies(_row("reorder", 1.04, 1), bound, 0.05)
    # the order search found nothing better than the program's order: the program's bound
    assert qualifies(_row("reorder", 1.25, 1, plan_order="program"), bound, 0.05)
    assert qualifies(_row("heuristic", 1.25, 1, plan_order="program"), bound, 0.05)
    assert not qualifies(_row("heuristic", 1.0, 1, peak_ok="False"), bound, 0.05)
    assert qualifies(_row("milp", 1.9, 1, solver_status="optimal"), 1.0, 0.05)  # proven optimal
    assert not qualifies(_row("lp", 1.9, 1, solver_status="optimal"), 1.0, 0.05)


def test_fastest_qualifying_row_against_the_best_row_before():
    before = [_row("milp", 1.02, 40.0), _row("heuristic", 1.5, 0.5), _row("lp", 1.03, 9.0),
              _row("milp", 1.0, 5.0, m="0.7")]
    now = [_row("milp", 1.02, 40.0, solver_status="optimal", gap="0"),
           _row("heuristic", 1.04, 30.0, policy="peak_shave", policy_wall_s="3.0"),
           _row("lp", 1.08, 1.0),  # outside 5 % of the MILP's proven 1.02
           _row("milp", 1.0, 5.0, m="0.7")]
    rows = progress_rows(before, now)
    assert [r["m"] for r in rows] == [0.8]  # 0.7 is not asked for
    r = rows[0]
    assert r["before_best_overhead"] == 1.02 and r["before_best_wall_s"] == 40.0
    assert r["before_all_methods_wall_s"] == 49.5
    assert r["now_fastest_method"] == "heuristic (peak_shave)"
    assert r["now_fastest_wall_s"] == 3.0  # the policy's own time, not the row's 30 s
    assert r["half_time"] is True
    slow = progress_rows(before, [_row("heuristic", 1.04, 30.0, policy_wall_s="25")])[0]
    assert slow["qualifies"] and slow["half_time"] is False
    none = progress_rows(before, [_row("heuristic", 1.5, 0.1)])[0]
    assert not none["qualifies"] and "half_time" not in none


def test_main_writes_one_row_per_instance(tmp_path, capsys):
    def write(path, rows):
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    b, n, out = tmp_path / "b.csv", tmp_path / "n.csv", tmp_path / "p.csv"
    write(b, [_row("milp", 1.1, 10.0), _row("milp", 1.1, 10.0, graph="h", m="0.9")])
    write(n, [_row("heuristic", 1.01, 1.0), _row("heuristic", 1.3, 1.0, graph="h", m="0.9")])
    main(["--before", str(b), "--now", str(n), "--out", str(out)])
    with out.open() as f:
        got = {(r["graph"], r["m"]): r for r in csv.DictReader(f)}
    assert got[("g", "0.8")]["half_time"] == "True"
    assert got[("h", "0.9")]["qualifies"] == "False"
    assert "| g | 0.8 |" in capsys.readouterr().out


def test_benchmark_heuristic_row_records_the_chosen_policy_time_and_rewrites_an_old_header(
        tmp_path, monkeypatch):
    """A heuristic row keeps every heuristic's time in ``detail`` and the chosen one's in
    ``policy_wall_s``; a table written before that column existed is rewritten with it (rows
    appended under the old header would be shifted), its rows kept."""
    import remat
    from experiments import solver_benchmark_published as sbp

    # in this process: forking a worker that has JAX's threads running can deadlock
    monkeypatch.setattr(sbp, "run_isolated", lambda args, hard, mem: sbp.solve_instance(*args))
    bench = tmp_path / "bench"
    bench.mkdir()
    remat.chain_graph(12, sizes=3).to_json(bench / "chain12.json")
    out, md = tmp_path / "p.csv", tmp_path / "p.md"
    args = ["--bench-dir", str(bench), "--methods", "heuristic", "--heuristics", "sqrtn",
            "peak_shave", "--proof-time", "0", "--out", str(out), "--md", str(md)]
    sbp.main([*args, "--mults", "0.9"])
    with out.open() as f:  # as an older version of the benchmark wrote it
        first = list(csv.DictReader(f))
    old_fields = [f for f in sbp.FIELDS if f != "policy_wall_s"]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(first)
    sbp.main([*args, "--mults", "0.8"])
    with out.open() as f:
        rd = csv.DictReader(f)
        assert rd.fieldnames == sbp.FIELDS
        rows = list(rd)
    assert [(r["graph"], r["m"]) for r in rows] == [("chain12", "0.9"), ("chain12", "0.8")]
    r = rows[1]
    assert r["status"] == "ok", r
    assert 0 < float(r["policy_wall_s"]) <= float(r["wall_s"])
    for name in ("sqrtn", "peak_shave"):
        assert f"{name}: " in r["detail"] and " s)" in r["detail"].split(f"{name}: ")[1].split(";")[0]


def test_bad_input_is_a_typed_error(tmp_path):
    import pytest

    from remat.core.errors import RematError

    with pytest.raises(RematError, match="tol"):
        progress_rows([], [_row("milp", 1.0, 1.0)], tol=-0.1)
    with pytest.raises(RematError, match="overhead"):
        progress_rows([{"graph": "g", "n": "1", "m": "0.8", "method": "milp", "status": "ok",
                        "wall_s": "1"}], [])
    with pytest.raises(RematError, match="no benchmark table"):  # not an empty 'before'
        main(["--before", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o.csv")])
