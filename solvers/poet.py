"""POET: energy-optimal rematerialization and paging as one MILP (Patil et al., ICML 2022).

The formulation is POET's Algorithm 1 / eq. (1), restated self-consistently below, on top of
the Checkmate core of :mod:`solvers.checkmate` (``R``, ``S`` = POET's ``S_RAM``, the memory rows
``U`` with their ``FREE`` variables: the exact device-memory model of :mod:`remat.core.schedule`).
POET adds, over ``T = n`` frontier-advancing steps:

* ``S_aux[t, i]`` (value i held in secondary storage entering step t), ``M_in[t, i]`` (page-in
  during step t, lands at its end), ``M_out[t, i]`` (page-out during step t, from its start),
  all binary and zero for ``i >= t``;
* RAM persistence      ``S[t+1, i] <= S[t, i] + R[t, i] + M_in[t, i]``      (replaces Checkmate's)
* storage persistence  ``S_aux[t+1, i] <= S_aux[t, i] + M_out[t, i]``,  ``S_aux[0] = 0``
* page-in source       ``M_in[t, i] <= S_aux[t, i]``
* page-out source      ``M_out[t, i] <= S[t, i]``
* deadline (eq. 3)     ``sum_t sum_i Psi_i R[t, i] (+ paging time if counted) <= deadline``
* objective (eq. 2)    ``min sum_t sum_i Phi_c_i R[t,i] + Phi_in_i M_in[t,i] + Phi_out_i M_out[t,i]``
  plus a tie-breaking epsilon per recompute and per page move.

Ablations (the paper's remat-only and paging-only baselines): ``paging=False`` pins
``S_aux = M_in = M_out = 0`` (remat only, Checkmate with an energy objective); ``remat=False``
pins ``R = I`` (paging only).

Units: bytes, seconds, joules.  No jax here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from remat.core.errors import InvalidPlanError
from solvers.checkmate import (
    CheckmateProblem,
    CheckmateVars,
    CoreContext,
    CoreExtension,
    Formulation,
    add_checkmate_core,
    checkmate_vector,
)
from solvers.milp import INF, MilpModel


@dataclasses.dataclass(frozen=True)
class PoetProblem:
    """A POET instance on arrays.

    Attributes:
      n: number of nodes (= steps T).
      edges: ``int64[m, 2]`` data edges ``(src, dst)``, ``src < dst`` (topological order).
      sizes: ``int64[n]`` output bytes ``M_i``.
      compute_energy: ``float64[n]`` joules per execution ``Phi_compute``.
      compute_time: ``float64[n]`` seconds per execution ``Psi_compute``.
      page_in_energy, page_out_energy: ``float64[n]`` joules per page move of node i's output.
      page_in_time, page_out_time: ``float64[n]`` seconds per page move.
      budget: device-memory budget ``mu_RAM`` in bytes (activations only, as everywhere in remat).
      deadline: ``mu_deadline`` in seconds, or ``None`` for no runtime constraint.
      paging, remat: ablation switches.
      count_paging_time: add page time to the deadline row (POET's eq. 3 does not: it assumes
        DMA hides paging).
      eps: tie-breaking cost per recompute / page move, relative to the mean positive per-node
        compute energy.
    """

    n: int
    edges: np.ndarray
    sizes: np.ndarray
    compute_energy: np.ndarray
    compute_time: np.ndarray
    page_in_energy: np.ndarray
    page_out_energy: np.ndarray
    page_in_time: np.ndarray
    page_out_time: np.ndarray
    budget: int
    deadline: float | None = None
    paging: bool = True
    remat: bool = True
    count_paging_time: bool = False
    eps: float = 1e-5


@dataclasses.dataclass(frozen=True)
class PoetSolution:
    """A solved POET instance.

    Attributes:
      R, S, S_aux, M_in, M_out: ``bool[T, n]`` schedule (after a cleanup that only removes
        useless recomputes, carries and page moves, never adding memory or energy).
      status: ``optimal``, ``time_limit`` (incumbent within ``gap``), ``feasible``.
      energy_j: total energy of the schedule (no tie-break terms), joules.
      compute_energy_j, page_in_energy_j, page_out_energy_j: its parts.
      runtime_s: compute time (plus paging time when the problem counts it).
      bound_j: best lower bound on ``energy_j`` the solver proved (tie-break terms removed).
      gap: relative MIP gap reported by the solver.
      solve_time_s, build_time_s: wall seconds.
      warm_started: a warm start was given and passed to the solver (it satisfied every row).
    """

    R: np.ndarray
    S: np.ndarray
    S_aux: np.ndarray
    M_in: np.ndarray
    M_out: np.ndarray
    status: str
    energy_j: float
    compute_energy_j: float
    page_in_energy_j: float
    page_out_energy_j: float
    runtime_s: float
    bound_j: float
    gap: float
    solve_time_s: float
    build_time_s: float
    warm_started: bool = False


def schedule_costs(problem: PoetProblem, R, M_in, M_out) -> dict[str, float]:
    """Energy (J) and runtime (s) of a schedule under ``problem``'s cost model (eqs. 2-3)."""
    cnt = np.asarray(R).sum(axis=0)
    nin = np.asarray(M_in).sum(axis=0)
    nout = np.asarray(M_out).sum(axis=0)
    ec = float(cnt @ problem.compute_energy)
    ei = float(nin @ problem.page_in_energy)
    eo = float(nout @ problem.page_out_energy)
    rt = float(cnt @ problem.compute_time)
    if problem.count_paging_time:
        rt += float(nin @ problem.page_in_time + nout @ problem.page_out_time)
    return {
        "energy_j": ec + ei + eo,
        "compute_energy_j": ec,
        "page_in_energy_j": ei,
        "page_out_energy_j": eo,
        "runtime_s": rt,
    }


