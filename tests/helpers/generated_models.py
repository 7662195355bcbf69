"""Randomly generated models in four front ends, for property tests beyond the zoo.

A :class:`Spec` describes a small network: per layer a width, an activation and a kind
(``dense``; ``add``: plus an earlier layer's output of the same width, a skip connection;
``concat``: an earlier layer's output concatenated to the input); and a loss that does
(``mse``, ``xent``) or does not (``sumsq``: the loss value is read by no backward node) read a
head; optionally a scanned stack of ``scan`` more ``Dense`` + tanh layers at the last width
(``lax.scan`` over stacked weights, ``nn.scan`` in linen, ``nnx.scan`` over ``nnx.vmap``-made
layers in nnx), the way deep JAX models are written.  :func:`build` writes the same network as plain JAX (a list of dicts), Flax linen, Flax nnx
and Equinox, each the way a user of that library would, and returns ``(loss, params, batch)``
with ``loss(params, batch)`` a float32 scalar.  :func:`specs` is the hypothesis strategy.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

ACTS = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "sigmoid": jax.nn.sigmoid,
}
FRONTENDS = ("plain", "linen", "nnx", "equinox")
LOSSES = ("mse", "xent", "sumsq")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A generated network.

    Attributes:
      widths: output width of each layer.
      acts: activation name of each layer (:data:`ACTS`).
      kinds: ``dense``, ``add`` or ``concat`` per layer.
      skips: for ``add``/``concat`` layers, the earlier layer whose output is used (-1: the input).
      loss: ``mse``, ``xent`` or ``sumsq``.
      frontend: ``plain``, ``linen``, ``nnx`` or ``equinox``.
      scan: iterations of the scanned stack after the layers (0: none).
      in_dim, batch, seed: input width, batch size, seed of parameters and data.
    """

    widths: tuple[int, ...]
    acts: tuple[str, ...]
    kinds: tuple[str, ...]
    skips: tuple[int, ...]
    loss: str
    frontend: str
    scan: int = 0
    in_dim: int = 6
    batch: int = 32
    seed: int = 0

    def in_widths(self) -> list[int]:
        """Width of each layer's input (after a concatenation)."""
        outs = [self.in_dim]
        res = []
        for i, w in enumerate(self.widths):
            x = outs[-1]
            if self.kinds[i] == "concat":
                x += outs[self.skips[i] + 1]
            res.append(x)
            outs.append(w)
        return res


@st.composite
def specs(draw, frontends=FRONTENDS, max_depth: int = 6) -> Spec:
    depth = draw(st.integers(2, max_depth))
    widths, kinds, skips = [], [], []
    outs = [6]
    for i in range(depth):
        kind = draw(st.sampled_from(["dense", "dense", "add", "concat"])) if i else "dense"
        skip = draw(st.integers(-1, i - 2)) if kind != "dense" and i >= 1 else -1
        if kind != "dense" and skip + 1 >= i:  # the skip must jump over at least one layer
            kind, skip = "dense", -1
        w = outs[skip + 1] if kind == "add" else draw(st.sampled_from([4, 8, 12]))
        widths.append(w)
        kinds.append(kind)
        skips.append(skip)
        outs.append(w)
    acts = tuple(draw(st.sampled_from(sorted(ACTS))) for _ in range(depth))
    return Spec(tuple(widths), acts, tuple(kinds), tuple(skips), draw(st.sampled_from(LOSSES)),
                draw(st.sampled_from(frontends)), scan=draw(st.sampled_from([0, 0, 2, 3])),
                seed=draw(st.integers(0, 3)))


