"""Solving the Checkmate MILP: the exact solve loop, its time split and fallbacks, and the
peak-minimising MILP behind :func:`min_feasible_budget`.

Times are wall seconds (:class:`SolveClock`), memory bytes, costs the problem's cost units.

Length: the whole solve and the lazy loop share the LP-first step, the time split, the
infeasibility answer and the incumbent/bound bookkeeping; keeping them in one module keeps one
definition of each (the race, the repair and the path cuts live in their own modules).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time

import numpy as np

from remat.core.errors import InfeasibleBudgetError, SolverError, SolverTimeoutError
from solvers.checkmate.formulation import (
    CheckmateVars,
    Formulation,
    add_checkmate_core,
    checkmate_vector,
    decode_schedule,
)
from solvers.checkmate.frontier import best_heuristic, check_frontier_schedule
from solvers.checkmate.path_cuts import PathCuts, path_cut_loop
from solvers.checkmate.problem import (
    CheckmateProblem,
    CheckmateSolution,
    checkpoint_all_schedule,
    rel_gap,
    schedule_cost,
    schedule_memory,
)
from solvers.checkmate.repair import repair_schedule
from solvers.milp import MilpModel, MilpSolution

__all__ = [
    "SolveClock",
    "solve_checkmate",
    "min_feasible_budget",
    "checkpoint_all_if_fits",
    "check_frontier_bound",
]

Schedule = tuple[np.ndarray, np.ndarray]
# share of the time limit the lazy solve keeps for repairing a relaxation's schedule that
# overshoots the budget (:func:`solvers.checkmate.repair.repair_schedule`)
REPAIR_SHARE = 0.1


class SolveClock:
    """Wall-clock accounting of one solve: ``limit`` seconds from construction."""

    def __init__(self, time_limit: float) -> None:
        self.limit = time_limit
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the solve started."""
        return time.perf_counter() - self.start

    def left(self, floor: float = -math.inf) -> float:
        """Seconds left of the limit (negative once overrun), at least ``floor``."""
        return max(floor, self.limit - self.elapsed())


def checkpoint_all_if_fits(problem: CheckmateProblem, clock: SolveClock, **meta
                           ) -> CheckmateSolution | None:
    """The checkpoint-all schedule (optimal: every node runs once) when it fits
    ``problem.budget`` bytes or there is no budget, else ``None``.  ``meta`` is added to its
    ``meta``."""
    R0, S0 = checkpoint_all_schedule(problem)
    peak0, _ = schedule_memory(problem, R0, S0)
    if problem.budget is not None and problem.budget < peak0:
        return None
    c = float(problem.costs.sum())
    return CheckmateSolution(R0, S0, "optimal", c, c, 0.0, peak0, clock.elapsed(), 0.0, 0,
                             {"method": "checkpoint_all", **meta})


def check_frontier_bound(problem: CheckmateProblem, time_limit: float) -> None:
    """Raise :class:`InfeasibleBudgetError` (with :func:`min_feasible_budget`, ``time_limit``
    seconds) when ``problem.budget`` is below the frontier lower bound."""
    budget = problem.budget
    if budget is not None and budget < problem.frontier_lower_bound():
        mf, exact = min_feasible_budget(problem, time_limit=time_limit)
        raise InfeasibleBudgetError(budget, mf, "below the frontier lower bound" +
                                    ("" if exact else " (min_feasible_bytes is an upper estimate)"))


# ------------------------------------------------------------------------ exact MILP
@dataclasses.dataclass(frozen=True)
class _LpBound:
    """The small LP relaxation's bound (cost units, ``-inf``: none), its time (seconds) and the
    path cuts its loop added (:mod:`solvers.checkmate.path_cuts`; ``None``: no loop ran)."""

    bound: float = -math.inf
    time_s: float = 0.0
    cuts: PathCuts | None = None

    def add_cuts(self, model: MilpModel, v) -> None:
        """Append the path cuts (if any) to a model built by :func:`add_checkmate_core`."""
        if self.cuts is not None and self.cuts.num_rows:
            self.cuts.add_to(model, v)


