"""``experiments/milp_unseen.py``: the instances it saves replay the graphs it planned."""

from __future__ import annotations

import csv

import pytest
from helpers.limits import SAFETY_S, pinned_host_profile

from experiments import milp_unseen
from solvers.checkmate import solve_checkmate


def test_saved_instance_replays_the_planned_graph(tmp_path):
    """A 12-layer run at 60 % (the host profile pinned: the same instance on every machine):
    the row is written, the graph's arrays are saved, and ``load_instance`` gives a problem
    whose budget is the policy's and whose optimum, solved from the file alone, is the
    optimum the policy proved on the graph."""
    out, inst = tmp_path / "rows.csv", tmp_path / "inst"
    with pinned_host_profile():
        milp_unseen.main(["--seeds", "0", "--budgets", "60%", "--layers", "12", "--time-limit",
                          str(SAFETY_S), "--out", str(out), "--save-instances", str(inst)])
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 1 and rows[0]["status"] == "optimal"
    P = milp_unseen.load_instance(inst / "seed0.npz", "60%")
    sol = solve_checkmate(P, time_limit=SAFETY_S)
    assert sol.status == "optimal"
    assert sol.objective / P.costs.sum() == pytest.approx(float(rows[0]["overhead"]), rel=2e-4)


def test_load_instance_rejects_a_budget_that_is_not_a_percentage(tmp_path):
    from remat.core.errors import BudgetFormatError

    for bad in ("30", "abc%", "-5%", 0.3):
        with pytest.raises(BudgetFormatError, match="percentage"):
            milp_unseen.load_instance(tmp_path / "missing.npz", bad)