# ------------------------------------------------------------------------------ the math
def _forward(spec: Spec, layer, x, stack=None):
    """The network, given ``layer(i, x) -> x @ W_i + b_i`` and (``spec.scan``) ``stack(h)``,
    the scanned ``tanh(h @ W + b)`` layers."""
    outs = [x]
    h = x
    for i, act in enumerate(spec.acts):
        if spec.kinds[i] == "concat":
            h = jnp.concatenate([h, outs[spec.skips[i] + 1]], axis=-1)
        h = ACTS[act](layer(i, h))
        if spec.kinds[i] == "add":
            h = h + outs[spec.skips[i] + 1]
        outs.append(h)
    return stack(h) if spec.scan else h


def _loss(spec: Spec, head, h, batch):
    if spec.loss == "sumsq":
        return jnp.sum(h ** 2)
    z = head(h)
    if spec.loss == "mse":
        return jnp.mean((z - batch["y"]) ** 2)
    logp = jax.nn.log_softmax(z)
    return -jnp.mean(jnp.take_along_axis(logp, batch["label"][:, None], axis=1))


def _batch(spec: Spec):
    rng = np.random.default_rng(spec.seed)
    return {
        "x": jnp.asarray(rng.normal(size=(spec.batch, spec.in_dim)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(spec.batch, 3)), jnp.float32),
        "label": jnp.asarray(rng.integers(0, 3, size=spec.batch), jnp.int32),
    }