def solve_checkmate(
    problem: CheckmateProblem,
    *,
    time_limit: float = 60.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    backend: str = "highs",
    warm_start: tuple[np.ndarray, np.ndarray] | str | None = "auto",
    formulation: Formulation = Formulation(),  # noqa: B008 (frozen dataclass)
    presolve: bool = True,
    log: bool = False,
    options: dict | None = None,
    lp_first: bool = True,
    lazy_memory: bool = True,
    path_cuts: bool = True,
    portfolio: int | None = None,
) -> CheckmateSolution:
    """Solve Checkmate's MILP exactly (up to ``mip_gap``) for ``problem.budget``.

    With ``lp_first`` the small LP relaxation of :func:`solve_checkmate_lp` (no ``U``/``FREE``
    chain; at most a quarter of ``time_limit``) runs first: if the warm start is already within
    ``mip_gap`` of its bound the warm start is returned as ``optimal`` without building the MILP,
    and otherwise its bound is kept when the MILP's own bound is weaker (large graphs whose root
    LP does not finish in time).  The MILP gets the time that is left; when that is under ten
    times the small LP's time (the full root LP would not finish and HiGHS overruns its limit in
    presolve), the warm start is returned with status ``time_limit`` and the LP bound.

    Args:
      warm_start: ``(R, S)`` frontier-form schedule, ``"auto"`` (cheapest fitting schedule from
        :func:`heuristic_schedules`) or ``None``.  A warm start that is not frontier-form or does
        not fit is ignored (``meta["warm_start"]`` says so).
      threads: HiGHS threads.  HiGHS 1.15's MIP search is serial ("1 max worker"): on a
        101-node chain at 30%, 1 thread 19.1 s, 2 threads 19.6 s.
      presolve: HiGHS presolve (default on).  Off was faster on 101-node chains (30%: 11.9 s vs
        19.1 s; 50%: 10.4 s vs 16.1 s) but a 51-node chain at 30% went from optimal in 23.8 s to
        a 60 s time-out (gap 1.2%), so it stays on.
      time_limit: seconds for everything (LP bound, model build, MILP).
      mip_gap: relative gap at which the solve stops (HiGHS ``mip_rel_gap``).
      lazy_memory: (HiGHS and the race, with the formulation's full memory chain) build the
        ``U``/``FREE`` memory chain only for the steps that need it: solve without it
        (start-of-step and frontier rows only, a relaxation), replay the schedule found, add
        the chain for every step whose replayed peak exceeds the budget, and solve again; a
        schedule of a relaxation
        that fits on replay is feasible, and optimal when within ``mip_gap`` of that
        relaxation's bound; a cheaper schedule that overshoots is repaired by a window MILP
        around its overshooting steps (:func:`~solvers.checkmate.repair.repair_schedule`).
        See :func:`_solve_lazy` for the measurements.  With ``backend="race"`` the lazy
        HiGHS loop races CP-SAT on the whole model (:mod:`solvers.checkmate.lazy_race`).
      path_cuts: (HiGHS and the race, with ``lp_first``) strengthen the small LP with path
        cuts, round by round (:func:`~solvers.checkmate.path_cuts.path_cut_loop`, within the
        LP's quarter of the time), and add the rows to every MILP model solved; rows that
        every schedule satisfies, violated by the LP's fractional recomputation chains.
      portfolio: (HiGHS, lazy) run the lazy loop as that many searches at once, HiGHS random
        seeds ``0..portfolio-1``, one thread each; the first proof stops the others
        (:mod:`solvers.checkmate.lazy_portfolio`; the others start only after the first has
        run 1 s).  ``None``: two when ``threads`` is ``None`` and the process may use two or
        more cores, else one (HiGHS's own threads, as before).
      backend: ``"highs"``, ``"cvxpy"`` or ``"cpsat"`` (OR-Tools CP-SAT, :mod:`solvers.cpsat`;
        ``threads`` is its worker count, default 4).  Zoo MLP (36 nodes) at 50 %: HiGHS proves
        1.340x in 40-60 s, CP-SAT in 12 s (``experiments/results/cpsat_benchmark.csv``).

    Returns:
      :class:`CheckmateSolution` (status ``optimal``, ``time_limit``, or ``feasible`` when a
      tolerance made the MILP's schedule exceed the budget and the warm start was returned).

    Raises:
      InfeasibleBudgetError: no schedule fits (``min_feasible_bytes`` computed with
        :func:`min_feasible_budget`).
      SolverTimeoutError: the time limit hit with no incumbent (impossible with a warm start).
    """
    members = _portfolio_size(portfolio, threads)  # bad input fails before any work
    clock = SolveClock(time_limit)
    done = checkpoint_all_if_fits(problem, clock, warm_start=None)
    if done is not None:
        return done
    check_frontier_bound(problem, time_limit)
    warm, warm_name = _initial_schedule(problem, warm_start)
    lp = _LpBound()
    if backend in ("cpsat", "race"):  # integer data: memory in units of the sizes' gcd
        formulation = dataclasses.replace(formulation, integer_memory=True)
    meta = {"backend": backend, "warm_start": warm_name}
    if lp_first and path_cuts and backend in ("highs", "race"):
        lp = _lp_bound_with_cuts(problem, formulation, 0.25 * time_limit, threads, meta)
    elif lp_first and backend in ("highs", "cpsat", "race"):
        lp = _lp_bound(problem, formulation, 0.25 * time_limit, threads)
    if warm is not None:
        done = _answer_without_milp(problem, warm, lp, clock, mip_gap, meta)
        if done is not None:
            return done
    lazy = lazy_memory and formulation.memory_chain and formulation.chain_steps is None
    if lazy and backend == "highs":
        if members > 1:
            from solvers.checkmate.lazy_portfolio import solve_lazy_portfolio

            return solve_lazy_portfolio(problem, warm, formulation, clock, mip_gap,
                                        range(members), presolve, options, log, lp, meta)
        return _solve_lazy(problem, warm, formulation, clock, mip_gap, threads, presolve,
                           options, log, lp, meta)
    if lazy and backend == "race":  # the lazy HiGHS loop against CP-SAT's whole model
        from solvers.checkmate.lazy_race import solve_lazy_race

        opts = dict(options or {})
        workers = int(opts.pop("cpsat_workers", 3))
        opts.pop("log", None)
        return solve_lazy_race(problem, warm, formulation, clock, mip_gap, threads, presolve,
                               opts, log, lp, meta, cpsat_workers=workers)
    t_b = time.perf_counter()
    model = MilpModel("checkmate")
    v = add_checkmate_core(model, problem, budget=problem.budget, formulation=formulation)
    lp.add_cuts(model, v)
    x0 = checkmate_vector(model, v, problem, *warm) if warm is not None else None
    build = time.perf_counter() - t_b
    try:
        sol = model.solve(backend, time_limit=clock.left(floor=0.05 * time_limit),
                          mip_gap=mip_gap, threads=threads, warm_start=x0, log=log,
                          presolve=presolve, options=options)
    except SolverTimeoutError as e:
        b = None if e.bound is None else e.bound * v.cost_unit
        raise SolverTimeoutError(str(e), bound=b) from None
    return _milp_answer(problem, model, v, sol, warm, lp, clock, mip_gap, build, meta)


