"""experiments.open_instances: the bounds reported for open published instances are proofs or
measured plans, checked against independent facts on small graphs."""

import numpy as np
from helpers.limits import SAFETY_S

import policies
import remat
from experiments import open_instances as oi
from experiments.solver_benchmark_published import min_step_bytes, open_bounds_section
from remat.core.schedule import replay
from solvers.pebbling_bound import prove_infeasible


def _graph():
    rng = np.random.default_rng(3)
    return remat.chain_graph(6, sizes=rng.integers(100, 900, 6))


def test_memory_floor_is_proven_and_below_a_real_plan():
    g = _graph()
    step = min_step_bytes(g)
    fits = replay(g, policies.get("recompute_all").plan(g)).peak_bytes  # a real schedule's peak
    floor, probes, _ = oi.memory_floor(g.preds, g.sizes, step - 1, int(fits) + 1000,
                                       proof_time=SAFETY_S, steps=20)
    assert probes > 0 and step - 1 <= floor < fits  # below a schedule that exists
    assert prove_infeasible(g.preds, g.sizes, floor, time_limit=SAFETY_S).proven


def test_program_order_lp_proves_infeasible_below_one_step_and_bounds_cost_above():
    g = _graph()
    st, _, _ = oi.program_order_lp(g, min_step_bytes(g) - 1, SAFETY_S)
    assert st == "infeasible"
    st, bound, _ = oi.program_order_lp(g, int(g.no_remat_peak()), SAFETY_S)
    assert st == "optimal" and abs(bound - 1.0) < 1e-6  # nothing needs recomputing
    b = int(0.8 * g.no_remat_peak())
    st, bound, _ = oi.program_order_lp(g, b, SAFETY_S)
    opt = policies.get("checkmate", time_limit=SAFETY_S).plan(g, budget=b)
    assert st == "optimal" and bound <= opt.meta["objective"] / g.costs.sum() + 1e-6


def test_open_instances_and_best_peak_read_the_benchmark_rows():
    rows = [
        {"graph": "a", "m": "0.6", "status": "timeout_no_incumbent", "method": "lp",
         "policy": "checkmate(relax=lp)", "min_feasible_bytes": "",
         "error": "LP rounding found no schedule within 5 bytes; the smallest peak found is 70 bytes"},
        {"graph": "a", "m": "0.6", "status": "heuristic_infeasible", "method": "heuristic",
         "policy": "pebbling", "min_feasible_bytes": "90", "error": ""},
        {"graph": "a", "m": "0.9", "status": "ok", "method": "milp", "policy": "checkmate",
         "min_feasible_bytes": "", "error": ""},
        {"graph": "b", "m": "0.6", "status": "infeasible_proven", "method": "milp",
         "policy": "checkmate", "min_feasible_bytes": "", "error": ""},
    ]
    assert oi.open_instances(rows) == [("a", "0.6")]
    assert oi.best_peak(rows[:2]) == (70, "lp (checkmate(relax=lp))")
    bound = {"graph": "a", "m": "0.6", "budget_bytes": "60", "memory_floor_bytes": "55",
             "floor_probes": "3", "floor_seconds": "1.0", "best_peak_bytes": "70",
             "lp_status": "infeasible", "lp_bound_overhead": "", "lp_seconds": "0.1"}
    md = "\n".join(open_bounds_section([bound], {("a", "0.6"): "open"}))
    assert "| a | 0.6 | 60 B | > 55 B" in md and "| 70 B |" in md and "infeasible" in md
    assert open_bounds_section([bound], {("a", "0.6"): "feasible (1.0, milp)"}) == []


def test_bad_arguments_are_typed_errors():
    import pytest

    from remat.core.errors import BudgetFormatError, RematError

    g = _graph()
    for lo, hi in ((10, 10), (20, 10), (-5, 10), (1.5, 10)):
        with pytest.raises(BudgetFormatError):
            oi.memory_floor(g.preds, g.sizes, lo, hi, proof_time=1, steps=2)
    for pt, steps in ((0, 2), (1, -1)):
        with pytest.raises(RematError):
            oi.memory_floor(g.preds, g.sizes, 0, 10, proof_time=pt, steps=steps)
    for b in (-1, 10.5):
        with pytest.raises(BudgetFormatError):
            oi.program_order_lp(g, b, 10)
    with pytest.raises(RematError):
        oi.program_order_lp(g, 1000, 0)


def test_shaved_peak_is_a_real_schedules_peak_and_no_higher_than_its_order():
    """The peak ``shaved_peak`` reports is the replayed peak of the schedule it returns (in the
    relabelled graph), never above the order's own no-recomputation peak, and never below the
    single-step need; 0 orders: nothing."""
    from policies.from_checkpoints import plan_from_steps
    from policies.reorder import relabel
    from remat.core.graph import make_graph
    from solvers.orders import order_peak

    rng = np.random.default_rng(7)
    n = 40
    edges = [(i, i + 1) for i in range(n - 1)]
    edges += [(int(a), int(b)) for a, b in rng.integers(0, n, (60, 2)) if a < b - 1]
    g = make_graph([f"v{i}" for i in range(n)], sorted(set(edges)),
                   out_bytes=[int(x) for x in rng.integers(10, 200, n)],
                   time_s=[float(x) for x in rng.uniform(1, 3, n)])
    b = int(0.6 * g.no_remat_peak())
    peak, src, order, steps = oi.shaved_peak(g, b, 4)
    g2 = relabel(g, order)
    assert replay(g2, plan_from_steps(g2, steps)).peak_bytes == peak
    assert min_step_bytes(g) <= peak <= order_peak(g.sizes, g.edge_array, np.asarray(order))
    assert src.startswith("peak_shave in greedy order")
    assert oi.shaved_peak(g, b, 0) == (None, "", None, None)


def test_shaved_peak_rejects_bad_input_with_typed_errors():
    import pytest

    from remat.core.errors import BudgetFormatError, RematError

    g = _graph()
    with pytest.raises(RematError, match="orders"):
        oi.shaved_peak(g, int(g.no_remat_peak()), -1)
    with pytest.raises(BudgetFormatError):
        oi.shaved_peak(g, -5, 2)
