"""The Ray backend of ``experiments.harness.sweep``: a local Ray cluster (2 CPUs) gives the same
rows as the local backend, and a sweep stopped midway resumes without recomputing or losing
rows.  Skipped when ray is not installed (it is in the ``dev`` and ``cluster`` extras)."""

import os
import time
import uuid
from collections import Counter

import pytest
from helpers.limits import SAFETY_S

import remat
from experiments.harness import DETERMINISTIC, KEY, read_rows, sweep

pytest.importorskip("ray")


def _counting(marks: str, sleep_s: float = 0.0):
    """A policy wrapper that leaves one marker file per ``plan`` call in ``marks`` (counted
    across Ray worker processes).  Defined in a function so that cloudpickle ships the class by
    value to the workers, which cannot import this test module."""

    class Counting:
        def __init__(self, inner: str):
            self.inner = inner
            self.name = inner

        def plan(self, graph, budget=None):
            import policies

            open(os.path.join(marks, f"{self.inner}@{budget}@{uuid.uuid4().hex}"), "w").close()
            time.sleep(sleep_s)
            return policies.get(self.inner).plan(graph, budget=budget)

    return Counting


def _det(rows):
    return sorted((tuple(r[k] for k in DETERMINISTIC) for r in rows), key=str)


GRAPHS = {"chain8": remat.chain_graph(8, sizes=[1, 2, 3, 4, 4, 3, 2, 1]),
          "chain6": remat.chain_graph(6, sizes=[3, 1, 2, 2, 1, 3])}


@pytest.mark.slow
def test_ray_sweep_gives_the_local_rows(tmp_path):
    """Graphs shipped to the workers, a zoo model built in each worker (with realised residual
    bytes and the executor's measured peak), registry policies built per task with threads=1,
    on a local cluster the sweep starts (and stops) itself when none is running: every
    deterministic column equal."""
    # device profiles with fixed constants: with device None a zoo model keeps the costs of
    # the ``host`` profile, calibrated by timing in each process (not deterministic); the
    # solvers' limit is a safety net (equal rows need both sides' solves to end on their own)
    kw = dict(budgets=["100%", "75%"], devices=["rtx-3090"], batch_sizes=[4],
              time_limit=SAFETY_S, execute=True, progress=False)
    pols = ["checkpoint_all", "sqrtn", "checkmate", "poet"]
    models = {**GRAPHS, "mlp": "mlp"}
    local = sweep(models, pols, out=tmp_path / "local.csv", **kw)
    ray_rows = sweep(models, pols, out=tmp_path / "ray.csv", backend="ray", num_cpus=2, **kw)
    assert len(local) == len(ray_rows) == 3 * 4 * 2 * 1
    assert _det(local) == _det(ray_rows)
    mlp = [r for r in ray_rows if r["model"] == "mlp" and r["peak_bytes"] is not None]
    assert mlp and all(r["realised_residual_bytes"] > 0 for r in mlp)
    assert all(r["executor_peak_bytes"] == r["peak_bytes"] for r in mlp)  # measured in workers
    assert all(r["status"] not in ("crash", "error") for r in ray_rows), ray_rows


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def cluster():
    """An existing 2-CPU local cluster, which ``sweep`` uses (and leaves running)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_ray_sweep_stopped_midway_resumes(tmp_path, cluster):
    """The driver stops after 3 rows (an exception from the row hook, as an interrupt would):
    those rows are on disk, in-flight tasks are cancelled, and the re-run plans only the
    missing rows, ending with every row exactly once."""
    marks = tmp_path / "marks"
    marks.mkdir()
    slow = _counting(str(marks), sleep_s=0.3)
    pols = {p: slow(p) for p in ("checkpoint_all", "sqrtn", "recompute_all")}
    budgets = ["100%", "90%", "80%"]
    out = tmp_path / "rows.csv"
    seen = []

    def stop_after_3(row):
        seen.append(row)
        if len(seen) == 3:
            raise _Stop

    with pytest.raises(_Stop):
        sweep(GRAPHS, pols, budgets, out=out, backend="ray", num_cpus=2, progress=False,
              on_row=stop_after_3)
    first = read_rows(out)
    assert len(first) == 3
    assert cluster.is_initialized()  # an existing cluster is left to its owner
    done = {(r["model"], r["policy"], r["budget_spec"]) for r in first}
    marks2 = tmp_path / "marks2"  # the resumed run's plan calls, apart from the first's
    marks2.mkdir()
    fast = _counting(str(marks2))
    rows = sweep(GRAPHS, {p: fast(p) for p in pols}, budgets, out=out, backend="ray",
                 num_cpus=2, progress=False)
    rerun = Counter(tuple(n.split("@")[:2]) for n in os.listdir(marks2))
    keys = [tuple(r[k] for k in KEY) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * 3 * 3  # nothing lost, nothing doubled
    # resumed plan calls: one per missing row (policy, budget), none for the finished rows
    assert sum(rerun.values()) == 18 - len(done)
    per_pb = Counter((p, b) for _, p, b in done)
    for p in pols:
        for b in budgets:
            assert rerun[(p, b)] == 2 - per_pb[(p, b)]
