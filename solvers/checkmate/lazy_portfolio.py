"""The lazy HiGHS solve run as a portfolio: one search per random seed, one core each.

HiGHS's MIP search is nearly serial and its time swings with the random seed, so a second core
is better spent on a second search with another seed than on HiGHS's own threads:
:func:`solve_lazy_portfolio` runs :func:`~solvers.checkmate.lazy.solve_lazy` once per seed, each
in its own thread with one HiGHS thread (highspy releases the GIL while it solves), and the first
to prove its answer optimal stops the others (:class:`~solvers.checkmate.lazy.LazyCancel`).
Otherwise, at the time limit, the cheapest schedule found (every one fits on replay) is returned
with the largest bound (each member's bound is a bound of the same problem: its rounds are
relaxations of it).  Portfolio against one search on 100-layer random-width MLPs:
``experiments/results/milp_unseen_portfolio.csv`` (``python experiments/milp_unseen.py
--portfolio both``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Sequence

from remat.core.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from solvers.checkmate.lazy import LazyCancel, solve_lazy
from solvers.checkmate.problem import CheckmateProblem, CheckmateSolution, rel_gap
from solvers.checkmate.solve_state import SolveState
from solvers.milp import highs_thread_count

__all__ = ["portfolio_size", "solve_lazy_portfolio"]


def portfolio_size(portfolio: int | None, threads: int | None) -> int:
    """How many lazy HiGHS searches ``solve_checkmate(portfolio=...)`` runs at once:
    ``portfolio``, or when ``None`` two if ``threads`` is ``None`` and the process may use two
    or more cores, else one."""
    if portfolio is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        return 2 if threads is None and cores >= 2 else 1
    if isinstance(portfolio, bool) or not isinstance(portfolio, int) or portfolio < 1:
        raise SolverError(f"portfolio must be a positive number of searches, got {portfolio!r}")
    return portfolio


def solve_lazy_portfolio(state: SolveState, seeds: Sequence[int], delay_s: float = 1.0
                         ) -> CheckmateSolution:
    """Run :func:`~solvers.checkmate.lazy.solve_lazy` on ``state`` once per seed in ``seeds``,
    at once (see the module docstring).

    Args:
      state: the solve; ``state.options`` go to every member's HiGHS (a ``random_seed`` there
        is overridden by the member's seed), ``state.threads`` is replaced by one.
      seeds: HiGHS ``random_seed`` of each member (at least two, distinct).
      delay_s: the first member runs alone for that long (seconds); the others start only if
        it has not finished by then (easy instances cost no second search).

    Returns:
      The cheapest member's :class:`CheckmateSolution` with the best bound of all members;
      ``meta["portfolio"]`` lists each member's seed, status (``stopped``: another member
      proved first), objective, bound and time (s since the solve began), and which one was
      returned (``winner``; only the first member is listed when it finished within
      ``delay_s``).

    Raises:
      InfeasibleBudgetError: a member proved that no schedule fits.
      SolverTimeoutError: no member found a schedule in time (with the best bound).
    """
    problem, clock, mip_gap = state.problem, state.clock, state.mip_gap
    seeds = [int(s) for s in seeds]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise SolverError(f"a portfolio needs at least two distinct seeds, got {seeds!r}")
    cancels = [LazyCancel() for _ in seeds]
    results: list[CheckmateSolution | Exception | None] = [None] * len(seeds)
    ended: list[float] = [math.nan] * len(seeds)

    def member(k: int) -> None:
        opts = {**(state.options or {}), "random_seed": seeds[k]}
        try:
            sol = solve_lazy(dataclasses.replace(state, threads=1, options=opts,
                                                 meta=dict(state.meta)), cancel=cancels[k])
        except Exception as e:  # noqa: BLE001 (handed to the calling thread)
            results[k] = e
            if isinstance(e, InfeasibleBudgetError):
                for c in cancels:
                    c.cancel()
        else:
            results[k] = sol
            if sol.status == "optimal":
                for j, c in enumerate(cancels):
                    if j != k:
                        c.cancel()
        ended[k] = clock.elapsed()

    with highs_thread_count(1):
        threads = [threading.Thread(target=member, args=(k,), daemon=True,
                                    name=f"checkmate-highs-seed{s}")
                   for k, s in enumerate(seeds)]
        threads[0].start()
        threads[0].join(timeout=max(0.0, float(delay_s)))
        started = [threads[0]]
        if threads[0].is_alive():  # not an easy instance: the other seeds join the search
            started += threads[1:]
            for t in threads[1:]:
                t.start()
        for t in started:
            t.join()
    if len(started) == 1:  # the first member finished before the others were needed
        seeds, results, ended = seeds[:1], results[:1], ended[:1]
    stopped = [c.event.is_set() for c in cancels][:len(seeds)]
    return _combine(problem, seeds, results, ended, stopped, mip_gap)


def _combine(problem: CheckmateProblem, seeds: list[int],
             results: list[CheckmateSolution | Exception | None], ended: list[float],
             stopped: list[bool], mip_gap: float) -> CheckmateSolution:
    """The portfolio's answer: the cheapest member's schedule and the best bound of all."""
    members = []
    for s, r, t, stop in zip(seeds, results, ended, stopped, strict=True):
        row = {"seed": s, "time_s": t}
        if isinstance(r, CheckmateSolution):  # "stopped": another member proved first
            row.update(status="stopped" if stop and r.status != "optimal" else r.status,
                       objective=r.objective, bound=r.lower_bound)
        else:
            row.update(status="error", error=f"{type(r).__name__}: {r}")
        members.append(row)
    errors = [r for r in results if isinstance(r, Exception)]
    for e in errors:
        if isinstance(e, InfeasibleBudgetError):
            raise e
    sols = [(k, r) for k, r in enumerate(results) if isinstance(r, CheckmateSolution)]
    bounds = [r.lower_bound for _, r in sols] + [
        e.bound for e in errors if isinstance(e, SolverTimeoutError) and e.bound is not None]
    bound = max([b for b in bounds if math.isfinite(b)], default=-math.inf)
    if not sols:
        others = [e for e in errors if not isinstance(e, SolverTimeoutError)]
        if others:  # a real failure, not a time-out: the caller sees the first one
            raise others[0]
        raise SolverTimeoutError("no portfolio member found a schedule in time",
                                 bound=bound if math.isfinite(bound) else None)
    k, best = min(sols, key=lambda kr: (kr[1].objective, kr[1].status != "optimal"))
    bound = min(max(bound, float(problem.costs.sum())), best.objective)
    gap = rel_gap(best.objective, bound)
    status = "optimal" if (best.status == "optimal" or gap <= mip_gap) else best.status
    meta = {**best.meta, "portfolio": {"members": members, "winner": seeds[k]}}
    return CheckmateSolution(best.R, best.S, status, best.objective, bound, gap,
                             best.peak_bytes, best.solve_time_s, best.build_time_s,
                             best.node_count, meta)
