r"""Plan reconstruction of the persistent chain recursion, shared by its two table back ends.

The persistent recursion is options 1-2 of :mod:`solvers.chain_dp.exact` (run, hold, split at a
first checkpoint ``j``; rotor's class, Beaumont et al. 2019).  :mod:`solvers.chain_dp.numpy_dp`
and :mod:`solvers.chain_dp.compiled` store its table differently; :class:`ScheduleEmitter` walks
either one back from the top state ``(a, k, h) = (-1, 0, 0)`` to an op sequence (``("f", j)``,
``("b", k)``).
"""

from __future__ import annotations

import abc

import numpy as np

from remat.core.errors import SolverError
from solvers.chain_dp.problem import INF


class ScheduleEmitter(abc.ABC):
    """Plan reconstruction shared by the table back ends
    (:class:`solvers.chain_dp.numpy_dp.NumpyDP`, numpy, and
    :class:`solvers.chain_dp.compiled.CompiledDP`, numba): a subclass provides ``tb``
    (:class:`~solvers.chain_dp.problem.Tables`), ``mode`` (``"mem"``/``"cost"``), ``bc``
    (``float64[M]`` backward costs), :meth:`value` and :meth:`split_entries` (how its table
    stores a split's right and left parts)."""

    label = "ChainDP"

    @abc.abstractmethod
    def split_entries(self, a: int, k: int, h: int, js: np.ndarray, kk: np.ndarray,
                      mlev: int, sa: int, cost: bool
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(right, left without x, left keeping x)`` table values of the splits of state
        ``(a, k, h)`` at first checkpoints ``js`` (``INF`` where not allowed)."""

    def emit(self, a: int, k: int, h: int, mlev: int, ops: list) -> None:
        """Append the schedule of state ``(a, k, h)`` at memory level ``mlev`` (cost mode) or
        of least peak (mem mode) to ``ops``; first cheapest option in the order run, hold,
        split by ``j``, re-evaluated in float64."""
        tb, cost = self.tb, self.mode == "cost"

        def val(a_, k_, h_, lev):
            if cost and lev < 0:
                return INF
            return self.value(a_, k_, h_, lev)

        while k < tb.M and k <= tb.e[a + 1]:
            x = int(tb.hi_eff[k])
            base = int(tb.s_ext[a + 1] + tb.g_ext[k] + (tb.s[x] if h else 0))
            held = {a} | ({x} if h else set())
            sa = int(tb.s_ext[a + 1])
            cands = []  # (value, kind, data)
            if set(tb.need(k)) <= held:
                need = base + int(tb.g[k])
                for hp in [0] + ([1] if h and tb.keepable(a, k + 1, x) else []):
                    c = val(a, k + 1, hp, mlev)
                    v = (self.bc[k] + c if need <= mlev else INF) if cost else max(need, c)
                    cands.append((v, "run", hp))
            else:
                sw = base + tb.sweep_mem(a, x)
                if not h:
                    c = val(a, k, 1, mlev)
                    v = ((tb.cumc[x + 1] - tb.cumc[a + 1] + c) if sw[-1] <= mlev else INF) \
                        if cost else max(int(sw[-1]), c)
                    cands.append((v, "hold", x))
                if x - a >= 2:  # every first checkpoint j
                    js = np.arange(a + 1, x)
                    kk = tb.e[js + 1] + 1
                    r, l0, l1 = self.split_entries(a, k, h, js, kk, mlev, sa, cost)
                    lft = np.minimum(l0, l1)
                    swj = sw[: len(js)]
                    if cost:
                        v = np.where(swj <= mlev, tb.cumc[js + 1] - tb.cumc[a + 1] + r + lft, INF)
                    else:
                        v = np.maximum(np.maximum(swj, r + sa), lft)
                    i = int(np.argmin(v))
                    cands.append((float(v[i]), "split", (int(js[i]), int(l1[i] < l0[i]))))
            v, kind, dat = min(cands, key=lambda c: c[0])
            if not np.isfinite(v):
                raise SolverError(f"{self.label}: no schedule at this memory level (bug)")
            if kind == "run":
                ops.append(("b", k))
                k, h = k + 1, dat
            elif kind == "hold":
                ops.extend(("f", i) for i in range(a + 1, x + 1))
                h = 1
            else:
                j, hp = dat
                ops.extend(("f", i) for i in range(a + 1, j + 1))
                self.emit(j, k, h, mlev - sa if cost else 0, ops)
                k, h = int(tb.e[j + 1]) + 1, hp
