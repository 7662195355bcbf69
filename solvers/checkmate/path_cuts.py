r"""Path cuts for the Checkmate MILP: valid inequalities that the LP relaxation violates.

Why.  Checkmate's rows ``R[t, j] <= R[t, i] + S[t, i]`` (1a) and ``S[t+1, i] <= S[t, i] + R[t, i]``
(1b) let one fractional unit of "value ``i`` is resident in step ``t``" support its user in the
same step *and* its copy into the next step in full.  The LP exploits that duplication: on the
100-layer random-width MLPs at 30 % its optimum recomputes a half of each value it needs, a
quarter of the one before, an eighth of the one before that (``R = 0.5, 0.25, 0.125, ...``),
and carries the other halves, so availability doubles along every path and little is ever
paid for.  No integer schedule does that.

The cut.  Take a value ``k`` that step ``tt`` needs resident (a user ``j`` of ``k`` runs in it,
``R[tt, j]``, or it is carried on, ``S[tt+1, k]``), a path ``k = p_0 <- p_1 <- ... <- p_m`` of
predecessors in the graph, and a step ``t0`` with ``k < t0 <= tt``.  Trace where ``k``'s copy in
step ``tt`` came from: a copy carried into step ``s`` (``S[s, p]``) existed in step ``s - 1``; a
copy computed in step ``s`` (``R[s, p]``) had every input resident in step ``s``, ``p``'s
predecessor on the path among them.  Walking back from ``(tt, k)`` the trace stays on the path
and in steps ``>= t0`` until it leaves through a copy carried into step ``t0`` or a computation
of ``p_m`` in steps ``t0 .. tt``, and it must leave (the first computation of ``p_i`` is in step
``p_i < t0``).  So, for every schedule satisfying (1a)-(1b)::

    X  <=  sum_{i=0..m} S[t0, p_i]  +  sum_{s=t0..tt} R[s, p_m],     X = R[tt, j] or S[tt+1, k]

(``X = 1`` when ``j`` is the frontier node ``tt``, whose ``R[tt, tt]`` is fixed to 1).  The LP
above violates such rows by up to 0.25 where the row is tight for integer schedules.  They are
valid for the full model and for every relaxation the lazy solve builds; they only cut off
fractional points.

Separation (:func:`separate`): for each step ``tt`` a dynamic programme over the nodes in
topological order gives, for every ``t0`` and node ``u``, the cheapest path from ``u``:
``best[t0, u] = S[t0, u] + min(sum_{s=t0..tt} R[s, u], min_{w in preds(u)} best[t0, w])``;
a row is violated where ``min_{k < t0 <= tt} best[t0, k] < X``.  ``O(n^2 |E|)`` work per
round, in a compiled (numba) kernel.

Loop (:func:`path_cut_loop`): the small LP (start-of-step and frontier rows, no ``U``/``FREE``
chain) is solved, violated rows are added, the LP is re-solved warm (cold after three rounds
without progress: the LP is degenerate and a warm re-solve stays at one vertex), until none is
violated, the bound stalls or the time share is spent.  Every LP of the loop is a relaxation
of the MILP, so its optimum is a valid lower bound.  Only the rows with a nonzero dual at the
last LP go to the MILP (they alone carry the bound; keeping every tight row made HiGHS's
search slower), usually 5-30 rows.

Measurements, and what was tried and dropped: ``docs/design/decisions/0003-path-cuts.md``.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from remat.core.errors import SolverError
from solvers.checkmate.formulation import CheckmateVars, Formulation, add_checkmate_core
from solvers.checkmate.problem import CheckmateProblem
from solvers.milp import INF, MilpModel, set_highs_threads

__all__ = ["PathCuts", "separate", "path_cut_loop", "CutLoopResult"]

_NO_CUTS = np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class PathCuts:
    """Path cuts in schedule coordinates (independent of any model's column numbering).

    Row ``r`` reads ``sum of its terms - X_r >= 0`` (``X_r`` a variable) or ``sum >= 1``.

    Attributes:
      lhs_kind: ``int8[r]``: 0 = the constant 1, 1 = ``R[lhs_t, lhs_i]``, 2 = ``S[lhs_t, lhs_i]``.
      lhs_t, lhs_i: ``int64[r]`` step and node of ``X_r``.
      term_row: ``int64[q]`` row of each term.
      term_kind: ``int8[q]``: 1 = ``R``, 2 = ``S``.
      term_t, term_i: ``int64[q]`` step and node of each term.
    """

    lhs_kind: np.ndarray
    lhs_t: np.ndarray
    lhs_i: np.ndarray
    term_row: np.ndarray
    term_kind: np.ndarray
    term_t: np.ndarray
    term_i: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.lhs_kind)

    @staticmethod
    def empty() -> PathCuts:
        z8 = np.zeros(0, np.int8)
        return PathCuts(z8, _NO_CUTS, _NO_CUTS, _NO_CUTS, z8, _NO_CUTS, _NO_CUTS)

    @staticmethod
    def concat(parts: list[PathCuts]) -> PathCuts:
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return PathCuts.empty()
        off = np.cumsum([0] + [p.num_rows for p in parts[:-1]])
        return PathCuts(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                          ("lhs_kind", "lhs_t", "lhs_i")),
                        np.concatenate([p.term_row + o for p, o in zip(parts, off)]),
                        *(np.concatenate([getattr(p, f) for p in parts]) for f in
                          ("term_kind", "term_t", "term_i")))

    def subset(self, rows: np.ndarray) -> PathCuts:
        """The rows ``rows`` (indices, in that order)."""
        rows = np.asarray(rows, np.int64)
        new = np.full(self.num_rows, -1, np.int64)
        new[rows] = np.arange(len(rows))
        keep = new[self.term_row] >= 0
        order = np.argsort(new[self.term_row[keep]], kind="stable")
        return PathCuts(self.lhs_kind[rows], self.lhs_t[rows], self.lhs_i[rows],
                        new[self.term_row[keep]][order], self.term_kind[keep][order],
                        self.term_t[keep][order], self.term_i[keep][order])

    def _cols(self, v: CheckmateVars, kind: np.ndarray, t: np.ndarray, i: np.ndarray
              ) -> np.ndarray:
        return np.where(kind == 1, v.R[t, i], v.S[t, i])

    def coo(self, v: CheckmateVars) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, cols, vals, lo)`` of the rows on the columns ``v`` (upper bounds are ``+inf``);
        terms on columns the model does not have are dropped (those variables are 0)."""
        tc = self._cols(v, self.term_kind, self.term_t, self.term_i)
        keep = tc >= 0
        rows, cols = [self.term_row[keep]], [tc[keep]]
        vals = [np.ones(int(keep.sum()))]
        var = self.lhs_kind > 0
        lc = self._cols(v, self.lhs_kind[var], self.lhs_t[var], self.lhs_i[var])
        if np.any(lc < 0):
            raise SolverError("a path cut's left-hand side is not a column of the model")
        rows.append(np.flatnonzero(var))
        cols.append(lc)
        vals.append(-np.ones(len(lc)))
        lo = np.where(var, 0.0, 1.0)
        return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), lo

    def add_to(self, model: MilpModel, v: CheckmateVars) -> np.ndarray:
        """Append the rows to ``model`` (columns ``v``); returns their row indices."""
        if not self.num_rows:
            return _NO_CUTS
        rows, cols, vals, lo = self.coo(v)
        return model.add_rows_coo(rows, cols, vals, self.num_rows, lo, INF, name="path_cut")

    def violation(self, R: np.ndarray, S: np.ndarray) -> np.ndarray:
        """``float[r]``: ``X_r - sum of terms`` at the point ``(R, S)`` (``> 0``: violated)."""
        val = np.where(self.term_kind == 1, R[self.term_t, self.term_i],
                       S[self.term_t, self.term_i])
        rhs = np.bincount(self.term_row, weights=val, minlength=self.num_rows)
        lhs = np.where(self.lhs_kind == 0, 1.0,
                       np.where(self.lhs_kind == 1, R[self.lhs_t, self.lhs_i],
                                S[self.lhs_t, self.lhs_i]))
        return lhs - rhs


