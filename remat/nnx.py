"""Flax nnx front end: ``remat.nnx.value_and_grad(loss_fn, policy)(model, batch)``.

The nnx-shaped drop-in for :func:`flax.nnx.value_and_grad` / :func:`flax.nnx.grad`: the
differentiated arguments are nnx Modules (graph nodes) or arrays, the gradients of a Module are
the ``nnx.State`` of its ``nnx.Param`` variables (or of a ``nnx.DiffState`` filter), and the
variables the loss updates (BatchNorm ``batch_stats``, Dropout RNG counters, any other
non-differentiated variable) are written back into the Module objects after the call, as nnx does.
It works eagerly, inside ``nnx.jit`` and with ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` +
``optimizer.update(model, grads)``.

Each call splits the Module arguments with ``nnx.split`` and runs :func:`remat.value_and_grad`
on a pure function of their states that merges them back, calls the loss, and returns the new
states as auxiliary output.  One pure function and one :func:`remat.value_and_grad` transform are
kept per graph structure (the arguments' ``GraphDef``s and static arguments), so the plan is made
once per graph and argument shapes, as in :func:`remat.value_and_grad`.

Differences from ``nnx.value_and_grad``: non-array arguments that are not differentiated
(Python numbers, ``True``, ``"train"``, ``None``) are static, with one plan per value, and must be
hashable; a Module may not share variables with another argument nor sit inside a container
argument; the loss may not assign a differentiated variable; and the policy may not choose
micro-batches (the loss reads and updates whole-batch state).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from remat.apply import _Transform
from remat.core.errors import ExtractionError, RematError
from remat.planning import resolve_policy

__all__ = ["value_and_grad", "grad"]

_NODE, _TREE, _STATIC = "node", "tree", "static"


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _is_differentiable(x) -> bool:
    """An array or a Python number (as ``jax.grad`` takes them)."""
    return _is_array(x) or (isinstance(x, (int, float, complex)) and not isinstance(x, bool))


def _has_node(x) -> bool:
    return any(nnx.graph.is_graph_node(leaf) for leaf in
               jax.tree_util.tree_leaves(x, is_leaf=nnx.graph.is_graph_node))


def _normalize_argnums(argnums) -> tuple[bool, dict[int, Any]]:
    """``(single, {index: DiffState filter or None})``: ``single`` when ``argnums`` is one int
    or ``DiffState``."""
    single = isinstance(argnums, (int, nnx.DiffState))
    items = (argnums,) if single else tuple(argnums)
    if not items:
        raise ExtractionError("argnums must name at least one argument")
    filters: dict[int, Any] = {}
    for a in items:
        if isinstance(a, nnx.DiffState):
            i, f = a.argnum, a.filter
        elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
            i, f = int(a), None
        else:
            raise ExtractionError(f"argnums entries must be ints or nnx.DiffState, got {a!r}")
        if i < 0:
            raise ExtractionError(f"argnums must be non-negative, got {i}")
        if i in filters:
            raise ExtractionError(f"argnum {i} is repeated in argnums")
        filters[i] = f
    return single, filters


def _hashable(x) -> Any:
    """``x`` itself when hashable, else its id (for filters, which the transform keeps)."""
    try:
        hash(x)
        return x
    except TypeError:
        return ("id", id(x))


def _static_key(a, i: int) -> tuple:
    """The cache key of static argument ``i``: its tree structure and (hashable) leaves."""
    leaves, tree = jax.tree_util.tree_flatten(a)
    try:
        hash(tuple(leaves))
    except TypeError:
        raise ExtractionError(f"argument {i} is neither an array nor hashable: a non-array "
                              "argument is static and needs hashable leaves") from None
    return tree, tuple((type(x), x) for x in leaves)


class _Structure:
    """One call's arguments taken apart: per argument its kind, graphdef and (differentiated)
    filter; the pure function's positional values; and the key of its graph structure."""

    def __init__(self, args: Sequence[Any], filters: dict[int, Any]):
        if max(filters) >= len(args):
            raise ExtractionError(
                f"argnums {sorted(filters)} point past the {len(args)} positional arguments")
        self.kinds, self.graphdefs, self.slots, self.rests = [], [], [], []
        seen: dict[int, int] = {}
        for i, a in enumerate(args):
            gd = rest = None
            if nnx.graph.is_graph_node(a):
                kind = _NODE
                for _, v in nnx.graph.iter_graph(a):
                    if isinstance(v, nnx.Variable):
                        j = seen.setdefault(id(v), i)
                        if j != i:
                            raise RematError(
                                f"arguments {j} and {i} share a variable; remat.nnx needs each "
                                "Module argument to own its variables")
                if i in filters:
                    gd, slot, rest = nnx.split(a, filters[i] or nnx.Param, ...)
                else:
                    gd, slot = nnx.split(a)
            elif i in filters:
                leaves = jax.tree_util.tree_leaves(a, is_leaf=nnx.graph.is_graph_node)
                if _has_node(a) or not leaves or not all(_is_differentiable(x) for x in leaves):
                    raise ExtractionError(
                        f"argnums entry {i} is a {type(a).__name__}; remat.nnx differentiates "
                        "nnx Modules (graph nodes) and arrays (or pytrees of arrays)")
                if filters[i] is not None:
                    raise ExtractionError(f"a DiffState filter needs a Module, argument {i} is "
                                          f"a {type(a).__name__}")
                kind, slot = _TREE, a
            elif _has_node(a):
                raise ExtractionError(
                    f"argument {i} is a container holding nnx Modules; pass the Modules as "
                    "separate positional arguments")
            elif any(_is_array(x) for x in jax.tree_util.tree_leaves(a)):
                kind, slot = _TREE, a
            else:
                kind, slot = _STATIC, _static_key(a, i)
            self.kinds.append(kind)
            self.graphdefs.append(gd)
            self.slots.append(slot)
            self.rests.append(rest)
        self.key = tuple(
            (k, gd, _hashable(filters.get(i)), slot if k == _STATIC else None)
            for i, (k, gd, slot) in enumerate(zip(self.kinds, self.graphdefs, self.slots)))

    def values(self) -> tuple:
        """The pure function's arguments: one per positional argument (``None`` for a static
        one), then the rest states."""
        return (*(None if k == _STATIC else v for k, v in zip(self.kinds, self.slots)),
                tuple(self.rests))


