"""Typed exceptions (and the :class:`RematWarning` base of warnings) for the whole project
(remat, policies, solvers, experiments).

Every public function that rejects its input raises one of these, never a bare ``assert``.
``solvers`` (which never imports jax) also raises them; this module imports nothing heavy.
"""

from __future__ import annotations

import math
from typing import Any


class RematError(Exception):
    """Base class of every error raised by remat."""


class RematWarning(UserWarning):
    """Base class of remat's warnings: the result stands but rests on an approximation the user
    should know about (a primitive costed by the fallback FLOP rule, a plan realised inexactly)."""


class InvalidGraphError(RematError, ValueError):
    """A training graph is malformed (cycle, missing attribute, negative size, bad edge).

    Attributes:
      node: the offending node's name or index, when one is to blame.
    """

    def __init__(self, message: str, *, node: Any = None):
        self.node = node
        super().__init__(message if node is None else f"{message} (node {node!r})")


class InvalidPlanError(RematError, ValueError):
    """A plan is illegal for its graph: an input is absent when a node runs, bad shapes, ..."""

    def __init__(self, message: str, *, step: int | None = None, node: Any = None):
        self.step = step
        self.node = node
        where = []
        if step is not None:
            where.append(f"step {step}")
        if node is not None:
            where.append(f"node {node!r}")
        super().__init__(message + (f" ({', '.join(where)})" if where else ""))


class InfeasibleBudgetError(RematError, ValueError):
    """No schedule fits the memory budget.

    Attributes:
      budget: the budget that was asked for, in bytes.
      min_feasible_bytes: the smallest budget (bytes) for which a schedule exists under the
        policy's memory model, computed (not guessed) by the policy or solver; ``None`` when
        unknown.  A policy's ``solve`` may raise it with ``None``: ``BasePolicy.plan`` then
        fills it from the policy's ``min_feasible_budget``.
      reason: the message after the numbers (why, and whether the minimum is proven).
    """

    def __init__(self, budget: float, min_feasible_bytes: float | None, message: str = ""):
        self.budget = budget
        self.min_feasible_bytes = min_feasible_bytes
        self.reason = message
        smallest = ("unknown" if min_feasible_bytes is None or not math.isfinite(min_feasible_bytes)
                    else f"{format_bytes(min_feasible_bytes)} ({int(min_feasible_bytes)} bytes)")
        text = f"budget {format_bytes(budget)} is infeasible; the smallest feasible budget is {smallest}"
        super().__init__(text + (f": {message}" if message else ""))


class SolverTimeoutError(RematError, TimeoutError):
    """A solver hit its time limit without any feasible incumbent to return.

    (With an incumbent, solvers return it with ``status="time_limit"`` instead of raising.)

    Attributes:
      incumbent: the best solution object found, or ``None``.
      bound: the best proven bound on the objective, when the solver has one.
    """

    def __init__(self, message: str, *, incumbent: Any = None, bound: float | None = None):
        self.incumbent = incumbent
        self.bound = bound
        super().__init__(message)


class SolverError(RematError, RuntimeError):
    """A solver failed for a reason other than infeasibility or a time-out."""


class NotApplicableError(RematError, ValueError):
    """A policy does not apply to this graph (a chain policy on a DAG, a scan planner on a graph
    without scans).  Not a malformed graph: another policy may plan it.

    Attributes:
      policy: the policy's registered name, when known.
    """

    def __init__(self, message: str, *, policy: str | None = None, node: Any = None):
        self.policy = policy
        self.node = node
        text = message if node is None else f"{message} (node {node!r})"
        super().__init__(text if policy is None else f"{policy}: {text}")


class UnsupportedPrimitiveError(RematError, NotImplementedError):
    """Extraction met a JAX primitive it cannot model.

    Attributes:
      primitive: the primitive's name.
      where: where it came from (source line and name stack), when known.
    """

    def __init__(self, primitive: str, where: str = "", message: str = ""):
        self.primitive = primitive
        self.where = where
        text = f"unsupported primitive {primitive!r}"
        if where:
            text += f" at {where}"
        if message:
            text += f": {message}"
        super().__init__(text)


class PagingError(RematError, RuntimeError):
    """A page-out or page-in of :func:`remat.execute` failed (storage write/read, transfer back
    to the device); the original exception is chained as ``__cause__``.

    Attributes:
      step: the step of the paging event, when known.
      node: the node whose output was being moved.
    """

    def __init__(self, message: str, *, step: int | None = None, node: Any = None):
        self.step = step
        self.node = node
        where = [f"step {step}"] if step is not None else []
        if node is not None:
            where.append(f"node {node!r}")
        super().__init__(message + (f" ({', '.join(where)})" if where else ""))


class ExtractionError(RematError, ValueError):
    """The function handed to ``remat.extract`` cannot be turned into a training graph
    (non-scalar loss, non-differentiable output, ...)."""


class MicrobatchError(RematError, ValueError):
    """Micro-batching cannot split the arguments (``microbatches`` not a positive integer, not
    dividing the batch size, or no batch axis to split)."""


class BudgetFormatError(RematError, ValueError):
    """A budget string or number cannot be parsed (e.g. ``"60 percent"``)."""


class InvalidOptionError(RematError, ValueError):
    """A policy or solver option has a value it does not take (``SqrtN(mode="fast")``,
    ``Checkmate(order_share=2)``); the message names the option and what it takes."""


class MissingDependencyError(RematError, ImportError):
    """An optional dependency is not installed; names the extra that provides it.

    Attributes:
      package: the import name that failed (``"ray"``, ``"pyarrow"``).
      extra: the ``pip install -e ".[extra]"`` extra that installs it.
    """

    def __init__(self, package: str, extra: str, what: str = ""):
        self.package = package
        self.extra = extra
        super().__init__(f"{what or package} needs the optional package {package!r}, not "
                         f"installed; install it with: pip install -e \".[{extra}]\"")


class UnknownNameError(RematError, KeyError):
    """A registry lookup (policy, device profile, zoo model) failed; lists what exists."""

    def __init__(self, kind: str, name: str, available: list[str]):
        self.kind = kind
        self.name = name
        self.available = list(available)
        super().__init__(f"unknown {kind} {name!r}; available: {', '.join(sorted(available))}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]


def format_bytes(n: float) -> str:
    """Human-readable byte count, e.g. ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
