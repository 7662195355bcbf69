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
* ``status``: ``ok``, ``infeasible`` (the policy's typed error, with its minimum in
  ``notes``), ``n/a`` (``NotApplicableError``: a chain policy on a non-chain graph, the scan
  planner on a model without ``lax.scan``), ``timeout`` (a solver's time limit with no
  incumbent), ``error: <RematError>`` or ``bug: <exception>`` (neither occurred); ``notes``:
  what the applier reported (what it approximated, and why realised and predicted differ);
  ``plan_status`` / ``solve_time_s``: the policy's status (``optimal``, ``time_limit``, ...) and
  solve time; ``wall_s``: the row's planning + application + compilation time.

Every registered policy runs (``policies.available()``, options through the public registry):
Checkmate and POET with a ``SOLVER_LIMIT_S`` = 20 s time limit, Pebbling with a 20 s search
limit.  POET is not skipped: at these sizes it reaches its time limit in at most ~30 s per row.
The sizes in ``MODELS`` are the zoo models scaled down: the 198 rows of the 11 policies of
issue 10 (9 models x 11 policies x 2 budgets) took 26.6 minutes on a loaded 2-core CPU (load
average 6), Melon's 18 rows 3 more.  Most of it is per-row XLA compilation (RecomputeAll's
deeply nested checkpoints alone take 8 minutes) and the solvers' time limits, not model size,
so the models were not shrunk further.  A newly registered policy is added by running the
script again (``--policies NAME``): existing rows are kept.

Command that produced ``experiments/results/fidelity.csv``::

    python experiments/fidelity_benchmark.py --out experiments/results/fidelity.csv