def _pure_fn(fn: Callable, st: _Structure, statics: tuple, filters: dict[int, Any],
             has_aux: bool) -> Callable:
    """``pure(*slots, rests) -> (loss, (aux, new_states))`` for arguments of structure ``st``;
    ``new_states[i]`` is the non-differentiated state of Module argument ``i`` after the loss
    (all of it for a Module that is not differentiated), ``None`` for other arguments."""
    kinds, graphdefs = tuple(st.kinds), tuple(st.graphdefs)

    def pure(*values):
        *slots, rests = values
        # nnx.merge reuses the states' Variable objects: remember the values before the loss
        diff_in = {i: jax.tree_util.tree_leaves(slots[i]) for i in filters if kinds[i] == _NODE}
        args = []
        for i, kind in enumerate(kinds):
            if kind == _NODE:
                parts = (slots[i],) if rests[i] is None else (slots[i], rests[i])
                args.append(nnx.merge(graphdefs[i], *parts))
            elif kind == _STATIC:
                args.append(statics[i])
            else:
                args.append(slots[i])
        out = fn(*args)
        loss, aux = out if has_aux else (out, None)
        new = []
        for i, kind in enumerate(kinds):
            if kind != _NODE:
                new.append(None)
            elif i in filters:
                _, diff, rest = nnx.split(args[i], filters[i] or nnx.Param, ...)
                if any(a is not b for a, b in zip(jax.tree_util.tree_leaves(diff), diff_in[i])):
                    raise RematError(
                        f"the loss assigns a differentiated variable of argument {i}; "
                        "remat.nnx writes back only the variables it does not differentiate")
                new.append(rest)
            else:
                new.append(nnx.split(args[i])[1])
        return loss, (aux, tuple(new))

    pure.__name__ = getattr(fn, "__name__", "loss")
    return pure


