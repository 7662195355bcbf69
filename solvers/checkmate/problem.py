"""Checkmate problems and solutions on arrays, and the frontier-form schedules every solver uses.

A schedule is Checkmate's *frontier advancing* pair ``R``/``S`` (``bool[T, n]``, ``T = n``):
step ``t`` computes node ``t`` for the first time (``R[t, t] = 1``), may recompute earlier nodes
(``R[t, i]``, ``i < t``) and starts with the outputs ``S[t, i] = 1`` (``i < t``) resident.
Memory (bytes) follows the replay semantics of :mod:`remat.core.schedule`: nodes of a step run in
index order; running node ``k`` needs its inputs resident and allocates its output; an output is
freed after the last node of the step that reads it unless it is carried into ``S[t+1]``.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property

import numpy as np

from remat.core.errors import SolverError
from solvers.bounds import frontier_lower_bound

__all__ = [
    "CheckmateProblem",
    "CheckmateSolution",
    "checkpoint_all_schedule",
    "schedule_memory",
    "schedule_cost",
    "normalize",
]


@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateProblem:
    """A rematerialization problem on arrays.

    Attributes:
      n: number of nodes (topologically ordered: every edge goes from a lower to a higher index).
      edges: ``int64[m, 2]`` data edges ``(src, dst)``, ``src < dst``.
      costs: ``float64[n]`` compute cost of one execution (seconds or any unit).
      sizes: ``int64[n]`` output bytes.
      budget: memory budget in bytes (``None``: unlimited).
    """

    n: int
    edges: np.ndarray
    costs: np.ndarray
    sizes: np.ndarray
    budget: int | None = None

    def __post_init__(self) -> None:
        n = int(self.n)
        e = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        costs = np.asarray(self.costs, dtype=np.float64).reshape(-1)
        sizes = np.asarray(self.sizes, dtype=np.int64).reshape(-1)
        if costs.shape != (n,) or sizes.shape != (n,):
            raise SolverError(f"costs {costs.shape} and sizes {sizes.shape} must have shape ({n},)")
        if len(e) and (e.min() < 0 or e.max() >= n or np.any(e[:, 0] >= e[:, 1])):
            raise SolverError("edges must satisfy 0 <= src < dst < n (topological order)")
        if np.any(costs < 0) or np.any(sizes < 0):
            raise SolverError("costs and sizes must be non-negative")
        e = np.unique(e, axis=0) if len(e) else e
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "edges", e)
        object.__setattr__(self, "costs", costs)
        object.__setattr__(self, "sizes", sizes)
        if self.budget is not None:
            object.__setattr__(self, "budget", int(self.budget))

    @classmethod
    def from_graph(cls, graph, budget: int | None = None) -> CheckmateProblem:
        """From a :class:`remat.Graph` (costs = ``time_s``, sizes = ``out_bytes``; budget bytes)."""
        return cls(graph.n, graph.edge_array, graph.costs, graph.sizes, budget)

    def with_budget(self, budget: int | None) -> CheckmateProblem:
        """The same problem with another budget (bytes, ``None``: unlimited)."""
        return dataclasses.replace(self, budget=budget)

    @cached_property
    def preds(self) -> list[np.ndarray]:
        """``preds[i]``: sorted ``int64`` indices of the nodes whose outputs node ``i`` reads."""
        return self._adjacency(1, 0)

    @cached_property
    def users(self) -> list[np.ndarray]:
        """``users[i]``: sorted ``int64`` indices of the nodes that read node ``i``'s output."""
        return self._adjacency(0, 1)

    def _adjacency(self, key: int, val: int) -> list[np.ndarray]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for e in self.edges:
            out[int(e[key])].append(int(e[val]))
        return [np.array(sorted(p), dtype=np.int64) for p in out]

    @cached_property
    def last_reader(self) -> np.ndarray:
        """``int64[n]``: the last node reading each output (the node itself if none)."""
        last = np.arange(self.n, dtype=np.int64)
        if len(self.edges):
            np.maximum.at(last, self.edges[:, 0], self.edges[:, 1])
        return last

    @cached_property
    def max_descendant(self) -> np.ndarray:
        """``int64[n]``: the largest index reachable from each node (itself included)."""
        md = np.arange(self.n, dtype=np.int64)
        for i in range(self.n - 1, -1, -1):
            u = self.users[i]
            if len(u):
                md[i] = max(md[i], int(md[u].max()))
        return md

    def frontier_lower_bound(self) -> int:
        """``max_t (b_t + sum_{p in preds(t)} b_p)``: bytes live while node t runs, in any
        schedule.  A lower bound on the smallest feasible budget
        (:func:`solvers.bounds.frontier_lower_bound`)."""
        return frontier_lower_bound(self.sizes, self.edges)