Resumable: rows already in ``--out`` are skipped (``--models``/``--policies`` select subsets).
``--summary`` prints the CSV's headline (largest disagreements) without running anything.
"""

from __future__ import annotations

import os

_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts (see docs/architecture.md)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

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
    "xla_flops", "xla_flops_base", "plan_status", "solve_time_s", "wall_s", "notes",
]


def _xla(f, args):
    import jax

    c = jax.jit(f).lower(*args).compile()
    ca = c.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return int(c.memory_analysis().temp_size_in_bytes), float((ca or {}).get("flops", float("nan")))


def _ratio(realised: int, predicted: int) -> float:
    """realised / predicted; 1.0 when both are 0 (nothing kept, as predicted)."""
    if predicted == 0:
        return 1.0 if realised == 0 else float("inf")
    return round(realised / predicted, 4)


def _policy(name):
    """``policies.get(name)`` with the solver/search time limit on the policies that take one
    (options looked up in the public registry, :func:`policies.option_names`)."""
    import policies

    opts = policies.option_names(name)
    kw = {k: SOLVER_LIMIT_S for k in ("time_limit", "search_time_s") if k in opts}
    return policies.get(name, **kw)


def run_model(name, policies_, budgets, done, writer, fh):
    import jax

    import remat
    from remat.apply import apply_plan
    from remat.core.errors import (
        InfeasibleBudgetError,
        NotApplicableError,
        RematError,
        SolverTimeoutError,
    )
    from remat.measurement import residual_bytes

    todo = [(p, b) for p in policies_ for b in budgets if (name, p, b) not in done]
    if not todo:
        return
    loss, params, batch = remat.zoo.get(name, **MODELS[name])
    args = (params, batch)
    t0 = time.perf_counter()
    g = remat.extract(loss, params, batch)
    extract_s = time.perf_counter() - t0
    base_res, _ = residual_bytes(loss, *args)
    base_temp, base_flops = _xla(jax.value_and_grad(loss), args)
    nfwd = len(g.forward_nodes)
    print(f"{name}: {nfwd} forward stages ({g.meta['stage_mode']}), {g.n} nodes, "
          f"extracted in {extract_s:.1f}s", flush=True)
    for pol, budget in todo:
        row = dict(model=name, policy=pol, budget=budget, n_forward_stages=nfwd,
                   residual_bytes_base=base_res, xla_temp_bytes_base=base_temp,
                   xla_flops_base=base_flops)
        t0 = time.perf_counter()
        try:
            plan = _policy(pol).plan(g, budget=budget)
            row.update(plan_status=plan.meta.get("status"),
                       solve_time_s=round(float(plan.meta.get("solve_time_s", 0.0)), 3))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                app = apply_plan(loss, args, None, graph=g, plan=plan)
            temp, flops = _xla(jax.value_and_grad(app.fn), args)
            row.update(
                status="ok", simulated_peak_bytes=remat.simulate(g, plan).peak_bytes,
                predicted_residual_bytes=app.predicted_residual_bytes,
                realised_residual_bytes=app.residual_bytes,
                realised_over_predicted=_ratio(app.residual_bytes, app.predicted_residual_bytes),
                xla_temp_bytes=temp, predicted_flops=app.predicted_flops, xla_flops=flops,
                notes=" | ".join(app.notes))
        except InfeasibleBudgetError as e:
            row.update(status="infeasible", notes=f"min {int(e.min_feasible_bytes)} B")
        except NotApplicableError as e:  # a chain / scan policy on a graph it does not plan
            row.update(status="n/a", notes=str(e)[:200])
        except SolverTimeoutError as e:
            row.update(status="timeout", notes=str(e)[:200])
        except RematError as e:
            row.update(status=f"error: {type(e).__name__}", notes=str(e)[:200])
        except Exception as e:  # noqa: BLE001 - a bug: recorded, and the sweep goes on
            row.update(status=f"bug: {type(e).__name__}", notes=str(e)[:200])
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        print(f"{name:13s} {pol:15s} {budget:4s} {row['status']:10s} "
              f"pred {row.get('predicted_residual_bytes')} real "
              f"{row.get('realised_residual_bytes')} temp {row.get('xla_temp_bytes')}/"
              f"{base_temp} ({row['wall_s']:.1f}s)", flush=True)
        writer.writerow(row)
        fh.flush()


def summarize(path: str) -> str:
    """The CSV's headline: row statuses, how many realisations are within 10% of the
    prediction, and the largest disagreements either way (realised / predicted)."""
    import collections

    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok:
        r["ratio"] = float(r["realised_over_predicted"])
    lines = [f"{len(rows)} rows: " + ", ".join(
        f"{k} {v}" for k, v in collections.Counter(r["status"] for r in rows).most_common())]
    if ok:
        temp = sorted((int(r["xla_temp_bytes"]) / max(int(r["xla_temp_bytes_base"]), 1), r["model"],
                       r["policy"], r["budget"]) for r in ok)
        med = temp[len(temp) // 2][0]
        lines.append(f"XLA temp over the unmodified step's: median {med:.2f}, lowest "
                     f"{temp[0][0]:.2f} ({' x '.join(temp[0][1:3])} at {temp[0][3]}), highest "
                     f"{temp[-1][0]:.2f} ({' x '.join(temp[-1][1:3])} at {temp[-1][3]})")
        close = sum(abs(r["ratio"] - 1) <= 0.1 for r in ok)
        lines.append(f"realised saved bytes within 10% of the prediction: {close} of {len(ok)}")
        for label, r in (("lowest", min(ok, key=lambda r: r["ratio"])),
                         ("highest", max(ok, key=lambda r: r["ratio"]))):
            lines.append(f"{label} realised/predicted {r['ratio']:.2f}: {r['model']} x "
                         f"{r['policy']} at {r['budget']} (predicted "
                         f"{int(r['predicted_residual_bytes'])} B, realised "
                         f"{int(r['realised_residual_bytes'])} B): {r['notes']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="experiments/results/fidelity.csv")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default="")
    ap.add_argument("--budgets", default=",".join(BUDGETS))
    ap.add_argument("--summary", action="store_true",
                    help="print the headline of --out and exit (no runs)")
    a = ap.parse_args(argv)
    if a.summary:
        print(summarize(a.out))
        return 0
    import policies

    pols = a.policies.split(",") if a.policies else policies.available()
    models = a.models.split(",")
    for kind, names, known in (("policy", pols, policies.available()),
                               ("model", models, list(MODELS))):
        bad = [x for x in names if x not in known]
        if bad:
            ap.error(f"unknown {kind} {bad[0]!r}; available: {', '.join(known)}")
    budgets = a.budgets.split(",")
    done = set()
    if os.path.exists(a.out):
        with open(a.out) as fh:
            done = {(r["model"], r["policy"], r["budget"]) for r in csv.DictReader(fh)}
    new = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            w.writeheader()
        for m in models:
            run_model(m, pols, budgets, done, w, fh)
    print(summarize(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
