"""Scanned transformers: remat's per-layer plans against JAX's built-in checkpoint policies.

For each scanned zoo transformer (``gpt2_small``/``bert_small`` with ``scan=True``: the blocks
are one ``nn.scan``) every point is one compiled training step, measured the same way:

* built-in: the block under ``nn.remat(policy=P)`` inside ``nn.scan``, as users write it, for
  ``P`` in no remat, ``everything_saveable``, ``dots_saveable``,
  ``dots_with_no_batch_dims_saveable``, ``nothing_saveable`` and ``save_only_these_names`` of
  the zoo's MaxText-style tags (``qkv``, ``context``, ``attn_out``, ``mlp_hidden``,
  ``mlp_out``) a user would pick;
* remat: ``remat.value_and_grad(loss, policies.ScanLayers(budget=b))`` on the plain scanned model
  for budgets ``b`` from 5% to 100% of the no-remat peak.

Measured: ``memory_analysis().temp_size_in_bytes`` of the jitted step (XLA:CPU with
``cse_barrier_expander`` disabled: this script sets ``XLA_FLAGS`` before JAX starts), its FLOPs
counted on its jaxpr with loops times their trip count (``flops``; XLA's ``cost_analysis``,
kept as ``xla_flops``, counts a scan's body once), the saved-residual bytes, and for remat plans the planner's
predicted residual bytes and the largest gradient deviation from the unmodified step.  ``dominated_by``
names, for every built-in point, the remat plan with no more temp bytes and no more FLOPs
(empty when none).

Command that produced ``experiments/results/scan_pareto.csv`` (and ``scan_pareto_<model>.png``,
not committed)::

    python experiments/scan_pareto.py --out experiments/results/scan_pareto.csv --plot
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_disable_hlo_passes=cse_barrier_expander")

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
BUDGETS = (0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
NAME_SETS = (("qkv",), ("mlp_hidden",), ("qkv", "mlp_hidden"), ("attn_out", "mlp_out"),
             ("qkv", "context", "attn_out", "mlp_hidden", "mlp_out"))

FIELDS = ["model", "kind", "point", "xla_temp_bytes", "flops", "xla_flops", "residual_bytes",
          "predicted_residual_bytes", "predicted_peak_bytes", "predicted_flops", "max_grad_err",
          "scan_decision", "dominated_by"]


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

    import policies
    import remat
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
    loss, params, batch = remat.zoo.get(name, scan=True, **MODELS[name])
    ref = jax.jit(jax.value_and_grad(loss))(params, batch)
    g = remat.extract(loss, params, batch)
    seen = set()
    for frac in BUDGETS:
        try:
            plan = policies.ScanLayers(budget=f"{100 * frac:g}%").plan(g)
        except remat.errors.InfeasibleBudgetError:
            continue
        dec = tuple((d.leaf, tuple(sorted(d.saved)), d.group) for d in plan.meta["scans"])
        if dec in seen:
            continue
        seen.add(dec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            app = apply_plan(loss, (params, batch), None, graph=g, plan=plan)
        vg = jax.value_and_grad(app.fn)
        temp, flops, xflops = _measure(vg, (params, batch))
        out = jax.jit(vg)(params, batch)
        err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
        body = g.program.scans[0]
        desc = "; ".join(f"keep [{', '.join(body.anchor_name(j) for j in sorted(d.saved))}]"
                         f" group {d.group}" for d in plan.meta["scans"])
        rows.append(dict(model=name, kind="remat", point=f"ScanLayers({100 * frac:g}%)",
                         xla_temp_bytes=temp, flops=flops, xla_flops=xflops,
                         residual_bytes=app.residual_bytes,
                         predicted_residual_bytes=app.predicted_residual_bytes,
                         predicted_peak_bytes=plan.meta.get("predicted_peak_bytes"),
                         predicted_flops=app.predicted_flops, max_grad_err=err,
                         scan_decision=desc))
        print(f"{name} ScanLayers({100 * frac:g}%) temp {temp / 2**20:7.2f} MiB  "
              f"{flops / 1e9:.3f} GFLOP  {desc}", flush=True)
    ours = [r for r in rows if r["kind"] == "remat"]
    for r in rows:
        if r["kind"] == "jax":
            dom = [o for o in ours if o["xla_temp_bytes"] <= r["xla_temp_bytes"]
                   and o["flops"] <= r["flops"]]
            r["dominated_by"] = min(dom, key=lambda o: o["flops"])["point"] if dom else ""
    return rows


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, marker, color in (("jax", "s", "tab:gray"), ("remat", "o", "tab:blue")):
        pts = [r for r in rows if r["kind"] == kind]
        ax.scatter([r["flops"] / 1e9 for r in pts],
                   [r["xla_temp_bytes"] / 2**20 for r in pts], marker=marker, color=color,
                   label="JAX built-in policy" if kind == "jax" else "remat ScanLayers")
        for r in pts if kind == "jax" else ():
            ax.annotate(r["point"].replace("save_only_these_names", "names")[:28],
                        (r["flops"] / 1e9, r["xla_temp_bytes"] / 2**20), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("step FLOPs (GFLOP; jaxpr count, scan body x trip count)")
    ax.set_ylabel("XLA temp memory (MiB, memory_analysis)")
    ax.set_title(f"{rows[0]['model']} (scan over {MODELS[rows[0]['model']]['num_layers']} blocks)")
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