@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateSolution:
    """A solved schedule.

    Attributes:
      R, S: ``bool[n, n]`` frontier-form schedule (normalised).
      status: ``optimal``, ``time_limit``, ``feasible`` (LP rounding / heuristic).
      objective: total compute cost of ``R`` (``costs @ R.sum(0)``), in the problem's cost units.
      lower_bound: proven lower bound on the optimal cost (MILP dual bound or LP relaxation).
      gap: ``(objective - lower_bound) / objective``.
      peak_bytes: peak memory of the schedule (replay semantics).
      solve_time_s, build_time_s: seconds.
      node_count: branch-and-bound nodes (-1 unknown).
      meta: extra facts (warm-start cost, method, LP details, ...).
    """

    R: np.ndarray
    S: np.ndarray
    status: str
    objective: float
    lower_bound: float
    gap: float
    peak_bytes: int
    solve_time_s: float
    build_time_s: float
    node_count: int = -1
    meta: dict = dataclasses.field(default_factory=dict)


def rel_gap(obj: float, lb: float) -> float:
    """``(obj - lb) / |obj|`` clipped at 0; ``nan`` when either is not finite."""
    if not (math.isfinite(obj) and math.isfinite(lb)):
        return math.nan
    return max(0.0, (obj - lb) / max(abs(obj), 1e-12))


# ------------------------------------------------------------------ schedules on arrays
def checkpoint_all_schedule(problem: CheckmateProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(R, S)`` of running every node once and keeping it until its last reader."""
    n = problem.n
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    S = (i < t) & (t <= problem.last_reader[None, :])
    return np.eye(n, dtype=bool), S


def schedule_cost(problem: CheckmateProblem, R: np.ndarray) -> float:
    """Total compute cost of ``R`` (``costs @ R.sum(0)``, in the problem's cost units)."""
    return float(problem.costs @ np.asarray(R).sum(axis=0))


def schedule_memory(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray) -> tuple[int, np.ndarray]:
    """Peak bytes of a schedule under the one memory semantics (:mod:`remat.core.events`).

    Returns ``(peak_bytes, step_peak)`` with ``step_peak`` ``int64[T]`` bytes (the most bytes
    live at any moment of each step).  The schedule is not checked for legality here.
    """
    from remat.core.events import lower_arrays

    ev = lower_arrays(problem.sizes, problem.edges, np.asarray(R, bool), np.asarray(S, bool),
                      strict=False)
    return int(ev.peak_bytes), np.asarray(ev.step_peak_bytes, dtype=np.int64)


def normalize(problem: CheckmateProblem, R: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop wasted work from a legal frontier-form schedule without raising cost or memory.

    Removes recomputations whose output is neither read in their step nor carried, checkpoints
    ``S[t, i]`` neither read in step t nor carried on, and recomputations of values already
    resident.  Vectorised over steps, one pass over nodes in reverse order.
    """
    R = np.asarray(R, bool).copy()
    S = np.asarray(S, bool).copy()
    T, n = R.shape
    tt = np.arange(T)
    for i in range(n - 1, -1, -1):
        u = problem.users[i]
        used = R[:, u].any(axis=1) if len(u) else np.zeros(T, bool)
        # S kept iff S[t..t'] all set and used at t' (backward recurrence, done with "next" scans)
        s = S[:, i]
        big = T + 1
        next_zero = np.where(~s, tt, big)
        next_zero = np.minimum.accumulate(next_zero[::-1])[::-1]
        next_used = np.where(s & used, tt, big)
        next_used = np.minimum.accumulate(next_used[::-1])[::-1]
        s_keep = s & (next_used < next_zero)
        s_next = np.r_[s_keep[1:], False]
        need = used | s_next | (tt == i)
        R[:, i] = R[:, i] & need & ~s_keep
        S[:, i] = s_keep
    return R, S