def cleanup_schedule(edges: np.ndarray, R, S, M_in, M_out):
    """Remove useless work from a schedule without adding memory or energy.

    Repeated until nothing changes: a recompute ``R[t, i]`` (``i < t``) whose output no later
    node of step t reads and that is not carried into ``S[t+1]``; a carry ``S[t+1, i]`` that
    step t+1 neither reads, carries on, nor pages out; a page-in whose value is not carried into
    ``S[t+1]``; a page-out with no later page-in of that value before the next page-out.
    ``S_aux`` is then rebuilt as "paged out in an earlier step and not yet re-paged-out".

    Args:
      edges: ``int64[m, 2]``.
      R, S, M_in, M_out: ``bool[T, n]``.

    Returns:
      ``(R, S, S_aux, M_in, M_out)`` as new boolean arrays.
    """
    R, S, M_in, M_out = (np.array(x, dtype=bool) for x in (R, S, M_in, M_out))
    T, n = R.shape
    src, dst = edges[:, 0], edges[:, 1]
    diag = np.zeros((T, n), dtype=bool)
    k = min(T, n)
    diag[np.arange(k), np.arange(k)] = True
    changed = True
    while changed:
        changed = False
        Snext = np.zeros_like(S)
        Snext[:-1] = S[1:]
        # read[t, i]: some node computed in step t reads i (order within the step is index order,
        # so any reader computed in the step comes after i when i is computed there too)
        read = np.zeros((T, n), dtype=bool)
        np.logical_or.at(read, (slice(None), src), R[:, dst])
        useless_r = R & ~diag & ~read & ~Snext
        if useless_r.any():
            R &= ~useless_r
            changed = True
            continue
        M_in &= Snext  # a page-in must feed S[t+1]
        useless_s = np.zeros_like(S)
        useless_s[1:] = S[1:] & ~read[1:] & ~Snext[1:] & ~M_out[1:]
        if useless_s.any():
            S &= ~useless_s
            changed = True
            continue
        # storage keeps a value once written, so only the first page-out of a value matters,
        # and only if some later step pages it back in
        first = np.argmax(M_out, axis=0)
        has_out = M_out.any(axis=0)
        last_in = np.where(M_in.any(axis=0), T - 1 - np.argmax(M_in[::-1], axis=0), -1)
        new_out = np.zeros_like(M_out)
        keep = has_out & (last_in > first)
        new_out[first[keep], np.flatnonzero(keep)] = True
        if (new_out != M_out).any():
            M_out = new_out
            changed = True
    S_aux = np.zeros_like(S)
    if T > 1:
        S_aux[1:] = np.logical_or.accumulate(M_out, axis=0)[:-1]
    if (M_in & ~S_aux).any():
        raise InvalidPlanError("page-in without an earlier page-out after cleanup")
    return R, S, S_aux, M_in, M_out