# ------------------------------------------------------------------ compiled kernels
def _kernels():
    import numba as nb

    @nb.njit(cache=True)
    def table(tt, R, S, CR, pptr, pidx, best, arg):
        """``best[t0, u]`` (``u < t0 <= tt``) and the chosen predecessor ``arg`` (-1: stop)."""
        for t0 in range(1, tt + 1):
            for u in range(t0):
                m = CR[tt + 1, u] - CR[t0, u]  # sum_{s=t0..tt} R[s, u]
                a = -1
                for q in range(pptr[u], pptr[u + 1]):
                    w = pidx[q]
                    if best[t0, w] < m:
                        m = best[t0, w]
                        a = w
                best[t0, u] = S[t0, u] + m
                arg[t0, u] = a

    @nb.njit(cache=True)
    def minima(n, R, S, CR, pptr, pidx, MV, AT):
        """``MV[tt, k, :]``: the ``K`` smallest ``best_tt[t0, k]`` over ``k < t0 <= tt``
        (ascending), ``AT`` their ``t0`` (-1: none)."""
        K = MV.shape[2]
        best = np.empty((n + 1, n))
        arg = np.empty((n + 1, n), np.int64)
        for tt in range(1, n):
            table(tt, R, S, CR, pptr, pidx, best, arg)
            for k in range(tt):
                for t0 in range(k + 1, tt + 1):
                    val = best[t0, k]
                    if val < MV[tt, k, K - 1]:
                        p = K - 1
                        while p > 0 and MV[tt, k, p - 1] > val:
                            MV[tt, k, p] = MV[tt, k, p - 1]
                            AT[tt, k, p] = AT[tt, k, p - 1]
                            p -= 1
                        MV[tt, k, p] = val
                        AT[tt, k, p] = t0

    return table, minima


