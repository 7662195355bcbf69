"""remat.nnx: the nnx-shaped drop-in, checked against ``nnx.value_and_grad`` on the same model.

Every comparison runs both sides in the same mode (eager, or both under ``nnx.jit``) on two
copies of one model built from the same seed: value and every gradient leaf at float32 rtol
1e-5, the same gradient tree (``nnx.State`` of ``nnx.Param``), and the same variables left in
the Module afterwards (BatchNorm statistics, Dropout RNG counters).  Models use ReLU.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import remat
from policies.base import BasePolicy, checkpoint_all_plan
from remat.core.errors import ExtractionError, NotApplicableError, RematError, UnknownNameError

RTOL, ATOL = 1e-5, 1e-6


class MLP(nnx.Module):
    """``Linear -> [BatchNorm] -> 6 x (Linear, relu) -> [Dropout] -> Linear``."""

    def __init__(self, rngs, *, bn=False, drop=0.0, width=16, depth=6):
        self.inp = nnx.Linear(4, width, rngs=rngs)
        self.bn = nnx.BatchNorm(width, rngs=rngs) if bn else None
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.drop = nnx.Dropout(drop, rngs=rngs) if drop else None
        self.out = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x):
        h = self.inp(x)
        if self.bn is not None:
            h = self.bn(h)
        for layer in self.layers:
            h = jax.nn.relu(layer(h))
        if self.drop is not None:
            h = self.drop(h)
        return self.out(h)


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def data(batch=8, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((batch, 4)), jnp.float32),
            jnp.asarray(rng.standard_normal((batch, 1)), jnp.float32))


def pair(**kw):
    """Two identical models."""
    return MLP(nnx.Rngs(0), **kw), MLP(nnx.Rngs(0), **kw)


def plain(x):
    return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def assert_tree_close(a, b, rtol=RTOL, atol=ATOL):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(plain(x)), np.asarray(plain(y)), rtol=rtol,
                                   atol=atol)


# one transform shared by the tests on the plain MLP: its plan is made once
SQRTN = remat.nnx.value_and_grad(loss_fn, "sqrtn")


@pytest.mark.parametrize("vg", [SQRTN, remat.nnx.value_and_grad(loss_fn, "checkmate",
                                                                 budget=remat.modelled("60%"))],
                         ids=["sqrtn", "checkmate-60%"])
def test_value_and_grads_equal_nnx(vg):
    m1, m2 = pair()
    x, y = data()
    value, grads = vg(m1, x, y)
    ref_value, ref_grads = nnx.value_and_grad(loss_fn)(m2, x, y)
    np.testing.assert_allclose(value, ref_value, rtol=RTOL)
    assert isinstance(grads, nnx.State)
    assert_tree_close(grads, ref_grads)
    app = vg.applied(m1, x, y)
    assert app.plan is not None and app.plan.R.sum() > app.graph.n  # something is recomputed


def test_plan_cached_per_graph_and_shapes():
    m1, _ = pair()
    x, y = data()
    SQRTN(m1, x, y)
    SQRTN(MLP(nnx.Rngs(3)), x, y)  # another model of the same structure: same transform
    assert len(SQRTN._transforms) == 1
    (t,) = SQRTN._transforms.values()
    n = len(t._cache)
    SQRTN(m1, x, y)
    assert len(t._cache) == n
    SQRTN(m1, *data(batch=16))
    assert len(t._cache) == n + 1
    assert SQRTN.applied(m1, x, y) is SQRTN.applied(m1, x, y)
    SQRTN(MLP(nnx.Rngs(0), depth=3), x, y)  # another graph: its own transform
    assert len(SQRTN._transforms) == 2


def test_argnums_two_modules():
    def loss(a, b, x, y):
        return jnp.mean((a(x) + b(x) - y) ** 2)

    (a1, a2), (b1, b2) = pair(), (MLP(nnx.Rngs(1)), MLP(nnx.Rngs(1)))
    x, y = data()
    value, grads = remat.nnx.value_and_grad(loss, "sqrtn", argnums=(0, 1))(a1, b1, x, y)
    ref_value, ref_grads = nnx.value_and_grad(loss, argnums=(0, 1))(a2, b2, x, y)
    np.testing.assert_allclose(value, ref_value, rtol=RTOL)
    assert isinstance(grads, tuple) and len(grads) == 2
    assert_tree_close(grads, ref_grads)


def test_argnums_module_and_array_with_aux():
    def loss(w, model, x, y):
        pred = model(x) * w
        return jnp.mean((pred - y) ** 2), {"pred_sum": pred.sum()}

    m1, m2 = pair()
    x, y = data()
    w = jnp.full((1,), 1.5, jnp.float32)
    (value, aux), grads = remat.nnx.value_and_grad(
        loss, "sqrtn", argnums=(1, 0), has_aux=True)(w, m1, x, y)
    (ref_value, ref_aux), ref_grads = nnx.value_and_grad(
        loss, argnums=(1, 0), has_aux=True)(w, m2, x, y)
    np.testing.assert_allclose(value, ref_value, rtol=RTOL)
    assert_tree_close(aux, ref_aux)
    assert_tree_close(grads, ref_grads)  # (module grads, array grad), in argnums order
    assert grads[1].shape == w.shape


def test_grad_and_diffstate():
    m1, m2 = pair()
    x, y = data()
    only_layers = nnx.DiffState(0, nnx.PathContains("layers"))
    grads = remat.nnx.grad(loss_fn, "sqrtn", argnums=only_layers)(m1, x, y)
    ref = nnx.grad(loss_fn, argnums=only_layers)(m2, x, y)
    assert_tree_close(grads, ref)
    assert set(grads) == {"layers"}

    def aux_loss(model, x, y):
        return loss_fn(model, x, y), 7.0

    grads, aux = remat.nnx.grad(aux_loss, "sqrtn", has_aux=True)(m1, x, y)
    assert_tree_close(grads, nnx.grad(loss_fn)(m2, x, y))
    assert float(aux) == 7.0


def test_batchnorm_and_dropout_state_written_back():
    """Train-mode BatchNorm statistics and Dropout RNG counters after two steps are what
    ``nnx.value_and_grad`` leaves, with the BatchNorm stage recomputed; the Module's Params are
    untouched."""
    m1, m2 = pair(bn=True, drop=0.25)
    x, y = data()
    vg = remat.nnx.value_and_grad(loss_fn, "checkmate", budget=remat.modelled("60%"))
    app = vg.applied(m1, x, y)
    assert app.graph.nodes[0].name == "fwd/layer0" and app.plan.R[:, 0].sum() > 1
    before = jax.tree.map(np.asarray, nnx.state(m1, nnx.Param))
    for _ in range(2):
        value, grads = vg(m1, x, y)
        ref_value, ref_grads = nnx.value_and_grad(loss_fn)(m2, x, y)
        np.testing.assert_allclose(value, ref_value, rtol=RTOL)
        assert_tree_close(grads, ref_grads)
    assert_tree_close(nnx.state(m1, nnx.Param), before, rtol=0, atol=0)
    stats, ref_stats = nnx.state(m1, nnx.BatchStat), nnx.state(m2, nnx.BatchStat)
    assert not np.allclose(stats["bn"]["mean"][...], 0)  # the statistics did move
    assert_tree_close(stats, ref_stats)
    assert_tree_close(nnx.state(m1, nnx.RngState), nnx.state(m2, nnx.RngState), rtol=0, atol=0)
    assert int(m1.drop.rngs.count[...]) == 2


def test_inside_nnx_jit_with_optimizer():
    """A few ``nnx.Optimizer`` steps under ``nnx.jit``: the same losses, parameters and
    BatchNorm statistics as the same loop with ``nnx.value_and_grad``."""
    x, y = data()

    def train(vg, steps=4):
        model = MLP(nnx.Rngs(0), bn=True)
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

        @nnx.jit
        def step(model, opt, x, y):
            value, grads = vg(model, x, y)
            opt.update(model, grads)
            return value

        return [float(step(model, opt, x, y)) for _ in range(steps)], model

    vg = remat.nnx.value_and_grad(loss_fn, "sqrtn")
    losses, model = train(vg)
    ref_losses, ref_model = train(nnx.value_and_grad(loss_fn))
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    assert losses[-1] < losses[0]
    assert_tree_close(nnx.state(model), nnx.state(ref_model))
    assert len(vg._transforms) == 1 and len(next(iter(vg._transforms.values()))._cache) == 1


def test_static_argument():
    def loss(model, x, y, scale):
        return loss_fn(model, x, y) * (2.0 if scale == "double" else 1.0)

    m1, m2 = pair()
    x, y = data()
    vg = remat.nnx.value_and_grad(loss, "sqrtn")
    v1, _ = vg(m1, x, y, "double")
    v2, _ = vg(m1, x, y, "single")
    np.testing.assert_allclose(v1, 2 * v2, rtol=RTOL)
    assert len(vg._transforms) == 2
    vg(m1, x, y, "double")
    assert len(vg._transforms) == 2

    def onehot_loss(model, x, y, n):  # a Python int is static, as under nnx.value_and_grad
        return jnp.mean(model(x) * jax.nn.one_hot(jnp.zeros(x.shape[0], int), n)[:, :1])

    value, grads = remat.nnx.value_and_grad(onehot_loss, "sqrtn")(m1, x, y, 3)
    ref_value, ref_grads = nnx.value_and_grad(onehot_loss)(m2, x, y, 3)
    np.testing.assert_allclose(value, ref_value, rtol=RTOL)
    assert_tree_close(grads, ref_grads)
    with pytest.raises(ExtractionError, match="neither an array nor hashable"):
        vg(m1, x, y, {"double"})  # a set: unhashable


def test_lazy_attribute():
    import remat.nnx as module

    assert remat.nnx is module and callable(remat.nnx.value_and_grad)


# --------------------------------------------------------------------------- bad input
def test_bad_input_typed_errors():
    m, _ = pair()
    x, y = data()
    with pytest.raises(ExtractionError, match="argnums entry 3 is a str"):
        remat.nnx.value_and_grad(lambda m, x, y, s: loss_fn(m, x, y), "sqrtn",
                                 argnums=(0, 3))(m, x, y, "x")
    with pytest.raises(ExtractionError, match="point past"):
        remat.nnx.value_and_grad(loss_fn, "sqrtn", argnums=5)(m, x, y)
    with pytest.raises(ExtractionError, match="repeated"):
        remat.nnx.value_and_grad(loss_fn, "sqrtn", argnums=(0, 0))
    with pytest.raises(ExtractionError, match="DiffState filter needs a Module"):
        remat.nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(1, nnx.Param))(m, x, y)
    with pytest.raises(ExtractionError, match="container holding nnx Modules"):
        remat.nnx.value_and_grad(lambda m, ms, x: jnp.mean(m(x)), "sqrtn")(m, [m], x)
    with pytest.raises(ExtractionError, match="scalar"):
        remat.nnx.value_and_grad(lambda m, x: m(x), "sqrtn")(m, x)
    with pytest.raises(RematError, match="share a variable"):
        remat.nnx.value_and_grad(lambda a, b, x: jnp.mean(a(x) + b(x)), "sqrtn")(m, m, x)
    with pytest.raises(UnknownNameError):
        remat.nnx.value_and_grad(loss_fn, "no_such_policy")


def test_assigning_a_differentiated_variable_is_refused():
    def loss(model, x, y):
        model.out.bias[...] = model.out.bias[...] + 1.0
        return loss_fn(model, x, y)

    m, _ = pair()
    with pytest.raises(RematError, match="assigns a differentiated variable"):
        remat.nnx.value_and_grad(loss, "sqrtn")(m, *data())


@dataclasses.dataclass(frozen=True)
class HalveBatch(BasePolicy):
    """Test policy: two micro-batches when the planner offers a split batch."""

    budget: int | None = None

    def solve(self, graph, budget_bytes, ctx):
        if ctx is None or ctx.graph_at is None:
            raise NotApplicableError("no micro-batch graph offered")
        return dataclasses.replace(checkpoint_all_plan(ctx.graph_at(2)), microbatches=2)


def test_policy_is_not_offered_microbatches():
    """The loss reads and writes whole-batch state (BatchNorm): no split batch is offered."""
    m, _ = pair(bn=True)
    with pytest.raises(NotApplicableError, match="no micro-batch graph"):
        remat.nnx.value_and_grad(loss_fn, HalveBatch())(m, *data())