class NnxTransform:
    """The callable returned by :func:`value_and_grad` and :func:`grad`."""

    def __init__(self, fn: Callable, policy: Any, *, budget: Any, argnums: Any, has_aux: bool,
                 stages: Any, return_value: bool):
        self.fn = fn
        self.policy = policy
        self.budget = budget
        self.argnums = argnums
        self.has_aux = has_aux
        self.stages = stages
        self.return_value = return_value
        self._single, self._filters = _normalize_argnums(argnums)
        self._policy = resolve_policy(policy, budget)  # fail fast on unknown names
        self._transforms: dict = {}
        self._lock = threading.Lock()
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__doc__ = getattr(fn, "__doc__", None)

    def _transform(self, args: Sequence[Any]) -> tuple[_Structure, _Transform]:
        st = _Structure(args, self._filters)
        with self._lock:
            t = self._transforms.get(st.key)
        if t is None:
            statics = tuple(a if k == _STATIC else None for k, a in zip(st.kinds, args))
            pure = _pure_fn(self.fn, st, statics, self._filters, self.has_aux)
            nums = tuple(self._filters)  # in argnums order, as the gradients
            t = _Transform(pure, self._policy, budget=self.budget, microbatches=None,
                           argnums=nums[0] if self._single else nums, has_aux=True,
                           stages=self.stages, reduction="mean", mode="value_and_grad")
            t.choose_microbatches = False
            with self._lock:
                t = self._transforms.setdefault(st.key, t)
        return st, t

    def applied(self, *args):
        """The :class:`remat.apply.Applied` plan for these arguments (graph, plan, segments,
        predicted and realised saved bytes); made once per graph structure and shapes."""
        st, t = self._transform(args)
        return t.applied(*st.values())

    def __call__(self, *args):
        st, t = self._transform(args)
        (loss, (aux, new)), grads = t(*st.values())
        for a, kind, state in zip(args, st.kinds, new):
            if kind == _NODE:
                nnx.update(a, state)
        if self.return_value:
            return ((loss, aux) if self.has_aux else loss), grads
        return (grads, aux) if self.has_aux else grads


def value_and_grad(
    fn: Callable,
    policy: Any = None,
    *,
    budget: int | str | None = None,
    argnums: int | nnx.DiffState | Sequence[int | nnx.DiffState] = 0,
    has_aux: bool = False,
    stages: Any = "auto",
) -> NnxTransform:
    """Drop-in for ``nnx.value_and_grad`` that applies a rematerialization plan.

    Args:
      fn: ``fn(*args)`` returning a float scalar loss (or ``(loss, aux)`` with ``has_aux``).
      policy: ``None`` (no remat), a policy object or a registry name (``"checkmate"``).
      budget: activation-memory budget in bytes or a string (``"60%"``, ``"512MiB"``).
      argnums: positional argument(s) to differentiate, as in ``nnx.value_and_grad``: ints
        (a Module's ``nnx.Param`` variables, or an array) or ``nnx.DiffState(i, filter)``.
      has_aux: ``fn`` returns ``(loss, aux)``.
      stages: the extractor's stage grouping (see :func:`remat.value_and_grad`).

    Returns:
      A callable returning ``(loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``): a
      Module's gradient is the ``nnx.State`` of its differentiated variables, a tuple of them
      when ``argnums`` is a sequence.  Updated non-differentiated variables are written back
      into the Modules.  ``f.applied(*args)`` gives the plan (:class:`remat.apply.Applied`).

    Raises:
      UnknownNameError: unknown policy name.
      ExtractionError: bad ``argnums`` (out of range, repeated, pointing at something that is
        neither a Module nor an array), or a loss that is not a float scalar.
      RematError: Module arguments sharing variables; the loss assigns a differentiated
        variable.
    """
    return NnxTransform(fn, policy, budget=budget, argnums=argnums, has_aux=has_aux,
                        stages=stages, return_value=True)


def grad(
    fn: Callable,
    policy: Any = None,
    *,
    budget: int | str | None = None,
    argnums: int | nnx.DiffState | Sequence[int | nnx.DiffState] = 0,
    has_aux: bool = False,
    stages: Any = "auto",
) -> NnxTransform:
    """Drop-in for ``nnx.grad``: :func:`value_and_grad` returning only the gradients
    (``(grads, aux)`` with ``has_aux``)."""
    return NnxTransform(fn, policy, budget=budget, argnums=argnums, has_aux=has_aux,
                        stages=stages, return_value=False)