def _portfolio_size(portfolio: int | None, threads: int | None) -> int:
    """How many lazy HiGHS searches :func:`solve_checkmate` runs at once (see there)."""
    if portfolio is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        return 2 if threads is None and cores >= 2 else 1
    if isinstance(portfolio, bool) or not isinstance(portfolio, int) or portfolio < 1:
        raise SolverError(f"portfolio must be a positive number of searches, got {portfolio!r}")
    return portfolio


def _initial_schedule(problem: CheckmateProblem, warm_start: Schedule | str | None
                      ) -> tuple[Schedule | None, str | None]:
    """``(schedule, name)`` of the warm start (see :func:`solve_checkmate`)."""
    budget = problem.budget
    if isinstance(warm_start, str) and warm_start == "auto":
        h = best_heuristic(problem, budget)
        if h is not None and h[3] <= budget:
            return (h[1], h[2]), h[0]
        return None, None
    if warm_start is not None:
        warm = check_frontier_schedule(problem, warm_start, budget)
        return warm, ("given" if warm is not None else
                      "given (rejected: not frontier-form or over budget)")
    return None, None


def _lp_bound(problem: CheckmateProblem, formulation: Formulation, time_limit: float,
              threads: int | None) -> _LpBound:
    """The small LP relaxation (no memory chain, no dominance rows) within ``time_limit`` s."""
    lpm = MilpModel("checkmate_lp_bound")
    lv = add_checkmate_core(lpm, problem, budget=problem.budget, formulation=dataclasses.replace(
        formulation, memory_chain=False, useful=False))
    try:
        lps = lpm.solve("highs", time_limit=time_limit, relax=True, threads=threads)
    except SolverTimeoutError:
        return _LpBound()
    bound = lps.objective * lv.cost_unit if lps.status == "optimal" else -math.inf
    return _LpBound(bound, lps.solve_time_s + lps.build_time_s)