# --------------------------------------------------------------------------- formulation
@dataclasses.dataclass(frozen=True, eq=False)
class PoetVars:
    """Column indices of a POET model (``-1`` where a variable does not exist).

    Attributes:
      core: the Checkmate blocks (``R``, ``S``, ``U``, ``FREE``) from
        :func:`solvers.checkmate.add_checkmate_core`.
      S_aux, M_in, M_out, G: ``int64[T, n]``; ``G[t, i]`` (continuous) frees at the start of
        step t a value that is paged out there and neither read in the step nor carried.
      energy_unit: joules per objective unit; time_unit: seconds per deadline-row unit.
    """

    core: CheckmateVars
    S_aux: np.ndarray
    M_in: np.ndarray
    M_out: np.ndarray
    G: np.ndarray
    energy_unit: float
    time_unit: float


class PoetPaging(CoreExtension):
    """POET's paging block, built into the Checkmate core by :func:`add_checkmate_core`.

    Columns (after the core's): ``M_out``, ``M_in``, ``S_aux`` (binary) and ``G`` (continuous),
    each ``int64[T, n]`` with ``-1`` for ``i >= t``; pruned entries (no descendant left) get an
    upper bound of 0.  Rows (after the core's), with ``M`` the sizes in memory units:

    * page-in / page-out sources ``M_in <= S_aux``, ``M_out <= S``;
    * ``M_in[t,i] + S[t,i] <= 1`` and ``M_in[t,i] + R[t,i] <= 1`` (a page-in of a value resident
      during the step is wasted: the replay keeps a carried value to the step end);
    * ``G <= M_out``, ``G <= 1 - R[t,i]``, ``G <= 1 - S[t+1,i]``, ``G <= 1 - R[t,j]`` for users
      ``j <= t``;
    * storage persistence ``S_aux[t+1,i] <= S_aux[t,i] + M_out[t,i]``;
    * start rows ``sum_i M_i S[t,i] <= budget`` (the replay frees a paged-out value at the step
      start).

    Terms on the core's rows (:class:`~solvers.checkmate.CoreRows`):

    * ``carry`` ``(t, i)``: ``- M_in[t,i]`` (POET's RAM persistence
      ``S[t+1,i] <= S[t,i] + R[t,i] + M_in[t,i]``);
    * ``useful_s`` ``(t, i)``: ``- M_out[t,i]`` (a checkpoint may exist to be paged out);
    * ``mem`` ``(t, 0)``: ``+ M_i G[t,i]`` (a value paged out and dropped frees its bytes);
    * ``frontier`` ``t``: ``- M_i M_in[t,i]`` for non-inputs ``i`` of ``t`` (a value paged in
      during step t is not resident while the frontier runs).

    Objective: paging energy in ``energy_unit`` joules plus the tie-break ``eps`` per move.
    """

    def __init__(self, problem: PoetProblem, energy_unit: float, eps: float) -> None:
        self.problem, self.energy_unit, self.eps = problem, energy_unit, eps
        n = problem.n
        self.S_aux, self.M_in, self.M_out, self.G = (np.full((n, n), -1, np.int64) for _ in range(4))

    def add_vars(self, ctx: CoreContext) -> None:
        n, md, model = ctx.problem.n, ctx.problem.max_descendant, ctx.model
        tS, iS = np.tril_indices(n, -1)
        ub = (md[iS] >= tS).astype(float)  # pruned (useless) entries get ub 0
        later = ub * (tS >= iS + 2)  # nothing to page in or hold in storage before t = i + 2
        self.M_out[tS, iS] = model.add_vars("M_out", len(tS), 0.0, ub, integer=True)
        self.M_in[tS, iS] = model.add_vars("M_in", len(tS), 0.0, later, integer=True)
        self.S_aux[tS, iS] = model.add_vars("S_aux", len(tS), 0.0, later, integer=True)
        self.G[tS, iS] = model.add_vars("G", len(tS), 0.0, ub)

    def add_rows(self, ctx: CoreContext) -> None:
        n, model, core, rows, M = ctx.problem.n, ctx.model, ctx.vars, ctx.rows, ctx.mem
        R, S, S_aux, M_in, M_out, G = core.R, core.S, self.S_aux, self.M_in, self.M_out, self.G
        src, dst = ctx.problem.edges[:, 0], ctx.problem.edges[:, 1]
        tS, iS = np.tril_indices(n, -1)
        nx = tS + 1 < n

        def pair_rows(a, b, hi, name, sb=1.0, sel=None):
            """Rows ``x[a] + sb * x[b] <= hi`` for the pairs ``(t, i)`` selected by ``sel``."""
            sel = np.ones(len(tS), bool) if sel is None else sel
            kk = int(sel.sum())
            model.add_rows_coo(np.r_[np.arange(kk), np.arange(kk)], np.r_[a[sel], b[sel]],
                               np.r_[np.full(kk, 1.0), np.full(kk, sb)], kk, -INF, hi, name=name)

        pair_rows(M_in[tS, iS], S_aux[tS, iS], 0.0, "poet_in_src", -1.0)
        pair_rows(M_out[tS, iS], S[tS, iS], 0.0, "poet_out_src", -1.0)
        pair_rows(M_in[tS, iS], S[tS, iS], 1.0, "poet_in_not_s")
        pair_rows(M_in[tS, iS], R[tS, iS], 1.0, "poet_in_not_r")
        pair_rows(G[tS, iS], M_out[tS, iS], 0.0, "poet_g_out", -1.0)
        pair_rows(G[tS, iS], R[tS, iS], 1.0, "poet_g_r")
        pair_rows(G[tS, iS], np.where(nx, S[np.minimum(tS + 1, n - 1), iS], -1), 1.0, "poet_g_s",
                  sel=nx)
        if len(src):  # G + R[t, j] <= 1 for users j of i with j <= t
            tj, ej = np.nonzero(np.arange(n)[:, None] >= dst[None, :])
            kk = len(tj)
            model.add_rows_coo(np.r_[np.arange(kk), np.arange(kk)],
                               np.r_[G[tj, src[ej]], R[tj, dst[ej]]], 1.0, kk, -INF, 1.0,
                               name="poet_g_users")
        # storage persistence: S_aux[t+1,i] - S_aux[t,i] - M_out[t,i] <= 0  (i < t < n-1);
        # S_aux[t+1, t] <= M_out[t, t] = 0 holds through the upper bounds (tS >= iS + 2)
        kk = int(nx.sum())
        rr = np.arange(kk)
        model.add_rows_coo(np.r_[rr, rr, rr],
                           np.r_[S_aux[tS[nx] + 1, iS[nx]], S_aux[tS[nx], iS[nx]],
                                 M_out[tS[nx], iS[nx]]],
                           np.r_[np.ones(kk), -np.ones(kk), -np.ones(kk)], kk, -INF, 0.0,
                           name="poet_aux_carry")
        model.add_rows_coo(tS, S[tS, iS], M[iS], n, -INF, self.problem.budget / core.mem_unit,
                           name="poet_start")
        # terms on the core's rows
        ctx.add_terms(rows.carry[tS[nx], iS[nx]], M_in[tS[nx], iS[nx]], -1.0)
        ctx.add_terms(rows.useful_s[tS, iS], M_out[tS, iS], -1.0)
        ctx.add_terms(rows.mem[tS, 0], G[tS, iS], M[iS])
        pm = np.zeros((n, n), bool)
        if len(src):
            pm[dst, src] = True
        sel = nx & ~pm[tS, iS] & (M[iS] > 0)
        ctx.add_terms(rows.frontier[tS[sel]], M_in[tS[sel], iS[sel]], -M[iS[sel]])
        # objective: paging energy + tie-break per move
        e_in, e_out = (np.asarray(e)[iS] / self.energy_unit + self.eps
                       for e in (self.problem.page_in_energy, self.problem.page_out_energy))
        model.add_objective(M_in[tS, iS], e_in)
        model.add_objective(M_out[tS, iS], e_out)


