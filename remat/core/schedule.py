"""Replay of a plan's memory behaviour, step by step (the semantics in :mod:`remat.core.plan`).

The memory model lives in one executable form, the event program of :mod:`remat.core.events`;
:func:`replay` is a fold over it (the per-compute live bytes, the step-start bytes, the peak).
:func:`remat.simulate` reports from it, :meth:`Plan.validate` checks legality with it, and the
executor interprets the same events.  It shares no code with the MILP builders in :mod:`solvers`.

Paging (POET plans, Patil et al. 2022, with the constraints of :mod:`solvers.poet`).  Only
device memory is counted; ``S_aux`` (secondary storage) costs nothing.

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
from typing import Any

import numpy as np

from remat.core.events import COMPUTE, Events, lower


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


def replay(graph: Any, plan: Any, *, strict: bool = True) -> Replay:
    """Replay ``plan`` on ``graph`` (see :mod:`remat.core.plan` for the semantics).

    Args:
      strict: raise :class:`InvalidPlanError` on an illegal plan (missing input, carrying a value
        that is not resident).  With ``strict=False`` the memory is reported as if legal.
    """
    return fold(lower(graph, plan, strict=strict))


def fold(events: Events) -> Replay:
    """The :class:`Replay` of an event program: its compute events' live bytes, the step-start
    bytes and the peak (bytes)."""
    c = events.kind == COMPUTE
    return Replay(
        step=events.step[c],
        node=events.node[c],
        live_bytes=events.live[c],
        step_start_bytes=events.step_start_bytes,
        peak_bytes=events.peak_bytes,
    )
