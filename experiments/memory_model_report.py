"""Predicted against compiled temp bytes (issue #33, item 2): the plan's simulated peak (the
graph's model, :func:`remat.simulate`) and :func:`remat.xla_memory.predict_temp_bytes` against
``memory_analysis().temp_size_in_bytes`` of the compiled step, on XLA:CPU with the
``cse_barrier_expander`` pass disabled (set here before JAX starts: XLA:CPU undoes
``jax.checkpoint`` otherwise).

Six models at small sizes (each step compiles in seconds on 2 cores): a plain-JAX 32-layer tanh
MLP, a plain-JAX pre-LN transformer, zoo ``gpt2_small`` and ``resnet50`` (scaled down), a Flax
``nn.scan`` transformer and a Flax linen CNN.  Per model: no remat (plain
``jax.value_and_grad``), ``sqrtn``, and ``checkmate`` (``time_limit=20``) at 30/50/70% of the
graph's no-remat peak; the scanned transformer's scan is one stage of its graph, so it also
gets ``scan_layers`` (the scan planner) at the same budgets.  The step
``jax.jit(jax.value_and_grad(applied.fn))`` is compiled.

Plans: ``policies.get(name, ...).plan(graph, budget=fraction * graph.no_remat_peak())``,
applied with ``remat.apply.apply_plan(loss, args, None, graph=graph, plan=plan)`` (the drop-in's
realisation of a given plan; the compiled-budget loop is not involved).

Columns: ``model, policy, budget`` (fraction of the no-remat peak, empty for none/sqrtn),
``status`` (``ok`` or the policy's typed error), ``plan_peak_bytes`` (the old model: the plan's
simulated peak on the graph, :func:`remat.simulate`; for no remat ``graph.no_remat_peak()``;
for scan decisions on :func:`remat.scans.adjusted_graph`), ``predicted_temp_bytes`` (the new
model), ``compiled_temp_bytes``, ``ratio_old`` / ``ratio_new`` (each over the compiled temp),
``residual_bytes`` (``saved_residuals`` of the applied function, for reference).

Commands that produced the result files (one per JAX version, the numbers differ)::

    /work/venv312/bin/python experiments/memory_model_report.py \\
        --out experiments/results/memory_model_jax0.12.0.1.csv
    /work/venv080/bin/python experiments/memory_model_report.py \\
        --out experiments/results/memory_model_jax0.8.0.csv

``--models`` selects models; ``--summary FILE`` prints a CSV's per-model table.
"""

from __future__ import annotations

import os

_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import csv  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

BUDGETS = (0.7, 0.5, 0.3)
SOLVER_LIMIT_S = 20.0
FIELDS = ["model", "policy", "budget", "status", "plan_peak_bytes", "predicted_temp_bytes",
          "compiled_temp_bytes", "ratio_old", "ratio_new", "residual_bytes", "wall_s"]


