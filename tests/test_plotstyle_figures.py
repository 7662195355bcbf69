"""The figure scripts (``experiments/figures/*.py``) draw every policy in its one colour and
marker from ``experiments/plotstyle.py`` and label every axis with a unit.

Static checks read the scripts' source (a script that plots must use ``plotstyle`` and no
colour cycle or hard-coded ``C0``/``tab:`` colour of its own; every literal axis label names a
unit in parentheses); functional checks call two scripts' ``plot`` on tiny synthetic rows and
read the colours and markers back from the matplotlib artists.
"""

from __future__ import annotations

import ast
import pathlib
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import policies  # noqa: E402
from experiments import plotstyle as ps  # noqa: E402

FIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "figures"
SCRIPTS = sorted(FIG_DIR.glob("*.py"))
#: First word inside an axis label's parentheses: the unit (``x``: a ratio, ``#``: a count).
UNITS = {"MiB", "KiB", "GiB", "bytes", "s", "J", "x", "%", "#", "samples/s", "samples"}


def _plots(src: str) -> bool:
    return "matplotlib" in src


def test_every_plotting_script_uses_plotstyle_and_no_colour_cycle_of_its_own():
    plotting = [p for p in SCRIPTS if _plots(p.read_text())]
    assert len(plotting) >= 10, [p.name for p in plotting]  # the scan found the scripts
    for p in plotting:
        src = p.read_text()
        assert re.search(r"from experiments import plotstyle|import experiments\.plotstyle", src), p.name
        assert re.search(r"\bps\.(style|series_style|line_kw|scatter_kw|bar_kw|"
                         r"scatter_policies|memory_vs_overhead|cost_bars|plot_timelines)\(",
                         src), p.name
        # colours chosen by position in a cycle or colormap change from figure to figure, and
        # so do format strings ("rD", "s--") that leave the colour to the cycle
        bad = re.findall(r"get_cmap\(|colou?rs?=\"C\d\"|colou?r=\"tab:|"
                         r"\"[bgrcmy][osDv^*x.]?-*\"\s*[,)]|\"[osDv^*x.]-+\"\s*[,)]", src)
        assert not bad, (p.name, bad)


def _axis_labels(src: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(src)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("set_xlabel", "set_ylabel") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append(node.args[0].value)
    return out


def _has_unit(label: str) -> bool:
    inner = re.findall(r"\(([^()]*)\)", label)
    return any(i.split()[0].rstrip(",;") in UNITS for i in inner if i.split())


@pytest.mark.parametrize("path", [p for p in SCRIPTS if _plots(p.read_text())],
                         ids=lambda p: p.stem)
def test_every_axis_label_of_a_figure_script_names_its_unit(path):
    labels = _axis_labels(path.read_text())
    assert labels, f"{path.name} labels no axis"
    missing = [lb for lb in labels if not _has_unit(lb)]
    assert not missing, (path.name, missing)


def test_unit_check_rejects_a_label_without_unit():
    assert _has_unit("peak memory (MiB)") and _has_unit("overhead vs checkpoint-all (x)")
    assert not _has_unit("peak / program-order peak") and not _has_unit("MiB")


def test_variants_take_their_policys_colour_and_differ_from_each_other():
    registered = set(policies.available())
    for name, base in {**ps.POLICY_VARIANTS, **ps.POLICY_ALIASES}.items():
        assert base in registered, (name, base)
        assert ps.series_style(name)["color"] == ps.style(base)["color"]
    for base in set(ps.POLICY_VARIANTS.values()):
        fam = [base] + [v for v, b in ps.POLICY_VARIANTS.items() if b == base]
        looks = {(s["marker"], str(s["linestyle"]), s["fill"])
                 for s in map(ps.series_style, fam)}
        assert len(looks) == len(fam), base  # each variant told apart from the policy and others
    for name in registered:  # a policy itself: exactly its POLICY_STYLES entry, solid, filled
        st = ps.series_style(name)
        assert (st["color"], st["marker"], st["linestyle"], st["fill"]) == (
            ps.POLICY_STYLES[name]["color"], ps.POLICY_STYLES[name]["marker"], "-", "full")


@pytest.fixture
def captured(monkeypatch):
    """The figures the scripts save (``savefig`` made a no-op that keeps the figure)."""
    figs: list = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self))
    return figs