def _lp_bound_with_cuts(problem: CheckmateProblem, formulation: Formulation, time_limit: float,
                        threads: int | None, meta: dict) -> _LpBound:
    """The small LP relaxation strengthened by path cuts (:func:`path_cut_loop`) within
    ``time_limit`` s; the cuts are kept for the MILP models.  ``meta["path_cuts"]`` records
    the rounds."""
    res = path_cut_loop(problem, formulation, time_limit, threads=threads)
    meta["path_cuts"] = {"rows": res.cuts.num_rows, "rounds": len(res.rounds),
                         "time_s": res.time_s, "first_bound": (res.rounds[0]["bound"]
                                                               if res.rounds else None),
                         "bound": res.bound, "stop": res.stop}
    # time_s is the first LP's alone: _answer_without_milp reads it as the root LP's cost
    return _LpBound(res.bound, res.first_lp_s, res.cuts)


def _answer_without_milp(problem: CheckmateProblem, warm: Schedule, lp: _LpBound,
                         clock: SolveClock, mip_gap: float, meta: dict) -> CheckmateSolution | None:
    """The warm start when the MILP is not needed (the LP bound proves it optimal) or cannot
    help (too little time left for its root LP), else ``None``."""
    wobj = schedule_cost(problem, warm[0])
    left = clock.left()
    status = None
    if wobj - lp.bound <= mip_gap * abs(wobj):
        status, method, note = "optimal", "warm start proven by the LP bound", ""
        solve_s, build_s = lp.time_s, clock.elapsed() - lp.time_s
    elif lp.time_s > 0 and left < 10 * lp.time_s:
        # the full MILP's root LP costs several times the small LP (n = 401 chain: 11 s vs
        # minutes); with this little time HiGHS would only overrun its limit in presolve/root LP.
        # (RENS around this small LP was tried: its 0/1 values contradict the exact memory model,
        # the fixed sub-MIP was infeasible on a 201-node chain.)
        method = "warm start (no time left for the MILP root)"
        note = f"{left:.1f} s left < 10 x LP time {lp.time_s:.1f} s"
        solve_s, build_s = clock.elapsed(), 0.0
    else:
        return None
    peak, _ = schedule_memory(problem, *warm)
    lb = min(max(lp.bound, float(problem.costs.sum())), wobj)
    gap = rel_gap(wobj, lb)
    if status is None:
        status = "optimal" if gap <= mip_gap else "time_limit"
    return CheckmateSolution(
        warm[0], warm[1], status, wobj, lb, gap, peak, solve_s, build_s, 0,
        {"method": method, **meta, "warm_start_objective": wobj, "lp_bound": lp.bound,
         "note": note})


def _milp_answer(problem: CheckmateProblem, model: MilpModel, v: CheckmateVars, sol: MilpSolution,
                 warm: Schedule | None, lp: _LpBound, clock: SolveClock, mip_gap: float,
                 build: float, meta: dict) -> CheckmateSolution:
    """The :class:`CheckmateSolution` of a finished MILP solve (raises when it has none)."""
    budget = problem.budget
    if sol.status == "infeasible":
        _raise_infeasible(problem, clock)
    if not sol.has_solution:
        raise SolverError(f"MILP ended with status {sol.message!r} and no solution")
    R, S = decode_schedule(problem, v, sol.x)
    peak, _ = schedule_memory(problem, R, S)
    note = ""
    if peak > budget:  # an integrality/feasibility tolerance let a few bytes through
        if warm is None:
            raise SolverError(f"MILP solution has peak {peak} > budget {budget} (tolerance problem)")
        note = f"MILP solution exceeded the budget by {peak - budget} bytes; warm start returned"
        R, S = warm
        peak, _ = schedule_memory(problem, R, S)
        sol = dataclasses.replace(sol, status="feasible")
    obj = schedule_cost(problem, R)
    # every node runs at least once: sum(costs) is always a valid bound
    trivial = float(problem.costs.sum())
    lb = max(sol.bound * v.cost_unit, trivial) if math.isfinite(sol.bound) else trivial
    lb = max(lb, lp.bound)
    if sol.status == "optimal":
        lb = min(obj, lb) if math.isfinite(lb) else obj
    status = sol.status if sol.status in ("optimal", "feasible") else "time_limit"
    if status == "time_limit" and rel_gap(obj, lb) <= mip_gap:
        status = "optimal"  # the LP bound closed the gap the MILP left open
    meta = {
        "method": "milp",
        **meta,
        "warm_start_objective": None if warm is None else schedule_cost(problem, warm[0]),
        "num_vars": model.num_vars,
        "num_int_vars": int(model.integrality().sum()),
        "num_rows": model.num_rows,
        "solver_message": sol.message,
        "milp_objective": sol.objective * v.cost_unit,
        "lp_bound": lp.bound,
        "note": note,
    }
    return CheckmateSolution(R, S, status, obj, lb, rel_gap(obj, lb), peak,
                             sol.solve_time_s, build + sol.build_time_s, sol.node_count, meta)


