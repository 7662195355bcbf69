r"""Binomial checkpointing (Griewank 1992; Griewank & Walther 2000, "revolve"), computed.

Reversing ``l`` steps of a chain with ``c`` checkpoint slots (the initial state's included) costs
at least

.. math::  t(l, c) = r\,l - \beta(c + 1, r - 1), \qquad \beta(s, t) = \binom{s + t}{s},

forward steps beyond the ``l`` taping steps, where ``r`` is the *repetition number*, the unique
integer with ``\beta(c, r - 1) < l \le \beta(c, r)`` (Griewank & Walther, *Evaluating
Derivatives*, Prop. 12.4).  It satisfies the recurrence of the nested (treeverse) schedule

.. math::  t(l, c) = \min_{1 \le j < l} \; j + t(l - j, c - 1) + t(j, c),\quad
           t(1, c) = 0,\quad t(l, 1) = l(l - 1)/2,

and :func:`split` returns the minimising first checkpoint ``j``.  Nothing is downloaded; all
values come from the binomial formula (exact Python integers).

In remat's chains (:func:`assign_steps`) the forward values ``v_0 .. v_{K-1}`` are the states
after steps ``0 .. K-1`` and the loss is step ``K``; with ``s`` stored activations besides the
(free) input, revolve advances ``t(K + 1, s + 1)`` times, plus one *taping* evaluation per step
whose backward reads the step's output (every layer of ``remat.chain_graph``; none when a
backward reads only its input, revolve's own model).
"""

from __future__ import annotations

from functools import cache
from math import comb

import numpy as np

from remat.core.errors import InvalidGraphError


def beta(s: int, t: int) -> int:
    """``β(s, t) = C(s + t, s)``: most steps reversible with ``s`` slots and ``t`` repetitions."""
    if s < 0 or t < 0:
        return 0
    return comb(s + t, s)


def repetition_number(n_steps: int, c: int) -> int:
    """Smallest ``r`` with ``n_steps <= β(c, r)``."""
    if n_steps < 1 or c < 1:
        raise InvalidGraphError(f"revolve needs >= 1 step and >= 1 slot, got {n_steps}, {c}")
    r = 0
    while beta(c, r) < n_steps:
        r += 1
    return r


@cache
def revolve_cost(n_steps: int, c: int) -> int:
    """``t(l, c)``: least forward steps (tapes aside) to reverse ``l = n_steps`` steps with
    ``c`` slots (Griewank & Walther, Prop. 12.4)."""
    if n_steps <= 1:
        return 0
    r = repetition_number(n_steps, c)
    return r * n_steps - beta(c + 1, r - 1)


def split(n_steps: int, s: int) -> int:
    """Optimal first advance ``j`` for reversing ``l`` steps with ``s`` free slots (input aside).

    The ``j`` minimising ``j + t(l - j, s) + t(j, s + 1)`` (``c = s + 1`` slots counting the
    segment's start); ties go to the largest ``j``.
    """
    js = np.arange(1, n_steps)
    vals = np.array([j + revolve_cost(n_steps - int(j), s) + revolve_cost(int(j), s + 1) for j in js])
    return int(js[np.flatnonzero(vals == vals.min())[-1]])


def assign_steps(bwd_hi: np.ndarray, bwd_lo: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Map each backward node of a chain to the forward step whose adjoint it is.

    Step ``i`` (``0 <= i < K``) computes ``v_i`` from ``v_{i-1}`` (``v_{-1}`` the free input);
    step ``K`` is the loss step (its output is not a forward value).  A node reading
    ``{x-1, x}`` is step ``x``'s adjoint and needs the step's output (``tape``: recomputed right
    before); a node reading only ``{y}`` is step ``y + 1``'s adjoint reading its input (no tape);
    a node reading nothing joins the previous node's step.

    Returns:
      ``(step[M], tape[K + 1])``.
    """
    M = len(bwd_hi)
    step = np.empty(M, dtype=np.int64)
    tape = np.zeros(K + 1, dtype=bool)
    prev = K
    for k in range(M):
        hi, lo = int(bwd_hi[k]), int(bwd_lo[k])
        if hi < 0:
            st = prev
        elif hi > lo:
            st = hi
            tape[st] = True
        else:
            st = min(hi + 1, prev)
            if st <= hi:  # cannot go back up: this node reads its step's output
                st = hi
                tape[st] = True
        step[k] = st
        prev = st
    return step, tape


def revolve_evals(K: int, slots: int, tape: np.ndarray, step: np.ndarray) -> int:
    """Forward evaluations of :func:`revolve_ops`: ``t(K + 1, slots + 1)`` advances plus one
    taping evaluation per step whose adjoint reads the step's output (steps without backward
    nodes are skipped; step 0 needs no advance)."""
    used = set(int(s) for s in step)
    return revolve_cost(K + 1, slots + 1) + int(sum(1 for i in used if tape[i]))


def revolve_ops(step_of_bwd: np.ndarray, tape: np.ndarray, K: int, slots: int) -> list[tuple[str, int]]:
    """The revolve schedule of a chain as ``("f", j)`` / ``("b", k)`` operations.

    Args:
      step_of_bwd: ``int64[M]`` step each backward node reverses (from :func:`assign_steps`).
      tape: ``bool[K + 1]`` whether reversing step i first recomputes ``v_i``.
      K: forward values ``v_0 .. v_{K-1}``; steps ``0 .. K``.
      slots: stored activations allowed besides the free input (``c = slots + 1``).

    ``rev(a, b, s)`` reverses steps ``b .. a+1`` with ``v_a`` resident: one step: tape and run
    its backward nodes; no free slot: for each step advance from ``v_a`` to its input; otherwise
    advance :func:`split` steps, store, ``rev`` the right part with ``s - 1`` slots and the left
    part with ``s`` (Griewank's treeverse).
    """
    by_step: dict[int, list[int]] = {}
    for k, x in enumerate(np.asarray(step_of_bwd, dtype=np.int64)):
        by_step.setdefault(int(x), []).append(k)
    ops: list[tuple[str, int]] = []

    def reverse_step(i: int) -> None:
        if tape[i] and i < K:
            ops.append(("f", i))
        ops.extend(("b", k) for k in by_step[i])

    def rev(a: int, b: int, s: int) -> None:
        if not any(x in by_step for x in range(a + 1, b + 1)):
            return
        n_steps = b - a
        if n_steps == 1:
            reverse_step(b)
        elif s == 0:
            for i in range(b, a, -1):
                if i in by_step:
                    ops.extend(("f", q) for q in range(a + 1, i))
                    reverse_step(i)
        else:
            j = split(n_steps, s)
            ops.extend(("f", q) for q in range(a + 1, a + j + 1))
            rev(a + j, b, s - 1)
            rev(a, a + j, s)

    import sys

    if sys.getrecursionlimit() < 4 * K + 200:
        sys.setrecursionlimit(4 * K + 200)
    rev(-1, K, int(slots))
    return ops
