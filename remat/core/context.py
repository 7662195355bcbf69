"""What a policy may use besides the graph and the budget (:class:`PolicyContext`).

Defined here (numpy-free, JAX-free) so that the JAX side (:mod:`remat.apply`) can hand it to
any policy without importing :mod:`policies`; :mod:`policies.base` re-exports it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class PolicyContext:
    """What a decision may use besides the graph and the budget.

    Attributes:
      time_limit: wall-clock seconds for the whole ``plan`` call (``None``: the policy's own
        option, if it has one).  Solvers get what is left: :meth:`time_left`.
      device: a :mod:`remat.devices` profile or its name (``None``: the graph's own costs).
      graph_at: ``graph_at(k)`` is the same training graph extracted at ``1/k`` of the batch
        (``k`` micro-batches, gradients accumulated); ``None`` when the graph cannot be
        re-extracted (a loaded JSON graph) or the caller fixed the micro-batch count.  A policy
        returning ``Plan(microbatches=k)`` plans the columns of ``graph_at(k)``, and
        ``remat.value_and_grad`` then runs ``k`` micro-batches.
      batch_size: the batch size the graph was extracted at, when known.
      batch_coupled: samples of a batch interact in the forward pass (BatchNorm statistics),
        so micro-batching changes the math, not only the memory.
      started: ``time.perf_counter()`` when planning began.
      warm_starts: other policies' plans of the same graph and budget handed to the policy as
        starting points (:class:`WarmStart`, by ``policies.combinators.WarmStarted``); a policy
        may use them or not.
      compiled_budget: the budget is an internal budget of the compiled-bytes loop
        (:mod:`remat.compiled_budget`), which compiles every plan and keeps only those whose
        compiled temp fits.  Below its modelled floor a policy may then return a plan whose
        replayed peak exceeds the budget, marked with ``meta["over_modelled_budget"]`` (bytes
        over): one that holds less than the budget everywhere but where its model's least
        transient does (XLA fuses what the model counts there).
    """

    time_limit: float | None = None
    device: Any = None
    graph_at: Callable[[int], Any] | None = None
    batch_size: int | None = None
    batch_coupled: bool = False
    started: float = dataclasses.field(default_factory=time.perf_counter)
    warm_starts: tuple[WarmStart, ...] = ()
    compiled_budget: bool = False

    def time_left(self, default: float | None = None) -> float | None:
        """Seconds left of ``time_limit`` (or of ``default``), at least 0.1; ``None``: no limit."""
        limit = self.time_limit if self.time_limit is not None else default
        if limit is None:
            return None
        return max(0.1, float(limit) - (time.perf_counter() - self.started))

    def microbatch_counts(self) -> list[int]:
        """The micro-batch counts ``k > 1`` that divide the batch (empty when unknown or when
        ``graph_at`` is unavailable)."""
        if self.graph_at is None or not self.batch_size:
            return []
        return [k for k in range(2, self.batch_size + 1) if self.batch_size % k == 0]


class WarmStart:
    """Another policy's plan offered as a starting point, planned when first read.

    Attributes:
      name: the policy's name (``"chain_dp"``).
      plan: its :class:`~remat.core.plan.Plan`, or ``None`` when it found none (not applicable,
        infeasible); ``make()`` is called on the first read only, so a start nobody reads costs
        nothing.
    """

    def __init__(self, name: str, make: Callable[[], Any]) -> None:
        self.name = name
        self._make: Callable[[], Any] | None = make
        self._plan: Any = None

    @property
    def planned(self) -> bool:
        """Whether :attr:`plan` has been computed."""
        return self._make is None

    @property
    def plan(self) -> Any:
        if self._make is not None:
            self._plan, self._make = self._make(), None
        return self._plan

    def __repr__(self) -> str:
        return f"WarmStart({self.name!r}, planned={self.planned})"

