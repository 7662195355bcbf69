"""remat: rematerialization policies for JAX.

``Graph``, ``Plan``, ``PlanStats``, ``simulate`` and ``load_graph`` import no JAX; the JAX-side entry points
(``extract``, ``value_and_grad``, ``execute``, ``measure``, ``zoo``, ``devices``) load on first use.
(Their modules are named differently from the functions, e.g. ``remat.extraction``, so
importing a module never shadows a function.)
"""

from __future__ import annotations

import importlib

from remat.core import errors
from remat.core.budget import Modelled, modelled, resolve_budget
from remat.core.graph import Graph, Node, chain_graph, make_graph
from remat.core.graph_io import load_graph
from remat.core.plan import Plan, PlanStats
from remat.core.simulate import Report, simulate

_LAZY = {
    "extract": ("remat.extraction", "extract"),
    "value_and_grad": ("remat.apply", "value_and_grad"),
    "grad": ("remat.apply", "grad"),
    "checkpoint": ("remat.apply", "checkpoint"),
    "checkpoint_policy": ("remat.apply", "checkpoint_policy"),
    "execute": ("remat.executor", "execute"),
    "ExecStats": ("remat.executor", "ExecStats"),
    "measure": ("remat.measurement", "measure"),
    "Measurement": ("remat.measurement", "Measurement"),
    "zoo": ("remat.zoo", None),
    "devices": ("remat.devices", None),
    "nnx": ("remat.nnx", None),
    "sharding": ("remat.sharding", None),
}

__all__ = [
    "Graph", "Node", "Plan", "PlanStats", "Report", "simulate", "load_graph", "make_graph", "chain_graph",
    "resolve_budget", "modelled", "Modelled", "errors", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        m = importlib.import_module(mod)
        value = m if attr is None else getattr(m, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'remat' has no attribute {name!r}")
