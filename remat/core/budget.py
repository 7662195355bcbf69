"""Budgets: bytes, or strings such as ``"60%"``, ``"0.6x"`` or ``"512MiB"``.

Two meanings, chosen by the caller, never guessed:

* the **compiled** budget of the drop-in (``remat.value_and_grad(..., budget="12GiB")``): the
  compiled step's temporary bytes (XLA's ``memory_analysis().temp_size_in_bytes``); ``"50%"`` is
  relative to the compiled no-remat step's temp (resolved by :mod:`remat.compiled_budget`);
* the **modelled** budget of a policy (``policy.plan(graph, budget)``): the graph's replayed peak
  (:meth:`remat.Graph.no_remat_peak` for ``"N%"``), the published-graph semantics.  Wrap a spec in
  :func:`modelled` to hand it to the drop-in with this meaning.
"""

from __future__ import annotations

import dataclasses
import math
import re

from remat.core.errors import BudgetFormatError

__all__ = ["Modelled", "modelled", "parse_budget", "resolve_budget", "resolve_against"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Modelled:
    """A budget on the graph's modelled peak, not on the compiled step (see the module
    docstring).  ``spec`` is any budget spec: bytes, ``"60%"``, ``"512MiB"``."""

    spec: int | float | str


def modelled(spec: int | float | str) -> Modelled:
    """``spec`` with the modelled-graph meaning: ``remat.value_and_grad(f, "checkmate",
    budget=remat.modelled("60%"))`` hands ``"60%"`` of the graph's no-remat peak to the policy
    and compiles nothing to check it."""
    parse_budget(spec)
    return Modelled(spec)


def parse_budget(budget: int | float | str | Modelled) -> tuple[str, float]:
    """``("bytes", n)`` for an absolute budget, ``("fraction", f)`` for ``"N%"`` / ``"0.6x"``.

    Raises:
      BudgetFormatError: not a finite non-negative number or a parsable string.
    """
    if isinstance(budget, Modelled):
        budget = budget.spec
    if isinstance(budget, bool):
        raise BudgetFormatError(f"budget must be bytes or a string, got {budget!r}")
    if isinstance(budget, (int, float)):
        if not math.isfinite(budget) or budget < 0:
            raise BudgetFormatError(f"budget must be a finite non-negative number, got {budget!r}")
        return "bytes", float(math.floor(budget))
    if not isinstance(budget, str):
        raise BudgetFormatError(f"budget must be bytes or a string, got {type(budget).__name__}")
    m = _RE.match(budget)
    if not m:
        raise BudgetFormatError(f"cannot parse budget {budget!r}; try '60%', '512MiB' or 1e9")
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit in ("%", "x"):
        return "fraction", (value / 100 if unit == "%" else value)
    if unit not in _UNITS:
        raise BudgetFormatError(f"unknown unit {m.group(2)!r} in budget {budget!r}")
    return "bytes", float(math.floor(value * _UNITS[unit]))


def resolve_against(budget: int | float | str | Modelled, reference_bytes: int) -> int:
    """Bytes of ``budget``, a relative one taken of ``reference_bytes`` (``ceil``, the peers'
    budget rule)."""
    kind, v = parse_budget(budget)
    if kind == "fraction":
        return int(math.ceil(v * reference_bytes))
    return int(v)


def resolve_budget(budget: int | float | str | Modelled | None, graph=None) -> int | None:
    """Turn a modelled budget spec into bytes.

    Args:
      budget: ``None`` (no limit), bytes as a number, ``"N%"`` / ``"0.6x"`` of the graph's
        checkpoint-all (no-remat) peak, ``"512MiB"``, ``"1.5GB"``, or a :class:`Modelled`.
      graph: needed for relative budgets.

    Returns:
      Bytes (``ceil`` of relative budgets), or ``None``.
    """
    if budget is None:
        return None
    kind, v = parse_budget(budget)
    if kind == "fraction":
        if graph is None:
            raise BudgetFormatError(f"relative budget {budget!r} needs a graph")
        return int(math.ceil(v * graph.no_remat_peak()))
    return int(v)