# ----------------------------------------------------------------------------------- models
def tanh_mlp(L=32, B=256, W=128, seed=0):
    """Plain JAX: ``L`` layers ``tanh(h @ w + b)``, mean squared error."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.PRNGKey(seed)
    ps = [(jax.random.normal(jax.random.fold_in(key, i), (W, W)) / np.sqrt(W), jnp.zeros((W,)))
          for i in range(L)]
    x = jax.random.normal(jax.random.fold_in(key, L), (B, W))
    y = jax.random.normal(jax.random.fold_in(key, L + 1), (B, W))

    def loss(ps, b):
        h = b[0]
        for w, c in ps:
            h = jnp.tanh(h @ w + c)
        return jnp.mean((h - b[1]) ** 2)

    return loss, ps, (x, y)


def plain_transformer(blocks=4, B=4, T=32, D=64, H=4, V=256, seed=0):
    """Plain JAX (dicts of arrays): pre-LN blocks, causal softmax attention, GELU MLP, next-token
    cross-entropy."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)

    def w(*s):
        return jnp.asarray(rng.normal(size=s) / np.sqrt(s[0]), jnp.float32)

    params = {
        "emb": w(V, D),
        "blocks": [{"qkv": w(D, 3 * D), "o": w(D, D), "up": w(D, 4 * D), "down": w(4 * D, D),
                    "g1": jnp.ones(D), "g2": jnp.ones(D)} for _ in range(blocks)],
        "head": w(D, V),
    }
    tokens = jnp.asarray(rng.integers(0, V, size=(B, T)), jnp.int32)

    def ln(x, g):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return g * (x - m) / jnp.sqrt(v + 1e-5)

    def loss(p, tokens):
        x = p["emb"][tokens]
        mask = jnp.tril(jnp.ones((T, T), bool))
        for blk in p["blocks"]:
            q, k, v = jnp.split(ln(x, blk["g1"]) @ blk["qkv"], 3, axis=-1)
            q, k, v = (a.reshape(B, T, H, D // H) for a in (q, k, v))
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
            a = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, T, D) @ blk["o"]
            x = x + jax.nn.gelu(ln(x, blk["g2"]) @ blk["up"]) @ blk["down"]
        logp = jax.nn.log_softmax((x @ p["head"])[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return loss, params, tokens


def gpt2_small():
    """Zoo ``gpt2_small`` scaled down (4 layers, width 128, 32 tokens, dropout on)."""
    import remat

    return remat.zoo.get("gpt2_small", batch_size=2, seq_len=32, hidden=128, num_heads=4,
                         num_layers=4, vocab_size=512)


def resnet50():
    """Zoo ``resnet50`` scaled down (width 16, 64 px, batch 2; BatchNorm in train mode)."""
    import remat

    return remat.zoo.get("resnet50", batch_size=2, image_size=64, width=16)


def scan_transformer(layers=4, width=64, heads=4, vocab=256, B=4, T=33):
    """Flax linen: pre-LN blocks under ``nn.scan`` (GELU MLPs), next-token cross-entropy."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            x = x + nn.SelfAttention(num_heads=heads, deterministic=True)(nn.LayerNorm()(x))
            h = nn.Dense(width)(jax.nn.gelu(nn.Dense(4 * width)(nn.LayerNorm()(x))))
            return x + h, None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, width)(tokens)
            stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                            length=layers)
            x, _ = stack()(x, None)
            return nn.Dense(vocab)(nn.LayerNorm()(x))

    m = Model()
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, vocab, size=(B, T)), jnp.int32)
    variables = m.init(jax.random.PRNGKey(0), tokens[:, :-1])

    def loss(v, t):
        logp = jax.nn.log_softmax(m.apply(v, t[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(logp, t[:, 1:, None], axis=-1))

    return loss, variables, tokens


def linen_cnn(B=8, S=32, depth=12):
    """Flax linen: ``depth`` 3x3 convs + ReLU at 16 channels, average pool, ``depth // 2`` at
    32 channels, global average pool, dense head; cross-entropy.  A chain of equal layers, so
    a budget of 30% of the no-remat peak is feasible."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(depth):
                x = nn.relu(nn.Conv(16, (3, 3))(x))
            x = nn.avg_pool(x, (2, 2), (2, 2))
            for _ in range(max(1, depth // 2)):
                x = nn.relu(nn.Conv(32, (3, 3))(x))
            return nn.Dense(10)(x.mean(axis=(1, 2)))

    m = CNN()
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(B, S, S, 3)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, size=B), jnp.int32)
    variables = m.init(jax.random.PRNGKey(0), x)

    def loss(v, b):
        logp = jax.nn.log_softmax(m.apply(v, b[0]))
        return -jnp.mean(jnp.take_along_axis(logp, b[1][:, None], axis=-1))

    return loss, variables, (x, y)


MODELS = {"tanh_mlp": tanh_mlp, "plain_transformer": plain_transformer,
          "gpt2_small": gpt2_small, "resnet50": resnet50, "scan_transformer": scan_transformer,
          "linen_cnn": linen_cnn}


# ----------------------------------------------------------------------------------- rows
def configs(name):
    """``(policy, budget fraction or None)`` rows of one model."""
    rows = [("none", None), ("sqrtn", None)] + [("checkmate", b) for b in BUDGETS]
    if name == "scan_transformer":
        rows += [("scan_layers", b) for b in BUDGETS]
    return rows


def compiled_temp(fn, args) -> int:
    import jax

    return int(jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
               .memory_analysis().temp_size_in_bytes)


def plan_peak(graph, plan) -> int:
    """The old model: the plan's simulated peak on the graph (scan decisions: on the graph
    with the decided scans' bytes)."""
    import remat
    from remat.scans import adjusted_graph

    g = adjusted_graph(graph, plan.meta["scans"]) if plan.meta.get("scans") else graph
    return int(remat.simulate(g, plan, placement=None).peak_bytes)


def run_model(name, writer, fh, plans_out=None):
    import numpy as np

    import policies
    import remat
    from remat import xla_memory
    from remat.apply import apply_plan
    from remat.core.errors import RematError

    loss, params, batch = MODELS[name]()
    args = (params, batch)
    g = remat.extract(loss, params, batch)
    base = g.no_remat_peak()
    for pol, frac in configs(name):
        t0 = time.perf_counter()
        row = dict(model=name, policy=pol, budget="" if frac is None else frac)
        try:
            if pol == "none":
                fn, plan, peak, res = loss, None, base, ""
            else:
                opts = {"time_limit": SOLVER_LIMIT_S} if pol == "checkmate" else {}
                budget = None if frac is None else int(np.ceil(frac * base))
                # the policy's plan at a budget on the graph's modelled peak, applied as the
                # drop-in applies it (no compiled-budget loop: this measures the model)
                plan = policies.get(pol, **opts).plan(g, budget=budget)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ap = apply_plan(loss, args, None, graph=g, plan=plan)
                fn, plan, res = ap.fn, ap.plan, ap.residual_bytes
                peak = plan_peak(g, plan)
            pred = xla_memory.predict_temp_bytes(g, plan)
            temp = compiled_temp(fn, args)
            row.update(status="ok", plan_peak_bytes=peak, predicted_temp_bytes=pred,
                       compiled_temp_bytes=temp, ratio_old=round(peak / temp, 4),
                       ratio_new=round(pred / temp, 4), residual_bytes=res)
            if plans_out is not None:
                plans_out.append(dict(model=name, policy=pol, budget=frac, plan=plan, temp=temp,
                                      plan_peak=peak))
        except RematError as e:  # infeasible budgets, non-applicable policies: said, not hidden
            row.update(status=f"{type(e).__name__}: {str(e)[:120]}")
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        writer.writerow(row)
        fh.flush()
        print(" ".join(f"{k}={row.get(k, '')}" for k in ("model", "policy", "budget", "status",
                                                          "ratio_old", "ratio_new")), flush=True)


def summary(path) -> str:
    """Per model: worst and median |ratio - 1| of the old and the new model, rows within 10%."""
    import numpy as np

    rows = [r for r in csv.DictReader(open(path)) if r["status"] == "ok"]
    out = [f"{'model':18s} {'rows':>4s} {'old min..max':>14s} {'new min..max':>14s} "
           f"{'new within 10%':>14s}"]
    for m in dict.fromkeys(r["model"] for r in rows):
        old = np.array([float(r["ratio_old"]) for r in rows if r["model"] == m])
        new = np.array([float(r["ratio_new"]) for r in rows if r["model"] == m])
        ok = int((np.abs(new - 1) <= 0.10).sum())
        out.append(f"{m:18s} {len(new):4d} {old.min():6.2f}..{old.max():<6.2f} "
                   f"{new.min():6.2f}..{new.max():<6.2f} {ok:>9d}/{len(new)}")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="CSV path (default: by JAX version)")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--summary", default=None, help="print a CSV's summary and exit")
    ap.add_argument("--save-plans", default=None, help="also pickle the plans (calibration)")
    a = ap.parse_args(argv)
    if a.summary:
        print(summary(a.summary))
        return
    if _FLAG not in os.environ.get("XLA_FLAGS", ""):
        sys.exit(f"XLA_FLAGS must contain {_FLAG} before JAX starts")
    import jax

    out = a.out or f"experiments/results/memory_model_jax{jax.__version__}.csv"
    plans = [] if a.save_plans else None
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for m in a.models:
            run_model(m, w, fh, plans)
    if plans is not None:
        import pickle

        with open(a.save_plans, "wb") as f:
            pickle.dump(plans, f)
    print(summary(out))


if __name__ == "__main__":
    main()
