"""The Checkmate MILP (Jain et al., "Checkmate", MLSys 2020): variables, core rows, extensions.

Length: the variables and the eight core row blocks of one formulation, with the extension
hook POET uses, are kept together so that the rows' numbering conventions live in one file.

The schedule is the frontier-form ``R``/``S`` pair of :mod:`solvers.checkmate.problem`.  The
replay's memory model is encoded with Checkmate's eqs. (2)-(3)::

    U[t, 0]   = M_0 R[t, 0] + sum_i M_i S[t, i]
    U[t, k+1] = U[t, k] + M_{k+1} R[t, k+1] - sum_{(i, k) in E} M_i FREE[t, i, k]
    U[t, k] <= budget
    FREE[t, i, k] <= R[t, k],  <= 1 - S[t+1, i],  <= 1 - R[t, j]  for every user j > k of i

(``FREE`` is continuous: with integer ``R``/``S`` its best value is the 0/1 product of the paper's
hazard linearisation, so relaxing its integrality is exact and removes ``T |E|`` binaries.)
Dependencies ``R[t, j] <= R[t, i] + S[t, i]`` for ``(i, j) in E`` (eq. 1a), carries
``S[t+1, i] <= S[t, i] + R[t, i]`` (eq. 1b), objective ``sum_t sum_i C_i R[t, i]`` (eq. 1).

Formulation work on top of the paper (each optional, see :class:`Formulation`):

* ``FREE`` continuous and only for ``k < t`` (frees after the frontier, the last node of the step,
  never matter) and no self-free term (a computed output nobody reads or carries is wasted work,
  removed by :func:`~solvers.checkmate.problem.normalize`; the frontier is the last node of its
  step).
* ``prune``: ``R[t, i] = S[t, i] = 0`` once no descendant of ``i`` has index ``>= t``.
* ``useful`` (off by default: it slowed HiGHS down): dominance
  rows ``R[t,i] <= S[t+1,i] + sum_{users j<=t} R[t,j]`` and the same for ``S[t,i]``: only
  *normalised* schedules (no wasted recomputation, no dead checkpoint) are kept; one of them is
  always optimal because normalising never raises cost or memory.
* ``frontier_rows``: the memory while the frontier ``t`` runs,
  ``M_t + sum_{p in preds(t)} M_p + sum_{i<t, i not in preds(t)} M_i S[t+1, i] <= budget``,
  written directly on ``S`` (a knapsack row the LP relaxation otherwise only sees through ``U``).
  This is the row that makes chains solvable.
* ``memory_chain=False``: drop ``U``/``FREE`` and keep start-of-step rows
  ``sum_i M_i S[t, i] <= budget`` (with the frontier rows); a relaxation, much smaller.
  ``chain_steps``: the chain for those steps only, start rows for the others (a relaxation
  until every step whose replayed peak exceeds the budget has its chain; see
  :func:`solvers.checkmate.solve.solve_checkmate`'s ``lazy_memory``).
* a complete warm start computed from a heuristic schedule (:func:`checkmate_vector`: ``R``,
  ``S`` fixed, ``FREE`` and ``U`` computed directly), handed to HiGHS with ``setSolution``.

Exactness: the MILP's ``U`` equals the replay's live bytes on normalised schedules and
over-estimates them otherwise, so its optimum equals the replay optimum over frontier schedules;
``tests/test_checkmate.py`` checks this against exhaustive enumeration at every budget of several
7-node graphs.  Memory is counted in units of the gcd of the sizes (or ``total/1e6`` bytes when
that would exceed 1e7 units; every returned schedule is then re-checked in bytes).

Extensions (e.g. POET's paging, :mod:`solvers.poet`) subclass :class:`CoreExtension` and are
passed to :func:`add_checkmate_core`; they see the core's columns and rows through a
:class:`CoreContext`, whose :class:`CoreRows` maps name core rows by step and node.

What each option bought, measured: ``docs/design/decisions/0001-checkmate-milp-formulation.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from remat.core.errors import SolverError
from solvers.checkmate.problem import CheckmateProblem, normalize
from solvers.milp import INF, MilpModel

__all__ = [
    "Formulation",
    "CheckmateVars",
    "CoreRows",
    "CoreContext",
    "CoreExtension",
    "add_checkmate_core",
    "checkmate_vector",
    "decode_schedule",
]


@dataclasses.dataclass(frozen=True)
class Formulation:
    """Switches for the formulation work (see the module docstring)."""

    prune: bool = True
    useful: bool = False
    frontier_rows: bool = True
    memory_chain: bool = True
    integer_memory: bool = False  # memory in units of the sizes' gcd, uncapped (CP-SAT)
    # steps whose U/FREE chain is built (``None``: every step); the other steps keep only the
    # start-of-step and frontier rows (the lazy solve of :mod:`solvers.checkmate.lazy`)
    chain_steps: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class CoreRows:
    """Global row indices of the core's row blocks, keyed by step and node (``-1``: no row,
    e.g. a block switched off by the :class:`Formulation`).

    Attributes:
      carry: ``int64[n, n]``: row ``(t, i)`` of ``S[t+1, i] - S[t, i] - R[t, i] <= 0``, ``i <= t < n-1``.
      mem: ``int64[n, n]``: row ``(t, k)`` defining ``U[t, k]``, ``k <= t`` (memory chain only).
      start: ``int64[n]``: start-of-step row ``sum_i M_i S[t, i] <= B`` (no memory chain only).
      useful_r, useful_s: ``int64[n, n]``: dominance rows ``(t, i)``, ``i < t`` (``useful`` only).
      frontier: ``int64[n]``: memory while node ``t < n-1`` runs (``frontier_rows`` only).
    """

    carry: np.ndarray
    mem: np.ndarray
    start: np.ndarray
    useful_r: np.ndarray
    useful_s: np.ndarray
    frontier: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateVars:
    """Column indices of the Checkmate blocks in a :class:`MilpModel` (``-1`` where absent).

    Attributes:
      R, S, U: ``int64[T, n]``.
      F: ``int64[T, m]`` FREE variable of edge ``e`` in step ``t``.
      mem_unit: bytes per memory unit used in the rows.
      cost_unit: cost per objective unit.
      peak: column of the peak-memory variable when the model minimises peak memory, else -1.
      rows: the core's row indices (``None`` until the rows are built).
    """

    R: np.ndarray
    S: np.ndarray
    U: np.ndarray
    F: np.ndarray
    mem_unit: float
    cost_unit: float
    peak: int = -1
    rows: CoreRows | None = None


@dataclasses.dataclass(eq=False)
class CoreContext:
    """What :func:`add_checkmate_core` shows a :class:`CoreExtension` while it builds.

    Attributes:
      model: the model being built.
      problem: the graph on arrays.
      formulation: the core's switches.
      mem: ``float64[n]`` output sizes in memory units (``sizes / vars.mem_unit``).
      budget_units: the budget row bound in memory units (``INF`` when unlimited).
      minimize_peak: the model minimises peak memory instead of cost.
      vars: the core's columns (set before the first hook runs).
      rows: the core's rows (``None`` in :meth:`CoreExtension.add_vars`).
    """

    model: MilpModel
    problem: CheckmateProblem
    formulation: Formulation
    mem: np.ndarray
    budget_units: float
    minimize_peak: bool
    vars: CheckmateVars | None = None
    rows: CoreRows | None = None

    @property
    def chain(self) -> bool:
        """The ``U``/``FREE`` memory chain is built (for some steps at least)."""
        return self.formulation.memory_chain or self.minimize_peak

    @property
    def chain_mask(self) -> np.ndarray:
        """``bool[n]``: the steps whose memory chain is built."""
        n = self.problem.n
        steps = self.formulation.chain_steps
        if not self.chain:
            return np.zeros(n, bool)
        if steps is None or self.minimize_peak:
            return np.ones(n, bool)
        idx = np.asarray(steps).reshape(-1)
        if idx.size and (idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= n):
            raise SolverError(f"chain_steps must be step indices in [0, {n}), got {steps!r}")
        mask = np.zeros(n, bool)
        mask[idx.astype(np.int64)] = True
        return mask

    def add_terms(self, rows: np.ndarray, cols: np.ndarray, vals: float | np.ndarray) -> None:
        """Add ``vals * x[cols]`` to core rows ``rows`` (entries of a :class:`CoreRows` map).

        Terms on rows the formulation did not build (``-1``) are dropped: they extend a block
        that is switched off.
        """
        rows = np.asarray(rows, np.int64).ravel()
        cols = np.asarray(cols, np.int64).ravel()
        vals = np.broadcast_to(np.asarray(vals, np.float64), rows.shape).ravel()
        ok = rows >= 0
        if ok.any():
            self.model.add_coefficients(rows[ok], cols[ok], vals[ok])


class CoreExtension:
    """Variables and rows built on the Checkmate core (e.g. POET's paging, :mod:`solvers.poet`).

    :func:`add_checkmate_core` calls, for each extension in order, :meth:`add_vars` once the
    core's columns exist (``R``, ``S``, ``U``, ``FREE``, ``PEAK``) and before any row, then
    :meth:`add_rows` after every core row block and before the core's objective.  An extension
    adds its own columns and row blocks to ``ctx.model`` and changes core rows only through
    :meth:`CoreContext.add_terms` with the row maps of ``ctx.rows``.  Both default to no-ops.
    """

    def add_vars(self, ctx: CoreContext) -> None:
        """Add the extension's columns (``ctx.rows`` is still ``None``)."""

    def add_rows(self, ctx: CoreContext) -> None:
        """Add the extension's rows, terms on core rows and objective terms."""


def _units(problem: CheckmateProblem, budget: int | None, integer: bool = False
           ) -> tuple[float, float]:
    """``(mem_unit, cost_unit)``: bytes per memory unit and cost per objective unit
    (``integer``: the sizes' gcd even when the numbers get large, for integer solvers)."""
    pos = problem.sizes[problem.sizes > 0]
    g = int(np.gcd.reduce(pos)) if len(pos) else 1
    mem_unit = float(g)
    top = max(float(budget or 0), float(problem.sizes.sum()))
    if top / mem_unit > 1e7 and not integer:  # keep coefficients sane (HiGHS tolerances are absolute)
        mem_unit = top / 1e6
    c = problem.costs[problem.costs > 0]
    cost_unit = 1.0
    if len(c):
        q = c / c.min()
        if np.allclose(q, np.round(q), rtol=0, atol=1e-9) and q.max() < 1e6:
            cost_unit = float(c.min())  # integer multiples: scale by the gcd-like unit
            ci = np.round(c / cost_unit).astype(np.int64)
            cost_unit *= float(np.gcd.reduce(ci))
        else:
            cost_unit = float(np.median(c))
    return mem_unit, cost_unit


def _budget_units(problem: CheckmateProblem, budget: int | None, mem_unit: float,
                  minimize_peak: bool) -> float:
    """The budget (bytes) in memory units, as the rows use it."""
    if budget is None and not minimize_peak:
        return INF
    if budget is None:
        return float(problem.sizes.sum()) / mem_unit
    # integer units (gcd scaling): floor is exact; otherwise the exact ratio, and the caller
    # re-checks every schedule in bytes (tolerances are ~1e-6 units, far below one byte)
    return math.floor(budget / mem_unit + 1e-9) if mem_unit == int(mem_unit) else budget / mem_unit


def add_checkmate_core(
    model: MilpModel,
    problem: CheckmateProblem,
    *,
    budget: int | None = None,
    formulation: Formulation = Formulation(),
    minimize_peak: bool = False,
    objective: bool = True,
    extensions: Sequence[CoreExtension] = (),
) -> CheckmateVars:
    """Add Checkmate's frontier-advancing variables, rows and objective to ``model``.

    Args:
      model: the model to extend (other blocks may also be added before or after).
      problem: the graph on arrays.
      budget: bytes (defaults to ``problem.budget``; ``None`` with ``minimize_peak``).
      formulation: optional strengthenings.
      minimize_peak: add a continuous peak variable ``P >= U[t, k]`` and minimise it (used to
        find the smallest feasible budget); the compute objective is then not added.
      objective: add ``sum C_i R[t, i]`` (in ``cost_unit`` units) to the objective.
      extensions: :class:`CoreExtension` blocks built into the same model (see there).

    Returns:
      :class:`CheckmateVars` with the column indices and the core's :class:`CoreRows`.
    """
    budget = problem.budget if budget is None else budget
    mem_unit, cost_unit = _units(problem, budget, formulation.integer_memory)
    ctx = CoreContext(model, problem, formulation, problem.sizes / mem_unit,
                      _budget_units(problem, budget, mem_unit, minimize_peak), minimize_peak)
    ctx.vars = _add_columns(ctx, mem_unit, cost_unit)
    for ext in extensions:
        ext.add_vars(ctx)
    _add_dependency_rows(ctx)
    carry = _add_carry_rows(ctx)
    mem, start = _add_memory_rows(ctx)
    _add_free_rows(ctx)
    useful_r, useful_s = _add_useful_rows(ctx)
    frontier = _add_frontier_rows(ctx)
    ctx.rows = CoreRows(carry, mem, start, useful_r, useful_s, frontier)
    ctx.vars = dataclasses.replace(ctx.vars, rows=ctx.rows)
    for ext in extensions:
        ext.add_rows(ctx)
    v = ctx.vars
    if minimize_peak:
        model.add_objective(np.array([v.peak]), 1.0)
    elif objective:
        tR, iR = np.tril_indices(problem.n)
        model.add_objective(v.R[tR, iR], problem.costs[iR] / cost_unit)
    return v


def _add_columns(ctx: CoreContext, mem_unit: float, cost_unit: float) -> CheckmateVars:
    """``R``, ``S`` (binary, lower triangles, pruned), ``U`` and ``FREE`` (chain only), ``PEAK``."""
    model, n, md = ctx.model, ctx.problem.n, ctx.problem.max_descendant
    dst = ctx.problem.edges[:, 1]
    tR, iR = np.tril_indices(n)
    ubR = np.ones(len(tR))
    lbR = (tR == iR).astype(float)
    tS, iS = np.tril_indices(n, -1)
    ubS = np.ones(len(tS))
    if ctx.formulation.prune:
        ubR[(md[iR] < tR)] = 0.0
        ubS[(md[iS] < tS)] = 0.0
    R = np.full((n, n), -1, np.int64)
    S = np.full((n, n), -1, np.int64)
    U = np.full((n, n), -1, np.int64)
    R[tR, iR] = model.add_vars("R", len(tR), lbR, ubR, integer=True)
    S[tS, iS] = model.add_vars("S", len(tS), 0.0, ubS, integer=True)
    te = ee = np.zeros(0, np.int64)
    if ctx.chain:
        cm = ctx.chain_mask
        tU, iU = tR[cm[tR]], iR[cm[tR]]
        U[tU, iU] = model.add_vars("U", len(tU), 0.0, INF if ctx.minimize_peak else ctx.budget_units)
        # FREE[t, e] for e = (i, k) with k < t
        if len(dst):
            te, ee = np.nonzero(np.arange(n)[:, None] > dst[None, :])
            te, ee = te[cm[te]], ee[cm[te]]
    F = np.full((n, len(dst)), -1, np.int64)
    F[te, ee] = model.add_vars("FREE", len(te), 0.0, 1.0)
    peak = -1
    if ctx.minimize_peak:
        peak = int(model.add_vars("PEAK", 1, 0.0, ctx.budget_units)[0])
    return CheckmateVars(R, S, U, F, mem_unit, cost_unit, peak)


def _row_map(shape: tuple[int, ...], key: tuple[np.ndarray, ...], rows: np.ndarray) -> np.ndarray:
    """An ``int64`` array of ``shape`` holding ``rows`` at ``key`` and ``-1`` elsewhere."""
    out = np.full(shape, -1, np.int64)
    out[key] = rows
    return out


def _pairs(model: MilpModel, a: np.ndarray, b: np.ndarray, sa: float, sb: float, hi: float,
           name: str) -> np.ndarray:
    """Rows ``sa * x[a[r]] + sb * x[b[r]] <= hi``, one per entry; returns their indices."""
    k = len(a)
    return model.add_rows_coo(np.r_[np.arange(k), np.arange(k)], np.r_[a, b],
                              np.r_[np.full(k, sa), np.full(k, sb)], k, -INF, hi, name=name)


def _edge_steps(n: int, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(t, e)`` for every edge ``e`` and step ``t >= dst[e]``."""
    if not len(dst):
        return (np.zeros(0, int),) * 2
    return np.nonzero(np.arange(n)[:, None] >= dst[None, :])


def _add_dependency_rows(ctx: CoreContext) -> None:
    """(1a): ``R[t, j] - R[t, i] - S[t, i] <= 0`` for ``(i, j)`` in E, ``j <= t``."""
    v, src, dst = ctx.vars, ctx.problem.edges[:, 0], ctx.problem.edges[:, 1]
    td, ed = _edge_steps(ctx.problem.n, dst)
    k = len(td)
    rows = np.repeat(np.arange(k), 3)
    cols = np.stack([v.R[td, dst[ed]], v.R[td, src[ed]], v.S[td, src[ed]]], 1).ravel()
    vals = np.tile([1.0, -1.0, -1.0], k)
    ctx.model.add_rows_coo(rows, cols, vals, k, -INF, 0.0, name="dep")


def _add_carry_rows(ctx: CoreContext) -> np.ndarray:
    """(1b): ``S[t+1, i] - S[t, i] - R[t, i] <= 0`` for ``i <= t < n-1``; returns the row map."""
    n, v = ctx.problem.n, ctx.vars
    tc, ic = np.tril_indices(n - 1) if n > 1 else (np.zeros(0, int),) * 2
    k = len(tc)
    r3 = np.stack([np.arange(k)] * 3, 1)
    c3 = np.stack([v.S[tc + 1, ic], v.S[tc, ic], v.R[tc, ic]], 1)
    v3 = np.tile([1.0, -1.0, -1.0], (k, 1))
    keep = c3 >= 0
    ids = ctx.model.add_rows_coo(r3[keep], c3[keep], v3[keep], k, -INF, 0.0, name="carry")
    return _row_map((n, n), (tc, ic), ids)


def _add_memory_rows(ctx: CoreContext) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. (2)-(3) (``U``/``FREE`` chain, plus ``P >= U`` when minimising the peak), or the
    start-of-step rows without the chain.  Returns the row maps ``(mem, start)``."""
    model, n, v, M = ctx.model, ctx.problem.n, ctx.vars, ctx.mem
    src, dst = ctx.problem.edges[:, 0], ctx.problem.edges[:, 1]
    tR, iR = np.tril_indices(n)
    tS, iS = np.tril_indices(n, -1)
    mem, start = np.full((n, n), -1, np.int64), np.full(n, -1, np.int64)
    cm = ctx.chain_mask
    if not cm.all():  # steps without the chain: memory at the step start, sum_i M_i S[t, i] <= B
        off = ~cm[tS]
        start = model.add_rows_coo(tS[off], v.S[tS[off], iS[off]], M[iS[off]], n, -INF,
                                   ctx.budget_units, name="start")
        if not cm.any():
            return mem, start
        tR, iR = tR[cm[tR]], iR[cm[tR]]
        tS, iS = tS[cm[tS]], iS[cm[tS]]
    nu = len(tR)
    urow = _row_map((n, n), (tR, iR), np.arange(nu))
    rr = [np.arange(nu), np.arange(nu)]
    cc = [v.U[tR, iR], v.R[tR, iR]]
    vv = [np.ones(nu), -M[iR]]
    prev = iR > 0
    rr.append(np.flatnonzero(prev))
    cc.append(v.U[tR[prev], iR[prev] - 1])
    vv.append(-np.ones(prev.sum()))
    rr.append(urow[tS, 0])  # S terms in row (t, 0)
    cc.append(v.S[tS, iS])
    vv.append(-M[iS])
    te, ee = np.nonzero(v.F >= 0)
    if len(te):  # FREE[t, (i, k)] frees M_i before node k+1, i.e. in row (t, k+1)
        rr.append(urow[te, dst[ee] + 1])
        cc.append(v.F[te, ee])
        vv.append(M[src[ee]])
    ids = model.add_rows_coo(np.concatenate(rr), np.concatenate(cc), np.concatenate(vv), nu,
                             0.0, 0.0, name="mem")
    if ctx.minimize_peak:
        _pairs(model, v.U[tR, iR], np.full(nu, v.peak), 1.0, -1.0, 0.0, "peak")
    return _row_map((n, n), (tR, iR), ids), start


def _add_free_rows(ctx: CoreContext) -> None:
    """``FREE`` upper bounds: two of the paper's hazard conditions and one per later user."""
    model, n, v, users = ctx.model, ctx.problem.n, ctx.vars, ctx.problem.users
    src, dst = ctx.problem.edges[:, 0], ctx.problem.edges[:, 1]
    te, ee = np.nonzero(v.F >= 0)
    if not len(te):
        return
    _pairs(model, v.F[te, ee], v.R[te, dst[ee]], 1.0, -1.0, 0.0, "free_r")
    has_next = te + 1 < n
    t2, e2 = te[has_next], ee[has_next]
    _pairs(model, v.F[t2, e2], v.S[t2 + 1, src[e2]], 1.0, 1.0, 1.0, "free_s")
    # pairs (edge e = (i, k), later user j of i, j > k)
    pe, pj = [], []
    for e in range(len(src)):
        i, kk = int(src[e]), int(dst[e])
        later = users[i][users[i] > kk]
        pe.extend([e] * len(later))
        pj.extend(later.tolist())
    if pe:
        pe, pj = np.array(pe), np.array(pj)
        tl, pl = np.nonzero(np.arange(n)[:, None] >= pj[None, :])
        has = v.F[tl, pe[pl]] >= 0  # steps with a chain
        tl, pl = tl[has], pl[has]
        _pairs(model, v.F[tl, pe[pl]], v.R[tl, pj[pl]], 1.0, 1.0, 1.0, "free_later")


def _add_useful_rows(ctx: CoreContext) -> tuple[np.ndarray, np.ndarray]:
    """Dominance rows (only normalised schedules): ``X[t, i] <= S[t+1, i] + sum_{users j <= t}
    R[t, j]`` for ``X`` in ``R``, ``S``.  Returns the row maps ``(useful_r, useful_s)``."""
    n, v = ctx.problem.n, ctx.vars
    maps = [np.full((n, n), -1, np.int64), np.full((n, n), -1, np.int64)]
    if not (ctx.formulation.useful and n > 1):
        return maps[0], maps[1]
    src, dst = ctx.problem.edges[:, 0], ctx.problem.edges[:, 1]
    tu, iu = np.tril_indices(n, -1)
    k = len(tu)
    rowid = _row_map((n, n), (tu, iu), np.arange(k))
    nxt = tu + 1 < n
    # users j of i with j <= t: for each edge (i, j), rows (t, i) with t >= j
    tj, ej = _edge_steps(n, dst)
    for out, (which, block) in zip(maps, (("useful_r", v.R), ("useful_s", v.S))):
        rr = [np.arange(k), np.flatnonzero(nxt), rowid[tj, src[ej]]]
        cc = [block[tu, iu], v.S[tu[nxt] + 1, iu[nxt]], v.R[tj, dst[ej]]]
        vv = [np.ones(k), -np.ones(nxt.sum()), -np.ones(len(tj))]
        out[tu, iu] = ctx.model.add_rows_coo(np.concatenate(rr), np.concatenate(cc),
                                             np.concatenate(vv), k, -INF, 0.0, name=which)
    return maps[0], maps[1]


def _add_frontier_rows(ctx: CoreContext) -> np.ndarray:
    """Memory while node ``t < n-1`` runs, directly on ``S[t+1]`` (``P`` on the right-hand side
    when minimising the peak).  Returns the row map ``int64[n]``."""
    n, v, M, preds = ctx.problem.n, ctx.vars, ctx.mem, ctx.problem.preds
    out = np.full(n, -1, np.int64)
    if not (ctx.formulation.frontier_rows and n > 1):
        return out
    pm = [np.zeros(n, bool) for _ in range(n)]
    base = M.copy()
    for t in range(n):
        pm[t][preds[t]] = True
        base[t] += M[preds[t]].sum()
    tf, i_f = np.tril_indices(n - 1, -1)  # i < t, t <= n-2
    isp = np.array([pm[t][i] for t, i in zip(tf, i_f)], bool) if len(tf) else np.zeros(0, bool)
    sel = ~isp & (M[i_f] > 0)
    tf, i_f = tf[sel], i_f[sel]
    rows_t = np.arange(n - 1)
    cols = [v.S[tf + 1, i_f]]
    vals = [M[i_f]]
    rws = [tf]
    if ctx.minimize_peak:
        rws.append(rows_t)
        cols.append(np.full(n - 1, v.peak))
        vals.append(-np.ones(n - 1))
        hi = -base[:n - 1]
    else:
        hi = ctx.budget_units - base[:n - 1]
    out[:n - 1] = ctx.model.add_rows_coo(np.concatenate(rws), np.concatenate(cols),
                                         np.concatenate(vals), n - 1, -INF, hi, name="frontier")
    return out


# ------------------------------------------------------------------ schedules <-> vectors
def checkmate_vector(model: MilpModel, v: CheckmateVars, problem: CheckmateProblem,
                     R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """A complete MILP vector (``nan`` for columns of other blocks) from a schedule: ``R``, ``S``
    as given, ``FREE`` and ``U`` computed directly.  ``R``/``S`` should be normalised."""
    n = problem.n
    R = np.asarray(R, bool)
    S = np.asarray(S, bool)
    x = np.full(model.num_vars, np.nan)
    m = v.R >= 0
    x[v.R[m]] = R[m]
    m = v.S >= 0
    x[v.S[m]] = S[m]
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    M = problem.sizes / v.mem_unit
    Snext = np.vstack([S[1:], np.zeros((1, n), bool)])
    # last computed user of each value in each step
    lastuse = np.full((n, n), -1, np.int64)
    for e in range(len(src)):
        col = np.where(R[:, dst[e]], dst[e], -1)
        lastuse[:, src[e]] = np.maximum(lastuse[:, src[e]], col)
    Fv = np.zeros((n, len(src)))
    if len(src):
        Fv = (R[:, dst] & ~Snext[:, src] & (lastuse[:, src] <= dst[None, :])).astype(float)
        mf = v.F >= 0
        x[v.F[mf]] = Fv[mf]
    freed = np.zeros((n, n))  # freed[t, k]: units freed after node k
    if len(src):
        np.add.at(freed.T, dst, (Fv * M[src][None, :]).T)
    Uv = (S * M).sum(1)[:, None] + np.cumsum(R * M, axis=1) - np.cumsum(freed, axis=1) + freed
    mu = v.U >= 0
    x[v.U[mu]] = Uv[mu]
    if v.peak >= 0:
        x[v.peak] = float(Uv[mu].max()) if mu.any() else 0.0
    return x


def decode_schedule(problem: CheckmateProblem, v: CheckmateVars, x: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The normalised ``(R, S)`` of a MILP vector ``x`` (entries above 0.5 are set)."""
    n = problem.n
    R = np.zeros((n, n), bool)
    S = np.zeros((n, n), bool)
    m = v.R >= 0
    R[m] = x[v.R[m]] > 0.5
    m = v.S >= 0
    S[m] = x[v.S[m]] > 0.5
    return normalize(problem, R, S)
