"""The hierarchical drop-in at half the compiled no-remat temp (#35, must-show 1), on the CPU.

For every zoo model (small CPU sizes; ``resnet18`` also at its own 2-2-2-2 depth) and for
models outside the zoo (a plain-JAX tanh MLP and pre-LN transformer, a residual attention
stack, a Flax linen CNN, a Flax nnx MLP, a DenseNet-style concatenating net, a Flax ``nn.scan``
transformer):
``remat.value_and_grad(loss, "hierarchical", budget="50%")``, i.e. 50 % of the compiled
no-remat step's temp bytes, met by the closed compiled-budget loop.  Per row: the graph's nodes
at equation granularity, the policy's planning time at the budget it returned (``plan_s``:
blocks, options and DP; extraction and compiles not included), the whole drop-in's set-up time
(``dropin_s``: extraction, plans and the loop's compiles), the budget, the compiled temp of
``jax.jit`` of the public transform (compiled here, independently of the loop), its ratio to
the budget and to the no-remat temp, the worst per-leaf gradient error against
``jax.value_and_grad`` (relative to the leaf's largest magnitude, at least 1e-3 of the largest
leaf's: a gradient that is zero in exact arithmetic is float noise), the plan's blocks and
scan decisions, and its micro-batch count (``microbatches``: more than 1 where the whole batch
does not fit and the samples do not interact).  A typed error is a row with its smallest feasible budget.  A last row times
planning a 48-layer plain-JAX transformer at equation granularity at 50 % of its modelled
peak (no compile).

XLA:CPU with the ``cse_barrier_expander`` pass disabled (set below, before JAX starts).

Command that made ``experiments/results/hierarchical_dropin_jax0.12.0.1.csv``::

    python experiments/hierarchical_dropin.py \\
        --out experiments/results/hierarchical_dropin_jax0.12.0.1.csv

The smallest compiled temp other policies reach where hierarchical is refused (the same
drop-in at ``"50%"``; a refusal names the compiled temp of the policy's smallest plan)::

    python experiments/hierarchical_dropin.py --policies hierarchical checkmate sqrtn \
        --models mobilenet_v2 \
        --out experiments/results/hierarchical_dropin_floors_jax0.12.0.1.csv

Every run plans with the ``host`` profile fixed at ``experiments.sharded_budget.HOST_RATES``
(no timing: the same plans on every rerun); ``--measured-host`` uses the measured profile.
Rows are written as they are made (an interrupted run keeps its rows).  Shown on
``docs/results/hierarchical.md``.
"""

from __future__ import annotations

import os

_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import csv  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

FIELDS = ["model", "source", "policy", "status", "nodes", "blocks", "scans", "microbatches",
          "plan_s", "dropin_s",
          "baseline_temp_bytes", "budget_bytes", "compiled_temp_bytes", "x_budget",
          "x_no_remat", "min_feasible_bytes", "grad_rel_err", "jax", "note"]

_T = dict(seq_len=16, hidden=64, num_layers=2, num_heads=2, mlp_dim=128, vocab_size=256)
ZOO = {
    "mlp": dict(batch_size=256, depth=8, width=64, in_features=64),
    "resnet18": dict(batch_size=16, image_size=16, width=8, stage_sizes=(1, 1, 1, 1)),
    "resnet50": dict(batch_size=8, image_size=16, width=8, stage_sizes=(1, 1, 1, 1)),
    "vgg16": dict(batch_size=8, image_size=32, width=8, fc_width=64),
    "mobilenet_v2": dict(batch_size=8, image_size=32, width_mult=0.25),
    "squeezenet": dict(batch_size=8, image_size=32),
    "unet": dict(batch_size=4, image_size=32, width=8),
    "gpt2_small": dict(batch_size=16, **_T),
    "bert_small": dict(batch_size=16, **_T),
}
#: zoo models at their own depth where ``ZOO`` shrinks it (the 1-1-1-1 ``resnet18`` is a ResNet-10)
ZOO_DEPTH = {
    "resnet18_2-2-2-2": ("resnet18", dict(ZOO["resnet18"], stage_sizes=(2, 2, 2, 2))),
}


def nnx_mlp(depth: int = 16, width: int = 64, batch: int = 128):
    """Flax nnx: a tanh MLP split into ``(graphdef, state)``; the loss merges them."""
    import jax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)]) \
                if hasattr(nnx, "List") else [nnx.Linear(width, width, rngs=rngs)
                                              for _ in range(depth)]

        def __call__(self, x):
            for layer in self.layers:
                x = jax.numpy.tanh(layer(x))
            return x

    graphdef, state = nnx.split(MLP(nnx.Rngs(0)))
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, width))

    def loss(state, x):
        return jax.numpy.mean(nnx.merge(graphdef, state)(x) ** 2)

    return loss, state, x


