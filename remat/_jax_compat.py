"""The one module through which remat touches JAX internals, for every supported JAX version.

Three kinds of internals, each read here and nowhere else:

* private functions (``jax._src``), listed in :data:`INTERNALS` and resolved by
  :func:`internal`: name stacks and source summaries, ``eval_context``, ``saved_residuals``,
  ``dce_jaxpr``; and public functions whose result changed (:func:`save_only_these_names`,
  :func:`save_and_offload_only_these_names`);
* equation parameters of control flow and calls: :func:`scan_params` (jax <= 0.11 stores
  ``num_consts``/``num_carry``; jax 0.12 stores flat trees ``ft_in``/``ft_out``),
  :func:`cond_branches`, :func:`while_parts`, :func:`call_body` (:data:`CALL_BODY`,
  :data:`CUSTOM_BODY`), :func:`bind_params`;
* the jaxpr layout: up to jax 0.11 a ``ClosedJaxpr`` wraps a ``Jaxpr`` and its constants, from
  0.12 one ``Jaxpr`` carries them (:func:`open_jaxpr`, :func:`jaxpr_consts`, :func:`is_literal`,
  :func:`is_dropvar`).

:func:`check` resolves every internal and runs every accessor on a tiny traced program (scan,
cond, while, jit, checkpoint, custom_jvp, custom_vjp); it returns the problems found, so a new
JAX release is checked in one call (``tests/test_jax_compat.py``), the offloading policy
included.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, NamedTuple

import jax
from jax.extend import core as _jc

from remat.core.errors import RematError

__all__ = [
    "JAX_VERSION", "INTERNALS", "CALL_BODY", "CUSTOM_BODY", "SCAN_KEYS", "COND_KEYS",
    "WHILE_KEYS", "JaxInternalError", "internal", "check",
    "new_name_stack", "current_name_stack", "scope_names", "transform_names", "user_context",
    "summarize", "eval_context", "saved_residuals", "dce_jaxpr", "save_only_these_names",
    "save_and_offload_only_these_names", "name_primitive",
    "ScanParams", "scan_params", "cond_branches", "while_parts", "call_body", "bind_params",
    "open_jaxpr", "jaxpr_consts", "is_literal", "is_dropvar",
]

JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in re.findall(r"\d+", jax.__version__)[:3])
"""The installed JAX version, e.g. ``(0, 12, 0)``."""

INTERNALS: dict[str, str] = {
    "NameStack": "jax._src.source_info_util:NameStack",
    "Scope": "jax._src.source_info_util:Scope",
    "Transform": "jax._src.source_info_util:Transform",
    "user_context": "jax._src.source_info_util:user_context",
    "current_name_stack": "jax._src.source_info_util:current_name_stack",
    "summarize": "jax._src.source_info_util:summarize",
    "eval_context": "jax._src.core:eval_context",
    "saved_residuals": "jax._src.ad_checkpoint:saved_residuals",
    "dce_jaxpr": "jax._src.interpreters.partial_eval:dce_jaxpr",
    "DropVar": "jax._src.core:DropVar",  # jax 0.8: not in jax.extend.core
}
"""Every private JAX name remat uses: short name -> ``module:attribute``."""

CALL_BODY: dict[str, str] = {
    "jit": "jaxpr",
    "pjit": "jaxpr",  # jax < 0.7 names jit's primitive pjit
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",  # jax.checkpoint
    "checkpoint": "jaxpr",
}
"""Call wrappers: primitive -> the parameter holding its body."""

CUSTOM_BODY: dict[str, str] = {
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "custom_jvp_call_jaxpr": "fun_jaxpr",
    "composite": "jaxpr",
    "custom_vmap_call": "call_jaxpr",
}
"""Custom-derivative and composite calls: primitive -> the parameter holding its body."""

_BODY_KEYS = ("call_jaxpr", "fun_jaxpr", "jaxpr")  # unregistered call-like primitives

SCAN_KEYS = ("jaxpr", "length", "reverse", "unroll", "num_consts", "num_carry", "ft_in", "ft_out")
"""Scan parameters read (``num_*`` up to jax 0.11, ``ft_*`` from 0.12)."""
COND_KEYS = ("branches",)
WHILE_KEYS = ("cond_jaxpr", "body_jaxpr", "cond_nconsts", "body_nconsts")


class JaxInternalError(RematError, ImportError):
    """A JAX internal remat relies on is missing from the installed JAX."""


def internal(name: str) -> Any:
    """The object :data:`INTERNALS` ``[name]`` names, imported now.

    Raises:
      JaxInternalError: the module or attribute is missing on the installed JAX.
    """
    path = INTERNALS[name]
    mod, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(mod)
        return getattr(obj, attr) if attr else obj
    except (ImportError, AttributeError) as exc:
        raise JaxInternalError(f"jax {jax.__version__} has no {path} (remat's {name!r}): "
                               f"{exc}") from exc


# ------------------------------------------------------------------------------ name stacks
_NameStack, _Scope, _Transform, _DropVar = (
    internal(n) for n in ("NameStack", "Scope", "Transform", "DropVar"))


def new_name_stack():
    """An empty name stack."""
    return _NameStack()


def current_name_stack():
    """The name stack of the trace being built."""
    return internal("current_name_stack")()


def scope_names(stack) -> list[str]:
    """Names of the ``Scope`` entries of a name stack, outermost first (transforms skipped)."""
    return [s.name for s in stack.stack if isinstance(s, _Scope)]


def transform_names(stack) -> list[str]:
    """Names of the transform entries (``jvp``, ``transpose``, ...) of a name stack."""
    return [s.name for s in stack.stack if isinstance(s, _Transform)]


def user_context(traceback, *, name_stack):
    """Context manager binding equations under ``traceback`` and ``name_stack``."""
    return internal("user_context")(traceback, name_stack=name_stack)


def summarize(source_info) -> str:
    """``file:line (function)`` of an equation's source info."""
    return internal("summarize")(source_info)