def build_poet(problem: PoetProblem, formulation: Formulation | None = None
               ) -> tuple[MilpModel, PoetVars, CheckmateProblem]:
    """Build the POET MILP: the Checkmate core (no objective) with :class:`PoetPaging` built
    in when ``problem.paging``, then the compute-energy objective (joules in ``energy_unit``,
    plus ``eps`` per recompute) and the deadline row (eq. 3, seconds in ``time_unit``).
    ``remat=False`` pins ``R`` to the identity.  Returns ``(model, PoetVars, CheckmateProblem)``.
    """
    n = problem.n
    edges = np.asarray(problem.edges, dtype=np.int64).reshape(-1, 2)
    ec = np.asarray(problem.compute_energy, float)
    cm = CheckmateProblem(n, edges, ec, problem.sizes, problem.budget)
    model = MilpModel("poet")
    e_unit = float(ec.sum()) if ec.sum() > 0 else 1.0
    ct = np.asarray(problem.compute_time, float)
    t_unit = float(ct.sum()) if ct.sum() > 0 else 1.0
    eps = problem.eps / max(n, 1)
    paging = PoetPaging(problem, e_unit, eps)
    core = add_checkmate_core(model, cm, budget=problem.budget,
                              formulation=formulation or Formulation(), objective=False,
                              extensions=[paging] if problem.paging and n > 1 else [])
    R = core.R
    tS, iS = np.tril_indices(n, -1)
    if not problem.remat:  # R = I
        model.fix(R[tS, iS], 0.0)
    # objective: compute energy (eq. 2) + tie-break per recompute
    tR, iR = np.tril_indices(n)
    model.add_objective(R[tR, iR], ec[iR] / e_unit + eps * (tR > iR))
    # deadline (eq. 3)
    if problem.deadline is not None:
        cols, vals = [R[tR, iR]], [ct[iR] / t_unit]
        if problem.count_paging_time and problem.paging and n > 1:
            cols += [paging.M_in[tS, iS], paging.M_out[tS, iS]]
            vals += [np.asarray(problem.page_in_time)[iS] / t_unit,
                     np.asarray(problem.page_out_time)[iS] / t_unit]
        c = np.concatenate(cols)
        model.add_rows_coo(np.zeros(len(c), np.int64), c, np.concatenate(vals), 1, -INF,
                           problem.deadline / t_unit * (1 + 1e-9), name="poet_deadline")
    v = PoetVars(core, paging.S_aux, paging.M_in, paging.M_out, paging.G, e_unit, t_unit)
    return model, v, cm