def _hex(c) -> str:
    return mcolors.to_hex(c, keep_alpha=False)


def test_budget_sweep_plot_draws_each_policy_in_its_style(captured, tmp_path):
    from experiments.figures import budget_sweep

    P = 100 * 2**20
    rows = [dict(model="m", policy="checkpoint_all", budget_frac="", peak_bytes=P, overhead=1.0,
                 no_remat_peak_bytes=P),
            dict(model="m", policy="jax_everything_saveable", budget_frac="", peak_bytes=P,
                 overhead=1.0, no_remat_peak_bytes=P),
            dict(model="m", policy="recompute_all", budget_frac="", peak_bytes=P // 3,
                 overhead=3.0, no_remat_peak_bytes=P)]
    for name, ov in (("chain_dp", 1.1), ("chen_greedy", 1.3)):
        for f in (0.5, 0.8):
            rows.append(dict(model="m", policy=name, budget_frac=f, peak_bytes=int(f * P),
                             overhead=ov + (0.8 - f), no_remat_peak_bytes=P))
    budget_sweep.plot(rows, ["m"], str(tmp_path))
    (fig,) = captured
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    for name, base in (("chain_dp", "chain_dp"), ("chen_greedy", "sqrtn")):
        assert _hex(lines[name].get_color()) == ps.style(base)["color"], name
    assert lines["chain_dp"].get_marker() == ps.style("chain_dp")["marker"]
    assert lines["chain_dp"].get_linestyle() == "-"
    # a variant: its policy's colour, an open marker and a broken line
    assert lines["chen_greedy"].get_fillstyle() == "none"
    assert lines["chen_greedy"].get_linestyle() != "-"
    pts = {c.get_label(): c for c in ax.collections}
    for name in ("checkpoint_all", "recompute_all"):
        assert _hex(pts[name].get_facecolor()[0]) == ps.style(name)["color"], name
    assert _hex(pts["jax_everything_saveable"].get_edgecolor()[0]) == ps.style("jax_policy")["color"]
    assert len(pts["jax_everything_saveable"].get_facecolor()) == 0  # open
    # the two identical baselines are named, not silently stacked
    assert any("2 identical" in t.get_text() and "checkpoint_all" in t.get_text()
               for t in ax.texts)
    assert "(x" in ax.get_xlabel() and "(x)" in ax.get_ylabel()


def test_poet_energy_plot_draws_poet_its_ablations_and_baselines_in_style(captured, tmp_path):
    from experiments.figures import poet_energy

    M = 2**20
    rows = [dict(model="r", device="d", config=c, budget_bytes=b * M, energy_j=e, peak_bytes=b * M)
            for c, pts in (("poet", ((10, 1.0), (8, 1.2))), ("remat_only", ((10, 1.1), (8, 1.5))),
                           ("paging_only", ((10, 1.05), (8, 1.4))))
            for b, e in pts]
    rows += [dict(model="r", device="d", config="checkpoint_all", budget_bytes="", energy_j=0.9,
                  peak_bytes=12 * M),
             dict(model="r", device="d", config="sqrtn", budget_bytes="", energy_j=1.3,
                  peak_bytes=9 * M)]
    poet_energy.plot(rows, str(tmp_path / "p.png"))
    (fig,) = captured
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    for label, base in (("poet", "poet"), ("remat-only", "poet"), ("paging-only", "poet"),
                        ("checkpoint_all", "checkpoint_all"), ("sqrtn", "sqrtn")):
        assert _hex(lines[label].get_color()) == ps.style(base)["color"], label
    for name in ("poet", "checkpoint_all", "sqrtn"):
        assert lines[name].get_marker() == ps.style(name)["marker"], name
    assert len({(ln.get_marker(), ln.get_linestyle()) for ln in
                (lines["poet"], lines["remat-only"], lines["paging-only"])}) == 3
    assert fig.axes[0].get_xlabel().endswith("(MiB)") and fig.axes[0].get_ylabel().endswith("(J)")
