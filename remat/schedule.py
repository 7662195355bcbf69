"""Replay of a plan's memory behaviour, step by step (the semantics in :mod:`remat.plan`).

This is the one place where the memory model lives: :func:`remat.simulate` reports from it,
:meth:`Plan.validate` checks legality with it, and the executor follows the same rules.
It deliberately shares no code with the MILP builders in :mod:`solvers`.
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

    if strict and S[0].any() and not (page_in[0] | S_aux[0]).any():
        i = int(np.flatnonzero(S[0])[0])
        raise InvalidPlanError("an output is resident before anything ran", step=0, node=graph.nodes[i].name)

    steps, nodes, lives = [], [], []
    start_bytes = S.astype(np.int64) @ sizes
    for t in range(T):
        comp = np.flatnonzero(R[t])
        m = len(comp)
        pos = np.full(n, -2, dtype=np.int64)  # position of each node's compute in this step
        pos[comp] = np.arange(m)
        resident0 = S[t] | page_in[t]  # paged-in values are resident from the step's start
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
                carried = S[t + 1] & ~(resident0 | R[t]) & ~page_in[t + 1]
                if carried.any():
                    i = int(np.flatnonzero(carried)[0])
                    raise InvalidPlanError(
                        "output carried into the next step without being resident",
                        step=t + 1,
                        node=graph.nodes[i].name,
                    )
            bad_in = page_in[t] & ~(S_aux[t] | (page_out[: t + 1].any(axis=0)))
            if bad_in.any():
                i = int(np.flatnonzero(bad_in)[0])
                raise InvalidPlanError("page-in of a value never paged out", step=t, node=graph.nodes[i].name)
        if m == 0:
            continue
        # alive interval [start, end] in positions; -1 = from the step start, m = to the end
        start = np.where(resident0, -1, np.where(pos >= 0, pos, m + 1))
        last_use = np.full(n, -1, dtype=np.int64)
        reads = R[t, dst]
        np.maximum.at(last_use, src[reads], pos[dst[reads]])
        end = np.maximum(last_use, np.where(pos >= 0, pos, -1))
        nxt = S[t + 1] if t + 1 < T else np.zeros(n, dtype=bool)
        # a value paged out this step stays until its page-out, modelled as the step's end
        end = np.where(nxt | page_out[t], m, end)
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


def _cat(xs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)
