"""Repair of schedules that overshoot the budget (:mod:`solvers.checkmate.repair`).

The overshooting schedules are the ones the lazy solve meets: optima of the relaxation without
the ``U``/``FREE`` memory chain, on random DAGs at budgets between the smallest feasible one and
the no-remat peak.  The reference is the full MILP's optimum (``lazy_memory=False``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.checkmate_problems import random_problem
from helpers.limits import SAFETY_S

from remat.core.errors import SolverError
from solvers.checkmate import min_feasible_budget, solve_checkmate
from solvers.checkmate.formulation import Formulation, add_checkmate_core, decode_schedule
from solvers.checkmate.problem import (
    checkpoint_all_schedule,
    normalize,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.repair import repair_schedule
from solvers.milp import MilpModel


def _relaxation_schedule(P):
    """The optimum of the relaxation without the memory chain (start and frontier rows)."""
    model = MilpModel("relaxation")
    v = add_checkmate_core(model, P, budget=P.budget, formulation=Formulation(memory_chain=False))
    sol = model.solve("highs", time_limit=SAFETY_S, mip_gap=1e-6)
    return normalize(P, *decode_schedule(P, v, sol.x))


def _overshooting_instances():
    out = []
    for seed in range(5):  # (seed 5 gave no overshooting schedule, after 3 s of MILPs)
        for n in (12, 14, 16):
            P = random_problem(n, 100 * seed + n, 1.0)
            top, lo = P.budget, min_feasible_budget(P)[0]
            for frac in (0.15, 0.5):
                Pb = P.with_budget(lo + int(frac * (top - lo)))
                R, S = _relaxation_schedule(Pb)
                peak, step_peak = schedule_memory(Pb, R, S)
                if peak > Pb.budget:
                    out.append((Pb, R, S, np.flatnonzero(step_peak > Pb.budget)))
    return out


@pytest.fixture(scope="module")
def overshooting():
    cases = _overshooting_instances()
    assert len(cases) >= 4, len(cases)  # otherwise the tests below check nothing
    return cases


def test_repair_fits_keeps_the_fixed_steps_and_costs_no_less_than_the_optimum(overshooting):
    """Every repaired schedule fits on replay, keeps the input outside the windows around its
    overshooting steps (up to normalisation, which only drops entries), and is no cheaper than
    the exact optimum (it is a schedule)."""
    for P, R, S, over in overshooting:
        fix = repair_schedule(P, R, S, time_limit=SAFETY_S, window=1)
        assert fix.status == "repaired", fix
        peak, _ = schedule_memory(P, fix.R, fix.S)
        assert peak <= P.budget
        free = np.zeros(P.n, bool)
        for t in over:
            free[max(0, t - fix.window):t + fix.window + 1] = True
        assert fix.free_steps == free.sum()
        # outside the windows the steps are the input's, less what normalising drops (a
        # checkpoint or recomputation that the repaired windows no longer read)
        assert not (fix.R[~free] & ~R[~free]).any() and not (fix.S[~free] & ~S[~free]).any()
        assert (fix.R[~free] == R[~free]).mean() > 0.9
        exact = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, lazy_memory=False,
                                warm_start=None)
        assert exact.status == "optimal"
        assert schedule_cost(P, fix.R) >= exact.objective * (1 - 1e-6)


def test_repair_with_every_step_free_is_the_exact_optimum(overshooting):
    """A window wider than the graph frees every step: the repair is the full MILP, so its
    cost is the exact optimum."""
    for P, R, S, _ in overshooting[:4]:
        fix = repair_schedule(P, R, S, time_limit=SAFETY_S, window=P.n)
        exact = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, lazy_memory=False,
                                warm_start=None)
        assert fix.status == "repaired" and fix.free_steps == P.n
        assert schedule_cost(P, fix.R) == pytest.approx(exact.objective, rel=1e-4)


def test_repair_of_a_fitting_schedule_and_bad_input():
    P = random_problem(10, 7, 1.0)
    R, S = checkpoint_all_schedule(P)
    fix = repair_schedule(P, R, S)
    assert fix.status == "fits" and np.array_equal(fix.R, R) and fix.free_steps == 0
    with pytest.raises(SolverError, match="budget"):
        repair_schedule(P.with_budget(None), R, S)
    with pytest.raises(SolverError, match="frontier-form"):
        repair_schedule(P, R, S.T)
    with pytest.raises(SolverError, match="frontier-form"):
        repair_schedule(P, R[:-1], S)


@pytest.mark.parametrize("due", [True, False])
def test_lazy_solve_stops_a_relaxation_whose_incumbent_overshoots_only_when_due(overshooting, due):
    """The lazy solve's watch (``OvershootWatch``) sees every improving solution of a
    relaxation: past its deadline an incumbent that overshoots stops the search (the time left
    is for the repair); before it, the relaxation is solved to its optimum."""
    import time

    from solvers.checkmate.lazy import OvershootWatch

    P, R, S, _ = overshooting[0]
    model = MilpModel("relaxation")
    v = add_checkmate_core(model, P, budget=P.budget, formulation=Formulation(memory_chain=False))
    watch = OvershootWatch(P, v, float("inf"), time.perf_counter() + (-1.0 if due else SAFETY_S))
    sol = model.solve("highs", time_limit=SAFETY_S, mip_gap=1e-6, on_start=watch.attach)
    assert watch.over  # the relaxation's own optimum overshoots
    assert watch.stopped is due
    if not due:
        assert sol.status == "optimal"
        assert schedule_cost(P, decode_schedule(P, v, sol.x)[0]) == pytest.approx(
            schedule_cost(P, R), rel=1e-6)