def _raise_infeasible(problem: CheckmateProblem, clock: SolveClock) -> None:
    """After a MILP (or a relaxation of it) reported ``infeasible``: raise
    :class:`InfeasibleBudgetError` with :func:`min_feasible_budget`, or :class:`SolverError`
    when a schedule within the budget exists after all (numerical trouble)."""
    budget = problem.budget
    mf, exact = min_feasible_budget(problem, time_limit=clock.limit)
    if mf <= budget:
        raise SolverError(f"solver reported infeasible but a schedule with peak {mf} fits")
    raise InfeasibleBudgetError(budget, mf, "" if exact else "min_feasible_bytes is an upper estimate")


class LazyCancel:
    """Stops :func:`_solve_lazy` from another thread (a racing back end that proved first):
    :meth:`cancel` stops the HiGHS search under way and no further round starts."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._h = None

    def attach(self, h) -> None:
        """The HiGHS object of the round about to run (stopped at once if already cancelled)."""
        with self._lock:
            self._h = h
            if self.event.is_set():
                h.cancelSolve()

    def detach(self) -> None:
        with self._lock:
            self._h = None

    def cancel(self) -> None:
        with self._lock:
            self.event.set()
            if self._h is not None:
                self._h.cancelSolve()


class _OvershootWatch:
    """Stops a relaxation's search at ``deadline`` (``time.perf_counter()`` seconds) when its
    incumbent overshoots the budget on replay and is cheaper than ``best``: the time left is
    for :func:`~solvers.checkmate.repair.repair_schedule`.  An incumbent that fits, or none,
    lets the search run to the time limit."""

    def __init__(self, problem: CheckmateProblem, v: CheckmateVars, best: float,
                 deadline: float, cancel: LazyCancel | None = None) -> None:
        self.problem, self.v, self.best, self.deadline = problem, v, best, deadline
        self.cancel = cancel
        self.over = False
        self.stopped = False
        self._h = None

    def _stop_if_due(self) -> None:
        if self.over and not self.stopped and time.perf_counter() >= self.deadline:
            self.stopped = True
            self._h.cancelSolve()

    def _on_solution(self, event) -> None:
        x = np.asarray(event.data_out.mip_solution, dtype=np.float64)
        if x.size < self.v.R.max() + 1:
            return
        R, S = decode_schedule(self.problem, self.v, x)
        peak, _ = schedule_memory(self.problem, R, S)
        self.over = bool(peak > self.problem.budget and schedule_cost(self.problem, R) < self.best)
        self._stop_if_due()

    def attach(self, h):
        """``on_start`` hook of :meth:`MilpModel.solve`: subscribe, arm the deadline timer."""
        import threading

        self._h = h
        if self.cancel is not None:
            self.cancel.attach(h)
        h.cbMipImprovingSolution.subscribe(self._on_solution)
        timer = threading.Timer(max(0.0, self.deadline - time.perf_counter()), self._stop_if_due)
        timer.daemon = True
        timer.start()

        def detach() -> None:
            timer.cancel()
            h.cbMipImprovingSolution.unsubscribe(self._on_solution)
            if self.cancel is not None:
                self.cancel.detach()

        return detach


def _solve_lazy(problem: CheckmateProblem, warm: Schedule | None, formulation: Formulation,
                clock: SolveClock, mip_gap: float, threads: int | None, presolve: bool,
                options: dict | None, log: bool, lp: _LpBound, meta: dict,
                cancel: LazyCancel | None = None) -> CheckmateSolution:
    """The MILP with its memory chain added lazily, step by step (``lazy_memory``).

    Round ``r`` solves the model whose ``U``/``FREE`` chain covers the steps collected so far
    (none at first: start-of-step and frontier rows only).  Every such model is a relaxation of
    the full one, so its bound is valid; its schedule is replayed (:func:`schedule_memory`,
    bytes), kept as the incumbent when it fits and is cheaper, and otherwise every step whose
    replayed peak exceeds the budget gets its chain in the next round.  The loop ends when a
    relaxation is solved to ``mip_gap`` and its schedule fits (proven optimal), when the
    incumbent is within ``mip_gap`` of the bound, or when time runs out (the incumbent and the
    best bound, ``time_limit``).  With every step collected the model is the full one, so the
    loop ends.

    Each round may use all the time left, with one exception: a schedule of a relaxation that
    overshoots the budget and is cheaper than the incumbent is repaired
    (:func:`~solvers.checkmate.repair.repair_schedule`: the exact MILP on windows of steps
    around the overshoots, the other steps fixed), and a relaxation whose incumbent overshoots
    is stopped at 90 % of the limit (:class:`_OvershootWatch`) to leave the repair its time.
    Before the repair, zoo ResNet-18 at 30 % (20 s) returned the greedy start, 1.069-1.075x:
    the relaxation's best, 1.040x, overshot on two steps, and the whole chain found 1.056x.
    With it, the repaired relaxation schedule is returned (6 free steps, 1.5-2 s).  Giving a
    relaxation 70 % of the time and the rest to rounds with the chain extended did not find a
    fitting schedule there, and cost the zoo MLP at 50 % a weaker bound (gap 6.3 % against
    5.1-5.4 %); so the watch keeps the whole limit for relaxations whose incumbent fits.

    Why: on the 100-layer random-width MLPs the full model's root LP and cuts take the whole
    minute; without the chain HiGHS proves seed 2 at 50 % in 10.5 s with a schedule that fits,
    where the full model stops at a 0.042 % gap (``experiments/results/milp_variants.csv``).
    """
    budget = problem.budget
    trivial = float(problem.costs.sum())
    best = None if warm is None else (schedule_cost(problem, warm[0]), warm[0], warm[1])
    bound = max(trivial, lp.bound)
    steps: set[int] = set()
    rounds: list[dict] = []
    build_s = solve_s = 0.0
    nodes = 0
    status = "time_limit"
    while cancel is None or not cancel.event.is_set():
        t_b = time.perf_counter()
        form = dataclasses.replace(formulation, memory_chain=bool(steps),
                                   chain_steps=tuple(sorted(steps)) if steps else None)
        model = MilpModel("checkmate_lazy")
        v = add_checkmate_core(model, problem, budget=budget, formulation=form)
        lp.add_cuts(model, v)
        x0 = None if best is None else checkmate_vector(model, v, problem, best[1], best[2])
        build_s += time.perf_counter() - t_b
        watch = _OvershootWatch(problem, v, math.inf if best is None else best[0],
                                clock.start + (1.0 - REPAIR_SHARE) * clock.limit, cancel)
        try:
            sol = model.solve("highs", time_limit=clock.left(floor=0.05 * clock.limit),
                              mip_gap=mip_gap, threads=threads, warm_start=x0, log=log,
                              presolve=presolve, options=options, on_start=watch.attach)
        except SolverTimeoutError as e:  # no incumbent of this relaxation in time
            if e.bound is not None and math.isfinite(e.bound):
                bound = max(bound, e.bound * v.cost_unit)
            if best is None:
                raise SolverTimeoutError(str(e), bound=bound) from None
            rounds.append({"chain_steps": len(steps), "status": "timeout_no_incumbent"})
            break
        solve_s += sol.solve_time_s
        build_s += sol.build_time_s
        nodes += max(0, sol.node_count)
        if sol.status == "infeasible":  # a relaxation is infeasible: so is the problem
            _raise_infeasible(problem, clock)
        if not sol.has_solution:
            raise SolverError(f"MILP ended with status {sol.message!r} and no solution")
        if math.isfinite(sol.bound):
            bound = max(bound, sol.bound * v.cost_unit)
        R, S = decode_schedule(problem, v, sol.x)
        peak, step_peak = schedule_memory(problem, R, S)
        cost = schedule_cost(problem, R)
        over = np.flatnonzero(step_peak > budget)
        rounds.append({"chain_steps": len(steps), "status": sol.status, "objective": cost,
                       "bound": bound, "fits": bool(peak <= budget),
                       "steps_over": int(len(over)), "time_s": sol.solve_time_s})
        if peak <= budget and (best is None or cost < best[0]):
            best = (cost, R, S)
        elif (peak > budget and (best is None or cost < best[0]) and clock.left() > 0.5
              and (cancel is None or not cancel.event.is_set())):
            fix = repair_schedule(problem, R, S, time_limit=min(
                clock.left(), max(1.0, REPAIR_SHARE * clock.limit)), mip_gap=mip_gap,
                threads=threads, formulation=formulation)
            fixed_cost = None if fix.R is None else schedule_cost(problem, fix.R)
            rounds[-1]["repair"] = {"status": fix.status, "objective": fixed_cost,
                                    "free_steps": fix.free_steps, "time_s": fix.time_s}
            if fixed_cost is not None and (best is None or fixed_cost < best[0]):
                best = (fixed_cost, fix.R, fix.S)
        if best is not None and rel_gap(best[0], bound) <= mip_gap:
            status = "optimal"
            break
        if (sol.status != "optimal" and peak <= budget) or clock.left() <= 0.05 * clock.limit:
            break  # out of time, or no better schedule to expect: the incumbent and the bound
        new = set(over.tolist()) - steps
        if not new:  # fits: the relaxation's optimum is feasible, so optimal; else over by a
            # tolerance on a step that has its chain already: keep the incumbent
            status = "optimal" if peak <= budget else "time_limit"
            break
        steps |= new
    if best is None:
        raise SolverTimeoutError("no schedule within the budget found in time", bound=bound)
    cost, R, S = best
    if status == "optimal":
        bound = min(bound, cost)
    peak, _ = schedule_memory(problem, R, S)
    out_meta = {
        "method": "milp",
        **meta,
        "memory_chain": "lazy",
        "warm_start_objective": None if warm is None else schedule_cost(problem, warm[0]),
        "lazy_rounds": rounds,
        "chain_steps": sorted(steps),
        "lp_bound": lp.bound,
        "note": "",
    }
    return CheckmateSolution(R, S, status, cost, bound, rel_gap(cost, bound), peak,
                             solve_s, build_s, nodes, out_meta)


# ----------------------------------------------------------------- smallest feasible budget
def min_feasible_budget(problem: CheckmateProblem, *, time_limit: float = 60.0,
                        formulation: Formulation = Formulation()  # noqa: B008 (frozen)
                        ) -> tuple[int, bool]:
    """The smallest budget (bytes) for which a frontier-form schedule exists.

    Returns ``(bytes, exact)``.  ``exact`` is True when a schedule meeting
    :meth:`CheckmateProblem.frontier_lower_bound` is found (the bound is then attained) or when
    the peak-minimising MILP proves optimality; otherwise ``bytes`` is the best schedule's peak
    found within ``time_limit`` seconds (an upper bound on the true minimum).
    """
    peak, exact, _, _ = _min_peak_schedule(problem, time_limit, formulation)
    return peak, exact


def _min_peak_schedule(problem: CheckmateProblem, time_limit: float,
                       formulation: Formulation = Formulation()  # noqa: B008 (frozen)
                       ) -> tuple[int, bool, np.ndarray, np.ndarray]:
    """``(peak_bytes, exact, R, S)`` of the lowest-peak schedule found (see
    :func:`min_feasible_budget`)."""
    lb = problem.frontier_lower_bound()
    h = best_heuristic(problem, None)
    best_peak, warm = h[3], (h[1], h[2])
    if best_peak <= lb:
        return int(best_peak), True, h[1], h[2]
    model = MilpModel("checkmate_min_peak")
    v = add_checkmate_core(model, problem, budget=best_peak, formulation=formulation,
                           minimize_peak=True)
    x0 = checkmate_vector(model, v, problem, *warm)
    try:
        sol = model.solve("highs", time_limit=time_limit, mip_gap=0.0, warm_start=x0)
    except SolverTimeoutError:
        return int(best_peak), False, warm[0], warm[1]
    if sol.has_solution:
        R, S = decode_schedule(problem, v, sol.x)
        peak, _ = schedule_memory(problem, R, S)
        if peak < best_peak:
            best_peak, warm = peak, (R, S)
    exact = sol.status == "optimal"
    return int(best_peak), bool(exact), warm[0], warm[1]