def poet_vector(model: MilpModel, v: PoetVars, cm: CheckmateProblem, R: np.ndarray,
                S: np.ndarray, M_in: np.ndarray | None = None, M_out: np.ndarray | None = None
                ) -> np.ndarray:
    """A complete MILP vector for a schedule (warm start): ``R``, ``S`` and the page moves as
    given, ``S_aux`` = paged out in an earlier step, ``G``, ``FREE`` and ``U`` computed directly."""
    n = cm.n
    R = np.asarray(R, bool)
    S = np.asarray(S, bool)
    z = np.zeros((n, n), bool)
    M_in = z if M_in is None else np.asarray(M_in, bool)
    M_out = z if M_out is None else np.asarray(M_out, bool)
    x = checkmate_vector(model, v.core, cm, R, S)
    S_aux = np.zeros_like(S)
    if n > 1:
        S_aux[1:] = np.logical_or.accumulate(M_out, axis=0)[:-1]
    S_aux &= cm.max_descendant[None, :] >= np.arange(n)[:, None]  # pruned columns (ub 0)
    used = np.zeros((n, n), bool)
    if len(cm.edges):
        src, dst = cm.edges[:, 0], cm.edges[:, 1]
        np.logical_or.at(used, (slice(None), src), R[:, dst])
    Snext = np.zeros_like(S)
    Snext[:-1] = S[1:]
    G = M_out & ~Snext & ~used & ~R
    for blk, val in ((v.S_aux, S_aux), (v.M_in, M_in), (v.M_out, M_out), (v.G, G)):
        m = blk >= 0
        x[blk[m]] = val[m]
    freed = (G * (cm.sizes / v.core.mem_unit)).sum(axis=1)  # units freed at each step start
    mu = v.core.U >= 0
    x[v.core.U[mu]] -= np.broadcast_to(freed[:, None], (n, n))[mu]
    return x


