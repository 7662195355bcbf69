"""Does the drop-in's budget steer XLA's bytes?  (issue #33, must-show 1, on the CPU.)

For the six models of :mod:`experiments.memory_model_report` (a plain-JAX 32-layer tanh MLP, a
plain-JAX transformer, zoo ``gpt2_small`` and ``resnet50`` scaled down, a Flax ``nn.scan``
transformer, a linen CNN) and budgets of 30/50/70% of the compiled no-remat step's temp:
``remat.value_and_grad(loss, policy, budget=f"{pct}%")`` with Checkmate (``time_limit=20`` s) and,
on the scanned model, ScanLayers.  Per row: the budget, the compiled temp of ``jax.jit`` of the
public transform (compiled here, independently of the closed loop's own figures), its ratio to
the budget, the closed loop's rounds and compiles, the plan's modelled peak, and
:func:`remat.xla_memory.predict_temp_bytes` of the returned plan against the compiled temp.
XLA:CPU with the ``cse_barrier_expander`` pass disabled (set below before JAX starts).

Command that made ``experiments/results/compiled_budget_jax0.12.0.1.csv`` (jax 0.12.0.1; a run
at another JAX version writes ``compiled_budget_jax<version>.csv``)::

    python experiments/compiled_budget_report.py \\
        --out experiments/results/compiled_budget_jax0.12.0.1.csv

Shown on ``docs/results/compiled_memory.md``.

The hierarchical policy against Checkmate at the stage level (the drop-in's default
granularity for Checkmate) in XLA's bytes at 30-90 %, with ``flops_x`` the applied step's jaxpr
FLOPs (:func:`remat.measurement.step_flops`) over ``jax.value_and_grad``'s (#35, must-shows 1
and 2)::

    python experiments/compiled_budget_report.py --policies hierarchical --pcts 30 50 70 90 \
        --fixed-host --out experiments/results/compiled_budget_hierarchical_jax0.12.0.1.csv
    python experiments/compiled_budget_report.py --policies checkmate --pcts 30 50 70 90 \
        --out experiments/results/compiled_budget_checkmate_sweep_jax0.12.0.1.csv
    python experiments/compiled_budget_report.py --policies checkmate --pcts 30 50 70 90 \
        --fixed-host --out experiments/results/compiled_budget_checkmate_cap_jax0.12.0.1.csv

(the last with the budget as a cap; stopped after three models),

shown on ``docs/results/hierarchical.md``, with the tanh MLP's two budgets where hierarchical
ran more FLOPs rerun after the memory model's barrier rules::

    python experiments/compiled_budget_report.py --models tanh_mlp --policies hierarchical \
        --pcts 30 50 --out experiments/results/compiled_budget_hierarchical_tanh_rerun_jax0.12.0.1.csv
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

PCTS = (30, 50, 70)
FIELDS = ["model", "policy", "pct", "status", "baseline_temp_bytes", "budget_bytes",
          "compiled_temp_bytes", "x_budget", "x_no_remat", "recomputes", "rounds", "compiles",
          "plan_peak_bytes", "predicted_temp_bytes", "predicted_x_compiled", "grad_rel_err",
          "flops_x", "plan_s", "jax", "notes"]


def _row(name, pol_name, pct, loss, params, batch, ref, base_flops):
    import jax
    import numpy as np

    import policies
    import remat
    from remat.core.errors import RematError
    from remat.measurement import step_flops

    pol = (policies.get("checkmate", time_limit=20.0) if pol_name == "checkmate"
           else policies.get(pol_name))
    vg = remat.value_and_grad(loss, pol, budget=f"{pct}%")
    row = dict(model=name, policy=pol_name, pct=pct, jax=jax.__version__)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            app = vg.applied(params, batch)
    except RematError as e:
        row.update(status=type(e).__name__, notes=str(e)[:300], plan_s=time.perf_counter() - t0,
                   budget_bytes=getattr(e, "budget", ""))
        return row
    row["plan_s"] = round(time.perf_counter() - t0, 2)
    compiled = int(jax.jit(vg).lower(params, batch).compile().memory_analysis()
                   .temp_size_in_bytes)
    v, g = jax.jit(vg)(params, batch)
    # per leaf, relative to the leaf's magnitude but at least 1e-3 of the largest leaf's (a
    # gradient that is zero in exact arithmetic, e.g. attention's key bias, is float noise)
    pairs = [(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(g),
                                                             jax.tree.leaves(ref[1]))]
    top = max(float(np.max(np.abs(b))) for _, b in pairs if b.size)
    err = max(float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-3 * top)
              for a, b in pairs if b.size)
    try:
        from remat.xla_memory import predict_temp_bytes

        pred = int(predict_temp_bytes(app.graph, app.plan, fn=app.fn))
    except Exception as e:  # noqa: BLE001 - a report column, said in the row
        pred, row["notes"] = "", f"predict: {type(e).__name__}: {e}"[:200]
    row.update(
        status="ok", baseline_temp_bytes=app.baseline_temp_bytes, budget_bytes=app.budget_bytes,
        compiled_temp_bytes=compiled, x_budget=round(compiled / app.budget_bytes, 3),
        x_no_remat=round(compiled / app.baseline_temp_bytes, 3),
        recomputes=bool((app.plan.R.sum(0) >= 2).any() or app.plan.meta.get("scans")),
        rounds=len(app.rounds),
        compiles=sum(1 for r in app.rounds if r.compiled_temp is not None and not r.reused),
        plan_peak_bytes=app.plan.meta.get("peak_bytes"), predicted_temp_bytes=pred,
        predicted_x_compiled=round(pred / compiled, 3) if pred != "" and compiled else "",
        grad_rel_err=f"{err:.2e}", flops_x=round(step_flops(vg, params, batch) / base_flops, 5),
        notes=(row.get("notes", "") + " | ".join(n for n in app.notes if "closed loop" not in n)
               )[:300])
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--policies", nargs="*", default=None,
                    help="registered policy names (default: checkmate, and scan_layers on the "
                         "scanned model)")
    ap.add_argument("--pcts", nargs="*", type=int, default=list(PCTS))
    ap.add_argument("--fixed-host", action="store_true",
                    help="plan with the host profile fixed at "
                         "experiments.sharded_budget.HOST_RATES (no timing: the same plans on "
                         "a loaded machine)")
    a = ap.parse_args(argv)
    import contextlib

    import remat.devices
    from experiments.sharded_budget import HOST_RATES

    with (remat.devices.fixed_host(*HOST_RATES) if a.fixed_host else contextlib.nullcontext()):
        _run(a)


def _run(a) -> None:
    """The rows of ``a.models`` x ``a.policies`` x ``a.pcts``, written as they are made."""
    import jax

    from experiments.memory_model_report import MODELS
    from remat.measurement import step_flops

    names = a.models or list(MODELS)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        for name in names:
            loss, params, batch = MODELS[name]()
            ref = jax.jit(jax.value_and_grad(loss))(params, batch)
            base_flops = step_flops(jax.value_and_grad(loss), params, batch)
            pols = a.policies or (
                ["checkmate"] + (["scan_layers"] if name == "scan_transformer" else []))
            for pol in pols:
                for pct in a.pcts:
                    row = _row(name, pol, pct, loss, params, batch, ref, base_flops)
                    w.writerow(row)
                    fh.flush()
                    print({k: row.get(k) for k in ("model", "policy", "pct", "status",
                                                    "x_budget", "x_no_remat", "compiles",
                                                    "predicted_x_compiled", "flops_x",
                                                    "plan_s")},
                          flush=True)


if __name__ == "__main__":
    main()
