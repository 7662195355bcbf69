"""The experiments' results CSVs: a sweep interrupted midway keeps every finished row and a
rerun skips them (experiments.tables.ResumableCsv)."""

from __future__ import annotations

import csv

from experiments.tables import ResumableCsv


def _key(r):
    return int(r["L"]), r["method"]


def test_resumable_csv_keeps_finished_rows_and_skips_them(tmp_path):
    path = tmp_path / "sub" / "rows.csv"
    fields = ["L", "method", "wall_s"]
    first = ResumableCsv(path, fields, key=_key)
    assert (10, "a") not in first
    first.append({"L": 10, "method": "a", "wall_s": 0.5})
    first.append({"L": 20, "method": "a"})  # a missing column stays empty
    # the sweep "dies" here; a new run reads what was flushed, with typed keys
    second = ResumableCsv(path, fields, key=_key)
    assert (10, "a") in second and (20, "a") in second and (10, "b") not in second
    assert second.get((10, "a"))["wall_s"] == "0.5"
    assert second.get((30, "a"), "none") == "none"
    second.append({"L": 10, "method": "b", "wall_s": 1.25})
    with path.open(newline="") as fh:
        lines = fh.read().splitlines()
    assert lines[0] == "L,method,wall_s" and lines.count("L,method,wall_s") == 1
    rows = list(csv.DictReader(path.open(newline="")))
    assert [(r["L"], r["method"], r["wall_s"]) for r in rows] == [
        ("10", "a", "0.5"), ("20", "a", ""), ("10", "b", "1.25")]
