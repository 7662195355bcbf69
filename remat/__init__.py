"""remat: rematerialization policies for JAX.

``Graph``, ``Plan``, ``simulate`` and ``load_graph`` import no JAX; the JAX-side entry points
(``extract``, ``value_and_grad``, ``execute``, ``measure``, ``zoo``, ``devices``) load on first use.
"""

from __future__ import annotations

import importlib
import sys
import types

from remat import errors
from remat.budget import resolve_budget
from remat.graph import Graph, Node, chain_graph, make_graph
from remat.graph_io import load_graph
from remat.plan import Plan
from remat.simulate import Report, simulate

_LAZY = {
    "extract": ("remat.extract", "extract"),
    "value_and_grad": ("remat.apply", "value_and_grad"),
    "grad": ("remat.apply", "grad"),
    "checkpoint": ("remat.apply", "checkpoint"),
    "checkpoint_policy": ("remat.apply", "checkpoint_policy"),
    "execute": ("remat.executor", "execute"),
    "ExecStats": ("remat.executor", "ExecStats"),
    "measure": ("remat.measure", "measure"),
    "Measurement": ("remat.measure", "Measurement"),
    "zoo": ("remat.zoo", None),
    "devices": ("remat.devices", None),
}

__all__ = [
    "Graph", "Node", "Plan", "Report", "simulate", "load_graph", "make_graph", "chain_graph",
    "resolve_budget", "errors", *_LAZY,
]


class _CallableModule(types.ModuleType):
    """A submodule named like its main function (``remat.extract``, ``remat.measure``): calling
    the module calls the function, so ``remat.extract(...)`` works whether or not
    ``remat.extract`` (the module) was imported first (the import system then binds the module)."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _LAZY.get(name, ("", None))[1] == name:
            value.__class__ = _CallableModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        m = importlib.import_module(mod)
        value = m if attr is None or attr == mod.rsplit(".", 1)[1] else getattr(m, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'remat' has no attribute {name!r}")