def _outside():
    import sys

    sys.path.insert(0, "tests")
    from helpers import outside_models as om

    from experiments.hierarchical_vs_checkmate import residual_stack
    from experiments.memory_model_report import linen_cnn

    return {
        "plain_tanh_mlp": lambda: om.plain_tanh_mlp(depth=16, width=64, batch=128),
        "plain_transformer": lambda: om.plain_transformer(layers=4, batch=8, seq=32, width=32,
                                                          vocab=64),
        "residual_stack": residual_stack,
        "linen_cnn": lambda: linen_cnn(B=8, S=16, depth=6),
        "nnx_mlp": nnx_mlp,
        "densenet": om.densenet,
        "linen_scan_transformer": om.linen_scan_transformer,
    }


def _grad_err(g, ref) -> float:
    import jax

    pairs = [(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(g),
                                                             jax.tree.leaves(ref))]
    top = max(float(np.max(np.abs(b))) for _, b in pairs if b.size)
    return max(float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-3 * top)
               for a, b in pairs if b.size)


def row(name: str, source: str, loss, params, batch, policy: str = "hierarchical") -> dict:
    import jax

    import policies
    import remat
    from remat.core.errors import RematError

    out = dict(model=name, source=source, policy=policy, jax=jax.__version__)
    pol = (policies.get("checkmate", time_limit=20.0) if policy == "checkmate"
           else policies.get(policy))
    vg = remat.value_and_grad(loss, pol, budget="50%")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            app = vg.applied(params, batch)
    except RematError as e:
        out.update(status=type(e).__name__, dropin_s=round(time.perf_counter() - t0, 1),
                   budget_bytes=getattr(e, "budget", ""),
                   min_feasible_bytes=getattr(e, "min_feasible_bytes", ""), note=str(e)[:200])
        return out
    out["dropin_s"] = round(time.perf_counter() - t0, 1)
    temp = int(jax.jit(vg).lower(params, batch).compile().memory_analysis().temp_size_in_bytes)
    _, g = jax.jit(vg)(params, batch)
    _, ref = jax.jit(jax.value_and_grad(loss))(params, batch)
    meta = app.plan.meta
    out.update(status="ok", nodes=app.graph.n, blocks=meta.get("blocks", ""),
               scans=len(meta.get("scans", ())), microbatches=app.plan.microbatches,
               plan_s=round(float(meta.get("solve_time_s", float("nan"))), 2),
               baseline_temp_bytes=app.baseline_temp_bytes, budget_bytes=app.budget_bytes,
               compiled_temp_bytes=temp, x_budget=round(temp / app.budget_bytes, 3),
               x_no_remat=round(temp / app.baseline_temp_bytes, 3),
               grad_rel_err=f"{_grad_err(g, ref):.2e}",
               note=" | ".join(n for n in app.notes if "closed loop" not in n)[:200])
    return out


def deep_transformer_row(layers: int = 48) -> dict:
    """Planning time of a ``layers``-layer transformer at equation granularity (modelled 50 %)."""
    import sys

    import jax

    import policies
    import remat

    sys.path.insert(0, "tests")
    from helpers import outside_models as om

    loss, params, batch = om.plain_transformer(layers=layers)
    t0 = time.perf_counter()
    g = remat.extract(loss, params, batch, stages="eqn")
    ext = time.perf_counter() - t0
    p = policies.Hierarchical(budget="50%").plan(g)
    return dict(model=f"plain_transformer_{layers}_layers", source="outside (planning only)",
                status="ok", nodes=g.n, blocks=p.meta["blocks"],
                plan_s=round(float(p.meta["solve_time_s"]), 2), jax=jax.__version__,
                note=f"extraction {ext:.1f} s; modelled budget 50% of the graph's no-remat peak; "
                     f"{float(p.compute_counts() @ g.costs) / float(g.costs.sum()):.3f}x compute")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--policies", nargs="*", default=["hierarchical"],
                    help="registered policy names (Checkmate with a 20 s limit)")
    ap.add_argument("--measured-host", action="store_true",
                    help="plan with this machine's measured host profile, not HOST_RATES")
    a = ap.parse_args(argv)
    import contextlib

    import remat.devices
    import remat.zoo
    from experiments.sharded_budget import HOST_RATES

    with (contextlib.nullcontext() if a.measured_host
          else remat.devices.fixed_host(*HOST_RATES)):
        _run(a, remat)


def _run(a, remat) -> None:
    """The rows of ``a.models`` under ``a.policies``, written to ``a.out`` as they are made."""
    builders = {n: ("zoo", (lambda n=n: remat.zoo.get(n, **ZOO[n]))) for n in ZOO}
    builders.update({n: ("zoo", (lambda z=z, kw=kw: remat.zoo.get(z, **kw)))
                     for n, (z, kw) in ZOO_DEPTH.items()})
    builders.update({n: ("outside", b) for n, b in _outside().items()})
    names = a.models or [*builders, "deep"]
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        for name in names:
            for pol in (("hierarchical",) if name == "deep" else a.policies):
                if name == "deep":
                    r = deep_transformer_row()
                else:
                    source, build = builders[name]
                    r = row(name, source, *build(), policy=pol)
                w.writerow(r)
                fh.flush()
                print({k: r.get(k) for k in ("model", "policy", "status", "nodes", "plan_s",
                                              "dropin_s", "x_budget", "x_no_remat",
                                              "min_feasible_bytes", "grad_rel_err")}, flush=True)


if __name__ == "__main__":
    main()
