"""Per-device budgets on sharded steps: layouts x models x budgets on 8 host devices (#36).

Command (the flags must be set before JAX starts; the module sets them when run as a script
only if ``XLA_FLAGS`` is unset)::

    XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_disable_hlo_passes=cse_barrier_expander" \\
        python -m experiments.sharded_budget

writes ``experiments/results/sharded_budget.csv``: per (layout, model, budget) the per-device
budget, the no-remat step's per-device compiled temp, the plan's modelled peak, the predicted
per-device temp (:func:`remat.sharded_memory.predict_sharded_temp_bytes` of the applied step:
nothing compiled; ``predicted_no_remat_temp`` the same for the no-remat step),
``calibrated_temp`` (the no-remat step's compiled temp times ``predicted_temp`` over
``predicted_no_remat_temp``: reads no compile of the plan), ``scaled_temp``
(the modelled peak times the no-remat step's compiled-over-modelled ratio), the compiled temp of
the applied step under ``jax.jit`` with the sharded arguments, and the largest gradient error
against ``jax.value_and_grad`` of the unsharded function.  ``--json`` prints one JSON row per case instead
(what ``tests/test_sharding.py`` runs in one subprocess).

With ``--mesh16`` (16 host devices: ``XLA_FLAGS`` as above with ``count=16``, set by the module
when unset) it plans a transformer step from abstract shapes on an 8 x 2 mesh instead
(:func:`plan_abstract16`) and writes ``experiments/results/sharded_plan16.csv``::

    python -m experiments.sharded_budget --mesh16

With ``--fsdp-choices`` (8 devices) it compares, under FSDP, the drop-in's plan with the same
plan keeping the stages it recomputes that read a gathered weight (:func:`fsdp_choices`) and
writes ``experiments/results/sharded_fsdp_choices.csv``::

    python -m experiments.sharded_budget --fsdp-choices

Every run plans with the ``host`` profile fixed at :data:`HOST_RATES` (no timing), so the
stage costs, plans and modelled times are the same on every rerun; ``--measured-host`` uses
this machine's measured profile.

Layouts on 8 devices: ``dp`` (parameters replicated, batch over ``data``), ``fsdp`` (parameters'
first axis and the batch over ``data``: XLA all-gathers each weight before use) and ``tp2xdp4``
(a 4 x 2 mesh: batch over ``data``, weights alternately column- and row-sharded over ``model``,
Megatron style; in the Flax transformer the attention's query/key/value kernels over their
heads axis, its output projection's over its heads axis, the MLP's first ``Dense`` by column and
its second by row).  Models: a tanh MLP and a pre-LN transformer in plain JAX, a Flax linen tanh
MLP with biases (``flax_mlp``) and a Flax linen pre-LN transformer (``flax_transformer``:
``nn.MultiHeadDotProductAttention`` with 8 heads and no biases, ``nn.LayerNorm``, ``nn.Dense``
with biases).

Length: the three runs (the layouts x models table, ``--fsdp-choices``, ``--mesh16``) share the
models, layouts and per-device figures, and ``tests/test_sharding.py`` runs cases of all of
them in one subprocess.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

FLAGS = "--xla_force_host_platform_device_count=8 --xla_disable_hlo_passes=cse_barrier_expander"
FLAGS16 = FLAGS.replace("count=8", "count=16")
OUT = os.path.join(os.path.dirname(__file__), "results", "sharded_budget.csv")
HOST_RATES = (5e10, 3.5e10)
"""The ``host`` profile's rates the runs plan with (FLOP/s, bytes/s: this 2-core machine's
calibration, rounded; :func:`remat.devices.fixed_host`), so a rerun differs only by what
changed in the code; ``--measured-host`` plans with the measured profile instead."""
LAYOUTS = ("dp", "fsdp", "tp2xdp4")
MODELS = ("mlp", "transformer", "flax_mlp", "flax_transformer")
FIELDS = ("layout", "model", "budget", "status", "budget_bytes", "no_remat_temp", "modelled_peak",
          "predicted_no_remat_temp", "predicted_temp", "calibrated_temp", "scaled_temp", "compiled_temp", "ratio", "grad_max_rel_err", "collectives",
          "gathered_bytes", "regathered_nodes", "regather_s", "all_gathers_no_remat", "all_gathers",
          "plan_s", "error")


def _models(width: int, batch: int, n_blocks: int = 2, only: str | None = None):
    """``{model: (loss, params, x)}``; with ``only`` the Flax models other than it are not built
    (each costs an ``init`` compile)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def mlp_loss(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h * h)

    def ln(h):
        m = jnp.mean(h, -1, keepdims=True)
        return (h - m) * jax.lax.rsqrt(jnp.mean((h - m) ** 2, -1, keepdims=True) + 1e-5)

    heads = 4

    def tf_loss(blocks, x):  # x: (B, S, D)
        b, s, d = x.shape
        h = x
        for p in blocks:
            a = ln(h)
            q, k, v = ((a @ p[n]).reshape(b, s, heads, d // heads) for n in ("wq", "wk", "wv"))
            att = jax.nn.softmax(jnp.einsum("bshd,bthd->bhst", q, k) / np.sqrt(d // heads), -1)
            o = jnp.einsum("bhst,bthd->bshd", att, v).reshape(b, s, d)
            h = h + o @ p["wo"]
            h = h + jnp.tanh(ln(h) @ p["w1"]) @ p["w2"]
        return jnp.mean(h * h)

    def r(i, shape):  # numpy draws: no XLA compile per weight
        a = np.random.default_rng(i).standard_normal(shape, dtype=np.float32)
        return jnp.asarray(a / np.float32(np.sqrt(shape[0])))

    mlp = ([r(i, (width, width)) for i in range(8)], r(99, (batch, width)))
    d, seq = 64, 32
    blocks = [{"wq": r(10 * i, (d, d)), "wk": r(10 * i + 1, (d, d)), "wv": r(10 * i + 2, (d, d)),
               "wo": r(10 * i + 3, (d, d)), "w1": r(10 * i + 4, (d, 4 * d)),
               "w2": r(10 * i + 5, (4 * d, d))} for i in range(n_blocks)]
    tf = (blocks, r(98, (batch // 16, seq, d)))
    out = {"mlp": (mlp_loss, *mlp), "transformer": (tf_loss, *tf)}
    flax = {"flax_mlp": lambda: _flax_mlp(width, batch),
            "flax_transformer": lambda: _flax_transformer(batch // 16, seq, d, n_blocks)}
    out.update({k: f() for k, f in flax.items() if only in (None, k)})
    return out


def _flax_mlp(width: int, batch: int):
    """A Flax linen MLP (8 tanh ``Dense`` layers with biases) and its loss."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, h):
            for _ in range(8):
                h = jnp.tanh(nn.Dense(width)(h))
            return h

    model = MLP()
    x = jnp.asarray(np.random.default_rng(97).standard_normal((batch, width), dtype=np.float32))
    params = jax.jit(model.init)(jax.random.PRNGKey(0), x[:1])

    def loss(p, xb):
        out = model.apply(p, xb)
        return jnp.mean(out * out)

    return loss, params, x


def _flax_transformer(n_seq: int, seq: int, d: int, n_blocks: int, heads: int = 8):
    """A Flax linen pre-LN transformer: ``n_blocks`` blocks of ``LayerNorm`` ->
    ``MultiHeadDotProductAttention`` (self-attention, ``heads`` heads) and ``LayerNorm`` ->
    ``Dense`` (4d, tanh) -> ``Dense`` (d), each residual; its loss and ``(n_seq, seq, d)`` inputs.
    Eight heads, so that FSDP can shard the output projection's ``(heads, head_dim, d)`` kernel
    over 8 devices.  The attention has no biases: a key bias's gradient is zero (softmax is
    invariant to a shift per query), so its entries are rounding noise and no relative error of
    them, sharded or not, means anything (1.6 for the sharded ``jax.value_and_grad`` itself)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h):
            attn = nn.MultiHeadDotProductAttention(num_heads=heads, use_bias=False, name="attn")
            h = h + attn(nn.LayerNorm()(h))
            m = jnp.tanh(nn.Dense(4 * d, name="mlp_in")(nn.LayerNorm()(h)))
            return h + nn.Dense(d, name="mlp_out")(m)

    class Transformer(nn.Module):
        @nn.compact
        def __call__(self, h):
            for i in range(n_blocks):
                h = Block(name=f"block_{i}")(h)
            return h

    model = Transformer()
    x = jnp.asarray(np.random.default_rng(96).standard_normal((n_seq, seq, d), dtype=np.float32))
    params = jax.jit(model.init)(jax.random.PRNGKey(1), x[:1])

    def loss(p, xb):
        out = model.apply(p, xb)
        return jnp.mean(out * out)

    return loss, params, x


def _layout(name: str, params, x):
    """``(sharded params, sharded x)`` for a layout on the 8 host devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devs = np.array(jax.devices()[:8])
    if name == "tp2xdp4":
        mesh = Mesh(devs.reshape(4, 2), ("data", "model"))
    else:
        mesh = Mesh(devs.reshape(8), ("data",))

    def spec(path, w):
        keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        if name == "dp":
            return P()
        if name == "fsdp":  # kernels' first axis; biases and norms replicated
            if w.ndim >= 2 and keys[-1] != "bias":
                return P("data", *([None] * (w.ndim - 1)))
            return P()
        # Megatron: column-parallel then row-parallel; a column layer's bias is sharded too
        if "attn" in keys:  # Flax attention: q/k/v (d, heads, hd) over heads, out (heads, hd, d)
            return P("model", None, None) if keys[-2] == "out" else P(None, "model", None)
        if any(k in ("mlp_in", "mlp_out") for k in keys):
            row = "mlp_out" in keys
        elif any(k.startswith("LayerNorm_") for k in keys):
            return P()
        elif any(k in ("wq", "wk", "wv", "wo", "w1", "w2") for k in keys):
            row = keys[-1] in ("wo", "w2")
        elif any(k.startswith("Dense_") for k in keys):  # Flax: Dense_i/kernel, Dense_i/bias
            row = int(next(k for k in keys if k.startswith("Dense_"))[6:]) % 2 == 1
        else:  # a list of weights
            row = int(keys[-1]) % 2 == 1
        if w.ndim == 1:
            return P() if row else P("model")
        return P("model", None) if row else P(None, "model")

    ps = jax.tree_util.tree_map_with_path(
        lambda p, w: jax.device_put(w, NamedSharding(mesh, spec(p, w))), params)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", *([None] * (x.ndim - 1)))))
    return ps, xs


def _count_gathers(hlo: str) -> int:
    return hlo.count(" all-gather(") + hlo.count(" all-gather-start(")


def _gather_reads(g) -> dict[int, tuple[int, float]]:
    """FSDP: forward node -> (gathered weights it reads, modelled time of their all-gathers, s)."""
    from remat import devices
    from remat.sharding import collective_time

    sh = g.meta.get("sharding", {})
    gathered, prog, n = sh.get("gathered_args", {}), g.program, sh.get("n_devices", 1)
    link = devices.for_backend().link_bw
    out = {}
    for i, nd in enumerate(g.nodes):
        args = [a for a in prog.node_args[i] if a in gathered]
        if not nd.is_backward and args:
            out[i] = (len(args), sum(collective_time("all-gather", gathered[a], n, link)
                                     for a in args))
    return out


def _regathers(g, plan) -> tuple[int, float]:
    """FSDP: forward nodes the plan recomputes that read a gathered weight (each recomputation
    regathers it), and the modelled time of those extra all-gathers, s."""
    import numpy as np

    counts = np.asarray(plan.R).sum(axis=0)
    reads = {i: s for i, (_, s) in _gather_reads(g).items() if counts[i] >= 2}
    return len(reads), float(sum((counts[i] - 1) * s for i, s in reads.items()))


def run_case(layout: str, model: str, budget: str, *, width: int = 128, batch: int = 8192,
             blocks: int = 2, policy: str = "checkmate") -> dict:
    """One (layout, model, budget) row (module docstring); ``blocks``: the transformer's."""
    import jax
    import numpy as np

    import remat
    from remat.core.errors import InfeasibleBudgetError
    from remat.sharded_memory import predict_sharded_temp_bytes

    loss, params, x = _models(width, batch, blocks, only=model)[model]
    ref_v, ref_g = jax.jit(jax.value_and_grad(loss))(params, x)  # unsharded
    ps, xs = _layout(layout, params, x)
    base = jax.jit(jax.value_and_grad(loss)).lower(ps, xs).compile()
    row = {"layout": layout, "model": model, "budget": budget,
           "no_remat_temp": int(base.memory_analysis().temp_size_in_bytes),
           "all_gathers_no_remat": _count_gathers(base.as_text())}
    vg = remat.value_and_grad(loss, policy, budget=budget)
    t0 = time.perf_counter()
    try:
        app = vg.applied(ps, xs)  # planned per device, outside jit (the shardings are visible)
    except InfeasibleBudgetError as e:
        row.update(status="infeasible", budget_bytes=int(e.budget),
                   error=f"InfeasibleBudgetError min_feasible_bytes={int(e.min_feasible_bytes)}",
                   plan_s=round(time.perf_counter() - t0, 2))
        return row
    row["plan_s"] = round(time.perf_counter() - t0, 2)
    g = app.graph
    sh = g.meta.get("sharding", {})
    peak = int(app.plan.meta.get("peak_bytes") or 0)
    scale = app.baseline_temp_bytes / max(g.no_remat_peak(), 1)
    # predicted before the applied step is compiled here (the drop-in's loop compiled it already,
    # but the prediction reads nothing of it: the step's program at per-device shapes)
    pred = predict_sharded_temp_bytes(g, app.plan, app.abstract_args, fn=app.fn)
    pred0 = predict_sharded_temp_bytes(g, None, app.abstract_args)
    compiled = jax.jit(vg).lower(ps, xs).compile()
    v, grads = compiled(ps, xs)
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
    gathered = sh.get("gathered_args", {})
    regathered, regather_s = _regathers(g, app.plan)
    errs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / (np.max(np.abs(np.asarray(b))) + 1e-30))
            for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_g))]
    errs.append(abs(float(v) - float(ref_v)) / abs(float(ref_v)))
    row.update(status="fit" if temp <= app.budget_bytes else "over",
               budget_bytes=int(app.budget_bytes), modelled_peak=peak,
               predicted_no_remat_temp=int(pred0), predicted_temp=int(pred),
               calibrated_temp=int(round(row["no_remat_temp"] * pred / max(pred0, 1))),
               scaled_temp=int(peak * scale), compiled_temp=temp,
               ratio=round(temp / max(row["no_remat_temp"], 1), 4),
               grad_max_rel_err=max(errs),
               collectives=";".join(sorted({c.kind for c in sh.get("collectives", ())})),
               gathered_bytes=int(sum(gathered.values())), regathered_nodes=regathered,
               regather_s=regather_s, all_gathers=_count_gathers(compiled.as_text()), error="")
    return row


OUT_FSDP = os.path.join(os.path.dirname(__file__), "results", "sharded_fsdp_choices.csv")
FIELDS_FSDP = ("model", "budget", "choice", "budget_bytes", "planned_budget", "no_remat_temp",
               "regathered_nodes", "modelled_peak", "modelled_gathers", "modelled_compute_s",
               "modelled_gather_s", "modelled_other_collective_s", "modelled_time_s",
               "predicted_temp", "compiled_temp", "fits", "all_gathers", "grad_max_rel_err")


def keep_gathered_plan(g, plan):
    """``plan`` with every forward node that reads an FSDP-gathered weight and that ``plan``
    recomputes run once instead (its first run kept until its last reader; every other node's
    runs unchanged, retention by liveness)."""
    import numpy as np

    from policies.from_checkpoints import plan_from_steps

    R = np.asarray(plan.R).copy()
    for i in _gather_reads(g):
        runs = np.flatnonzero(R[:, i])
        R[runs[1:], i] = False
    keep = plan_from_steps(g, [np.flatnonzero(r) for r in R], policy="keep_gathered",
                           source=plan.meta.get("policy"))
    keep.validate(g)
    return keep


def fsdp_choices(model: str, budget: str, *, width: int = 128, batch: int = 8192,
                 blocks: int = 2, policy: str = "checkmate") -> list[dict]:
    """FSDP: the drop-in's plan at ``budget`` (``chosen``) against the same plan with the stages
    that read a gathered weight kept rather than recomputed (:func:`keep_gathered_plan`), applied
    by the drop-in (``keep``: kept stages in the drop-in's trimmed checkpoints, whose backward
    regathers the weight; ``keep_untrimmed``: kept stages run as is, so XLA keeps the gathered
    weight).  Per choice: the modelled per-device peak, the modelled time (compute, the
    forward all-gathers the plan runs, the other collectives of the no-remat step), the
    predicted and compiled per-device temp, the compiled step's all-gathers.  Only the chosen
    row when the plan recomputes no such stage."""
    import jax
    import numpy as np

    import remat
    from remat.apply import apply_plan
    from remat.core.errors import InfeasibleBudgetError
    from remat.sharded_memory import predict_sharded_temp_bytes

    loss, params, x = _models(width, batch, blocks, only=model)[model]
    ref_g = jax.jit(jax.grad(loss))(params, x)  # unsharded
    ps, xs = _layout("fsdp", params, x)
    try:
        app = remat.value_and_grad(loss, policy, budget=budget).applied(ps, xs)
    except InfeasibleBudgetError as e:
        return [{"model": model, "budget": budget, "choice": "infeasible",
                 "budget_bytes": int(e.budget)}]
    g = app.graph
    reads = _gather_reads(g)
    other_s = sum(c.time_s for c in g.meta["sharding"]["collectives"] if c.kind != "all-gather")
    chosen = app.plan
    regathered = _regathers(g, chosen)[0]
    choices = [("chosen", chosen)]
    if regathered:
        keep = keep_gathered_plan(g, chosen)
        choices += [("keep", keep), ("keep_untrimmed", keep.with_meta(trim_segments=False))]
    rows = []
    for name, plan in choices:
        a = app if plan is chosen else apply_plan(loss, (ps, xs), None, graph=g, plan=plan,
                                                  warn=False)
        rep = remat.simulate(g, plan)
        counts = np.asarray(plan.R).sum(axis=0)
        gather_s = float(sum(counts[i] * t for i, (_, t) in reads.items()))
        pred = predict_sharded_temp_bytes(g, plan, a.abstract_args, fn=a.fn)
        compiled = jax.jit(jax.value_and_grad(a.fn)).lower(ps, xs).compile()
        grads = compiled(ps, xs)[1]
        temp = int(compiled.memory_analysis().temp_size_in_bytes)
        err = max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))
                        / (np.max(np.abs(np.asarray(v))) + 1e-30))
                  for u, v in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_g)))
        rows.append({"model": model, "budget": budget, "choice": name,
                     "budget_bytes": int(app.budget_bytes),
                     "planned_budget": int(chosen.meta.get("budget") or 0),
                     "no_remat_temp": int(app.baseline_temp_bytes),
                     "regathered_nodes": _regathers(g, plan)[0],
                     "modelled_peak": int(rep.peak_bytes),
                     "modelled_gathers": int(sum(counts[i] * k for i, (k, _) in reads.items())),
                     "modelled_compute_s": rep.compute_time_s - gather_s,
                     "modelled_gather_s": gather_s, "modelled_other_collective_s": other_s,
                     "modelled_time_s": rep.compute_time_s + other_s,
                     "predicted_temp": int(pred), "compiled_temp": temp,
                     "fits": temp <= app.budget_bytes,
                     "all_gathers": _count_gathers(compiled.as_text()), "grad_max_rel_err": err})
    return rows