# ------------------------------------------------------------------------------ functions
def eval_context():
    """Context manager running JAX operations eagerly even inside a trace."""
    return internal("eval_context")()


def saved_residuals(fn, *args) -> list[tuple[Any, str]]:
    """``[(aval, description)]`` of what ``jax.vjp(fn, *args)`` saves (abstract, runs nothing)."""
    return internal("saved_residuals")(fn, *args)


def save_only_these_names(*names: str):
    """``jax.checkpoint_policies.save_only_these_names(*names)`` with ``.saveable_names`` (a
    frozenset; jax <= 0.11 returns an object holding it, jax 0.12 a plain function)."""
    pol = jax.checkpoint_policies.save_only_these_names(*names)
    if not hasattr(pol, "saveable_names"):
        pol.saveable_names = frozenset(names)
    return pol


def save_and_offload_only_these_names(saved, offloaded, *, src: str = "device",
                                      dst: str = "pinned_host"):
    """``jax.checkpoint_policies.save_and_offload_only_these_names``: values tagged (by
    ``checkpoint_name``) with a name in ``saved`` are saved, in ``offloaded`` are moved from memory
    kind ``src`` to ``dst`` (``Offloadable``), every other value is recomputed.  The result carries
    ``.saveable_names`` and ``.offloaded_names`` (frozensets)."""
    saved, offloaded = frozenset(saved), frozenset(offloaded)
    pol = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=sorted(saved), names_which_can_be_offloaded=sorted(offloaded),
        offload_src=src, offload_dst=dst)

    def policy(*args, **params):  # a plain function: the attributes below can be attached
        return pol(*args, **params)

    policy.saveable_names = saved
    policy.offloaded_names = offloaded
    return policy


def name_primitive():
    """The primitive ``jax.ad_checkpoint.checkpoint_name`` binds, with which checkpoint policies
    are called for a tagged value (``policy(name_p, aval, name=...)``); read from a traced
    program (``jax.ad_checkpoint.name_p`` is public only from jax 0.12)."""
    from jax.ad_checkpoint import checkpoint_name

    closed = jax.make_jaxpr(lambda x: checkpoint_name(x, "remat"))(0.0)
    return open_jaxpr(closed).eqns[0].primitive


