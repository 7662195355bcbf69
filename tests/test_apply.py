"""remat.apply: the drop-in value_and_grad / grad / checkpoint and checkpoint_policy.

References are always JAX's own ``jax.value_and_grad`` of the unmodified function (float32,
rtol 1e-5 / atol 1e-6), compared in the same execution mode (both jitted): BatchNorm models at
tiny sizes are ill-conditioned enough that jit vs eager differ by more than the tolerance, with
or without remat.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.mlp_models import mlp_setup as shared_mlp_setup
from helpers.mlp_models import relu_mlp_loss

import policies
import remat
from remat._jax_compat import saved_residuals
from remat.core.errors import ExtractionError, MicrobatchError, UnknownNameError

RTOL, ATOL = 1e-5, 1e-6


def assert_tree_close(a, b, rtol=RTOL, atol=ATOL):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def residual_bytes(f, *args):
    """Bytes of saved residuals, arguments excluded (independent of remat.measure)."""
    return sum(
        int(np.prod(a.shape)) * a.dtype.itemsize for a, d in saved_residuals(f, *args) if "argument" not in d
    )


mlp_loss = relu_mlp_loss


def mlp_setup(depth=8, width=32, batch=16, seed=0):
    return shared_mlp_setup(depth, width, batch, seed=seed, bias=0.01)


class EveryOther:
    """A hand-written policy object (not from the registry): keep every other forward stage."""

    name = "every_other"

    def plan(self, graph, budget=None):
        saved = [v.index for v in graph.forward_nodes if v.index % 2 == 1]
        from policies.from_checkpoints import plan_from_checkpoints

        return plan_from_checkpoints(graph, saved, policy=self.name)


# ----------------------------------------------------------------------------- zoo gradients
ZOO = {
    "mlp": dict(depth=6, width=32),
    "resnet18": dict(width=8, image_size=16),
    "bert_small": dict(seq_len=8, hidden=32, num_layers=2, num_heads=2, vocab_size=64, max_len=16),
}


def _zoo(name):
    return remat.zoo.get(name, batch_size=4, **ZOO[name])


@pytest.mark.parametrize(
    "name,policy,budget",
    [("mlp", "sqrtn", None), ("mlp", "chain_dp", "80%"), ("mlp", EveryOther(), None),
     ("mlp", "recompute_all", None),
     pytest.param("bert_small", "checkmate", remat.modelled("70%"), id="bert_small-checkmate-70%")],
)
def test_zoo_gradients_match(name, policy, budget):
    """bert at a modelled budget: with ``"70%"`` of the compiled step, the compiled-budget loop
    (tests/test_compiled_budget.py) made this case 40 s in the full suite against 11 s."""
    loss, params, batch = _zoo(name)
    ref = jax.jit(jax.value_and_grad(loss))(params, batch)
    f = remat.value_and_grad(loss, policy, budget=budget)
    out = jax.jit(f)(params, batch)
    assert_tree_close(out, ref)
    app = f.applied(params, batch)
    assert app.plan is not None and any(s.remat for s in app.segments), "the plan recomputes something"


def test_policy_none_is_plain_value_and_grad():
    params, batch = mlp_setup()
    f = remat.value_and_grad(mlp_loss)
    assert f.applied(params, batch).plan is None
    assert_tree_close(f(params, batch), jax.value_and_grad(mlp_loss)(params, batch))


def test_has_aux_batchnorm_state_resnet18():
    """resnet18 (BatchNorm, residual blocks) with ``(loss, new_batch_stats)`` as has_aux."""
    spec = remat.zoo.get_model("resnet18", batch_size=4, **ZOO["resnet18"])
    ref = jax.jit(jax.value_and_grad(spec.loss_and_state_fn, has_aux=True))(spec.variables, spec.batch)
    f = remat.value_and_grad(spec.loss_and_state_fn, "sqrtn", has_aux=True)
    out = jax.jit(f)(spec.variables, spec.batch)
    assert_tree_close(out, ref)  # ((loss, new_batch_stats), grads)
    assert sum(s.remat for s in f.applied(spec.variables, spec.batch).segments) >= 2


def test_grad_has_aux():
    params, batch = mlp_setup(depth=4)

    def loss(p, b):
        return mlp_loss(p, b), {"h": b["x"].sum()}

    (v, aux), g_ref = jax.value_and_grad(loss, has_aux=True)(params, batch)
    g, aux2 = remat.grad(loss, EveryOther(), has_aux=True)(params, batch)
    assert_tree_close((g, aux2), (g_ref, aux))


def test_argnums_tuple_and_grad():
    params, batch = mlp_setup(depth=6)

    def loss(p1, p2, batch):
        return mlp_loss(p1 + p2, batch)

    args = (params[:3], params[3:], batch)
    ref = jax.value_and_grad(loss, argnums=(0, 1))(*args)
    out = jax.jit(remat.value_and_grad(loss, "sqrtn", argnums=(0, 1)))(*args)
    assert isinstance(out[1], tuple) and len(out[1]) == 2
    assert_tree_close(out, ref)
    g = remat.grad(loss, "sqrtn", argnums=(0, 1))(*args)
    assert_tree_close(g, ref[1])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_microbatches_match(reduction):
    params, batch = mlp_setup(depth=4, batch=16)
    k = 4

    def loss(p, b):  # a sum loss for "sum", the mean for "mean"
        per = jnp.mean((jax.nn.relu(b["x"] @ p[0][0]) @ p[1][0] - b["y"]) ** 2, axis=1)
        return jnp.mean(per) if reduction == "mean" else jnp.sum(per)

    ps = params[:2]
    # independent reference 1: a Python loop of jax.value_and_grad over the micro-batches
    vs, gs = [], []
    for j in range(k):
        mb = jax.tree_util.tree_map(lambda a, j=j: a[j * 4 : (j + 1) * 4], batch)
        v, g = jax.value_and_grad(loss)(ps, mb)
        vs.append(v)
        gs.append(g)
    red = (lambda xs: sum(xs) / k) if reduction == "mean" else sum
    ref = (red(vs), jax.tree_util.tree_map(lambda *a: red(list(a)), *gs))
    out = jax.jit(remat.value_and_grad(loss, "sqrtn", microbatches=k, reduction=reduction))(ps, batch)
    assert_tree_close(out, ref)
    # reference 2: the full batch (the loss is separable over examples)
    assert_tree_close(out, jax.value_and_grad(loss)(ps, batch), rtol=1e-5, atol=1e-5)


def test_microbatches_has_aux_stack_and_last():
    params, batch = mlp_setup(depth=3, batch=8)

    def loss(p, b):
        out = mlp_loss(p, b)
        return out, {"first": b["x"][0, 0]}

    f = jax.jit(remat.value_and_grad(loss, "sqrtn", microbatches=2, has_aux=True))
    (v, aux), g = f(params, batch)
    np.testing.assert_allclose(np.asarray(aux["first"]), np.asarray(batch["x"][[0, 4], 0]))
    (_, aux_last), _ = remat.value_and_grad(loss, "sqrtn", microbatches=2, has_aux=True, microbatch_aux="last")(params, batch)
    np.testing.assert_allclose(float(aux_last["first"]), float(batch["x"][4, 0]))


def test_jit_and_cache_per_shape():
    params, batch = mlp_setup()
    f = remat.value_and_grad(mlp_loss, "sqrtn")
    a1 = f.applied(params, batch)
    assert f.applied(params, batch) is a1
    small = jax.tree_util.tree_map(lambda a: a[:8], batch)
    a2 = f.applied(params, small)
    assert a2 is not a1 and a2.graph.meta.get("batch_size") in (8, None)
    assert_tree_close(jax.jit(f)(params, small), jax.value_and_grad(mlp_loss)(params, small))


def test_checkpoint_drop_in_and_transforms():
    params, batch = mlp_setup()
    g_ref = jax.grad(mlp_loss)(params, batch)
    c = remat.checkpoint(mlp_loss, "sqrtn")
    np.testing.assert_allclose(float(c(params, batch)), float(mlp_loss(params, batch)), rtol=1e-6)
    assert_tree_close(jax.jit(jax.grad(c))(params, batch), g_ref)


# ----------------------------------------------------------------------------- memory evidence
def test_sqrtn_32_layer_residuals_and_executor_peak():
    loss, params, batch = remat.zoo.get("mlp", batch_size=64, depth=32, width=64)
    f = remat.value_and_grad(loss, policies.SqrtN())
    app = f.applied(params, batch)
    base, ours = residual_bytes(loss, params, batch), residual_bytes(app.fn, params, batch)
    assert base >= 3 * ours, (base, ours)
    assert_tree_close(jax.jit(f)(params, batch), jax.jit(jax.value_and_grad(loss))(params, batch))
    # the executor on the same graph: checkpoint-all vs the plan, measured live bytes
    _, _, st_all = remat.execute(app.graph, policies.checkpoint_all_plan(app.graph), params, batch)
    _, _, st = remat.execute(app.graph, app.plan, params, batch)
    assert st_all.peak_bytes >= 2 * st.peak_bytes, (st_all.peak_bytes, st.peak_bytes)


# ----------------------------------------------------------------------------- errors
def test_errors():
    params, batch = mlp_setup(batch=6)
    with pytest.raises(UnknownNameError):
        remat.value_and_grad(mlp_loss, "no_such_policy")
    with pytest.raises(MicrobatchError):
        remat.value_and_grad(mlp_loss, "sqrtn", microbatches=4)(params, batch)
    with pytest.raises(MicrobatchError):
        remat.value_and_grad(mlp_loss, microbatches=0)
    with pytest.raises(ExtractionError):
        remat.value_and_grad(lambda p, b: mlp_loss(p, b) * jnp.ones(3), "sqrtn")(params, batch)
    with pytest.raises(ExtractionError):
        remat.value_and_grad(lambda p, b: (mlp_loss(p, b) > 0).astype(jnp.int32))(params, batch)


# ----------------------------------------------------------------------------- checkpoint_policy
def tagged_loss(params, batch):
    h = batch["x"]
    for i, (w, b) in enumerate(params):
        with jax.named_scope(f"layer{i}"):
            h = jax.ad_checkpoint.checkpoint_name(jax.nn.relu(h @ w + b), f"layer{i}")
    return jnp.mean((h - batch["y"]) ** 2)


def test_checkpoint_policy_with_jax_checkpoint():
    params, batch = mlp_setup(depth=8, width=16, batch=8)
    graph = remat.extract(tagged_loss, params, batch)
    plan = policies.SqrtN().plan(graph)
    pol = remat.checkpoint_policy(plan, graph)
    saved_layers = {n for n in pol.saveable_names if n.startswith("layer")}
    assert saved_layers and len(saved_layers) < 8
    wrapped = jax.checkpoint(tagged_loss, policy=pol)
    assert_tree_close(jax.jit(jax.value_and_grad(wrapped))(params, batch), jax.value_and_grad(tagged_loss)(params, batch))
    # exactly the saved layers' tagged outputs are saved: hand count of bytes
    assert _same_names(_named(wrapped, params, batch), saved_layers)
    assert residual_bytes(wrapped, params, batch) == len(saved_layers) * 8 * 16 * 4
    # the same from a policy object (planned on the graph)
    assert remat.checkpoint_policy(policies.SqrtN(), graph).saveable_names == pol.saveable_names


class Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        y = nn.relu(nn.Dense(self.width)(x))
        return jax.ad_checkpoint.checkpoint_name(y, f"MLP/{self.name}")


class MLP(nn.Module):
    depth: int = 6
    width: int = 16
    block: type = Block

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            x = self.block(self.width, name=f"block{i}")(x)
        return x


def _named(f, *args):
    """The names of ``f``'s saved residuals, as ``saved_residuals`` describes them; where that JAX
    describes a named residual by its primitive (jax < 0.9: "output of reduce_precision"), one
    placeholder per such residual, so the count is still checked."""
    out = set()
    for i, (_, d) in enumerate(saved_residuals(f, *args)):
        if "named '" in d:
            out.add(d.split("named '")[1].split("'")[0])
        elif d.startswith("output of reduce_precision"):
            out.add(f"<unnamed {i}>")
    return out


def _same_names(got: set, want: set) -> bool:
    unnamed = {n for n in got if n.startswith("<unnamed")}
    return got - unnamed <= want and len(got) == len(want)


def test_checkpoint_policy_with_flax_linen_remat_and_scan():
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16))
    m = MLP()
    v = m.init(jax.random.PRNGKey(0), x)

    def loss(v, x):
        return jnp.mean(m.apply(v, x) ** 2)

    graph = remat.extract(loss, v, x)
    pol = remat.checkpoint_policy("sqrtn", graph)
    saved = pol.saveable_names & {f"MLP/block{i}" for i in range(6)}
    assert 0 < len(saved) < 6
    # flax.linen.remat of the whole model: inside, only the plan's saved blocks keep their output
    mr = nn.remat(MLP, policy=pol)()

    def loss_r(v, x):
        return jnp.mean(mr.apply(v, x) ** 2)

    assert_tree_close(jax.jit(jax.value_and_grad(loss_r))(v, x), jax.jit(jax.value_and_grad(loss))(v, x))
    assert _same_names(_named(loss_r, v, x), saved)
    # hand count: the saved blocks' outputs, plus the model output that the loss's square reads
    assert residual_bytes(loss_r, v, x) == (len(saved) + 1) * 8 * 16 * 4

    # nn.scan over a remat'd block: the policy applies to the scan body (same names every layer)
    name = sorted(saved)[0]

    class ScanBlock(nn.Module):
        @nn.compact
        def __call__(self, c, _):
            z = jax.ad_checkpoint.checkpoint_name(nn.Dense(16)(c), name)  # a saved stage's name
            return nn.relu(z), None

    def scanned(policy):
        mod = nn.remat(ScanBlock, policy=policy) if policy != "plain" else ScanBlock
        return nn.scan(mod, variable_axes={"params": 0}, split_rngs={"params": True}, length=4)()

    vs = scanned("plain").init(jax.random.PRNGKey(0), x, None)

    def ls(policy):
        mod = scanned(policy)
        return lambda v, x: jnp.mean(mod.apply(v, x, None)[0] ** 2)

    assert_tree_close(jax.jit(jax.value_and_grad(ls(pol)))(vs, x), jax.jit(jax.value_and_grad(ls("plain")))(vs, x))
    # saving the named pre-activations costs exactly one stacked f32[4, 8, 16] more than nothing
    assert residual_bytes(ls(pol), vs, x) - residual_bytes(ls(None), vs, x) == 4 * 8 * 16 * 4


def test_checkpoint_policy_with_flax_nnx_remat():
    from flax import nnx

    class NBlock(nnx.Module):
        def __init__(self, i, rngs):
            self.i = i
            self.lin = nnx.Linear(16, 16, rngs=rngs)

        def __call__(self, x):
            with jax.named_scope(f"layer{self.i}"):
                return jax.ad_checkpoint.checkpoint_name(jax.nn.relu(self.lin(x)), f"layer{self.i}")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.blocks = nnx.List([NBlock(i, rngs) for i in range(6)])

        def __call__(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    net = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16))
    graphdef, state = nnx.split(net)

    def loss(state, x):
        return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

    graph = remat.extract(loss, state, x)
    pol = remat.checkpoint_policy("sqrtn", graph)
    saved = {n for n in pol.saveable_names if n.startswith("layer")}
    assert 0 < len(saved) < 6

    def loss_r(state, x):
        return jnp.mean(nnx.remat(lambda m, h: m(h), policy=pol)(nnx.merge(graphdef, state), x) ** 2)

    assert_tree_close(jax.jit(jax.value_and_grad(loss_r))(state, x), jax.jit(jax.value_and_grad(loss))(state, x))
    assert _same_names(_named(loss_r, state, x), saved)


class BNNet(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
        for i in range(3):
            x = nn.Dense(16, name=f"dense{i}")(x)
            x = nn.relu(nn.BatchNorm(use_running_average=not train, name=f"bn{i}")(x))
        return nn.Dense(4, name="head")(x)


def test_microbatches_with_batchnorm_state():
    """BatchNorm state as has_aux with micro-batches: statistics per micro-batch, the returned
    state is the last micro-batch's (``microbatch_aux="last"``); reference: a Python loop."""
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    y = jax.random.randint(jax.random.PRNGKey(1), (16,), 0, 4)
    m = BNNet()
    v = m.init(jax.random.PRNGKey(2), x[:2], train=False)

    def loss_and_state(v, b):
        logits, state = m.apply(v, b["x"], mutable=["batch_stats"])
        ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), b["y"][:, None], axis=1))
        return ce, state

    batch = {"x": x, "y": y}
    outs = [
        jax.value_and_grad(loss_and_state, has_aux=True)(v, {"x": x[4 * j : 4 * j + 4], "y": y[4 * j : 4 * j + 4]})
        for j in range(4)
    ]
    ref_loss = sum(o[0][0] for o in outs) / 4
    ref_g = jax.tree_util.tree_map(lambda *a: sum(a) / 4, *[o[1] for o in outs])
    f = remat.value_and_grad(loss_and_state, "sqrtn", has_aux=True, microbatches=4, microbatch_aux="last")
    (loss, state), g = jax.jit(f)(v, batch)
    assert_tree_close((loss, state, g), (ref_loss, outs[-1][0][1], ref_g))