OUT16 = os.path.join(os.path.dirname(__file__), "results", "sharded_plan16.csv")
FIELDS16 = ("budget", "status", "budget_bytes", "no_remat_temp", "predicted_no_remat_temp",
            "modelled_no_remat_peak", "modelled_peak", "predicted_temp", "compiled_temp", "ratio",
            "compute_overhead", "plan_s", "error")


def plan_abstract16(budgets=("30%", "50%", "70%", "90%"), *, policy: str = "checkmate") -> list:
    """Plan a sharded transformer step from abstract shapes on a 16-device mesh (8 data x 2
    model, Megatron-style weights): no weights exist, the drop-in's compiled-budget loop lowers
    and compiles the SPMD step ahead of time at ``jax.ShapeDtypeStruct``\\ s with their
    shardings.  Per budget (of the no-remat step's per-device compiled temp): the plan's modelled
    per-device peak, the predicted per-device temp
    (:func:`remat.sharded_memory.predict_sharded_temp_bytes`, nothing compiled), the compiled
    per-device temp the loop reached, and the plan's compute overhead (recompute included)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import remat
    from remat.core.errors import InfeasibleBudgetError
    from remat.sharded_memory import predict_sharded_temp_bytes

    loss = _models(128, 8192, only="transformer")["transformer"][0]
    mesh = Mesh(np.array(jax.devices()[:16]).reshape(8, 2), ("data", "model"))
    d, seq, batch, nblocks = 256, 128, 64, 4

    def sds(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    col, row = P(None, "model"), P("model", None)
    blocks = [{"wq": sds((d, d), col), "wk": sds((d, d), col), "wv": sds((d, d), col),
               "wo": sds((d, d), row), "w1": sds((d, 4 * d), col), "w2": sds((4 * d, d), row)}
              for _ in range(nblocks)]
    x = sds((batch, seq, d), P("data", None, None))
    rows = []
    for b in budgets:
        vg = remat.value_and_grad(loss, policy, budget=b)
        t0 = time.perf_counter()
        try:
            app = vg.applied(blocks, x)
        except InfeasibleBudgetError as e:
            rows.append({"budget": b, "status": "infeasible", "budget_bytes": int(e.budget),
                         "plan_s": round(time.perf_counter() - t0, 2),
                         "error": f"InfeasibleBudgetError min_feasible_bytes="
                                  f"{int(e.min_feasible_bytes)}"})
            continue
        g = app.graph
        pred = predict_sharded_temp_bytes(g, app.plan, app.abstract_args, fn=app.fn)
        pred0 = predict_sharded_temp_bytes(g, None, app.abstract_args)
        rep = remat.simulate(g, app.plan)
        temp = int(app.compiled_temp_bytes)
        rows.append({"budget": b, "status": "fit" if temp <= app.budget_bytes else "over",
                     "budget_bytes": int(app.budget_bytes),
                     "no_remat_temp": int(app.baseline_temp_bytes),
                     "predicted_no_remat_temp": int(pred0),
                     "modelled_no_remat_peak": int(g.no_remat_peak()),
                     "modelled_peak": int(rep.peak_bytes), "predicted_temp": int(pred),
                     "compiled_temp": temp,
                     "ratio": round(temp / max(app.baseline_temp_bytes, 1), 4),
                     "compute_overhead": round(rep.overhead, 4),
                     "plan_s": round(time.perf_counter() - t0, 2), "error": ""})
    return rows


def _write_rows(path: str, fields, rows) -> None:
    """Write ``rows`` (dicts, an iterable) to the CSV ``path``, each as it comes."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        for r in rows:
            print(r, file=sys.stderr, flush=True)
            w.writerow({k: r.get(k, "") for k in fields})
            f.flush()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON row per case on stdout")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--budgets", default="50%,70%,85%")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--mesh16", action="store_true", help="plan the abstract 16-device "
                    "transformer (needs 16 host devices) and write " + os.path.basename(OUT16))
    ap.add_argument("--fsdp-choices", action="store_true", help="FSDP: the plan against the "
                    "same plan keeping its regathered stages (fsdp_choices), for --models and "
                    "--budgets; writes " + os.path.basename(OUT_FSDP))
    ap.add_argument("--measured-host", action="store_true", help="plan with this machine's "
                    "measured host profile instead of the fixed rates HOST_RATES")
    a = ap.parse_args(argv)
    import contextlib
    import warnings

    from remat import devices

    warnings.simplefilter("ignore")
    with contextlib.nullcontext() if a.measured_host else devices.fixed_host(*HOST_RATES):
        _run(a)


def _run(a) -> None:
    if a.mesh16:
        _write_rows(OUT16, FIELDS16, plan_abstract16())
        return
    if a.fsdp_choices:  # rows written as they are made (an interrupted run keeps its rows)
        _write_rows(OUT_FSDP, FIELDS_FSDP, (r for m in a.models.split(",")
                                            for b in a.budgets.split(",")
                                            for r in fsdp_choices(m, b)))
        return
    rows = (run_case(layout, model, budget) for layout in a.layouts.split(",")
            for model in a.models.split(",") for budget in a.budgets.split(","))
    if a.json:
        for row in rows:
            print(json.dumps(row), flush=True)
    else:  # rows written as they are made (an interrupted run keeps its rows)
        _write_rows(a.out, FIELDS, rows)


if __name__ == "__main__":
    if "XLA_FLAGS" not in os.environ:
        os.execve(sys.executable, [sys.executable, "-m", "experiments.sharded_budget", *sys.argv[1:]],
                  {**os.environ, "XLA_FLAGS": FLAGS16 if "--mesh16" in sys.argv else FLAGS})
    main()