def solve_poet(
    problem: PoetProblem,
    *,
    time_limit: float = 60.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    backend: str = "highs",
    warm_start=None,
    log: bool = False,
) -> PoetSolution:
    """Solve POET's MILP (eq. 1, restated) for ``problem``.

    Args:
      warm_start: a frontier schedule ``(R, S)`` or ``(R, S, M_in, M_out)`` that fits the
        budget and deadline (e.g. the better ablation's solution), or ``None``.  A vector that
        violates a row is dropped (``meta`` of the caller can compare energies).
      time_limit, mip_gap, threads, backend: passed to :meth:`MilpModel.solve`; ``"cpsat"``
        counts memory in units of the sizes' gcd (integer data) and refuses a deadline row
        (fractional times) with :class:`~remat.core.errors.SolverError`.

    Returns:
      :class:`PoetSolution`; status ``infeasible`` (no schedule, arrays empty) is returned, not
      raised, so the caller can compute the smallest feasible budget.

    Raises:
      SolverTimeoutError: the time limit hit without an incumbent.
    """
    import math
    import time

    t0 = time.perf_counter()
    model, v, cm = build_poet(problem, Formulation(integer_memory=True) if backend in ("cpsat", "race")
                              else None)
    x0 = None
    if warm_start is not None:
        w = list(warm_start)
        if not problem.paging:
            w = w[:2]
        x0 = poet_vector(model, v, cm, *w)
        obj, viol = model.evaluate(np.nan_to_num(x0))
        if viol > 1e-6:
            x0 = None
    build = time.perf_counter() - t0
    sol = model.solve(backend, time_limit=time_limit, mip_gap=mip_gap, threads=threads,
                      warm_start=x0, log=log)
    n = problem.n
    if sol.status == "infeasible" or not sol.has_solution:
        z = np.zeros((n, n), bool)
        return PoetSolution(z, z, z, z, z, "infeasible", math.nan, math.nan, math.nan, math.nan,
                            math.nan, math.nan, math.nan, sol.solve_time_s, build)

    def get(blk):
        out = np.zeros((n, n), bool)
        m = blk >= 0
        out[m] = sol.x[blk[m]] > 0.5
        return out

    R, S, M_in, M_out = get(v.core.R), get(v.core.S), get(v.M_in), get(v.M_out)
    R, S, S_aux, M_in, M_out = cleanup_schedule(cm.edges, R, S, M_in, M_out)
    c = schedule_costs(problem, R, M_in, M_out)
    bound = sol.bound * v.energy_unit if math.isfinite(sol.bound) else math.nan
    if sol.status == "optimal" or not math.isfinite(bound):
        bound = min(bound, c["energy_j"]) if math.isfinite(bound) else c["energy_j"]
    bound = min(bound, c["energy_j"])
    gap = max(0.0, (c["energy_j"] - bound) / max(c["energy_j"], 1e-300))
    status = "optimal" if sol.status == "optimal" else sol.status
    return PoetSolution(R, S, S_aux, M_in, M_out, status, c["energy_j"], c["compute_energy_j"],
                        c["page_in_energy_j"], c["page_out_energy_j"], c["runtime_s"], bound, gap,
                        sol.solve_time_s, build + sol.build_time_s, x0 is not None)
