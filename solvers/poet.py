"""POET: energy-optimal rematerialization and paging as one MILP (Patil et al., ICML 2022).

The formulation is POET's Algorithm 1 / eq. (1) as restated self-consistently in
``notes/seeds-poet-olla.md`` A.5, on top of the Checkmate core of :mod:`solvers.checkmate`
(``R``, ``S`` = POET's ``S_RAM``, the memory rows ``U`` with their ``FREE`` variables: the exact
device-memory model of :mod:`remat.schedule`).  POET adds, over ``T = n`` frontier-advancing steps:

* ``S_aux[t, i]`` (value i held in secondary storage entering step t), ``M_in[t, i]`` (page-in
  during step t, lands at its end), ``M_out[t, i]`` (page-out during step t, from its start),
  all binary and zero for ``i >= t``;
* RAM persistence      ``S[t+1, i] <= S[t, i] + R[t, i] + M_in[t, i]``      (replaces Checkmate's)
* storage persistence  ``S_aux[t+1, i] <= S_aux[t, i] + M_out[t, i]``,  ``S_aux[0] = 0``
* page-in source       ``M_in[t, i] <= S_aux[t, i]``
* page-out source      ``M_out[t, i] <= S[t, i]``
* deadline (eq. 3)     ``sum_t sum_i Psi_i R[t, i] (+ paging time if counted) <= deadline``
* objective (eq. 2)    ``min sum_t sum_i Phi_c_i R[t,i] + Phi_in_i M_in[t,i] + Phi_out_i M_out[t,i]``
  plus a tie-breaking epsilon per recompute and per page move (A.13.11).

Ablations (A.5): ``paging=False`` pins ``S_aux = M_in = M_out = 0`` (remat only, Checkmate with
an energy objective); ``remat=False`` pins ``R = I`` (paging only).

Units: bytes, seconds, joules.  No jax here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from remat.errors import InvalidPlanError


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
        DMA hides paging, A.6/A.13.3).
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
    """Remove useless work from a schedule without adding memory or energy (A.13.11).

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

    core: object
    S_aux: np.ndarray
    M_in: np.ndarray
    M_out: np.ndarray
    G: np.ndarray
    energy_unit: float
    time_unit: float


def _tri_pos(t: np.ndarray, i: np.ndarray, strict: bool) -> np.ndarray:
    """Row position of ``(t, i)`` in ``np.tril_indices`` order (``strict``: offset -1)."""
    return t * (t - 1) // 2 + i if strict else t * (t + 1) // 2 + i