# ------------------------------------------------------------------------------ front ends
# Parameters are made from their shapes (the library's own ``init`` / constructor under
# ``jax.eval_shape``) and filled from numpy (``N(0, 1/fan_in)``, biases small): eager JAX
# initialisation compiles one XLA program per operation and shape, most of a property test's
# time on a small machine.
def _S(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _fill(tree, seed: int):
    """Replace every ``ShapeDtypeStruct`` leaf of ``tree`` by a float array: weights (rank >= 2)
    ``N(0, 1 / fan_in)`` with ``fan_in`` the second-to-last axis, vectors ``N(0, 0.01)``."""
    rng = np.random.default_rng(seed)

    def f(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        scale = 1 / np.sqrt(x.shape[-2]) if len(x.shape) >= 2 else 0.1
        return jnp.asarray(rng.normal(size=x.shape) * scale, x.dtype)

    return jax.tree_util.tree_map(f, tree)


def _plain(spec: Spec):
    W = spec.widths[-1]
    params = {"layers": [{"w": _S((din, w)), "b": _S((w,))}
                         for din, w in zip(spec.in_widths(), spec.widths)],
              "head": _S((W, 3))}
    if spec.scan:
        params["stack"] = {"w": _S((spec.scan, W, W)), "b": _S((spec.scan, W))}
    params = _fill(params, spec.seed)

    def loss(p, batch):
        def stack(h):
            return jax.lax.scan(lambda h, q: (jnp.tanh(h @ q["w"] + q["b"]), None), h,
                                p["stack"])[0]

        h = _forward(spec, lambda i, x: x @ p["layers"][i]["w"] + p["layers"][i]["b"], batch["x"],
                     stack)
        return _loss(spec, lambda h: h @ p["head"], h, batch)

    return loss, params


def _linen(spec: Spec):
    import flax.linen as nn

    class Cell(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return jnp.tanh(nn.Dense(spec.widths[-1])(h)), None

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = [nn.Dense(w, name=f"dense{i}") for i, w in enumerate(spec.widths)]
            stack = None
            if spec.scan:
                stack = nn.scan(Cell, variable_axes={"params": 0}, split_rngs={"params": True},
                                length=spec.scan)(name="stack")
            return _forward(spec, lambda i, h: dense[i](h), x,
                            stack and (lambda h: stack(h, None)[0]))

    class Head(nn.Module):
        @nn.compact
        def __call__(self, h):
            return nn.Dense(3, use_bias=False)(h)

    net, head = Net(), Head()
    b = _batch(spec)
    key = jax.random.PRNGKey(spec.seed)
    v = _fill({"net": jax.eval_shape(net.init, key, b["x"]),
               "head": jax.eval_shape(head.init, key, jnp.zeros((1, spec.widths[-1])))},
              spec.seed)

    def loss(v, batch):
        h = net.apply(v["net"], batch["x"])
        return _loss(spec, lambda h: head.apply(v["head"], h), h, batch)

    return loss, v


def _nnx(spec: Spec):
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.List([nnx.Linear(din, w, rngs=rngs)
                                   for din, w in zip(spec.in_widths(), spec.widths)])
            self.head = nnx.Linear(spec.widths[-1], 3, use_bias=False, rngs=rngs)
            W = spec.widths[-1]
            if spec.scan:
                @nnx.split_rngs(splits=spec.scan)
                @nnx.vmap(in_axes=(0,), out_axes=0)
                def make(rngs):
                    return nnx.Linear(W, W, rngs=rngs)

                self.stack = make(rngs)

        def __call__(self, x, batch):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def stack(h, lin):
                return jnp.tanh(lin(h))

            h = _forward(spec, lambda i, z: self.dense[i](z), x,
                         lambda h: stack(h, self.stack))
            return _loss(spec, self.head, h, batch)

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Net(nnx.Rngs(spec.seed))))
    state = _fill(state, spec.seed)

    def loss(state, batch):
        return nnx.merge(graphdef, state)(batch["x"], batch)

    return loss, state


def _equinox(spec: Spec):
    import equinox as eqx

    class Net(eqx.Module):
        dense: list
        head: eqx.nn.Linear
        stack: eqx.nn.Linear | None

        def __init__(self, key):
            ks = jax.random.split(key, len(spec.widths) + 2)
            self.dense = [eqx.nn.Linear(din, w, key=k)
                          for din, w, k in zip(spec.in_widths(), spec.widths, ks)]
            self.head = eqx.nn.Linear(spec.widths[-1], 3, use_bias=False, key=ks[-2])
            W = spec.widths[-1]
            self.stack = (eqx.filter_vmap(lambda k: eqx.nn.Linear(W, W, key=k))(
                jax.random.split(ks[-1], spec.scan)) if spec.scan else None)

        def __call__(self, x, batch):
            def stack(h):
                dyn, static = eqx.partition(self.stack, eqx.is_array)

                def body(h, d):
                    return jnp.tanh(jax.vmap(eqx.combine(d, static))(h)), None

                return jax.lax.scan(body, h, dyn)[0]

            h = _forward(spec, lambda i, z: jax.vmap(self.dense[i])(z), x, stack)
            return _loss(spec, jax.vmap(self.head), h, batch)

    net = _fill(eqx.filter_eval_shape(Net, jax.random.PRNGKey(spec.seed)), spec.seed)
    params, static = eqx.partition(net, eqx.is_array)

    def loss(params, batch):
        return eqx.combine(params, static)(batch["x"], batch)

    return loss, params


def build(spec: Spec):
    """``(loss, params, batch)`` of ``spec`` in its front end."""
    make = {"plain": _plain, "linen": _linen, "nnx": _nnx, "equinox": _equinox}[spec.frontend]
    loss, params = make(spec)
    return loss, params, _batch(spec)


#: explicit specs run for every front end (``frontend`` filled in): skips, concatenation and a
#: scanned stack under a loss read by no backward node; a deep plain chain with an MSE head; a
#: shallow cross-entropy net
EXAMPLES = (
    dict(widths=(8, 12, 8, 12, 4), acts=("tanh", "relu", "gelu", "sigmoid", "tanh"),
         kinds=("dense", "dense", "concat", "add", "dense"), skips=(-1, -1, 0, 1, -1),
         loss="sumsq", scan=2),
    dict(widths=(12, 8, 8, 4, 8, 12), acts=("tanh",) * 6, kinds=("dense",) * 6,
         skips=(-1,) * 6, loss="mse"),
    dict(widths=(4, 8), acts=("relu", "gelu"), kinds=("dense", "dense"), skips=(-1, -1),
         loss="xent", scan=3),
)
