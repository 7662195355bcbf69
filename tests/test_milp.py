"""The generic sparse MILP model: results checked against brute-force enumeration and
scipy's own LP solver, time-limit and infeasibility paths."""

import itertools
import math

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp
from helpers.limits import SAFETY_S

from remat.core.errors import SolverError, SolverTimeoutError
from solvers.milp import MilpModel


def _knapsack(seed: int, n: int = 8):
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 10, n).astype(float)
    v = rng.integers(1, 10, n).astype(float)
    cap = float(w.sum() // 2)
    return w, v, cap


def _brute_knapsack(w, v, cap):
    best = -math.inf
    for bits in itertools.product((0, 1), repeat=len(w)):
        x = np.array(bits, float)
        if x @ w <= cap:
            best = max(best, x @ v)
    return best


@pytest.mark.parametrize("backend", ["highs", "cvxpy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knapsack_matches_enumeration(backend, seed):
    w, v, cap = _knapsack(seed)
    m = MilpModel()
    x = m.add_vars("x", len(w), 0, 1, integer=True)
    m.add_rows(sp.csr_matrix(w[None, :]), hi=cap)
    m.add_objective(x, -v)
    sol = m.solve(backend, time_limit=SAFETY_S)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(-_brute_knapsack(w, v, cap))
    obj, viol = m.evaluate(sol.x)
    assert obj == pytest.approx(sol.objective) and viol <= 1e-6


def test_lp_relaxation_matches_scipy_linprog():
    w, v, cap = _knapsack(3, n=10)
    m = MilpModel()
    x = m.add_vars("x", len(w), 0, 1, integer=True)
    m.add_rows_coo(np.zeros(len(w)), x, w, 1, hi=cap)
    m.add_objective(x, -v)
    lp = m.solve(relax=True)
    ref = scipy.optimize.linprog(-v, A_ub=w[None, :], b_ub=[cap], bounds=[(0, 1)] * len(w))
    assert lp.status == "optimal" and lp.objective == pytest.approx(ref.fun)
    assert lp.bound == pytest.approx(lp.objective)
    mip = m.solve()
    assert mip.objective >= lp.objective - 1e-9  # relaxation is a lower bound


def test_blocks_rows_fix_and_mixed_integer():
    # min x + 2y + 3z, x + y + z >= 2.5 (z continuous), x, y integer in [0, 1]; fix y = 0
    m = MilpModel()
    xy = m.add_vars("xy", (2,), 0, 1, integer=True)
    z = m.add_vars("z", 1, 0, 10)
    assert list(m.block("xy")) == [0, 1] and list(m.block("z")) == [2]
    m.add_rows(sp.csr_matrix(np.ones((1, 3))), lo=2.5)
    m.add_objective(np.r_[xy, z], [1, 2, 3])
    sol = m.solve()
    assert sol.objective == pytest.approx(1 + 2 + 3 * 0.5)  # x=y=1, z=0.5
    m.fix(xy[1:], 0.0)
    sol = m.solve()
    assert sol.objective == pytest.approx(1 + 3 * 1.5)
    assert np.allclose(sol.x, [1, 0, 1.5])


def test_infeasible_status():
    m = MilpModel()
    x = m.add_vars("x", 2, 0, 1, integer=True)
    m.add_rows_coo([0, 0], x, [1, 1], 1, lo=3)
    assert m.solve().status == "infeasible"
    assert m.solve("cvxpy").status == "infeasible"


def _hard_model(n=60, seed=0):
    # a random multi-dimensional knapsack: its proof takes a search (43 nodes)
    rng = np.random.default_rng(seed)
    m = MilpModel()
    x = m.add_vars("x", n, 0, 1, integer=True)
    W = rng.integers(20, 100, (8, n)).astype(float)
    m.add_rows(sp.csr_matrix(W), hi=W.sum(1) / 2)
    m.add_objective(x, -rng.integers(20, 100, n).astype(float))
    return m, x


def test_time_limit_with_incumbent_returns_time_limit_status():
    """A limit of 0 s (spent at HiGHS's first check, whatever the machine's speed) with a
    feasible warm start: status ``time_limit`` and the warm start back; a search stopped by a
    work limit (HiGHS ``mip_max_nodes``) returns its incumbent, a valid bound and the gap."""
    m, x = _hard_model()
    ws = np.zeros(m.num_vars)  # all-zero is feasible
    sol = m.solve(time_limit=0.0, warm_start=ws, mip_gap=0.0)
    assert sol.status == "time_limit" and sol.x is not None
    assert sol.objective == 0.0 and not sol.bound > sol.objective
    part = m.solve(time_limit=SAFETY_S, warm_start=ws, mip_gap=0.0,
                   options={"mip_max_nodes": 1})
    full = m.solve(time_limit=SAFETY_S, warm_start=ws, mip_gap=0.0)
    assert full.status == "optimal" and full.node_count > 1
    assert part.status == "feasible" and part.x is not None and part.node_count <= 1
    assert part.bound <= full.objective <= part.objective < 0.0
    assert part.gap > 0 and part.gap == pytest.approx((part.objective - part.bound)
                                                      / abs(part.objective))


def test_time_limit_without_incumbent_raises_with_bound():
    # a market-split instance (Cornuejols-Dawande): feasible points are very hard to find; a
    # limit of 0 s is spent before HiGHS has one, at any speed
    rng = np.random.default_rng(1)
    n = 40
    m = MilpModel()
    m.add_vars("x", n, 0, 1, integer=True)
    A = rng.integers(0, 100, (4, n)).astype(float)
    rhs = np.floor(A.sum(1) / 2)
    m.add_rows(sp.csr_matrix(A), lo=rhs, hi=rhs)
    with pytest.raises(SolverTimeoutError) as err:
        m.solve(time_limit=0.0)
    assert err.value.bound is None or err.value.bound <= 0.0


def test_partial_warm_start_and_bad_backend():
    w, v, cap = _knapsack(4)
    m = MilpModel()
    x = m.add_vars("x", len(w), 0, 1, integer=True)
    m.add_rows(sp.csr_matrix(w[None, :]), hi=cap)
    m.add_objective(x, -v)
    sol = m.solve(warm_start=(np.array([0]), np.array([0.0])))
    assert sol.objective == pytest.approx(-_brute_knapsack(w, v, cap))
    with pytest.raises(SolverError):
        m.solve("gurobi")
    with pytest.raises(SolverError):
        m.add_rows_coo([0], [99], [1.0], 1, hi=1)


def test_add_coefficients_extends_existing_rows():
    # x + y <= 1 built first, then z added to the same row: max x + y + z -> 1
    m = MilpModel()
    xy = m.add_vars("xy", 2, 0, 1, integer=True)
    row = m.add_rows_coo([0, 0], xy, [1, 1], 1, hi=1.0, name="cap")
    z = m.add_vars("z", 1, 0, 1, integer=True)
    m.add_objective(np.r_[xy, z], -1.0)
    assert m.solve().objective == pytest.approx(-2.0)
    m.add_coefficients(m.row_block("cap"), z, 1.0)
    assert list(row) == list(m.row_block("cap"))
    assert m.solve().objective == pytest.approx(-1.0)
    with pytest.raises(SolverError):
        m.add_coefficients([5], z, 1.0)


def test_thread_count_can_change_between_solves():
    # HiGHS has one process-wide pool; changing `threads` must not make run() fail
    w, v, cap = _knapsack(5)
    m = MilpModel()
    x = m.add_vars("x", len(w), 0, 1, integer=True)
    m.add_rows(sp.csr_matrix(w[None, :]), hi=cap)
    m.add_objective(x, -v)
    ref = -_brute_knapsack(w, v, cap)
    for threads in (None, 2, 1, None, 2):
        sol = m.solve(threads=threads)
        assert sol.status == "optimal" and sol.objective == pytest.approx(ref)


def test_a_quiet_solve_prints_nothing_to_stdout():
    """highspy 1.16 prints a version banner on its first ``Highs()`` in a process, at the C
    level; a solve without ``log`` must leave the caller's stdout (e.g. ``remat compare``'s
    table) clean, and the solve must still work."""
    import subprocess
    import sys

    code = (
        "import numpy as np, scipy.sparse as sp\n"
        "from solvers.milp import MilpModel\n"
        "m = MilpModel(); x = m.add_vars('x', 3, 0, 1, integer=True)\n"
        "m.add_rows(sp.csr_matrix(np.ones((1, 3))), hi=2.0); m.add_objective(x, -np.arange(1.0, 4.0))\n"
        "s = m.solve('highs', time_limit=5)\n"
        "import sys; sys.stderr.write(f'{s.status} {s.objective:g}')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().endswith("optimal -5")
    assert r.stdout == ""


def test_registry_solves_as_the_model_method_does():
    """``solvers.milp.solve(model, backend=...)`` is what ``MilpModel.solve`` runs; an unknown
    name is a typed error naming the back ends."""
    import solvers.milp as milp

    w, v, cap = _knapsack(6)
    m = MilpModel()
    x = m.add_vars("x", len(w), 0, 1, integer=True)
    m.add_rows(sp.csr_matrix(w[None, :]), hi=cap)
    m.add_objective(x, -v)
    assert set(milp.BACKENDS) == {"highs", "cvxpy", "cpsat", "race"}
    for relax in (False, True):
        a = milp.solve(m, backend="highs", time_limit=SAFETY_S, relax=relax)
        b = m.solve("highs", time_limit=SAFETY_S, relax=relax)
        assert (a.status, a.objective, a.bound) == (b.status, b.objective, b.bound)
        assert np.array_equal(a.x, b.x)
    with pytest.raises(SolverError, match=r"unknown MILP backend 'gurobi'; use one of \('highs'"):
        milp.solve(m, backend="gurobi")
    with pytest.raises(SolverError, match="unknown MILP backend"):
        milp.check_backend("gurobi")
