r"""Compiled (numba) kernels of the persistent chain recursion (driver:
:mod:`solvers.chain_dp.compiled`).

Same recursion as :class:`solvers.chain_dp.numpy_dp.NumpyDP` (options 1-2 of
:mod:`solvers.chain_dp.exact`: run, hold, split at a first checkpoint ``j``; rotor's persistent
class, Beaumont et al. 2019; every ``j`` is tried, no cut), tabulated level by level:

* ``T[m, h, row]`` (``float32``, ``m = 0 .. Lv`` memory levels, ``row`` = state ``(a, k)``,
  numbered backward-node-major so that the right parts ``(j, k)``, ``j = a+1 ..``, of a state
  are adjacent); row 0 = finished (cost 0).
* ``Q[qoff[a + 1] + t - 1]`` = sweep cost ``c_{a+1} + .. + c_j`` plus the cheaper left part
  ``F(a, e(j) + 1, h', m)`` at the level being filled (``j = a + t``; it depends on ``(a, j)``
  only), rewritten every level.

A level ``m`` depends on itself (left parts, "run", "hold", right parts of a zero-size anchor)
and on lower levels (right parts at ``m - s_a``).  A state's split option is the min-reduction
``min_j Q[a, j] + T[m - s_a, h, (j, k)]`` over the first checkpoints whose sweep fits (the
running max ``SW``): ``≈ K³/3`` sums per level for ``remat.chain_graph``, 8.1·10¹⁰ at K = 1000
and 256 levels; states whose segment fits entirely at level ``m`` copy level ``m - 1``.  What
makes it fast, none of it changing a single bit of the table (``tests/test_chain_dp.py`` keeps
the scalar kernel this replaced and compares every entry):

* SIMD: the reduction is a 16-lane loop (``llvm.minnum``; numba's ``min`` is not vectorised,
  nor is a loop whose index may be negative); a min of sums each rounded once, in any order;
* one pass over ``Q[a, ·]`` for the ``h = 1`` and ``h = 0`` states (two sums per load);
* anchors in blocks of ``AB`` (their ``Q`` rows stay in L2 while every ``k`` runs over them);
* exact pruning (:func:`fill_cost`): block lower bounds select one contiguous range of first
  checkpoints per state, about 1 in 5 of them on the 1000-layer chain.

Timings: ``experiments/chain_dp_timing.py`` (``experiments/results/chain_dp_timing.csv``).

:func:`fill_mem` is the ``(min, max)`` recursion (the exact smallest budget, bytes, no levels),
where a split's sweep memory only grows with ``j``, so the scan over ``j`` stops once it
reaches the best value so far.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types, uint64
from numba.extending import intrinsic

INF32 = np.float32(np.inf)


@njit(cache=True)
def _bisect_le(arr, lo, hi, v):
    """Largest index ``i`` in ``[lo, hi)`` with ``arr[i] <= v`` (non-decreasing ``arr``), else ``lo - 1``."""
    if hi <= lo or arr[lo] > v:
        return lo - 1
    a, b = lo, hi - 1
    while a < b:
        mid = (a + b + 1) // 2
        if arr[mid] <= v:
            a = mid
        else:
            b = mid - 1
    return a


@intrinsic
def _fminnum(typingctx, a, b):
    """``llvm.minnum.f32(a, b)``: the smaller of two ``float32`` (tables hold no NaN); unlike
    numba's ``min`` it lets LLVM vectorise a min-reduction loop (16 lanes with AVX-512)."""
    sig = types.float32(types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
        fn = builder.module.declare_intrinsic("llvm.minnum", [ir.FloatType()], fnty)
        return builder.call(fn, args, fastmath=("nnan", "nsz", "reassoc"))

    return sig, codegen


#: first checkpoints per block of the pruning bounds (see :func:`fill_cost`)
BLK = 64
#: states with fewer blocks are scanned whole
NBMIN = 3
#: anchors per block of :func:`_level` (their rows of ``Q`` stay in the 1 MiB L2 cache)
AB = 128


# The reductions are written out inside _level (a helper taking arrays costs a call with every
# array's fields as arguments, and reference counting); they use llvm.minnum (16 lanes) and
# unsigned indices (a loop whose index may be negative is not vectorised).  A min of sums each
# rounded once, in any order: every value is bit-identical to a sequential scan.
@njit(cache=True)
def _level(m, K, M, s, g, s_ext, g_ext, cumc, bc, hi, lo, hi_eff, e, roff, jstart, jlist, qoff,
           SW, cs, pad, T, Q, boff, TB, QB, P, eps, st, zero):
    """Fill level ``m`` of ``T`` for the anchors ``a`` whose size is zero (``zero``) or not.

    Nonzero-size anchors read their right parts at lower levels and, at level ``m``, only
    their own states and left parts ``Q[a, ·]``: any order of them is valid.  A zero-size anchor
    reads the right parts ``(j > a, k)`` at level ``m`` itself: those run afterwards (a second
    call), ``a`` descending, never pruned (``TB[m]`` is incomplete then).  Per backward node
    ``k`` (descending) and anchor: copy, run, or split (both ``h`` in one pass), then hold
    (``h = 0``, it reads the state's ``h = 1`` value), then the left parts of anchor ``a``
    that end at ``k``.  ``st``: ``int64[4]`` counters (sums, bounds, pruned states)."""
    nr = T.shape[2]
    Tf = T.reshape(-1)  # flat views, made once per call
    nbk = TB.shape[2]
    TBf = TB.reshape(-1)
    nbj = QB.shape[0] // (K + 1)
    # anchors in blocks of AB whose left parts Q[a, ·] (<= AB rows of <= 4 KB) stay in cache
    # while every backward node k runs over them (any order of nonzero-size anchors is valid)
    for bh in range(K - 1, -2, -AB):
        bl = max(bh - AB + 1, -1)
        for k in range(M - 1, -1, -1):
            x = hi_eff[k]
            amax = min(roff[k + 1] - roff[k] - 2, bh)  # live anchors of k: a = -1 .. amax
            if amax < bl:
                continue
            # block minima of T + P of the rows written here, flushed into TB when the block
            # changes (a running minimum in memory would chain every state on the previous)
            cb = -1
            acc1 = np.inf
            acc0 = np.inf
            for a in range(amax, bl - 2, -1):
                b = (a + 1) // BLK
                if b != cb or a < bl:
                    if cb >= 0:
                        w = (m * 2 + 1) * nbk + boff[k] + cb
                        TBf[w] = min(TBf[w], acc1)
                        w = (m * 2) * nbk + boff[k] + cb
                        TBf[w] = min(TBf[w], acc0)
                    cb = b
                    acc1 = np.inf
                    acc0 = np.inf
                if a < bl:
                    break
                sa = s_ext[a + 1]
                if (sa == 0) != zero:
                    continue
                row = roff[k] + a + 1
                pa = P[a + 1]
                q0 = qoff[a + 1]
                pend1 = False
                pend0 = False
                n1 = 0
                n0 = 0
                hold_need = 0
                for h in (1, 0):
                    if h == 1 and not (x >= 0 and x > a):
                        continue
                    ti = (m * 2 + h) * nr + row
                    base = sa + g_ext[k] + (s[x] if h == 1 else 0)
                    top = base + pad + (cs[x + 1] - cs[a + 1] if x > a else 0)
                    if m > 0 and m > top:  # every value fits: F is constant from here on
                        v = Tf[ti - 2 * nr]
                        Tf[ti] = v
                        if h == 1:
                            acc1 = min(acc1, np.float64(v) + pa)
                        else:
                            acc0 = min(acc0, np.float64(v) + pa)
                        continue
                    runnable = True
                    if hi[k] >= 0:
                        if not (lo[k] == a or (h == 1 and lo[k] == x)):
                            runnable = False
                        if not (hi[k] == a or (h == 1 and hi[k] == x)):
                            runnable = False
                    if runnable:
                        best = INF32
                        if m >= base + g[k]:
                            rn = roff[k + 1] + a + 1 if (k + 1 < M and k + 1 <= e[a + 1]) else 0
                            v = T[m, 0, rn]
                            keep = (h == 1 and k + 1 < M and k + 1 <= e[a + 1] and x > a
                                    and hi_eff[k + 1] == x)
                            if keep and T[m, 1, rn] < v:
                                v = T[m, 1, rn]
                            best = v + np.float32(bc[k])
                        Tf[ti] = best
                        if h == 1:
                            acc1 = min(acc1, np.float64(best) + pa)
                        else:
                            acc0 = min(acc0, np.float64(best) + pa)
                        continue
                    jmax = x - 1 if h == 1 else x
                    jtop = min(jmax, x - 1)
                    n = 0
                    if jtop > a and m >= sa:
                        # first checkpoints j = a + 1 .. a + n whose sweep fits in m
                        if SW[q0 + jtop - a - 1] <= m - base:  # all of them (usual case)
                            n = jtop - a
                        else:
                            n = _bisect_le(SW, q0, q0 + jtop - a, m - base) - q0 + 1
                    if h == 1:
                        pend1, n1 = True, n
                    else:
                        pend0, n0 = True, n
                        hold_need = base + SW[q0 + jmax - a - 1]
                # split: min_j Q[a, j] + T[m - s_a, h, (j, k)], both h in one pass
                c1 = INF32
                c0 = INF32
                i0 = a + 2  # entry of the right part (a + 1, k) in the rows of k
                b0 = i0 // BLK
                nb = (i0 + n1 - 1) // BLK - b0 + 1
                if pend1 and pend0 and n1 == n0 and nb >= NBMIN and m > 0 and sa > 0:
                    # exact pruning (see fill_cost): scan only the range of blocks whose
                    # lower bound does not exceed the state's value one level lower
                    tp1 = Tf[(m * 2 - 1) * nr + row]
                    tp0 = Tf[(m * 2 - 2) * nr + row]
                    cut1 = np.float64(tp1) + eps
                    cut0 = np.float64(tp0) + eps
                    lv0 = (m - sa) * 2
                    qb = uint64((a + 1) * nbj + b0)
                    tb0 = uint64(lv0 * nbk + boff[k] + b0)
                    tb1 = tb0 + uint64(nbk)
                    ulo = nb
                    uhi = -1
                    for u in range(nb):
                        uu = uint64(u)
                        qv = QB[qb + uu]
                        keep = (qv + TBf[tb1 + uu] <= cut1) | (qv + TBf[tb0 + uu] <= cut0)
                        ulo = min(ulo, u if keep else nb)
                        uhi = max(uhi, u if keep else -1)
                    st[1] += nb
                    st[2] += 1
                    if ulo <= uhi:
                        t0 = max(0, (b0 + ulo) * BLK - i0)
                        t1 = min(n1, (b0 + uhi + 1) * BLK - i0)
                        r0 = (lv0 * nr) + roff[k] + a + 2 + t0
                        qq = uint64(q0 + t0)
                        ra = uint64(r0)
                        rb = uint64(r0 + nr)
                        st[0] += 2 * (t1 - t0)
                        for t in range(uint64(t1 - t0)):
                            qv = Q[qq + t]
                            c1 = _fminnum(c1, qv + Tf[rb + t])
                            c0 = _fminnum(c0, qv + Tf[ra + t])
                    c1 = min(c1, tp1)
                    c0 = min(c0, tp0)
                elif n1 > 0 or n0 > 0:
                    r0 = ((m - sa) * 2) * nr + roff[k] + a + 2  # (a + 1, k) at level m - s_a
                    qq = uint64(q0)
                    ra = uint64(r0)
                    rb = uint64(r0 + nr)
                    nn = min(n1, n0)
                    st[0] += n1 + n0
                    for t in range(uint64(nn)):
                        qv = Q[qq + t]
                        c1 = _fminnum(c1, qv + Tf[rb + t])
                        c0 = _fminnum(c0, qv + Tf[ra + t])
                    for t in range(uint64(nn), uint64(n1)):
                        c1 = _fminnum(c1, Q[qq + t] + Tf[rb + t])
                    for t in range(uint64(nn), uint64(n0)):
                        c0 = _fminnum(c0, Q[qq + t] + Tf[ra + t])
                if pend1:
                    T[m, 1, row] = c1
                    acc1 = min(acc1, np.float64(c1) + pa)
                if pend0:
                    if m >= hold_need:  # hold v_x (sweep up to it), then the h = 1 state
                        v = T[m, 1, row] + np.float32(cumc[x + 1] - cumc[a + 1])
                        if v < c0:
                            c0 = v
                    T[m, 0, row] = c0
                    acc0 = min(acc0, np.float64(c0) + pa)
                # left parts of anchor a that end at k: j with e(j) + 1 == k
                for ii in range(jstart[k], jstart[k + 1]):
                    j = jlist[ii]
                    if j <= a:
                        continue
                    v = T[m, 0, row]
                    if hi_eff[k] == j and x > a and T[m, 1, row] < v:
                        v = T[m, 1, row]
                    v = v + np.float32(cumc[j + 1] - cumc[a + 1])
                    Q[qoff[a + 1] + j - a - 1] = v
                    w = (a + 1) * nbj + (j + 1) // BLK
                    QB[w] = min(QB[w], np.float64(v) - P[j + 1])
    return 0


@njit(cache=True)
def fill_cost(K, M, Lv, s, g, s_ext, g_ext, cumc, bc, hi, lo, hi_eff, e, roff, jstart, jlist,
              qoff, SW, cs, pad, T, Q, boff, TB, QB0, QB, P, eps, stats):
    """Fill ``T[0 .. Lv]`` (see the module docstring), one thread; returns 0.

    Pruning tables (``float64``, cost units): ``TB[m, h, boff[k] + (a + 1) // BLK]`` = minimum
    of ``T[m, h, (a, k)] + P[a + 1]`` over a block of ``BLK`` anchors, ``+inf`` until written;
    ``QB[(a + 1) * nbj + (j + 1) // BLK]`` = minimum of ``Q(a, j) - P[j + 1]`` over the block
    at the level being filled, reset to ``QB0`` (the entries no level rewrites) each level.
    ``P[j + 1] = 2·(c_0 + .. + c_j) - (bc_0 + .. + bc_{e(j)})``, a potential that makes
    ``T + P`` nearly flat along a state's right parts (its cost falls by about ``2·c_j + bc``
    per layer), so ``QB + TB`` is close to a block's true minimum of ``Q + T``.

    Exactness: every entry is non-increasing in ``m``, in ``float32`` too (options only gain
    feasibility with ``m``, their inputs are non-increasing by induction, rounding is
    monotone), so ``tprev = T[m - 1, h, row]`` bounds the state from above.  A block whose
    bound exceeds ``tprev + eps`` (``eps`` > the ``float64`` rounding of the bound) holds only
    sums whose real value exceeds ``tprev``, so ``float32`` values ``>= tprev``; the state
    scans the one range from the first to the last block kept for either ``h`` and takes
    ``min(scanned, tprev)``: if a skipped block held a smaller value than every scanned one,
    that value is ``>= tprev`` and the state's value is ``<= tprev``.  ``stats``: ``int64[1,
    4]``, summed counters of :func:`_level`."""
    for m in range(Lv + 1):
        QB[:] = QB0
        for zero in (False, True):
            _level(m, K, M, s, g, s_ext, g_ext, cumc, bc, hi, lo, hi_eff, e, roff, jstart, jlist,
                   qoff, SW, cs, pad, T, Q, boff, TB, QB, P, eps, stats[0], zero)
    return 0


@njit(cache=True)
def fill_mem(K, M, s, g, s_ext, g_ext, hi, lo, hi_eff, e, roff, jstart, jlist, qoff, SW, T, Q):
    """The ``(min, max)`` recursion: ``T[h, row]`` = least peak (bytes, float64) of each state."""
    for k in range(M - 1, -1, -1):
        x = hi_eff[k]
        for a in range(K - 1, -2, -1):
            if k > e[a + 1]:
                continue
            row = roff[k] + a + 1
            sa = s_ext[a + 1]
            for h in (1, 0):
                if h == 1 and not (x >= 0 and x > a):
                    continue
                base = sa + g_ext[k] + (s[x] if h == 1 else 0)
                best = np.inf
                runnable = True
                if hi[k] >= 0:
                    if not (lo[k] == a or (h == 1 and lo[k] == x)):
                        runnable = False
                    if not (hi[k] == a or (h == 1 and hi[k] == x)):
                        runnable = False
                if runnable:
                    rn = roff[k + 1] + a + 1 if (k + 1 < M and k + 1 <= e[a + 1]) else 0
                    v = T[0, rn]
                    keep = (h == 1 and k + 1 < M and k + 1 <= e[a + 1] and x > a
                            and hi_eff[k + 1] == x)
                    if keep and T[1, rn] < v:
                        v = T[1, rn]
                    T[h, row] = max(v, float(base + g[k]))
                    continue
                jmax = x - 1 if h == 1 else x
                q0 = qoff[a + 1]
                if h == 0:
                    best = max(float(base + SW[q0 + jmax - a - 1]), T[1, row])
                jtop = min(jmax, x - 1)
                r0 = roff[k] + a + 2
                for t in range(jtop - a):
                    need = float(base + SW[q0 + t])
                    if need >= best:  # the sweep only grows with j
                        break
                    v = max(need, max(T[h, r0 + t] + sa, Q[q0 + t]))
                    if v < best:
                        best = v
                T[h, row] = best
            for ii in range(jstart[k], jstart[k + 1]):
                j = jlist[ii]
                if j <= a:
                    continue
                v = T[0, row]
                if hi_eff[k] == j and x > a and T[1, row] < v:
                    v = T[1, row]
                Q[qoff[a + 1] + j - a - 1] = v
    return 0
