"""Does the drop-in realise the plan?  Every zoo model x every policy x budget: the plan's
predicted saved bytes against the saved-residual bytes of the transformed function, and XLA's
compiled temp bytes and FLOPs against the unmodified step's.

Per row (one model at the sizes in ``MODELS``, one registered policy, one budget):

* ``predicted_residual_bytes``: what the plan keeps from the forward pass (outputs of forward
  stages it computes once that the backward or a recomputation reads;
  :func:`remat.apply.predicted_residual_bytes`);
* ``realised_residual_bytes``: ``saved_residuals`` of ``remat.value_and_grad``'s function,
  arguments excluded (independent of the plan);
* ``xla_temp_bytes`` / ``xla_flops``: ``memory_analysis().temp_size_in_bytes`` and
  ``cost_analysis()["flops"]`` of the jitted step (XLA:CPU with the ``cse_barrier_expander``
  pass disabled, set by this script before JAX starts), next to the unmodified step's
  (``*_base``) and the plan's modelled FLOPs (``predicted_flops``);
* ``status``: ``ok``, ``infeasible`` (the policy's typed error, with its minimum), ``n/a`` (a
  chain policy on a non-chain graph) or ``error: ...``; ``notes`` what the applier reported.

Command that produced ``experiments/results/fidelity.csv``::

    python experiments/fidelity_benchmark.py --out experiments/results/fidelity.csv

Resumable: rows already in ``--out`` are skipped (``--models``/``--policies`` select subsets).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_disable_hlo_passes=cse_barrier_expander")

import argparse  # noqa: E402
import csv  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

MODELS = {
    "mlp": dict(batch_size=64, depth=16, width=256),
    "vgg16": dict(batch_size=4, width=16, fc_width=128),
    "resnet18": dict(batch_size=4, width=16),
    "resnet50": dict(batch_size=2, image_size=64, width=16),
    "mobilenet_v2": dict(batch_size=2, image_size=64, width_mult=0.5),
    "squeezenet": dict(batch_size=2, image_size=64, width=32),
    "unet": dict(batch_size=2, image_size=64, width=16),
    "bert_small": dict(batch_size=4, seq_len=32, hidden=128, num_heads=4),
    "gpt2_small": dict(batch_size=2, seq_len=32, hidden=128, num_heads=4),
}
BUDGETS = ("70%", "50%")
SOLVER_LIMIT_S = 20.0

FIELDS = [
    "model", "policy", "budget", "status", "n_forward_stages", "simulated_peak_bytes",
    "predicted_residual_bytes", "realised_residual_bytes", "realised_over_predicted",
    "residual_bytes_base", "xla_temp_bytes", "xla_temp_bytes_base", "predicted_flops",
    "xla_flops", "xla_flops_base", "notes",
]


def _xla(f, args):
    import jax

    c = jax.jit(f).lower(*args).compile()
    ca = c.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return int(c.memory_analysis().temp_size_in_bytes), float((ca or {}).get("flops", float("nan")))


def _policy(name):
    import policies

    try:
        return policies.get(name, time_limit=SOLVER_LIMIT_S)
    except TypeError:
        return policies.get(name)


def run_model(name, policies_, budgets, done, writer, fh):
    import jax

    import remat
    from remat.apply import apply_plan
    from remat.errors import InfeasibleBudgetError, InvalidGraphError, RematError
    from remat.measurement import residual_bytes

    loss, params, batch = remat.zoo.get(name, **MODELS[name])
    args = (params, batch)
    g = remat.extract(loss, params, batch)
    base_res, _ = residual_bytes(loss, *args)
    base_temp, base_flops = _xla(jax.value_and_grad(loss), args)
    nfwd = len(g.forward_nodes)
    for pol in policies_:
        for budget in budgets:
            if (name, pol, budget) in done:
                continue
            row = dict(model=name, policy=pol, budget=budget, n_forward_stages=nfwd,
                       residual_bytes_base=base_res, xla_temp_bytes_base=base_temp,
                       xla_flops_base=base_flops)
            t0 = time.perf_counter()
            try:
                plan = _policy(pol).plan(g, budget=budget)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    app = apply_plan(loss, args, None, graph=g, plan=plan)
                temp, flops = _xla(jax.value_and_grad(app.fn), args)
                row.update(
                    status="ok", simulated_peak_bytes=remat.simulate(g, plan).peak_bytes,
                    predicted_residual_bytes=app.predicted_residual_bytes,
                    realised_residual_bytes=app.residual_bytes,
                    realised_over_predicted=round(app.residual_bytes
                                                  / max(app.predicted_residual_bytes, 1), 4),
                    xla_temp_bytes=temp, predicted_flops=app.predicted_flops, xla_flops=flops,
                    notes=" | ".join(app.notes))
            except InfeasibleBudgetError as e:
                row.update(status="infeasible", notes=f"min {int(e.min_feasible_bytes)} B")
            except InvalidGraphError as e:  # chain policies on non-chains
                row.update(status="n/a", notes=str(e)[:200])
            except RematError as e:
                row.update(status="n/a" if "NotApplicable" in type(e).__name__ else
                           f"error: {type(e).__name__}", notes=str(e)[:200])
            print(f"{name:13s} {pol:15s} {budget:4s} {row['status']:10s} "
                  f"pred {row.get('predicted_residual_bytes')} real "
                  f"{row.get('realised_residual_bytes')} temp {row.get('xla_temp_bytes')}/"
                  f"{base_temp} ({time.perf_counter() - t0:.1f}s)", flush=True)
            writer.writerow(row)
            fh.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="experiments/results/fidelity.csv")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default="")
    ap.add_argument("--budgets", default=",".join(BUDGETS))
    a = ap.parse_args(argv)
    import policies

    pols = a.policies.split(",") if a.policies else policies.available()
    done = set()
    if os.path.exists(a.out):
        with open(a.out) as fh:
            done = {(r["model"], r["policy"], r["budget"]) for r in csv.DictReader(fh)}
    new = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            w.writeheader()
        for m in a.models.split(","):
            run_model(m, pols, a.budgets.split(","), done, w, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
