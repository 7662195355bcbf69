"""Replay of a plan's memory behaviour, step by step (the semantics in :mod:`remat.plan`).

This is the one place where the memory model lives: :func:`remat.simulate` reports from it,
:meth:`Plan.validate` checks legality with it, and the executor follows the same rules.
It deliberately shares no code with the MILP builders in :mod:`solvers`.

Paging (POET plans, Patil et al. 2022, restated constraints of ``notes/seeds-poet-olla.md``
A.5/A.6).  Only device memory is counted; ``S_aux`` (secondary storage) costs nothing.

* ``page_out[t, i]`` happens at the *start* of step ``t``, before any compute of the step, and
  needs ``S[t, i]`` (POET's ``M_out <= S_RAM``).  It copies the value to storage and does not
  change its device residency: the value then lives and is freed by the ordinary rules (freed
  once no later node of step t reads it, unless it is carried in ``S[t+1]``).
* ``page_in[t, i]`` happens at the *end* of step ``t``, after its last compute and frees, and
  needs ``S_aux[t, i]`` (POET's ``M_in <= S_aux``): the value is usable from step ``t+1``
  (``S[t+1] <= S[t] + R[t] + M_in[t]``).  Its bytes are counted from step ``t+1``'s start.
* ``S_aux[t+1] <= S_aux[t] + page_out[t]``; ``S_aux[0]`` is empty.  When a plan carries no
  ``S_aux``, storage holds every value paged out in an earlier step.

With these timings paging never changes the bytes live during a step's computes, so the peak is
still ``max(step-start bytes, per-event live bytes)`` over device memory, which is exactly the
POET MILP's ``U`` (Checkmate's memory rows) with ``M_in``/``M_out`` only in persistence rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from remat.errors import InvalidPlanError


@dataclasses.dataclass(frozen=True)
class Replay:
    """What happens when a plan runs.

    Attributes:
      step: ``int64[E]`` step of each compute event (events in execution order).
      node: ``int64[E]`` node run by each event.
      live_bytes: ``int64[E]`` device bytes resident while the event's node runs, its own
        output included (Checkmate's ``U[t, k]``).
      step_start_bytes: ``int64[T]`` bytes resident entering each step (``S[t] @ sizes``).
      peak_bytes: max over events and step starts.
    """

    step: np.ndarray
    node: np.ndarray
    live_bytes: np.ndarray
    step_start_bytes: np.ndarray
    peak_bytes: int


def replay(graph, plan, *, strict: bool = True) -> Replay:
    """Replay ``plan`` on ``graph`` (see :mod:`remat.plan` for the semantics).

    Args:
      strict: raise :class:`InvalidPlanError` on an illegal plan (missing input, carrying a value
        that is not resident).  With ``strict=False`` the memory is reported as if legal.
    """
    R, S = plan.R, plan.S
    T, n = R.shape
    if n != graph.n:
        raise InvalidPlanError(f"plan has {n} columns, graph has {graph.n} nodes")
    sizes = graph.sizes
    e = graph.edge_array
    src, dst = e[:, 0], e[:, 1]
    S_aux = plan.S_aux if plan.S_aux is not None else np.zeros_like(S)
    page_in = plan.page_in if plan.page_in is not None else np.zeros_like(S)
    page_out = plan.page_out if plan.page_out is not None else np.zeros_like(S)

    if plan.S_aux is None:  # storage holds everything paged out in an earlier step
        S_aux = np.zeros_like(S)
        if T > 1:
            S_aux[1:] = np.logical_or.accumulate(page_out, axis=0)[:-1]
    if strict and S[0].any():
        i = int(np.flatnonzero(S[0])[0])
        raise InvalidPlanError("an output is resident before anything ran", step=0, node=graph.nodes[i].name)
    if strict:
        _check_paging(graph, S, S_aux, page_in, page_out)

    steps, nodes, lives = [], [], []
    start_bytes = S.astype(np.int64) @ sizes
    for t in range(T):
        comp = np.flatnonzero(R[t])
        m = len(comp)
        pos = np.full(n, -2, dtype=np.int64)  # position of each node's compute in this step
        pos[comp] = np.arange(m)
        resident0 = S[t]  # page-ins of step t land at its end (counted in S[t + 1])
        if strict:
            # every input of a computed node must be resident or computed earlier this step
            need = R[t, dst]
            ok = resident0[src] | (R[t, src] & (pos[src] < pos[dst]))
            bad = np.flatnonzero(need & ~ok)
            if len(bad):
                s_, d_ = int(src[bad[0]]), int(dst[bad[0]])
                raise InvalidPlanError(
                    f"input {graph.nodes[s_].name!r} is not resident", step=t, node=graph.nodes[d_].name
                )
            if t + 1 < T:
                carried = S[t + 1] & ~(resident0 | R[t]) & ~page_in[t]
                if carried.any():
                    i = int(np.flatnonzero(carried)[0])
                    raise InvalidPlanError(
                        "output carried into the next step without being resident",
                        step=t + 1,
                        node=graph.nodes[i].name,
                    )
        if m == 0:
            continue
        # alive interval [start, end] in positions; -1 = from the step start, m = to the end
        start = np.where(resident0, -1, np.where(pos >= 0, pos, m + 1))
        last_use = np.full(n, -1, dtype=np.int64)
        reads = R[t, dst]
        np.maximum.at(last_use, src[reads], pos[dst[reads]])
        end = np.maximum(last_use, np.where(pos >= 0, pos, -1))
        # a value carried into step t+1 stays to the end (a page-in alone does not count here)
        nxt = S[t + 1] & (resident0 | R[t]) if t + 1 < T else np.zeros(n, dtype=bool)
        end = np.where(nxt, m, end)
        alive = start <= end
        diff = np.zeros(m + 3, dtype=np.int64)
        idx = np.flatnonzero(alive)
        np.add.at(diff, np.clip(start[idx], -1, m) + 1, sizes[idx])
        np.add.at(diff, np.clip(end[idx], -1, m) + 2, -sizes[idx])
        level = np.cumsum(diff)  # level[p + 1] = bytes alive at position p
        live = level[np.arange(m) + 1]
        steps.append(np.full(m, t, dtype=np.int64))
        nodes.append(comp.astype(np.int64))
        lives.append(live)
    live_all = _cat(lives)
    peak = int(max(live_all.max(initial=0), start_bytes.max(initial=0)))
    return Replay(_cat(steps), _cat(nodes), live_all, start_bytes, peak)


def _check_paging(graph, S, S_aux, page_in, page_out) -> None:
    """Raise :class:`InvalidPlanError` unless the paging matrices obey POET's rules:
    ``page_out <= S``, ``page_in <= S_aux``, ``S_aux[0] = 0``,
    ``S_aux[t+1] <= S_aux[t] + page_out[t]`` (all ``bool[T, n]``)."""

    def fail(mask, msg, shift=0):
        t, i = (int(v[0]) for v in np.nonzero(mask))
        raise InvalidPlanError(msg, step=t + shift, node=graph.nodes[i].name)

    if (page_out & ~S).any():
        fail(page_out & ~S, "page-out of a value not resident at the step start")
    if (page_in & ~S_aux).any():
        fail(page_in & ~S_aux, "page-in of a value not in secondary storage")
    if S_aux[0].any():
        fail(S_aux[:1], "a value is in secondary storage before anything ran")
    grow = S_aux[1:] & ~(S_aux[:-1] | page_out[:-1])
    if grow.any():
        fail(grow, "value in secondary storage without a page-out", shift=1)


def _cat(xs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)
