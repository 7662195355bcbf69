"""Frontier-form schedules without a solver: conversion, the cheapest ``R`` for a given ``S``,
and heuristic schedules used as warm starts and fallbacks.

Schedules are ``bool[n, n]`` ``R``/``S`` pairs as described in :mod:`solvers.checkmate.problem`;
memory in bytes, costs in the problem's cost units.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from solvers.checkmate.problem import (
    CheckmateProblem,
    checkpoint_all_schedule,
    normalize,
    schedule_cost,
    schedule_memory,
)

__all__ = [
    "min_r_given_s",
    "to_frontier_form",
    "heuristic_schedules",
    "best_heuristic",
    "check_frontier_schedule",
]


def min_r_given_s(problem: CheckmateProblem, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest ``R`` for a given checkpoint matrix ``S`` (Checkmate's ``solve_r_opt``), then
    :func:`normalize`.  ``S`` is first cut to its strict lower triangle."""
    n = problem.n
    S = np.tril(np.asarray(S, bool), -1)
    R = np.zeros((n, n), bool)
    tt = np.arange(n)
    s_next = np.vstack([S[1:], np.zeros((1, n), bool)])
    for i in range(n - 1, -1, -1):
        u = problem.users[i]
        used = R[:, u].any(axis=1) if len(u) else np.zeros(n, bool)
        R[:, i] = (tt == i) | ((tt > i) & ~S[:, i] & (used | s_next[:, i]))
    return normalize(problem, R, S)


def to_frontier_form(problem: CheckmateProblem, R: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Re-cut any schedule's compute sequence into ``n`` frontier steps.

    The events of ``R`` (steps in order, nodes in index order within a step) are split after the
    first computation of each node; step ``s`` of the result holds the events after node
    ``s - 1``'s first computation up to node ``s``'s.  ``S`` is then the minimal (liveness)
    retention.  Returns ``None`` when first computations are not in index order or a new step
    would run a node twice or out of index order.  Memory is not checked here.
    """
    R = np.asarray(R, bool)
    n = problem.n
    ev_t, ev_i = np.nonzero(R)  # row-major: steps in order, index order inside a step
    seen = np.zeros(n, bool)
    Rf = np.zeros((n, n), bool)
    s = 0
    last = -1
    for i in ev_i.tolist():
        if s >= n:
            return None  # events after the last first computation
        if Rf[s, i] or i <= last:
            return None
        Rf[s, i] = True
        last = i
        if not seen[i]:
            if i != s:
                return None
            seen[i] = True
            s += 1
            last = -1
    if s != n:
        return None
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    reads = np.zeros((n, n), bool)
    if len(src):
        np.logical_or.at(reads.T, src, Rf[:, dst].T)  # reads[t, i]: a node run in t reads i
    need = reads & ~Rf
    Sf = np.zeros((n, n), bool)
    carry = np.zeros(n, bool)
    for t in range(n - 1, -1, -1):
        carry = need[t] | (carry & ~Rf[t]) if t + 1 < n else need[t]
        Sf[t] = carry
    if np.triu(Sf).any():
        return None
    return Rf, Sf


def check_frontier_schedule(problem: CheckmateProblem, schedule: tuple[np.ndarray, np.ndarray],
                            budget: int | None
                            ) -> tuple[np.ndarray, np.ndarray] | None:
    """``schedule = (R, S)`` normalised if it is a legal frontier-form schedule within ``budget``
    bytes (``None``: any peak), else ``None``."""
    R, S = (np.asarray(a, bool) for a in schedule)
    n = problem.n
    if R.shape != (n, n) or S.shape != (n, n):
        return None
    if np.triu(R, 1).any() or np.triu(S).any() or not np.diag(R).all():
        return None
    R, S = normalize(problem, R, S)
    peak, _ = schedule_memory(problem, R, S)
    if budget is not None and peak > budget:
        return None
    return R, S


# ------------------------------------------------------------------------- heuristics
Rule = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


def _frontier_steps(problem: CheckmateProblem, rule: Rule) -> tuple[np.ndarray, np.ndarray]:
    """Build a schedule step by step: R[t] = the least recomputation that makes the frontier t
    runnable from S[t]; S[t+1] = ``rule(t, resident_end, R[t])``."""
    n = problem.n
    preds = problem.preds
    R = np.zeros((n, n), bool)
    S = np.zeros((n, n), bool)
    for t in range(n):
        st = S[t]
        need = [t]
        R[t, t] = True
        while need:
            k = need.pop()
            for p in preds[k]:
                if not st[p] and not R[t, p]:
                    R[t, p] = True
                    need.append(int(p))
        if t + 1 < n:
            S[t + 1] = rule(t, st | R[t], R[t])
    return R, S


def heuristic_schedules(problem: CheckmateProblem, max_candidates: int = 24
                        ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Yield ``(name, R, S)`` frontier schedules: checkpoint-all and "keep every c-th node" rules
    (outputs of kept nodes carried until their last reader, the rest recomputed from the nearest
    kept ancestors; recomputed values optionally kept until their last reader), so that one of
    them fits most budgets.  A cheap warm start, not an optimiser."""
    n = problem.n
    lr = problem.last_reader
    idx = np.arange(n)
    pred_next = [np.zeros(n, bool) for _ in range(n)]
    for t in range(n - 1):
        pred_next[t][problem.preds[t + 1]] = True
    R, S = checkpoint_all_schedule(problem)
    yield "checkpoint_all", R, S
    cs = sorted({max(1, int(round(x))) for x in np.geomspace(1, max(n, 2), max_candidates)})
    for carry_recomputed in (True, False):
        for c in cs:
            keep = (idx % c) == 0

            def rule(t, resident, Rt, keep=keep, cr=carry_recomputed):
                alive = resident & (lr > t) & (idx <= t)
                want = keep | pred_next[t]
                if cr:
                    want = want | (Rt & (idx < t))
                return alive & want

            R, S = _frontier_steps(problem, rule)
            R, S = normalize(problem, R, S)
            yield f"keep_every_{c}{'_carry' if carry_recomputed else ''}", R, S


def best_heuristic(problem: CheckmateProblem, budget: int | None
                   ) -> tuple[str, np.ndarray, np.ndarray, int, float] | None:
    """The cheapest heuristic schedule that fits ``budget`` bytes (or the lowest-memory one when
    none fits, or ``budget`` is None): ``(name, R, S, peak_bytes, cost)``."""
    best = None
    lowest = None
    for name, R, S in heuristic_schedules(problem):
        peak, _ = schedule_memory(problem, R, S)
        cost = schedule_cost(problem, R)
        cand = (name, R, S, peak, cost)
        if lowest is None or (peak, cost) < (lowest[3], lowest[4]):
            lowest = cand
        if budget is not None and peak <= budget and (best is None or cost < best[4]):
            best = cand
    return best if best is not None else lowest