def dce_jaxpr(jaxpr):
    """``jaxpr`` with equations no output reads removed (every output kept)."""
    out, _ = internal("dce_jaxpr")(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
    return out


# ------------------------------------------------------------------------------ jaxprs
def open_jaxpr(j):
    """The ``Jaxpr`` of a ``ClosedJaxpr`` (jax <= 0.11) or ``j`` itself (an open ``Jaxpr``;
    from jax 0.12 every jaxpr, its constants attached)."""
    return j if isinstance(j, _jc.Jaxpr) else j.jaxpr


def jaxpr_consts(j) -> list:
    """Constants bound to ``open_jaxpr(j).constvars`` (none for an open jaxpr before 0.12)."""
    return list(getattr(j, "consts", ()) or ())


def is_literal(v) -> bool:
    """``v`` (an equation operand) is a literal."""
    return isinstance(v, _jc.Literal)


def is_dropvar(v) -> bool:
    """``v`` (an equation result) is dropped."""
    return isinstance(v, _DropVar)


# ------------------------------------------------------------------------------ equations
def _name(e) -> str:
    return e.primitive.name


class ScanParams(NamedTuple):
    """A scan equation's parameters (body inputs are ``consts, carry, xs``)."""

    jaxpr: Any
    length: int
    num_consts: int
    num_carry: int
    reverse: bool
    unroll: Any


def scan_params(e) -> ScanParams:
    """:class:`ScanParams` of a scan equation (``JaxprEqn`` or ``LeafEqn``)."""
    p = e.params
    if "num_consts" in p:
        nc, ncar = int(p["num_consts"]), int(p["num_carry"])
    else:  # jax >= 0.12: ft_in is a flat tree (consts, carry, xs)
        consts, carry, _ = p["ft_in"].unpack()
        nc, ncar = len(consts), len(carry)
    return ScanParams(p["jaxpr"], int(p["length"]), nc, ncar, bool(p.get("reverse", False)),
                      p.get("unroll", 1))


def cond_branches(e) -> tuple:
    """The branch jaxprs of a ``cond`` equation."""
    return tuple(e.params["branches"])


def while_parts(e) -> tuple[Any, Any, int, int]:
    """``(cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts)`` of a ``while`` equation."""
    p = e.params
    return p["cond_jaxpr"], p["body_jaxpr"], int(p["cond_nconsts"]), int(p["body_nconsts"])


def call_body(e, key: str | None = None):
    """The body jaxpr of a call-like equation, or ``None``.

    Registered primitives (:data:`CALL_BODY`, :data:`CUSTOM_BODY`) read their parameter;
    others read ``key`` or the first of ``call_jaxpr``, ``fun_jaxpr``, ``jaxpr`` present.
    """
    p = e.params
    k = CALL_BODY.get(_name(e)) or CUSTOM_BODY.get(_name(e)) or key
    if k is not None:
        return p.get(k)
    return next((p[k] for k in _BODY_KEYS if p.get(k) is not None), None)


def bind_params(e) -> tuple[tuple, dict]:
    """``(subfuns, params)`` to re-bind equation ``e``: ``e.primitive.bind(*subfuns, *args,
    **params)``."""
    bp = e.primitive.get_bind_params(e.params)
    if isinstance(bp, tuple):  # older JAX: (subfuns, params)
        return tuple(bp[0]), bp[1]
    return (), bp


# ------------------------------------------------------------------------------ the check
def _probe_program():
    import jax.numpy as jnp
    from jax import lax

    @jax.custom_jvp
    def cj(x):
        return jnp.sin(x)

    cj.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))

    @jax.custom_vjp
    def cv(x):
        return jnp.cos(x)

    cv.defvjp(lambda x: (jnp.cos(x), x), lambda r, g: (-jnp.sin(r) * g,))

    def f(x, w):
        c, ys = lax.scan(lambda c, xi: (c * xi + w, c), w, x)
        y = lax.cond(c > 0, jnp.sin, jnp.cos, x)
        z = lax.while_loop(lambda v: v[0] < 10.0, lambda v: v * 2.0 + 1.0, x)
        j = jax.jit(lambda a: a * 3.0)(x)
        k = jax.checkpoint(lambda a: jnp.sin(a) * 2.0)(x)
        return c + ys.sum() + y.sum() + z.sum() + j.sum() + k.sum() + cj(x).sum() + cv(x).sum()

    return jax.make_jaxpr(f)(jnp.ones(3), jnp.float32(0.5))


