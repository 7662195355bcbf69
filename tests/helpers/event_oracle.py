"""An independent oracle for the event program (:mod:`remat.core.events`).

:func:`oracle_run` is a deliberately plain Python interpreter of the rules written in
:mod:`remat.core.plan` and :mod:`remat.core.schedule` (sets and loops, no numpy, no code shared
with ``remat.events``).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class OracleResult:
    legal: bool
    compute_live: list  # bytes while each compute runs, in execution order
    step_start: list  # bytes entering each step
    peak: int


def oracle_run(n, sizes, edges, R, S, page_in=None, page_out=None, S_aux=None) -> OracleResult:
    """Run a schedule by the written rules, as if legal, noting whether any rule was broken.

    Entering step t the live set is S[t] (a value of S[t] that was not live breaks a rule, and is
    made live anyway).  Page-outs at the step start need S[t, i].  Nodes of R[t] run in index
    order and need their inputs live (a missing input breaks a rule and is not read).  A live
    value is dropped at the step start and after each node once no remaining node of the step
    reads or recomputes it, unless S[t+1] keeps it.  Page-ins at the step end need the value in
    storage, and make it live when S[t+1] keeps it.
    """
    T = len(R)
    preds = {j: [s for s, d in edges if d == j] for j in range(n)}
    S_next = [list(S[t + 1]) if t + 1 < T else [False] * n for t in range(T)]
    legal = True
    live: set = set()
    stored: set = set()  # values paged out in an earlier step (when no S_aux is given)
    compute_live, step_start = [], []
    for t in range(T):
        want = {i for i in range(n) if S[t][i]}
        if want - live:
            legal = False
        live = set(want)
        step_start.append(sum(sizes[i] for i in live))
        if S_aux is not None:
            have = {i for i in range(n) if S_aux[t][i]}
            if t == 0 and have:
                legal = False
            if t > 0 and not have <= {i for i in range(n) if S_aux[t - 1][i] or page_out[t - 1][i]}:
                legal = False
        else:
            have = set(stored)
        outs = [i for i in range(n) if page_out is not None and page_out[t][i]]
        if any(i not in live for i in outs):
            legal = False
        order = [k for k in range(n) if R[t][k]]
        keep = S_next[t]

        def still_wanted(i, rest, keep=keep):
            return keep[i] or any(k == i or i in preds[k] for k in rest)

        live = {i for i in live if still_wanted(i, order)}
        for p, k in enumerate(order):
            if any(j not in live for j in preds[k]):
                legal = False
            live.add(k)
            compute_live.append(sum(sizes[i] for i in live))
            live = {i for i in live if still_wanted(i, order[p + 1 :])}
        for i in range(n):
            if page_in is not None and page_in[t][i]:
                if i not in have:
                    legal = False
                if S_next[t][i]:
                    live.add(i)
        stored |= set(outs)
    peak = max(compute_live + step_start + [0])
    return OracleResult(legal, compute_live, step_start, peak)


def oracle_peak(g, plan) -> int:
    """The peak bytes of a legal ``plan`` on the graph ``g`` by :func:`oracle_run` (the written
    rules, no code shared with :mod:`remat.core.events`, which ``remat.simulate``, the policies'
    ``meta["peak_bytes"]`` and the executor's bookkeeping all fold)."""
    mats = [None if m is None else m.tolist() for m in (plan.page_in, plan.page_out, plan.S_aux)]
    ref = oracle_run(g.n, g.sizes.tolist(), g.edge_array.tolist(), plan.R.tolist(),
                     plan.S.tolist(), *mats)
    assert ref.legal, "the oracle finds the plan illegal"
    return ref.peak


def hand_compute_cost(g, plan) -> float:
    """The compute cost of ``plan`` by hand: every computation ``R[t][i]`` costs node ``i``'s
    ``time_s`` (plain Python over the nodes, not :func:`remat.simulate`)."""
    return sum(node.time_s * sum(bool(row[i]) for row in plan.R.tolist())
               for i, node in enumerate(g.nodes))


def oracle_schedule_peak(problem, R, S) -> int:
    """:func:`oracle_peak` of a schedule ``(R, S)`` of a :class:`solvers.checkmate.CheckmateProblem`
    (what ``solvers.checkmate.problem.schedule_memory`` and a solution's ``peak_bytes`` report
    through the event program)."""
    ref = oracle_run(problem.n, [int(b) for b in problem.sizes],
                     [(int(a), int(b)) for a, b in problem.edges],
                     [[bool(x) for x in row] for row in R], [[bool(x) for x in row] for row in S])
    assert ref.legal, "the oracle finds the schedule illegal"
    return ref.peak
