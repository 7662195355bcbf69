"""Budgets: bytes, or strings such as ``"60%"`` (of the checkpoint-all peak) or ``"512MiB"``."""

from __future__ import annotations

import math
import re

from remat.errors import BudgetFormatError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")


def resolve_budget(budget: int | float | str | None, graph=None) -> int | None:
    """Turn a budget spec into bytes.

    Args:
      budget: ``None`` (no limit), bytes as a number, ``"N%"`` / a float fraction string
        ``"0.6x"`` of the graph's checkpoint-all (no-remat) peak, or ``"512MiB"``, ``"1.5GB"``.
      graph: needed for relative budgets.

    Returns:
      Bytes (``ceil`` of relative budgets, the peers' budget rule), or ``None``.
    """
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise BudgetFormatError(f"budget must be bytes or a string, got {budget!r}")
    if isinstance(budget, (int, float)):
        if not math.isfinite(budget) or budget < 0:
            raise BudgetFormatError(f"budget must be a finite non-negative number, got {budget!r}")
        return int(math.floor(budget))
    if not isinstance(budget, str):
        raise BudgetFormatError(f"budget must be bytes or a string, got {type(budget).__name__}")
    m = _RE.match(budget)
    if not m:
        raise BudgetFormatError(f"cannot parse budget {budget!r}; try '60%', '512MiB' or 1e9")
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit in ("%", "x"):
        if graph is None:
            raise BudgetFormatError(f"relative budget {budget!r} needs a graph")
        frac = value / 100 if unit == "%" else value
        return int(math.ceil(frac * graph.no_remat_peak()))
    if unit not in _UNITS:
        raise BudgetFormatError(f"unknown unit {m.group(2)!r} in budget {budget!r}")
    return int(math.floor(value * _UNITS[unit]))
