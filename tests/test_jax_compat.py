"""The JAX internals remat touches, checked on the installed JAX (:mod:`remat._jax_compat`).

The list below is the contract: every private name resolves, every accessor reads a traced
scan / cond / while / jit / checkpoint / custom_jvp / custom_vjp equation correctly, and
:func:`~remat._jax_compat.check` reports a missing name or a broken accessor instead of passing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from remat import _jax_compat as compat
from remat.frontend import INLINE_FORWARD, evaluate, flatten

# the private JAX names remat uses (module:attribute); a new one goes here and in INTERNALS
USED = {
    "NameStack": "jax._src.source_info_util:NameStack",
    "Scope": "jax._src.source_info_util:Scope",
    "Transform": "jax._src.source_info_util:Transform",
    "user_context": "jax._src.source_info_util:user_context",
    "current_name_stack": "jax._src.source_info_util:current_name_stack",
    "summarize": "jax._src.source_info_util:summarize",
    "eval_context": "jax._src.core:eval_context",
    "saved_residuals": "jax._src.ad_checkpoint:saved_residuals",
    "dce_jaxpr": "jax._src.interpreters.partial_eval:dce_jaxpr",
    "DropVar": "jax._src.core:DropVar",
}


def test_internals_are_the_listed_ones():
    assert compat.INTERNALS == USED


@pytest.mark.parametrize("name", sorted(USED))
def test_internal_resolves(name):
    assert compat.internal(name) is not None


def test_check_is_clean_on_the_installed_jax():
    assert compat.check() == [], jax.__version__


def _eqn(closed, name):
    return next(e for e in compat.open_jaxpr(closed).eqns if e.primitive.name == name)


def test_scan_params_and_rebind():
    w = jnp.float32(0.5)

    def f(x, c0):
        return lax.scan(lambda c, xi: (c * xi + w, (c, xi)), c0, x, reverse=True)

    x = jnp.arange(1.0, 5.0)
    closed = jax.make_jaxpr(f)(x, jnp.float32(1.0))
    e = _eqn(closed, "scan")
    sp = compat.scan_params(e)
    assert (sp.length, sp.num_carry, sp.reverse) == (4, 1, True)
    assert sp.num_consts + sp.num_carry + 1 == len(e.invars)
    assert len(compat.open_jaxpr(sp.jaxpr).invars) == len(e.invars)
    # frontend.evaluate re-binds the scan with its own parameters (ft_in/ft_out on jax 0.12)
    fj = flatten(closed, INLINE_FORWARD)
    assert [le.name for le in fj.eqns].count("scan") == 1
    env = evaluate(fj.eqns, {**fj.const_env(), **dict(zip(fj.arg_ids, [x, jnp.float32(1.0)]))})
    got = [r.val if not isinstance(r, int) else env[r] for r in fj.out_refs]
    want = jax.tree_util.tree_leaves(f(x, jnp.float32(1.0)))
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b)


def test_cond_and_while_accessors():
    def f(x):
        y = lax.cond(x[0] > 0, jnp.sin, jnp.cos, x)
        return lax.while_loop(lambda v: v[0] < 10.0, lambda v: v * 2.0 + y, x)

    closed = jax.make_jaxpr(f)(jnp.ones(3))
    br = compat.cond_branches(_eqn(closed, "cond"))
    assert len(br) == 2 and all(compat.open_jaxpr(b).eqns for b in br)
    cj, bj, cn, bn = compat.while_parts(_eqn(closed, "while"))
    assert (cn, bn) == (0, 1)
    assert len(compat.open_jaxpr(bj).invars) == bn + 1
    assert len(compat.open_jaxpr(cj).outvars) == 1


def test_call_bodies():
    @jax.custom_jvp
    def cj(x):
        return jnp.sin(x)

    cj.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))

    @jax.custom_vjp
    def cv(x):
        return jnp.cos(x)

    cv.defvjp(lambda x: (jnp.cos(x), x), lambda r, g: (-jnp.sin(r) * g,))

    def f(x):
        return jax.jit(jnp.tanh)(x) + jax.checkpoint(jnp.exp)(x) + cj(x) + cv(x)

    closed = jax.make_jaxpr(f)(jnp.ones(3))
    seen = {}
    for e in compat.open_jaxpr(closed).eqns:
        body = compat.call_body(e)
        if body is not None:
            seen[e.primitive.name] = {x.primitive.name for x in compat.open_jaxpr(body).eqns}
    jit_name = "jit" if "jit" in seen else "pjit"
    assert seen[jit_name] == {"tanh"} and "exp" in seen["remat2"]
    assert seen["custom_jvp_call"] == {"sin"} and seen["custom_vjp_call"] == {"cos"}
    assert compat.call_body(_eqn(closed, "add")) is None


def test_jaxpr_layout_and_name_stacks():
    c = jnp.arange(3.0)
    closed = jax.make_jaxpr(lambda x: x + c)(jnp.ones(3))
    j = compat.open_jaxpr(closed)
    assert len(j.constvars) == len(compat.jaxpr_consts(closed)) == 1
    lit = jax.make_jaxpr(lambda x: x + 1.0)(jnp.ones(3)).eqns[0].invars[1]
    assert compat.is_literal(lit) and not compat.is_dropvar(lit)
    stack = compat.new_name_stack().extend("a").transform("jvp").extend("b")
    assert compat.scope_names(stack) == ["a", "b"] and compat.transform_names(stack) == ["jvp"]
    with compat.eval_context():
        assert compat.scope_names(compat.current_name_stack()) == []
    res = compat.saved_residuals(lambda x: jnp.sin(jnp.sin(x)).sum(), jnp.ones(3))
    assert any("argument" not in d for _, d in res)
    big = jax.make_jaxpr(lambda x: (jnp.sin(x), x * 2)[1])(jnp.ones(3))
    assert len(compat.dce_jaxpr(compat.open_jaxpr(big)).eqns) == 1

    pol = compat.save_only_these_names("b", "a")
    assert pol.saveable_names == frozenset({"a", "b"}) and callable(pol)


# ------------------------------------------------------------------------------ it can fail
def test_check_reports_a_missing_internal(monkeypatch):
    monkeypatch.setitem(compat.INTERNALS, "saved_residuals", "jax._src.ad_checkpoint:gone")
    problems = compat.check()
    assert len(problems) == 1 and problems[0].startswith("saved_residuals:"), problems
    with pytest.raises(compat.JaxInternalError, match="gone"):
        compat.saved_residuals(jnp.sin, jnp.ones(3))


def test_check_reports_a_broken_accessor(monkeypatch):
    # the jax 0.12 break: the scan equation lost num_consts
    def old_scan_params(e):
        return e.params["num_consts"] if "ft_in" in e.params else e.params["ft_in"]

    monkeypatch.setattr(compat, "scan_params", old_scan_params)
    problems = compat.check()
    assert len(problems) == 1 and problems[0].startswith("scan: KeyError"), problems


def test_op_class_sees_into_jax_checkpoint():
    """``jax.checkpoint``'s equation (primitive ``remat2``) takes the class of its body, as the
    other call-like primitives do: a symmetrical body is symmetrical, a dot makes it asymmetrical."""
    from remat.stages import eqn_class

    def eqn(f):
        closed = jax.make_jaxpr(jax.checkpoint(f))(jnp.ones((3, 3)))
        return next(e for e in closed.eqns if e.primitive.name == "remat2")

    assert eqn_class(eqn(lambda x: jnp.tanh(x) * 2.0)) == "symmetrical"
    assert eqn_class(eqn(lambda x: x @ x)) == "asymmetrical"
