r"""Compiled (numba) kernels of the persistent chain recursion of :mod:`solvers.chain_dp`.

Same recursion as :class:`solvers.chain_dp_fast._FastDP` (options 1-2 of the
:mod:`solvers.chain_dp` docstring: run, hold, split at a first checkpoint ``j``; every ``j`` is
tried, no cut), tabulated level by level so that each step reads memory that is in cache:

* ``T[m, h, row]`` (``float32``, ``m = 0 .. Lv`` memory levels, ``row`` = state ``(a, k)``,
  numbered backward-node-major so that the right parts ``(j, k)``, ``j = a+1 ..``, of a state
  are adjacent); row 0 = finished (cost 0).
* ``Q[qoff[a + 1] + t - 1]`` = sweep cost ``c_{a+1} + .. + c_j`` plus the cheaper left part
  ``F(a, e(j) + 1, h', m)`` at the level being filled (``j = a + t``; it depends on ``(a, j)``
  only), rewritten every level.

A level ``m`` depends on itself (left parts, "run", "hold", right parts of a zero-size anchor)
and on lower levels (right parts at ``m - s_a``); inside a level the states run in the order of
the exact recursion (``k`` descending, then ``a`` descending, ``h = 1`` before ``h = 0``).  Each
state's split option is one contiguous min-reduction ``min_j Q[a, j] + T[m - s_a, h, (j, k)]``
over the first checkpoints whose sweep fits (``j <= jlim(m)``, a binary search in the
precomputed running max ``SW``).  Work: ``Σ_states (d - 1)`` element operations per level
(``d = x - a``), ``≈ K³/3`` per level for ``remat.chain_graph`` (both ``h``), the same count as
the numpy path but in cache; states whose segment fits entirely at level ``m`` copy level
``m - 1`` (their cost cannot fall further).  :func:`fill_mem` is the ``(min, max)`` recursion
(the exact smallest budget, bytes, no levels), where a split's sweep memory only grows with
``j``, so the scan over ``j`` stops once it reaches the best value so far.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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


# no "ninf": the tables hold +inf (infeasible levels)
@njit(cache=True, fastmath={"nnan", "nsz", "reassoc", "arcp", "contract"})
def _min_sum(Q, q0, Tr, r0, n, best):
    """``min(best, min_t Q[q0 + t] + Tr[r0 + t])`` over ``t < n`` (vectorised reduction)."""
    for t in range(n):
        v = Q[q0 + t] + Tr[r0 + t]
        best = min(best, v)
    return best


@njit(cache=True)
def fill_cost(K, M, Lv, s, g, s_ext, g_ext, cumc, bc, hi, lo, hi_eff, e, roff, jstart, jlist,
              qoff, SW, cs, pad, T, Q):
    """Fill ``T[0 .. Lv]`` (see the module docstring); returns 0, or 1 on an ordering error."""
    for m in range(Lv + 1):
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
                    top = base + pad + (cs[x + 1] - cs[a + 1] if x > a else 0)
                    if m > 0 and m > top:  # every value fits: F is constant from here on
                        T[m, h, row] = T[m - 1, h, row]
                        continue
                    best = INF32
                    runnable = True
                    if hi[k] >= 0:
                        if not (lo[k] == a or (h == 1 and lo[k] == x)):
                            runnable = False
                        if not (hi[k] == a or (h == 1 and hi[k] == x)):
                            runnable = False
                    if runnable:
                        if m >= base + g[k]:
                            rn = roff[k + 1] + a + 1 if (k + 1 < M and k + 1 <= e[a + 1]) else 0
                            v = T[m, 0, rn]
                            keep = (h == 1 and k + 1 < M and k + 1 <= e[a + 1] and x > a
                                    and hi_eff[k + 1] == x)
                            if keep and T[m, 1, rn] < v:
                                v = T[m, 1, rn]
                            best = v + np.float32(bc[k])
                        T[m, h, row] = best
                        continue
                    jmax = x - 1 if h == 1 else x
                    q0 = qoff[a + 1]
                    if h == 0 and m >= base + SW[q0 + jmax - a - 1]:  # hold v_x
                        v = T[m, 1, row] + np.float32(cumc[x + 1] - cumc[a + 1])
                        if v < best:
                            best = v
                    jtop = min(jmax, x - 1)
                    if jtop > a and m >= sa:
                        # first checkpoints j = a + 1 .. jl whose sweep fits in m
                        tl = _bisect_le(SW, q0, q0 + jtop - a, m - base) - q0  # t - 1
                        if tl >= 0:
                            r0 = roff[k] + a + 2  # row of (a + 1, k)
                            best = _min_sum(Q, q0, T[m - sa, h], r0, tl + 1, best)
                    T[m, h, row] = best
                # left parts of anchor a that end at k: j with e(j) + 1 == k
                for ii in range(jstart[k], jstart[k + 1]):
                    j = jlist[ii]
                    if j <= a:
                        continue
                    v = T[m, 0, row]
                    if hi_eff[k] == j and x > a and T[m, 1, row] < v:
                        v = T[m, 1, row]
                    Q[qoff[a + 1] + j - a - 1] = v + np.float32(cumc[j + 1] - cumc[a + 1])
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
