"""Exhaustive reference for tiny POET instances, written independently of the MILP.

It enumerates every schedule with the frontier-advancing structure (step t computes node t and
any subset of earlier nodes), every carried set, page-out set and page-in set, replaying the
memory rules of :mod:`remat.core.schedule` by hand (page-out at the step start, page-in at the step
end, frees after a value's last reader in the step).  A dynamic programme over states
``(step, resident set, storage set)`` keeps the Pareto front of (time, energy) so a deadline can
be imposed.  Exponential: only for graphs of at most ~6 nodes.
"""

from __future__ import annotations

import itertools


def _subsets(items):
    items = list(items)
    for r in range(len(items) + 1):
        yield from itertools.combinations(items, r)


def brute_force_energy(
    n,
    edges,
    sizes,
    e_compute,
    t_compute,
    e_in,
    e_out,
    budget,
    *,
    deadline=None,
    paging=True,
    remat=True,
    t_in=None,
    t_out=None,
):
    """Minimum total energy (joules) of a legal schedule, or ``None`` when none fits.

    Args are plain lists: ``sizes[i]`` bytes, ``e_compute[i]``/``t_compute[i]`` per execution,
    ``e_in[i]``/``e_out[i]`` per page move, ``budget`` bytes, ``deadline`` seconds (compute time,
    plus page time when ``t_in``/``t_out`` are given).
    """
    preds = [[s for s, d in edges if d == k] for k in range(n)]
    # states: (S frozenset, A frozenset) -> list of (time, energy) Pareto labels
    states = {(frozenset(), frozenset()): [(0.0, 0.0)]}
    for t in range(n):
        new_states: dict = {}
        for (S, A), labels in states.items():
            if sum(sizes[i] for i in S) > budget:
                continue
            earlier = [i for i in range(t) if i not in S] if remat else []
            for extra in _subsets(earlier):
                comp = sorted(extra + (t,))
                if not all(all(p in S or p in comp[: comp.index(k)] for p in preds[k]) for k in comp):
                    continue
                pos = {k: j for j, k in enumerate(comp)}
                m = len(comp)
                alive_end = sorted(set(S) | set(comp))
                outs = list(_subsets(sorted(S - A))) if paging else [()]
                for keep in _subsets(alive_end):
                    if t == n - 1 and keep:
                        continue
                    keep_s = set(keep)
                    # per-event live bytes
                    ok = True
                    for j in range(m):
                        live = 0
                        for v in alive_end:
                            start = -1 if v in S else pos[v]
                            uses = [pos[k] for k in comp if v in preds[k]]
                            end = m if v in keep_s else max(uses + ([pos[v]] if v in pos else [-1]))
                            if start <= j <= end:
                                live += sizes[v]
                        if live > budget:
                            ok = False
                            break
                    if not ok:
                        continue
                    ec = sum(e_compute[k] for k in comp)
                    tc = sum(t_compute[k] for k in comp)
                    ins = list(_subsets(sorted(A - keep_s))) if paging else [()]
                    for po in outs:
                        for pi in ins:
                            if t == n - 1 and pi:
                                continue
                            e = ec + sum(e_out[i] for i in po) + sum(e_in[i] for i in pi)
                            dt = tc
                            if t_in is not None:
                                dt += sum(t_out[i] for i in po) + sum(t_in[i] for i in pi)
                            key = (frozenset(keep_s | set(pi)), frozenset(A | set(po)))
                            lst = new_states.setdefault(key, [])
                            for tm, en in labels:
                                lst.append((tm + dt, en + e))
        states = {k: _pareto(v, deadline) for k, v in new_states.items()}
        states = {k: v for k, v in states.items() if v}
    best = [en for labels in states.values() for _, en in labels]
    return min(best) if best else None


def _pareto(labels, deadline):
    if deadline is not None:
        labels = [x for x in labels if x[0] <= deadline * (1 + 1e-9)]
    if deadline is None:
        return [min(labels, key=lambda x: x[1])] if labels else []
    labels.sort()
    out, best = [], float("inf")
    for tm, en in labels:
        if en < best - 1e-15:
            out.append((tm, en))
            best = en
    return out
