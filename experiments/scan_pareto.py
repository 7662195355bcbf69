"""Scanned transformers: remat's per-layer plans against JAX's built-in checkpoint policies.

For each scanned zoo transformer (``gpt2_small``/``bert_small`` with ``scan=True``: the 8
blocks are one ``nn.scan``; width 128, sequence 64, batch 8, the issue's model) every point is
one compiled training step, measured the same way:

* built-in: the block under ``nn.remat(policy=P)`` inside ``nn.scan``, as users write it, for
  ``P`` in no remat, ``everything_saveable``, ``dots_saveable``,
  ``dots_with_no_batch_dims_saveable``, ``nothing_saveable`` and ``save_only_these_names`` of
  the zoo's MaxText-style tags (``qkv``, ``context``, ``attn_out``, ``mlp_hidden``,
  ``mlp_out``) a user would pick;
* remat: ``policies.ScanLayers(budget=b)`` on the plain scanned model, applied as
  ``remat.value_and_grad`` applies it (:func:`remat.apply.apply_plan`), at every budget where
  its plan changes (:func:`policies.scan_layers.frontier`: from no budget, the fewest FLOPs,
  down to its smallest feasible budget, each budget one byte under the previous plan's
  predicted peak; 12 to 13 budgets per model here).

Measured: ``memory_analysis().temp_size_in_bytes`` of the jitted step (XLA:CPU with
``cse_barrier_expander`` disabled: this script adds it to ``XLA_FLAGS`` before JAX starts and
checks that ``nothing_saveable`` then needs less temp than no remat), its FLOPs counted on its
jaxpr with loops times their trip count after dead-code elimination (``flops``; XLA's
``cost_analysis``, kept as ``xla_flops``, counts a scan's body once), the saved-residual bytes,
and for remat plans the planner's predicted residual bytes, peak and FLOPs, the predicted
saving (no-remat peak minus the plan's) next to the measured one (no-remat temp minus the
plan's temp), and the largest gradient deviation from the unmodified step.  ``dominated_by``
names, for every built-in point, the remat plan with no more temp bytes and no more FLOPs and
the fewest FLOPs among those (empty when none).

Command that produced ``experiments/results/scan_pareto.csv`` (and ``scan_pareto_<model>.png``,
not committed; about 5 minutes on 2 loaded CPU cores)::

    python experiments/scan_pareto.py --out experiments/results/scan_pareto.csv --plot
"""

from __future__ import annotations

import os

_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import argparse  # noqa: E402
import csv  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

MODELS = {
    # the model: 8 blocks, width 128, sequence 64, batch 8
    "gpt2_small": dict(batch_size=8, seq_len=64, hidden=128, num_layers=8, num_heads=4,
                       vocab_size=512, max_len=64, dropout=0.0),
    "bert_small": dict(batch_size=8, seq_len=64, hidden=128, num_layers=8, num_heads=4,
                       vocab_size=512, max_len=64, dropout=0.0),
}
NAME_SETS = (("qkv",), ("mlp_hidden",), ("qkv", "mlp_hidden"), ("attn_out", "mlp_out"),
             ("qkv", "context", "attn_out", "mlp_hidden", "mlp_out"))

FIELDS = ["model", "kind", "point", "budget_bytes", "xla_temp_bytes", "flops", "xla_flops",
          "residual_bytes", "predicted_residual_bytes", "predicted_peak_bytes", "predicted_flops",
          "predicted_saving_bytes", "measured_saving_bytes", "max_grad_err", "scan_decision",
          "dominated_by"]


def _builtins():
    import jax

    cp = jax.checkpoint_policies
    pts = [("no remat", None), ("everything_saveable", cp.everything_saveable),
           ("dots_saveable", cp.dots_saveable),
           ("dots_with_no_batch_dims_saveable", cp.dots_with_no_batch_dims_saveable),
           ("nothing_saveable", cp.nothing_saveable)]
    pts += [(f"save_only_these_names({', '.join(n)})", cp.save_only_these_names(*n))
            for n in NAME_SETS]
    return pts


def _measure(vg, args):
    """``(temp bytes, FLOPs, XLA FLOPs)``: XLA's compiled temp size; FLOPs counted on the step's
    jaxpr with loops times their trip count (:func:`remat.measurement.step_flops`), because
    XLA's ``cost_analysis`` counts a ``while`` body (a compiled scan) once."""
    import jax

    from remat.measurement import step_flops

    c = jax.jit(vg).lower(*args).compile()
    ca = c.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return (int(c.memory_analysis().temp_size_in_bytes), step_flops(vg, *args),
            float(ca["flops"]))