def _n_in(j) -> int:
    return len(open_jaxpr(j).invars)


def _probe_scan(e) -> None:
    sp = scan_params(e)
    n_xs = len(e.invars) - sp.num_consts - sp.num_carry
    ok = (sp.length == 3 and sp.num_carry == 1 and n_xs == 1 and sp.num_consts >= 0
          and _n_in(sp.jaxpr) == len(e.invars) and not sp.reverse)
    assert ok, f"scan_params gave {sp[1:]} for {len(e.invars)} operands"
    subfuns, params = bind_params(e)
    vals = [jax.numpy.ones(v.aval.shape, v.aval.dtype) for v in e.invars]
    outs = e.primitive.bind(*subfuns, *vals, **params)
    assert len(outs) == len(e.outvars), "re-binding the scan gave the wrong number of results"


def _probe_cond(e) -> None:
    br = cond_branches(e)
    assert len(br) == 2 and all(_n_in(b) == len(e.invars) - 1 for b in br), "cond_branches"


def _probe_while(e) -> None:
    cj, bj, cn, bn = while_parts(e)
    assert _n_in(cj) == cn + 1 and _n_in(bj) == bn + 1, "while_parts"


def _probe_call(e) -> None:
    b = call_body(e)
    assert b is not None and open_jaxpr(b).eqns, f"call_body of {_name(e)}"
    assert len(jaxpr_consts(b)) + _n_in(b) >= len(e.invars), f"call_body of {_name(e)} inputs"


_PROBES = {"scan": _probe_scan, "cond": _probe_cond, "while": _probe_while,
           "jit|pjit": _probe_call, "remat2|checkpoint": _probe_call,
           "custom_jvp_call": _probe_call, "custom_vjp_call|custom_vjp_call_jaxpr": _probe_call}


def check() -> list[str]:
    """Problems with the internals remat uses on the installed JAX (empty: none).

    Resolves every :data:`INTERNALS` entry, then runs each equation accessor (and a re-bind of
    the scan) on :func:`_probe_program`'s equations.
    """
    problems = []
    for name in INTERNALS:
        try:
            internal(name)
        except JaxInternalError as exc:
            problems.append(f"{name}: {exc}")
    try:
        closed = _probe_program()
        stack = new_name_stack().extend("a")
        assert scope_names(stack) == ["a"] and summarize(closed.jaxpr.eqns[0].source_info)
    except Exception as exc:  # noqa: BLE001 - report, do not raise
        return [*problems, f"probe program: {type(exc).__name__}: {exc}"]
    eqns = open_jaxpr(closed).eqns
    for names, probe in _PROBES.items():
        found = [e for e in eqns if _name(e) in names.split("|")]
        if not found:
            problems.append(f"{names}: no such equation in the probe program")
            continue
        try:
            probe(found[0])
        except Exception as exc:  # noqa: BLE001 - report, do not raise
            problems.append(f"{names}: {type(exc).__name__}: {exc}")
    try:  # remat.offload's policy: a tagged value is offloaded device -> pinned_host
        got = save_and_offload_only_these_names((), ["remat"])(
            name_primitive(), jax.ShapeDtypeStruct((), "float32"), name="remat")
        assert (got.src, got.dst) == ("device", "pinned_host"), got
    except Exception as exc:  # noqa: BLE001 - report, do not raise
        problems.append(f"save_and_offload_only_these_names: {type(exc).__name__}: {exc}")
    return problems