_KERNELS = None


def _get_kernels():
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _kernels()
    return _KERNELS


def _csr_preds(problem: CheckmateProblem) -> tuple[np.ndarray, np.ndarray]:
    e = problem.edges
    order = np.lexsort((e[:, 0], e[:, 1])) if len(e) else np.zeros(0, np.int64)
    pidx = e[order, 0].astype(np.int64) if len(e) else _NO_CUTS
    pptr = np.zeros(problem.n + 1, np.int64)
    if len(e):
        np.add.at(pptr, e[:, 1] + 1, 1)
    return np.cumsum(pptr), pidx


def _demands(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(LR, JR, LS)``: ``LR[tt, k]`` the largest ``R[tt, j]`` over users ``j <= tt`` of ``k``
    (1 for the frontier's inputs), ``JR`` that user, ``LS[tt, k] = S[tt+1, k]``."""
    n = problem.n
    LR = np.zeros((n, n))
    JR = np.full((n, n), -1, np.int64)
    for k, j in problem.edges.tolist():  # rows tt >= j: user j may run in step tt
        col = R[j:, j]
        better = col > LR[j:, k]
        LR[j:, k] = np.where(better, col, LR[j:, k])
        JR[j:, k] = np.where(better, j, JR[j:, k])
    if len(problem.edges):  # the frontier's inputs: X = R[tt, tt] = 1, the strongest row
        src, dst = problem.edges[:, 0], problem.edges[:, 1]
        LR[dst, src] = 1.0
        JR[dst, src] = dst
    LS = np.zeros((n, n))
    LS[:-1] = S[1:]
    return LR, JR, LS


def separate(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray, *, eps: float = 1e-3,
             max_rows: int | None = None, per_demand: int = 4,
             frontier_only: bool = False) -> PathCuts:
    """The ``per_demand`` most violated path cuts (one per ``t0``) of every demand at the point
    ``(R, S)`` (``float[n, n]``, the LP values in schedule coordinates), at most ``max_rows`` of
    them (most violated first).

    Returns the rows violated by more than ``eps``."""
    n = problem.n
    R = np.ascontiguousarray(R, np.float64)
    S = np.ascontiguousarray(S, np.float64)
    if R.shape != (n, n) or S.shape != (n, n):
        raise SolverError(f"R {R.shape} and S {S.shape} must have shape ({n}, {n})")
    if not (isinstance(per_demand, int | np.integer) and per_demand >= 1):
        raise SolverError(f"per_demand must be a positive integer, got {per_demand!r}")
    if n < 2:
        return PathCuts.empty()
    table, minima = _get_kernels()
    CR = np.zeros((n + 1, n))
    CR[1:] = np.cumsum(R, axis=0)  # CR[s + 1] = sum_{s' <= s} R[s']
    Sx = np.zeros((n + 1, n))
    Sx[:n] = S
    pptr, pidx = _csr_preds(problem)
    MV = np.full((n, n, per_demand), np.inf)
    AT = np.full((n, n, per_demand), -1, np.int64)
    minima(n, R, Sx, CR, pptr, pidx, MV, AT)
    LR, JR, LS = _demands(problem, R, S)
    if frontier_only:
        LR = np.where(JR == np.arange(n)[:, None], LR, 0.0)
        LS = np.zeros_like(LS)
    # candidate rows: one per (demand, t0) violated by more than eps
    vr = LR[:, :, None] - MV
    vs = LS[:, :, None] - MV
    tr, kr, cr = np.nonzero((vr > eps) & (AT >= 0))
    ts, ks, cs = np.nonzero((vs > eps) & (AT >= 0))
    viol = np.r_[vr[tr, kr, cr], vs[ts, ks, cs]]
    tt = np.r_[tr, ts]
    kk = np.r_[kr, ks]
    t0s = np.r_[AT[tr, kr, cr], AT[ts, ks, cs]]
    j = JR[tr, kr]
    lhs_kind = np.r_[np.where(j == tr, 0, 1), np.full(len(ts), 2)].astype(np.int8)
    lhs_t = np.r_[tr, ts + 1]
    lhs_i = np.r_[np.where(j == tr, 0, j), ks]
    order = np.argsort(-viol, kind="stable")
    if max_rows is not None:
        order = order[:max_rows]
    if not len(order):
        return PathCuts.empty()
    best = np.empty((n + 1, n))
    arg = np.empty((n + 1, n), np.int64)
    rows_r, kind_r, t_r, i_r = [], [], [], []
    by_tt: dict[int, list[int]] = {}
    for r in order:
        by_tt.setdefault(int(tt[r]), []).append(int(r))
    out_rows = []
    for step, rs in by_tt.items():
        table(step, R, Sx, CR, pptr, pidx, best, arg)
        for r in rs:
            t0 = int(t0s[r])
            path = [int(kk[r])]
            while arg[t0, path[-1]] >= 0:
                path.append(int(arg[t0, path[-1]]))
            row = len(out_rows)
            out_rows.append(r)
            pm = path[-1]
            steps = np.arange(t0, step + 1)
            rows_r.append(np.full(len(path) + len(steps), row))
            kind_r.append(np.r_[np.full(len(path), 2), np.full(len(steps), 1)])
            t_r.append(np.r_[np.full(len(path), t0), steps])
            i_r.append(np.r_[path, np.full(len(steps), pm)])
    sel = np.asarray(out_rows, np.int64)
    return PathCuts(lhs_kind[sel], lhs_t[sel].astype(np.int64), lhs_i[sel].astype(np.int64),
                    np.concatenate(rows_r).astype(np.int64),
                    np.concatenate(kind_r).astype(np.int8),
                    np.concatenate(t_r).astype(np.int64), np.concatenate(i_r).astype(np.int64))


@dataclasses.dataclass(frozen=True, eq=False)
class CutLoopResult:
    """What :func:`path_cut_loop` found.

    Attributes:
      cuts: every row added (violated when added).
      bound: the last LP's optimum in cost units (a lower bound of the MILP; ``-inf``: none).
      time_s: seconds spent.
      rounds: ``[{"bound": ..., "rows": ..., "lp_s": ...}, ...]`` per LP solved.
      first_lp_s: seconds of the first (cold) LP, the small LP alone.
      stop: why the loop ended: ``"no_violated_row"``, ``"stalled"``, ``"max_rounds"``,
        ``"time_limit"`` (no time for another round) or ``"lp_<HiGHS status>"`` (an LP that
        did not end optimal, e.g. at the time limit).
    """

    cuts: PathCuts
    bound: float
    time_s: float
    rounds: list
    first_lp_s: float = 0.0
    stop: str = ""


def path_cut_loop(problem: CheckmateProblem, formulation: Formulation, time_limit: float, *,
                  threads: int | None = None, max_rounds: int = 60, stall_rounds: int = 16,
                  stall_tol: float = 1e-6, cold: bool = False, per_demand: int = 4,
                  rows_per_node: int = 4, keep: str = "dual",
                  frontier_only: bool = True, cold_after: int = 3) -> CutLoopResult:
    """Solve the small LP relaxation (no ``U``/``FREE`` chain) with path cuts added round by
    round (see the module docstring) within ``time_limit`` seconds.

    Stops when no row is violated, after ``stall_rounds`` rounds that raised the bound by less
    than ``stall_tol`` (relative) in all, after ``max_rounds``, or when the next round would
    not fit in the time left (estimated from the last one).

    Args:
      stall_rounds: rounds with too little progress before the loop stops; the LP is
        degenerate and its bound can sit on a plateau for several rounds before it rises (why
        16: ``docs/design/decisions/0003-path-cuts.md``).
      cold: re-solve every round from scratch; ``cold_after``: from scratch after that many
        rounds without progress (0: never).
      per_demand: rows per demand (one per ``t0``, the most violated first);
        ``rows_per_node``: at most that many times ``n`` rows a round.
      keep: which rows go into :attr:`CutLoopResult.cuts`: ``"dual"`` (nonzero dual at the
        last LP), ``"tight"`` (zero slack there) or ``"all"``.
      frontier_only: demands of the frontier's inputs only (``X = 1``); otherwise also those
        of recomputed users and carries.
    """
    import highspy

    if keep not in ("dual", "tight", "all"):
        raise SolverError(f"keep must be 'dual', 'tight' or 'all', got {keep!r}")
    if not (isinstance(time_limit, int | float) and time_limit > 0):
        raise SolverError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    t_start = time.perf_counter()
    model = MilpModel("checkmate_path_cuts")
    v = add_checkmate_core(model, problem, budget=problem.budget, formulation=dataclasses.replace(
        formulation, memory_chain=False, useful=False, chain_steps=None))
    h, _ = model.to_highs(relax=True)
    set_highs_threads(h, threads)
    n = problem.n
    mR, mS = v.R >= 0, v.S >= 0
    parts: list[PathCuts] = []
    rounds: list[dict] = []
    bound = -math.inf
    history: list[float] = []
    last_round = 0.0
    # (cut rows in the LP, their row activities, their duals) at the last LP solved to
    # optimality: a round cut short by the time limit leaves no usable duals
    solved: tuple[int, np.ndarray, np.ndarray] | None = None
    stop = ""
    while True:
        t_round = time.perf_counter()
        left = time_limit - (t_round - t_start)
        if left <= 0 or (rounds and left < 1.5 * last_round):
            stop = "time_limit"
            break
        # HiGHS's time limit is on its run clock, which adds up every run() of this object:
        # the limit is the time run so far plus what is left (a bare ``left`` stopped a
        # 100-layer MLP's loop after 13 of 19 rounds, at 8 s of its 15)
        h.setOptionValue("time_limit", float(h.getRunTime() + left))
        stuck = (cold_after > 0 and len(history) >= cold_after
                 and history[-1] - history[-cold_after]
                 <= stall_tol * abs(history[-1]))
        if cold or (stuck and cold_after > 0):
            h.clearSolver()  # a degenerate LP stays at one vertex when warm: start afresh
        h.run()
        lp_s = time.perf_counter() - t_round
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            stop = "lp_" + h.modelStatusToString(h.getModelStatus()).lower().replace(" ", "_")
            break
        obj = float(h.getInfo().objective_function_value) * v.cost_unit
        bound = max(bound, obj)
        history.append(obj)
        sol = h.getSolution()
        in_lp = sum(c.num_rows for c in parts)
        solved = (in_lp, np.asarray(sol.row_value, np.float64)[model.num_rows:],
                  np.asarray(sol.row_dual, np.float64)[model.num_rows:])
        x = np.asarray(sol.col_value, np.float64)
        R = np.zeros((n, n))
        S = np.zeros((n, n))
        R[mR] = x[v.R[mR]]
        S[mS] = x[v.S[mS]]
        cuts = separate(problem, R, S, max_rows=rows_per_node * n, per_demand=per_demand,
                        frontier_only=frontier_only)
        rounds.append({"bound": obj, "rows": cuts.num_rows, "lp_s": lp_s})
        stalled = (len(history) > stall_rounds and history[-1] - history[-1 - stall_rounds]
                   <= stall_tol * abs(history[-1]))
        if not cuts.num_rows or stalled or len(rounds) >= max_rounds:
            stop = ("no_violated_row" if not cuts.num_rows else "stalled" if stalled
                    else "max_rounds")
            break
        rows, cols, vals, lo = cuts.coo(v)
        A = _csr(rows, cols, vals, cuts.num_rows, model.num_vars)
        h.addRows(cuts.num_rows, lo, np.full(cuts.num_rows, highspy.kHighsInf),
                  A.nnz, A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data)
        parts.append(cuts)
        last_round = time.perf_counter() - t_round
    cuts = PathCuts.concat(parts)
    if keep != "all" and cuts.num_rows:
        # keep the rows with a nonzero dual (or zero slack) at the last LP solved to
        # optimality; the others, and rows added after it, only make the MILP's LPs larger.
        # Its nonzero-dual rows alone give the LP its bound (LP duality).
        if solved is None or len(solved[1]) != solved[0]:
            cuts = cuts.subset(np.zeros(0, np.int64))
        else:
            in_lp, act, dual = solved
            lo = np.where(cuts.lhs_kind[:in_lp] > 0, 0.0, 1.0)
            sel = (np.abs(dual) > 1e-9) if keep == "dual" else (act - lo <= 1e-6)
            cuts = cuts.subset(np.flatnonzero(sel))
    return CutLoopResult(cuts, bound, time.perf_counter() - t_start, rounds,
                         rounds[0]["lp_s"] if rounds else 0.0, stop)


def _csr(rows, cols, vals, nr, nc):
    import scipy.sparse as sp

    return sp.csr_matrix((vals, (rows, cols)), shape=(nr, nc))
