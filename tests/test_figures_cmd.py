"""``remat figures``: runs the selected figure scripts into ``--out``, writes the PNG and CSV of
each and an ``index.md``, keeps going past a failing figure, never touches the committed
results, and rejects unknown ``--only`` names with a one-line error listing what exists."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from experiments import cli, figures_index
from experiments.figures_index import FIGURES, Figure, Step, UnknownFigureError


@pytest.mark.slow
def test_figures_quick_only_writes_pngs_csvs_index_and_survives_a_failure(tmp_path, monkeypatch, capsys):
    committed = figures_index.ROOT / "experiments" / "results" / "melon_adapt.csv"
    before = committed.read_bytes()
    broken = Figure("broken", "nothing", (Step("experiments.no_such_module", lambda o, q: []),),
                    "broken.csv", (), lambda rows: "", "n/a")
    monkeypatch.setattr(figures_index, "FIGURES", {"broken": broken, **FIGURES})  # runs first
    rc = cli.main(["figures", "--quick", "--only", "broken", "melon_adapt", "budget_sweep",
                   "--out", str(tmp_path)])
    assert rc == 1  # one figure failed, the others still ran
    index = (tmp_path / "index.md").read_text()
    for name in ("melon_adapt", "budget_sweep"):
        fig = FIGURES[name]
        assert f"## {name}" in index and fig.mirrors in index
        with open(tmp_path / fig.csv, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows, name
        for png in fig.pngs:
            assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
            assert f"]({png})" in index
        assert f"- paper: {fig.paper}" in index
    # the headline is read from the CSV just written: melon_adapt's overhead range
    ov = [float(r["overhead"]) for r in csv.DictReader(open(tmp_path / "melon_adapt.csv"))
          if float(r["stop_restart_s"]) > 0]
    assert f"{100 * max(ov):.1f}% of stop-restart" in index
    assert "## broken" in index and "status: failed" in index
    assert index.index("## broken") < index.index("## melon_adapt")  # the failure came first and the rest still ran
    assert committed.read_bytes() == before  # quick runs never overwrite committed results
    assert "melon_adapt" in capsys.readouterr().out


def test_unknown_figure_is_a_one_line_typed_error(tmp_path, capsys):
    rc = cli.main(["figures", "--quick", "--only", "melon_pool", "nope", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nope'" in err
    assert all(name in err for name in FIGURES)
    assert not (tmp_path / "index.md").exists()  # nothing ran
    with pytest.raises(UnknownFigureError):
        figures_index.select(["nope"])


def test_every_figure_names_its_paper_files_and_quick_steps(tmp_path):
    for name, fig in FIGURES.items():
        assert fig.name == name and fig.mirrors and fig.paper and fig.csv.endswith(".csv")
        for quick in (True, False):
            args = [a for st in fig.steps for a in st.args(tmp_path, quick)]
            # every step's outputs are redirected into the output folder
            assert any(str(tmp_path) in a for a in args), name
        assert dataclasses.is_dataclass(fig)