def build_poet(problem: PoetProblem, formulation=None):
    """Build the POET MILP on the Checkmate core.  Returns ``(model, PoetVars, CheckmateProblem)``.

    Rows added on top of the core (global row indices of the core's named row blocks are
    extended with :meth:`MilpModel.add_coefficients`):

    * carry rows ``S[t+1,i] - S[t,i] - R[t,i] - M_in[t,i] <= 0`` (POET's RAM persistence);
    * ``useful_s`` dominance rows get ``- M_out[t,i]`` (a checkpoint may exist to be paged out);
    * ``frontier`` rows count ``S[t+1,i] - M_in[t,i]`` (a paged-in value is not resident while
      the frontier runs);
    * memory row ``U[t,0]`` gets ``+ M_i G[t,i]``, with ``G <= M_out``, ``G <= 1 - S[t+1,i]``,
      ``G <= 1 - R[t,j]`` for users ``j <= t`` and for ``j = i``, and start rows
      ``sum_i M_i S[t,i] <= budget`` (the replay frees such a value at the step start);
    * ``S_aux`` persistence, page-in/page-out sources, ``M_in[t,i] + S[t,i] <= 1`` and
      ``M_in[t,i] + R[t,i] <= 1`` (a page-in of a value resident during the step is wasted: the
      replay keeps a carried value to the step end), the deadline row and the objective.
    """
    from solvers.checkmate import CheckmateProblem, Formulation, add_checkmate_core
    from solvers.milp import INF, MilpModel

    n = problem.n
    edges = np.asarray(problem.edges, dtype=np.int64).reshape(-1, 2)
    ec = np.asarray(problem.compute_energy, float)
    cm = CheckmateProblem(n, edges, ec, problem.sizes, problem.budget)
    model = MilpModel("poet")
    core = add_checkmate_core(model, cm, budget=problem.budget,
                              formulation=formulation or Formulation(), objective=False)
    R, S = core.R, core.S
    M = cm.sizes / core.mem_unit
    B_units = problem.budget / core.mem_unit
    md = cm.max_descendant
    e_unit = float(ec.sum()) if ec.sum() > 0 else 1.0
    ct = np.asarray(problem.compute_time, float)
    t_unit = float(ct.sum()) if ct.sum() > 0 else 1.0
    tS, iS = np.tril_indices(n, -1)
    eps = problem.eps / max(n, 1)

    if not problem.remat:  # R = I
        model.fix(R[tS, iS], 0.0)

    neg = np.full((n, n), -1, np.int64)
    S_aux, M_in, M_out, G = neg.copy(), neg.copy(), neg.copy(), neg.copy()
    if problem.paging and n > 1:
        live = md[iS] >= tS  # pruned (useless) entries get ub 0
        ub = live.astype(float)
        M_out[tS, iS] = model.add_vars("M_out", len(tS), 0.0, ub, integer=True)
        M_in[tS, iS] = model.add_vars("M_in", len(tS), 0.0, ub * (tS >= iS + 2), integer=True)
        S_aux[tS, iS] = model.add_vars("S_aux", len(tS), 0.0, ub * (tS >= iS + 2), integer=True)
        G[tS, iS] = model.add_vars("G", len(tS), 0.0, ub)
        k = len(tS)

        def pair_rows(a, b, hi, name, sa=1.0, sb=1.0, sel=None):
            sel = np.ones(k, bool) if sel is None else sel
            kk = int(sel.sum())
            model.add_rows_coo(np.r_[np.arange(kk), np.arange(kk)], np.r_[a[sel], b[sel]],
                               np.r_[np.full(kk, sa), np.full(kk, sb)], kk, -INF, hi, name=name)

        pair_rows(M_in[tS, iS], S_aux[tS, iS], 0.0, "poet_in_src", 1.0, -1.0)
        pair_rows(M_out[tS, iS], S[tS, iS], 0.0, "poet_out_src", 1.0, -1.0)
        pair_rows(M_in[tS, iS], S[tS, iS], 1.0, "poet_in_not_s")
        pair_rows(M_in[tS, iS], R[tS, iS], 1.0, "poet_in_not_r")
        pair_rows(G[tS, iS], M_out[tS, iS], 0.0, "poet_g_out", 1.0, -1.0)
        pair_rows(G[tS, iS], R[tS, iS], 1.0, "poet_g_r")
        nx = tS + 1 < n
        Snext = np.where(nx, S[np.minimum(tS + 1, n - 1), iS], -1)
        pair_rows(G[tS, iS], Snext, 1.0, "poet_g_s", sel=nx)
        # G + R[t, j] <= 1 for users j of i with j <= t
        src, dst = edges[:, 0], edges[:, 1]
        if len(edges):
            tj, ej = np.nonzero(np.arange(n)[:, None] >= dst[None, :])
            kk = len(tj)
            model.add_rows_coo(np.r_[np.arange(kk), np.arange(kk)],
                               np.r_[G[tj, src[ej]], R[tj, dst[ej]]], 1.0, kk, -INF, 1.0,
                               name="poet_g_users")
        # storage persistence: S_aux[t+1,i] - S_aux[t,i] - M_out[t,i] <= 0  (i < t < n-1)
        sel = nx
        kk = int(sel.sum())
        rr = np.arange(kk)
        model.add_rows_coo(np.r_[rr, rr, rr],
                           np.r_[S_aux[tS[sel] + 1, iS[sel]], S_aux[tS[sel], iS[sel]],
                                 M_out[tS[sel], iS[sel]]],
                           np.r_[np.ones(kk), -np.ones(kk), -np.ones(kk)], kk, -INF, 0.0,
                           name="poet_aux_carry")
        # S_aux[t+1, t] <= M_out[t, t] = 0: already ub 0 (tS >= iS + 2).
        # start rows: sum_i M_i S[t, i] <= B
        model.add_rows_coo(tS, S[tS, iS], M[iS], n, -INF, B_units, name="poet_start")
        # extend the core's rows
        carry = model.row_block("carry")  # tril_indices(n-1) order, rows (t, i), i <= t
        model.add_coefficients(carry[_tri_pos(tS[nx], iS[nx], False)], M_in[tS[nx], iS[nx]], -1.0)
        useful_s = model.row_block("useful_s")  # tril_indices(n, -1) order
        if len(useful_s):
            model.add_coefficients(useful_s[_tri_pos(tS, iS, True)], M_out[tS, iS], -1.0)
        mem = model.row_block("mem")  # tril_indices(n) order; row (t, 0)
        model.add_coefficients(mem[_tri_pos(tS, np.zeros_like(tS), False)], G[tS, iS], M[iS])
        front = model.row_block("frontier")  # one row per t < n-1
        if len(front):
            pm = np.zeros((n, n), bool)
            if len(edges):
                pm[dst, src] = True
            sel = nx & ~pm[tS, iS] & (M[iS] > 0)
            model.add_coefficients(front[tS[sel]], M_in[tS[sel], iS[sel]], -M[iS[sel]])
        # objective: paging energy + tie-break per move
        model.add_objective(M_in[tS, iS], np.asarray(problem.page_in_energy)[iS] / e_unit + eps)
        model.add_objective(M_out[tS, iS], np.asarray(problem.page_out_energy)[iS] / e_unit + eps)

    # objective: compute energy (eq. 2) + tie-break per recompute
    tR, iR = np.tril_indices(n)
    model.add_objective(R[tR, iR], ec[iR] / e_unit + eps * (tR > iR))
    # deadline (eq. 3)
    if problem.deadline is not None:
        cols, vals = [R[tR, iR]], [ct[iR] / t_unit]
        if problem.count_paging_time and problem.paging and n > 1:
            cols += [M_in[tS, iS], M_out[tS, iS]]
            vals += [np.asarray(problem.page_in_time)[iS] / t_unit,
                     np.asarray(problem.page_out_time)[iS] / t_unit]
        c = np.concatenate(cols)
        model.add_rows_coo(np.zeros(len(c), np.int64), c, np.concatenate(vals), 1, -INF,
                           problem.deadline / t_unit * (1 + 1e-9), name="poet_deadline")
    return model, PoetVars(core, S_aux, M_in, M_out, G, e_unit, t_unit), cm


def poet_vector(model, v: PoetVars, cm, R, S, M_in=None, M_out=None) -> np.ndarray:
    """A complete MILP vector for a schedule (warm start): ``R``, ``S`` and the page moves as
    given, ``S_aux`` = paged out in an earlier step, ``G``, ``FREE`` and ``U`` computed directly."""
    from solvers.checkmate import checkmate_vector

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
      time_limit, mip_gap, threads, backend: passed to :meth:`MilpModel.solve`.

    Returns:
      :class:`PoetSolution`; status ``infeasible`` (no schedule, arrays empty) is returned, not
      raised, so the caller can compute the smallest feasible budget.

    Raises:
      SolverTimeoutError: the time limit hit without an incumbent.
    """
    import math
    import time

    t0 = time.perf_counter()
    model, v, cm = build_poet(problem)
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
