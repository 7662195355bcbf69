"""The one schedule type every policy produces and every applier/evaluator consumes.

A plan is Checkmate's pair of boolean matrices over *steps* (rows) × *nodes* (columns):

* ``R[t, i]``: node ``i`` is (re)computed during step ``t`` (nodes of a step run in index order);
* ``S[t, i]``: node ``i``'s output is held in memory when step ``t`` begins (a checkpoint).

Memory semantics (shared by :func:`remat.simulate` and :func:`remat.execute`): entering step
``t`` the live set is ``{i : S[t, i]}``.  Running node ``k`` needs every predecessor live and
allocates ``out_bytes[k]``; after each node (and at the start of the step) every live output that
is neither read by a later node of this step nor in ``S[t+1]`` is freed (a resident output that
the step recomputes stays until its recomputation, which replaces it).  ``S[t+1, i]`` requires
``i`` live at the end of step ``t``.

POET plans add ``S_aux`` (held in secondary storage entering step t), ``page_out`` and
``page_in`` (transfers during step t); see :mod:`remat.core.schedule` for their semantics.

These rules are executable in one place: :func:`remat.core.events.lower` turns a plan into its event
program (compute, free, page-out, page-in), which :meth:`Plan.validate`, the replay, the
simulator, the executor and the layout pass (:mod:`remat.core.layout`) all consume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from remat.core.errors import InvalidPlanError

if TYPE_CHECKING:
    from remat.core.events import Events
    from remat.core.graph import Graph


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """What every policy reports about its plan, typed.

    :meth:`policies.base.BasePolicy.plan` fills it for every policy and stores its fields in
    ``Plan.meta`` under the same keys; :attr:`Plan.stats` reads them back.  Policy-specific
    extras (Checkmate's ``tried``, OLLA's ``arena_bytes``, ...) stay in ``meta`` only.

    Attributes:
      policy: name of the policy that made the plan (``"custom"``: none).
      budget: the budget in bytes (``None``: no limit).
      status: ``"optimal"`` (proven), ``"feasible"`` (a solver's plan without proof),
        ``"time_limit"`` (a solver's incumbent at its time limit), ``"heuristic"`` (no solver);
        ``"unknown"`` for a plan no policy wrapper checked.
      objective: the policy's objective value, in ``objective_unit``.
      objective_unit: ``"cost"`` (the graph's compute-cost units), ``"bytes"`` (OLLA's arena),
        ``"J"`` (POET's energy).
      lower_bound: a proven bound on the objective (``None``: no bound).
      gap: ``(objective - lower_bound) / objective`` in ``[0, 1]`` (``None``: no bound).
      peak_bytes: peak of the plan's replay (bytes), on the graph at the plan's micro-batch size.
      compute_cost: ``sum(runs[i] * cost[i])`` over the nodes, in the graph's cost units.
      solve_time_s: wall seconds of the ``plan`` call.
    """

    policy: str = "custom"
    budget: int | None = None
    status: str = "unknown"
    objective: float | None = None
    objective_unit: str | None = None
    lower_bound: float | None = None
    gap: float | None = None
    peak_bytes: int | None = None
    compute_cost: float | None = None
    solve_time_s: float = 0.0

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> PlanStats:
        """The statistics held in a plan's ``meta`` (defaults where a key is missing)."""
        return cls(**{f.name: meta[f.name] for f in dataclasses.fields(cls) if f.name in meta})

    def as_meta(self) -> dict[str, Any]:
        """The fields as ``Plan.meta`` entries (the keys every policy's plan carries)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A rematerialization schedule.

    Attributes:
      R: ``bool[T, n]`` compute (or recompute) node i in step t.
      S: ``bool[T, n]`` output of node i is resident in device memory entering step t.
      page_out: optional ``bool[T, n]``: copy node i's output to secondary storage in step t.
      page_in: optional ``bool[T, n]``: copy node i's output back to device memory in step t.
      S_aux: optional ``bool[T, n]``: node i's output is held in secondary storage entering step t.
      offsets: optional ``int64[A]`` byte offsets in one memory arena, one per *allocation* of the
        plan's event program in allocation order (:mod:`remat.core.events`: every compute, and every
        page-in that brings a value back, allocates; a node computed k times has k entries).
        Filled by :func:`remat.core.layout.allocate`; checked by :meth:`validate`.
      microbatches: number of micro-batches the batch is split into (gradients accumulated).
      meta: the :class:`PlanStats` fields (``policy``, ``budget``, ``status``, ``objective``,
        ``gap``, ``peak_bytes``, ``solve_time_s``, ...; typed as :attr:`stats`) and the
        policy's own entries.
    """

    R: np.ndarray
    S: np.ndarray
    page_out: np.ndarray | None = None
    page_in: np.ndarray | None = None
    S_aux: np.ndarray | None = None
    offsets: np.ndarray | None = None
    microbatches: int = 1
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        R = np.asarray(self.R, dtype=bool)
        S = np.asarray(self.S, dtype=bool)
        if R.ndim != 2 or R.shape != S.shape:
            raise InvalidPlanError(f"R {R.shape} and S {S.shape} must be 2-D of one shape")
        object.__setattr__(self, "R", R)
        object.__setattr__(self, "S", S)
        for field in ("page_out", "page_in", "S_aux"):
            v = getattr(self, field)
            if v is not None:
                v = np.asarray(v, dtype=bool)
                if v.shape != R.shape:
                    raise InvalidPlanError(f"{field} has shape {v.shape}, expected {R.shape}")
                object.__setattr__(self, field, v)
        if self.offsets is not None:
            off = np.asarray(self.offsets)
            if off.ndim != 1 or (off.size and not np.issubdtype(off.dtype, np.integer)):
                got = f"{off.dtype}{off.shape}"
                raise InvalidPlanError(f"offsets must be a 1-D integer array, got {got}")
            object.__setattr__(self, "offsets", off.astype(np.int64))
        if int(self.microbatches) < 1:
            raise InvalidPlanError(f"microbatches must be >= 1, got {self.microbatches}")
        meta = {"policy": "custom", "budget": None, "status": "unknown", "solve_time_s": 0.0}
        meta.update(dict(self.meta))
        object.__setattr__(self, "meta", meta)

    @property
    def stats(self) -> PlanStats:
        """The statistics every policy reports (:class:`PlanStats`), read from ``meta``."""
        return PlanStats.from_meta(self.meta)

    @property
    def num_steps(self) -> int:
        return int(self.R.shape[0])

    @property
    def paging(self) -> bool:
        return self.page_out is not None and bool(self.page_out.any() or self.page_in.any())

    def saved_forward(self, graph) -> frozenset[int]:
        """Forward nodes whose outputs are kept, not recomputed: computed exactly once.

        This is the set a ``jax.checkpoint`` name policy saves when the plan is applied.
        """
        counts = self.R.sum(axis=0)
        fwd = ~graph.is_backward_array
        return frozenset(int(i) for i in np.flatnonzero(fwd & (counts == 1)))

    def compute_counts(self) -> np.ndarray:
        """``int64[n]``: how many times each node runs."""
        return self.R.sum(axis=0).astype(np.int64)

    def validate(self, graph) -> Events:
        """Check legality against ``graph``; raise :class:`InvalidPlanError` naming the step and
        node otherwise.  Rules: shapes match; every node runs at least once; ``S[0]`` is empty
        (paging aside); a node runs only when all its inputs are resident; an output can be held
        into step t+1 only if it was resident at the end of step t; ``offsets``, when present,
        are a valid layout of the plan's allocations (:func:`remat.core.layout.validate`).

        Returns:
          The plan's event program (:func:`remat.core.events.lower`), so callers need not lower twice.
        """
        from remat.core import layout
        from remat.core.events import lower

        if self.R.shape[1] != graph.n:
            raise InvalidPlanError(f"plan has {self.R.shape[1]} columns, graph has {graph.n} nodes")
        missing = np.flatnonzero(~self.R.any(axis=0))
        if len(missing):
            raise InvalidPlanError("node never computed", node=graph.nodes[missing[0]].name)
        events = lower(graph, self, strict=True)
        if self.offsets is not None:
            lt = layout.lifetimes(events)
            names = [graph.nodes[i].name for i in lt.node]
            layout.validate(lt.intervals, lt.sizes, self.offsets, labels=names)
        return events

    def with_meta(self, **kw: Any) -> Plan:
        return dataclasses.replace(self, meta={**self.meta, **kw})

    def summary(self, graph=None) -> str:
        n_extra = int(self.R.sum() - self.R.shape[1])
        s = (
            f"Plan[{self.meta.get('policy')}] {self.R.shape[0]} steps, {n_extra} recomputations, "
            f"status={self.meta.get('status')}"
        )
        if self.paging:
            s += f", {int(self.page_out.sum())} page-outs, {int(self.page_in.sum())} page-ins"
        if self.microbatches > 1:
            s += f", microbatches={self.microbatches}"
        return s


def plan_from_order(graph, order, *, keep, policy: str, **meta: Any) -> Plan:
    """Build a Checkmate-style plan from a per-step compute list.

    Args:
      graph: the Graph.
      order: list over steps; ``order[t]`` is an iterable of node indices run in step t.
      keep: predicate ``keep(t, i) -> bool`` or a ``bool[T, n]`` array telling whether the output of
        node i, if resident at the end of step t, is carried into step t+1.  Outputs not carried
        are dropped.  Values needed by a later step must be carried (or recomputed there).
    """
    T, n = len(order), graph.n
    R = np.zeros((T, n), dtype=bool)
    for t, nodes in enumerate(order):
        R[t, list(nodes)] = True
    S = np.zeros((T, n), dtype=bool)
    resident = np.zeros(n, dtype=bool)
    keep_arr = None if callable(keep) else np.asarray(keep, dtype=bool)
    for t in range(T - 1):
        resident = S[t] | R[t]
        if keep_arr is not None:
            S[t + 1] = resident & keep_arr[t]
        else:
            S[t + 1] = [bool(resident[i]) and bool(keep(t, i)) for i in range(n)]
    return Plan(R=R, S=S, meta={"policy": policy, **meta})


def checkpoint_all_plan(graph: Graph) -> Plan:
    """Run every node once in order, keeping each output until its last reader.

    Step ``t`` computes node ``t``; ``S[t, i] = i < t <= last_reader[i]``.  Its simulated peak is
    exactly :meth:`Graph.no_remat_peak`.
    """
    n = graph.n
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    S = (i < t) & (t <= graph.last_reader[None, :])
    return Plan(R=np.eye(n, dtype=bool), S=S, meta={"policy": "checkpoint_all", "status": "optimal"})