def run_model(name: str) -> list[dict]:
    import jax
    import numpy as np

    import remat
    from policies.scan_layers import frontier
    from remat.apply import apply_plan
    from remat.measurement import residual_bytes

    rows = []
    for label, pol in _builtins():
        loss, params, batch = remat.zoo.get(name, scan=True, remat_policy=pol, **MODELS[name])
        temp, flops, xflops = _measure(jax.value_and_grad(loss), (params, batch))
        res, _ = residual_bytes(loss, params, batch)
        rows.append(dict(model=name, kind="jax", point=label, xla_temp_bytes=temp, flops=flops,
                         xla_flops=xflops, residual_bytes=res))
        print(f"{name} {label:60s} temp {temp / 2**20:7.2f} MiB  {flops / 1e9:.3f} GFLOP",
              flush=True)
    base_temp = rows[0]["xla_temp_bytes"]
    nothing = next(r for r in rows if r["point"] == "nothing_saveable")
    if nothing["xla_temp_bytes"] >= base_temp:
        raise SystemExit(f"{name}: nothing_saveable needs no less XLA temp than no remat: "
                         f"XLA_FLAGS={os.environ.get('XLA_FLAGS')!r} did not take effect")
    loss, params, batch = remat.zoo.get(name, scan=True, **MODELS[name])
    ref = jax.jit(jax.value_and_grad(loss))(params, batch)
    g = remat.extract(loss, params, batch)
    peak0 = g.no_remat_peak()
    body = g.program.scans[0]
    for budget, plan in frontier(g):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            app = apply_plan(loss, (params, batch), None, graph=g, plan=plan)
        vg = jax.value_and_grad(app.fn)
        temp, flops, xflops = _measure(vg, (params, batch))
        out = jax.jit(vg)(params, batch)
        err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
        desc = "; ".join(f"keep [{', '.join(body.anchor_name(j) for j in sorted(d.saved))}]"
                         f" group {d.group}" for d in plan.meta["scans"]) or "JAX's own residuals"
        label = ("ScanLayers(budget=None)" if budget is None
                 else f"ScanLayers({budget / 2**20:.2f} MiB = {100 * budget / peak0:.1f}%)")
        pred_peak = int(plan.meta["peak_bytes"])
        rows.append(dict(model=name, kind="remat", point=label, budget_bytes=budget,
                         xla_temp_bytes=temp, flops=flops, xla_flops=xflops,
                         residual_bytes=app.residual_bytes,
                         predicted_residual_bytes=app.predicted_residual_bytes,
                         predicted_peak_bytes=pred_peak, predicted_flops=app.predicted_flops,
                         predicted_saving_bytes=peak0 - pred_peak,
                         measured_saving_bytes=base_temp - temp, max_grad_err=err,
                         scan_decision=desc))
        print(f"{name} {label} temp {temp / 2**20:7.2f} MiB  {flops / 1e9:.3f} GFLOP  "
              f"saving predicted {(peak0 - pred_peak) / 2**20:.2f} measured "
              f"{(base_temp - temp) / 2**20:.2f} MiB  {desc}", flush=True)
    ours = [r for r in rows if r["kind"] == "remat"]
    for r in rows:
        if r["kind"] == "jax":
            dom = [o for o in ours if o["xla_temp_bytes"] <= r["xla_temp_bytes"]
                   and o["flops"] <= r["flops"]]
            r["dominated_by"] = min(dom, key=lambda o: o["flops"])["point"] if dom else ""
    return rows


def plot(rows, path: str) -> None:
    """Temp (log scale) against FLOPs: built-in policies as hollow squares (a remat plan at
    the same point shows inside), remat's plans as dots joined in budget order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    ours = [r for r in rows if r["kind"] == "remat"]
    ax.plot([r["flops"] / 1e9 for r in ours], [r["xla_temp_bytes"] / 2**20 for r in ours],
            "o-", color="tab:blue", lw=0.8, ms=5, label="remat ScanLayers (one budget each)")
    jax_pts = sorted((r for r in rows if r["kind"] == "jax"), key=lambda r: r["flops"])
    ax.scatter([r["flops"] / 1e9 for r in jax_pts],
               [r["xla_temp_bytes"] / 2**20 for r in jax_pts], marker="s", s=90,
               facecolors="none", edgecolors="tab:red", label="JAX built-in policy")
    for i, r in enumerate(jax_pts):
        ax.annotate(r["point"].replace("save_only_these_names", "names"),
                    (r["flops"] / 1e9, r["xla_temp_bytes"] / 2**20), fontsize=6,
                    xytext=(5, 6 if i % 2 else -9), textcoords="offset points")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_yticks([t for t in (10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150)
                   if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]])
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("step FLOPs (GFLOP; jaxpr count, scan body x trip count)")
    ax.set_ylabel("XLA temp memory (MiB, memory_analysis, cse_barrier_expander off)")
    ax.set_title(f"{rows[0]['model']} (nn.scan over {MODELS[rows[0]['model']]['num_layers']} "
                 "blocks): down-left is better")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="experiments/results/scan_pareto.csv")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--plot", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for m in a.models.split(","):
        mr = run_model(m)
        rows += mr
        if a.plot:
            plot(mr, os.path.join(os.path.dirname(a.out) or ".", f"scan_pareto_{m}.png"))
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
