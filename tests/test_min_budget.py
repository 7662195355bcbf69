"""experiments.min_budget: the smallest budget of a graph, decided by witnesses and proofs, equal
to an exhaustive search's on small DAGs; a row for a published graph; typed errors."""

import csv

import numpy as np
import pytest
from helpers.bench_graphs import FILES, needs_bench
from helpers.pebbling_oracle import exact_min_peak, random_dag

from experiments import min_budget as mb
from remat.core.errors import RematError, SolverError


@pytest.mark.parametrize("seed", range(6))
def test_smallest_budget_equals_the_exhaustive_minimum(seed):
    g = random_dag(seed + 20, 8)
    exact = exact_min_peak(g)
    row = mb.smallest_budget(g, probe_time=10, probe_states=1_000_000)
    assert row["exact"] and row["feasible_at"] == exact and row["infeasible_at"] == exact - 1
    assert row["min_step_bytes"] <= exact <= row["no_remat_peak_bytes"]
    assert row["witness_overhead"] >= 1.0


def test_limits_give_a_typed_error_not_a_guess():
    g = random_dag(1, 40)
    with pytest.raises(SolverError):
        mb.smallest_budget(g, probe_time=10, probe_states=1)  # no witness even at the peak
    with pytest.raises(RematError):
        mb.smallest_budget(g, probe_time=0, probe_states=10)


N100 = [f for f in FILES if f.name.startswith("random_layered_n100_")]


@needs_bench
def test_cli_writes_a_row_per_graph_and_resumes(tmp_path):
    out = tmp_path / "mb.csv"
    mb.main(["--graphs", "random_layered_n100_", "--out", str(out), "--probe-time", "20",
             "--probe-states", "20000"])
    rows = list(csv.DictReader(out.open()))
    assert [r["graph"] for r in rows] == [N100[0].stem]
    r = rows[0]
    lo, hi = int(r["infeasible_at"]), int(r["feasible_at"])
    assert int(r["min_step_bytes"]) - 1 <= lo < hi <= int(r["no_remat_peak_bytes"])
    assert r["exact"] == str(hi - lo == 1)
    stamp = out.stat().st_mtime_ns
    mb.main(["--graphs", "random_layered_n100_", "--out", str(out)])  # already there: skipped
    assert out.stat().st_mtime_ns == stamp and np.isfinite(float(r["witness_overhead"]))


def test_an_undecided_probe_still_narrows_the_feasible_end(monkeypatch):
    """Probes the search cannot decide stop the proven end, not the feasible one: with answers
    'infeasible' up to the single-step need, 'unknown' below F and 'feasible' from F, the row
    is the bracket (need, F] and says it is not exact."""
    import solvers.pebbling_search as ps
    from solvers.bounds import frontier_lower_bound

    g = random_dag(2, 12)
    need, peak = frontier_lower_bound(g.sizes, g.edge_array), g.no_remat_peak()
    F = need + (peak - need) // 2
    real = ps.decide(g.preds, g.sizes, peak)

    def fake(preds, sizes, b, **kw):
        status = "infeasible" if b <= need else "unknown" if b < F else "feasible"
        return ps.Decision(status, b, real.schedule if status == "feasible" else None,
                           None, None, None, 0, 0.0)

    monkeypatch.setattr(ps, "decide", fake)
    row = mb.smallest_budget(g, probe_time=1, probe_states=10)
    assert (row["infeasible_at"], row["feasible_at"], row["exact"]) == (need, F, False)
    assert "unknown" in row["outcomes"]
