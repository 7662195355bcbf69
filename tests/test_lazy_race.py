"""The race of the lazy HiGHS loop against CP-SAT (:mod:`solvers.checkmate.lazy_race`).

References are the whole-chain HiGHS MILP's proven optima (``lazy_memory=False``) on random
DAGs between their smallest feasible budget and the no-remat peak.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from helpers.checkmate_problems import random_problem
from helpers.event_oracle import oracle_schedule_peak
from helpers.limits import SAFETY_S

import remat
from remat.core.errors import InfeasibleBudgetError, SolverTimeoutError
from solvers.checkmate import CheckmateProblem, min_feasible_budget, solve_checkmate
from solvers.checkmate.problem import schedule_cost

pytest.importorskip("ortools")


def _instances():
    for seed in range(3):
        for n in (12, 16):
            P = random_problem(n, 100 * seed + n, 1.0)
            top, lo = P.budget, min_feasible_budget(P)[0]
            yield P.with_budget(lo + int(0.15 * (top - lo)))


def _check(P, sol):
    assert oracle_schedule_peak(P, sol.R, sol.S) == sol.peak_bytes <= P.budget
    assert sol.objective == pytest.approx(schedule_cost(P, sol.R))
    assert sol.lower_bound <= sol.objective * (1 + 1e-9)


def test_lazy_race_proves_the_whole_models_optimum():
    """Either side may win; the answer is the proven optimum, fits on replay, and names the
    winner and both sides' statuses."""
    winners = []
    for P in _instances():
        full = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, lazy_memory=False,
                               warm_start=None)
        race = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, warm_start=None,
                               backend="race")
        assert full.status == race.status == "optimal"
        assert race.objective == pytest.approx(full.objective, rel=2e-4)
        _check(P, race)
        r = race.meta["race"]
        assert race.meta["backend"] == "race" and r["winner"] in ("highs", "cpsat")
        assert "optimal" in (r["highs_status"], r["cpsat_status"])
        winners.append(r["winner"])
    assert len(winners) == 6


def test_lazy_race_returns_cpsats_schedule_when_highs_has_none(monkeypatch):
    """With the HiGHS side out (no incumbent in time), CP-SAT's schedule is the answer: the
    optimum, fitting on replay; with CP-SAT out too, the race raises the timeout."""
    import solvers.checkmate.lazy_race as lr

    def no_highs(*a, **k):
        raise SolverTimeoutError("stub: no HiGHS incumbent", bound=None)

    P = next(iter(_instances()))
    ref = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, lazy_memory=False, warm_start=None)
    monkeypatch.setattr(lr, "solve_lazy", no_highs)
    race = solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, warm_start=None, backend="race")
    assert race.meta["race"]["winner"] == "cpsat"
    assert race.meta["race"]["highs_error"] == "SolverTimeoutError"
    assert race.status == "optimal" and race.objective == pytest.approx(ref.objective, rel=2e-4)
    _check(P, race)

    def no_cpsat(*a, **k):
        raise SolverTimeoutError("stub: no CP-SAT incumbent", bound=None)

    monkeypatch.setattr("solvers.milp.backends.cpsat.solve_cpsat", no_cpsat)
    with pytest.raises(SolverTimeoutError, match="stub"):
        solve_checkmate(P, time_limit=SAFETY_S, lp_first=False, warm_start=None, backend="race")


def test_lazy_race_infeasible_budget_names_the_smallest_feasible_one():
    P = next(iter(_instances()))
    lo = min_feasible_budget(P)[0]
    with pytest.raises(InfeasibleBudgetError) as err:
        solve_checkmate(P.with_budget(lo - 1), time_limit=SAFETY_S, lp_first=False,
                        warm_start=None, backend="race")
    assert err.value.min_feasible_bytes == lo


def test_lazy_race_cpsat_infeasibility_proof_names_the_smallest_feasible_budget(monkeypatch):
    """CP-SAT proves the budget infeasible first and stops the HiGHS side, which then has
    neither schedule nor proof: the race still raises the typed error with the smallest
    feasible budget (not the HiGHS side's time-out)."""
    import solvers.checkmate.lazy_race as lr

    def highs_outpaced(*a, cancel=None, **k):
        assert cancel.event.wait(SAFETY_S), "CP-SAT never proved the budget infeasible"
        raise SolverTimeoutError("stub: HiGHS stopped by CP-SAT's proof", bound=None)

    P = next(iter(_instances()))
    lo = min_feasible_budget(P)[0]
    monkeypatch.setattr(lr, "solve_lazy", highs_outpaced)
    with pytest.raises(InfeasibleBudgetError) as err:
        solve_checkmate(P.with_budget(lo - 1), time_limit=SAFETY_S, lp_first=False,
                        warm_start=None, backend="race")
    assert err.value.min_feasible_bytes == lo


def test_lazy_solve_stops_when_cancelled_from_another_thread():
    """``LazyCancel`` (what a CP-SAT proof triggers) stops the HiGHS search under way and
    starts no further round: on a 40-layer chain at 30 % (far from proven in its first
    round), another thread cancels once HiGHS's search has called back (its search is under
    way, whatever the machine's speed); the round ends unproven, no other round starts, and
    the incumbent comes back."""
    from solvers.checkmate.formulation import Formulation
    from solvers.checkmate.frontier import best_heuristic
    from solvers.checkmate.lazy import LazyCancel, solve_lazy
    from solvers.checkmate.solve_state import SolveClock, SolveState

    rng = np.random.default_rng(0)
    L = 40
    g = remat.chain_graph(L, sizes=rng.integers(1, 9, L), fwd_costs=rng.uniform(0.5, 2, L))
    P = CheckmateProblem.from_graph(g, math.ceil(0.3 * g.no_remat_peak()))
    h = best_heuristic(P, P.budget)
    warm = (h[1], h[2])
    under_way = threading.Event()

    class Cancel(LazyCancel):
        def attach(self, highs) -> None:
            highs.cbMipInterrupt.subscribe(lambda event: under_way.set())
            super().attach(highs)

    cancel = Cancel()

    def cancel_once_under_way() -> None:
        if under_way.wait(SAFETY_S):
            cancel.cancel()

    canceller = threading.Thread(target=cancel_once_under_way, daemon=True)
    canceller.start()
    state = SolveState(P, SolveClock(SAFETY_S), warm=warm, formulation=Formulation(),
                       mip_gap=1e-6)
    sol = solve_lazy(state, cancel=cancel)
    canceller.join(SAFETY_S)
    assert under_way.is_set() and cancel.event.is_set()
    rounds = sol.meta["lazy_rounds"]
    assert len(rounds) == 1 and rounds[0]["status"] != "optimal", rounds
    assert sol.status == "time_limit"
    _check(P, sol)
