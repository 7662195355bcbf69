"""``remat compare`` (table, plot, ``--timeline``) and the shared figure style
(``experiments/plotstyle.py``)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers.limits import SAFETY_S  # noqa: E402

import policies  # noqa: E402
import remat  # noqa: E402
from experiments import cli  # noqa: E402
from experiments import plotstyle as ps  # noqa: E402


def test_every_registered_policy_has_its_own_colour_and_marker():
    # the project's own policies (a test may register a plugin such as "every_kth")
    names = [n for n in policies.available()
             if type(policies.get(n)).__module__.startswith("policies.")]
    styles = [ps.style(n) for n in names]
    assert all(n in ps.POLICY_STYLES for n in names), set(names) - set(ps.POLICY_STYLES)
    assert len({s["color"] for s in styles}) == len(names)
    assert len({s["marker"] for s in styles}) == len(names)
    # an unknown (plugin) policy gets a style that does not change between calls
    assert ps.style("every_kth") == ps.style("every_kth")


def test_coincident_and_overlapping_points_are_grouped_and_drawn_apart():
    assert ps.coincident_groups([1.0, 1.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.5]) == [[0, 1], [2], [3]]
    fig, ax = plt.subplots()
    names = ["chain_dp", "checkmate", "sqrtn", "recompute_all"]
    xs, ys = [10.0, 10.0, 9.0, 5.0], [1.17, 1.17, 1.2, 4.0]
    groups = ps.scatter_policies(ax, names, xs, ys)
    assert [0, 1] in groups and [3] in groups
    fig.canvas.draw()
    # the two identical plans are drawn at different screen positions, neither hidden
    centres = [c.get_offset_transform().transform(c.get_offsets())[0] for c in ax.collections
               if c.get_label() in ("chain_dp", "checkmate")]
    assert len(centres) == 2 and np.linalg.norm(centres[0] - centres[1]) > 8
    assert any("2 identical" in t.get_text() for t in ax.texts)
    plt.close(fig)


def test_paging_cost_is_drawn_next_to_compute(tmp_path):
    g = remat.chain_graph(4, sizes=[1, 2, 3, 2])
    rows = [
        {"policy": "checkpoint_all", "budget_bytes": 10, "peak_bytes": 8, "overhead": 1.0,
         "compute_time_s": 4.0, "energy_j": 4.0},
        {"policy": "poet", "budget_bytes": 10, "peak_bytes": 5, "overhead": 1.0,
         "compute_time_s": 4.0, "energy_j": 5.0, "paging_time_s": 0.5, "paging_energy_j": 1.0,
         "bytes_paged": 3 * 2**20},
    ]

    class Dev:
        name = "test-device"

    png = tmp_path / "c.png"
    cli._plot_compare(rows, g, str(png), device=Dev())
    assert png.stat().st_size > 1000
    fig, axes = plt.subplots(1, 1)
    ps.cost_bars(axes, ["checkpoint_all", "poet"], [4.0, 4.0], [0.0, 0.5], unit="s",
                 paged_bytes=[0, 3 * 2**20])
    notes = [t.get_text() for t in axes.texts]
    assert notes == ["paging 0.5 s, 3.00 MiB moved"]
    plt.close(fig)


@pytest.mark.filterwarnings("ignore")
def test_cli_compare_zoo_mlp_every_policy_with_timelines(tmp_path, capsys):
    """The user-facing path: every registered policy on the zoo MLP, a table row each, the
    comparison plot and the timeline plot written."""
    png = tmp_path / "cmp.png"
    rc = cli.main(["compare", "mlp", "--batch-size", "16", "--budget", "85%", "--plot", str(png),
                   "--time-limit", "1", "--timeline"])
    out = capsys.readouterr().out
    assert rc == 0
    header = next(i for i, ln in enumerate(out.splitlines()) if ln.startswith("policy "))
    table = [ln for ln in out.splitlines()[header + 1:] if ln.strip() and " " in ln.strip()]
    by_name = {ln.split()[0]: ln for ln in table}
    assert set(policies.available()) <= set(by_name), set(policies.available()) - set(by_name)
    assert "n/a" in by_name["scan_layers"]  # no scan in the MLP
    assert "x" in by_name["chain_dp"] and "infeasible" not in by_name["chain_dp"]
    assert png.exists() and png.stat().st_size > 10_000
    tl = tmp_path / "cmp_timeline.png"
    assert tl.exists() and tl.stat().st_size > 10_000


def test_cli_compare_unknown_device_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "c.json"
    remat.chain_graph(4).to_json(path)
    rc = cli.main(["compare", str(path), "--budget", "100%", "--device", "no_such_device",
                   "--plot", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "cortex-m4" in err and len(err.strip().splitlines()) == 1


@pytest.mark.filterwarnings("ignore")
def test_cli_inspect_timeline_draws_each_default_policy(tmp_path, capsys, monkeypatch):
    """``remat inspect mlp --timeline PNG``: the default policies planned, simulated and drawn
    side by side by ``plotstyle.plot_timelines`` (the function ``compare --timeline`` uses)."""
    drawn: dict = {}
    real = ps.plot_timelines

    def spy(reports, **kw):
        drawn.update(reports)
        return real(reports, **kw)

    monkeypatch.setattr(ps, "plot_timelines", spy)
    png = tmp_path / "tl.png"
    rc = cli.main(["inspect", "mlp", "--batch-size", "16", "--timeline", str(png)])
    out = capsys.readouterr().out
    assert rc == 0 and f"timelines written to {png}" in out
    assert png.exists() and png.stat().st_size > 10_000
    assert list(drawn) == list(cli.INSPECT_TIMELINE_POLICIES)
    g = remat.extract(*remat.zoo.get("mlp", batch_size=16))
    for name, rep in drawn.items():
        assert rep.timeline["live_bytes"].max() == rep.peak_bytes, name
        assert f"{name} " in out and "overhead" in out
    assert drawn["checkpoint_all"].peak_bytes == g.no_remat_peak()
    assert drawn["sqrtn"].peak_bytes < g.no_remat_peak()  # SqrtN recomputes to save memory


def test_cli_inspect_timeline_unknown_policy_is_a_one_line_error(tmp_path, capsys):
    png = tmp_path / "tl.png"
    rc = cli.main(["inspect", "mlp", "--timeline", str(png), "--policies", "sqrtn,no_such_policy"])
    cap = capsys.readouterr()
    assert rc == 2 and len(cap.err.strip().splitlines()) == 1
    assert "no_such_policy" in cap.err and "chain_dp" in cap.err  # lists what exists
    assert cap.out == "" and not png.exists()  # failed before extracting anything


def test_compare_plans_small_graphs_with_cpsat_and_passes_the_gap():
    """Checkmate races HiGHS and CP-SAT up to CPSAT_MAX_NODES nodes (when OR-Tools is
    installed) and stays on HiGHS above; every MILP policy gets the comparison's gap; others are untouched."""
    pytest.importorskip("ortools")
    small = remat.chain_graph(6, sizes=100)
    big = remat.chain_graph(cli.CPSAT_MAX_NODES // 2 + 1)
    assert small.n <= cli.CPSAT_MAX_NODES < big.n
    cm = cli._make_policy_for("checkmate", 7.0, graph=small, mip_gap=0.02)
    assert (cm.solver, cm.time_limit, cm.mip_gap) == ("race", 7.0, 0.02)
    assert cli._make_policy_for("checkmate", 7.0, graph=big).solver == "highs"
    assert cli._make_policy_for("poet", 7.0, graph=small, mip_gap=0.02).mip_gap == 0.02
    assert cli._make_policy_for("poet", 7.0, graph=small).solver == "highs"
    assert not hasattr(cli._make_policy_for("sqrtn", 7.0, graph=small, mip_gap=0.02), "mip_gap")
    # the gap is a real stopping rule: the race's answer on the small chain is within it
    # (under the safety net, so that the gap, not a clock, ends the race)
    p = cli._make_policy_for("checkmate", SAFETY_S, graph=small, mip_gap=0.02).plan(
        small, budget=int(0.7 * small.no_remat_peak()))
    assert p.meta["backend"] == "race" and p.meta["gap"] <= 0.02


def test_compare_defaults_to_its_own_time_limit_and_takes_an_explicit_one(monkeypatch):
    """``remat compare`` gives each solver COMPARE_TIME_LIMIT seconds unless ``--time-limit``
    says otherwise (the other subcommands keep their own default)."""
    seen = []

    class Stop(Exception):
        pass

    def fake_compare(graph, budget, **kw):
        seen.append(kw["time_limit"])
        raise Stop

    monkeypatch.setattr(cli, "compare", fake_compare)
    for argv, want in ((["compare", "mlp", "--budget", "50%"], cli.COMPARE_TIME_LIMIT),
                       (["compare", "mlp", "--budget", "50%", "--time-limit", "4"], 4.0)):
        with pytest.raises(Stop):
            cli.main(argv)
        assert seen[-1] == want
    assert cli.COMPARE_TIME_LIMIT > 20.0  # what ResNet-50/SqueezeNet's POET needed at 50 %


# ----------------------------------------------------------- arguments checked before work
BAD_ARGUMENTS = [
    ["compare", "mlp", "--budget", "abc"],
    ["compare", "mlp", "--budget", "50%", "--policies", "no_such_policy"],
    ["compare", "mlp", "--budget", "50%", "--device", "no_such_device"],
    ["compare", "mlp", "--budget", "50%", "--batch-size", "0"],
    ["compare", "mlp", "--budget", "50%", "--mip-gap", "-1"],
    ["compare", "mlp", "--budget", "50%", "--plot", "/no/such/folder/x.png"],
    ["compare", "no_such_model", "--budget", "50%"],
    ["compare", "missing_graph.json", "--budget", "50%"],
    ["plan", "mlp", "--policy", "no_such_policy"],
    ["plan", "mlp", "--policy", "sqrtn", "--budget", "12 parsecs"],
    ["plan", "mlp", "--policy", "sqrtn", "--stages", "layers"],
    ["plan", "mlp", "--policy", "sqrtn", "--time-limit", "0"],
    ["inspect", "mlp", "--timeline", "t.png", "--policies", "sqrtn,no_such_policy"],
    ["inspect", "mlp", "--budget", "-5%"],
    ["inspect", "no_such_model"],
    ["sweep", "--models", "mlp", "--budgets", "50%", "nope", "--out", "r.csv"],
    ["sweep", "--models", "mlp", "--budgets", "50%", "--out", "r.txt"],
    ["sweep", "--models", "mlp", "--budgets", "50%", "--out", "r.csv", "--devices", "nope"],
    ["sweep", "--models", "mlp", "--budgets", "50%", "--out", "r.csv", "--threads", "0"],
    ["figures", "--only", "no_such_figure"],
]


@pytest.mark.parametrize("argv", BAD_ARGUMENTS, ids=lambda a: " ".join(a))
def test_bad_arguments_are_one_line_errors_before_any_work(argv, tmp_path, capsys, monkeypatch):
    """Every subcommand checks its arguments first: exit status 2, one line ``remat: error:``,
    no model extracted, no file written."""
    import remat

    def no_work(*a, **k):
        raise AssertionError("the model was extracted before the arguments were checked")

    monkeypatch.setattr(remat, "extract", no_work)
    monkeypatch.setattr(remat.zoo, "get", no_work)
    monkeypatch.chdir(tmp_path)
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("remat: error: "), err
    assert list(tmp_path.iterdir()) == []
