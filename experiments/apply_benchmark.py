"""Cost of applying a plan with ``remat.value_and_grad``, per zoo model.

For each zoo model (small CPU sizes, listed in ``MODELS``) and policy: planning + application
overhead (extraction, planning, interpreter set-up; seconds), compile time, the compiled step's
median wall time with and without the plan (and their ratio), saved-residual bytes with and
without the plan (JAX's ``saved_residuals``, arguments excluded), whether the
recomputation survived XLA (compiled dot/conv and opt-barrier counts), and the largest gradient
deviation from ``jax.value_and_grad`` of the unmodified loss (both jitted), in units of the
tolerance ``atol + rtol * |ref|`` (rtol 1e-5, atol 1e-6): ``<= 1`` means equal to tolerance.

Command that produced ``experiments/results/apply_benchmark.csv``::

    XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander \\
        python experiments/apply_benchmark.py --runs 15 --out experiments/results/apply_benchmark.csv

(``--models mlp,resnet18`` to run a subset; ``--policy`` to change the policy.)  Measured on the
shared 2-core machine while other jobs ran (load average 5-10): wall times are noisy, treat
ratios within about +-40 % as equal.  ``max_grad_dev_tol`` above 1 (mobilenet_v2 at batch 2) comes
from BatchNorm over a handful of values, where the changed XLA fusion moves float rounding.
The flag keeps XLA:CPU from undoing the recomputation, so the wall-time ratio includes it.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

MODELS = {
    "mlp": dict(batch_size=64, depth=16, width=256),
    "vgg16": dict(batch_size=4, width=16, fc_width=128),
    "resnet18": dict(batch_size=4),
    "resnet50": dict(batch_size=2, image_size=64, width=16),
    "mobilenet_v2": dict(batch_size=2, image_size=64, width_mult=0.5),
    "squeezenet": dict(batch_size=2, image_size=64, width=32),
    "unet": dict(batch_size=2, image_size=64, width=16),
    "bert_small": dict(batch_size=4, seq_len=32, hidden=128, num_heads=4),
    "gpt2_small": dict(batch_size=2, seq_len=32, hidden=128, num_heads=4),
}

FIELDS = [
    "model", "policy", "options", "n_forward_stages", "n_saved", "n_remat_segments",
    "plan_apply_s", "compile_s_base", "compile_s_remat", "wall_s_base", "wall_s_remat",
    "wall_ratio", "residual_bytes_base", "residual_bytes_remat", "residual_ratio",
    "hlo_dots_base", "hlo_dots_remat", "hlo_opt_barriers", "max_grad_dev_tol", "xla_flag",
]


def _median_time(f, args, runs):
    import jax

    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run_one(name, opts, policy, runs):
    import jax
    import numpy as np

    import remat
    from remat.measurement import FLAG, hlo_counts, residual_bytes

    kw = dict(opts)
    bs = kw.pop("batch_size")
    loss, params, batch = remat.zoo.get(name, batch_size=bs, **kw)
    args = (params, batch)
    base = jax.value_and_grad(loss)
    t = time.perf_counter()
    cb = jax.jit(base).lower(*args).compile()
    compile_base = time.perf_counter() - t

    f = remat.value_and_grad(loss, policy)
    app = f.applied(*args)  # extraction + planning + interpreter set-up
    t = time.perf_counter()
    cr = jax.jit(f).lower(*args).compile()
    compile_remat = time.perf_counter() - t

    ref, out = cb(*args), cr(*args)
    dev = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        dev = max(dev, float(np.max(np.abs(a - b) / (1e-6 + 1e-5 * np.abs(b)), initial=0.0)))
    wb, wr = _median_time(cb, args, runs), _median_time(cr, args, runs)
    rb, _ = residual_bytes(loss, *args)
    rr, _ = residual_bytes(app.fn, *args)
    db, _ = hlo_counts(cb.as_text())
    dr, bar = hlo_counts(cr.as_text())
    return {
        "model": name, "policy": str(policy), "options": ";".join(f"{k}={v}" for k, v in opts.items()),
        "n_forward_stages": len(app.graph.forward_nodes), "n_saved": len(app.saved),
        "n_remat_segments": sum(s.remat for s in app.segments),
        "plan_apply_s": round(app.plan_time_s, 3), "compile_s_base": round(compile_base, 3),
        "compile_s_remat": round(compile_remat, 3), "wall_s_base": round(wb, 5),
        "wall_s_remat": round(wr, 5), "wall_ratio": round(wr / wb, 3),
        "residual_bytes_base": rb, "residual_bytes_remat": rr,
        "residual_ratio": round(rb / max(rr, 1), 2), "hlo_dots_base": db, "hlo_dots_remat": dr,
        "hlo_opt_barriers": bar, "max_grad_dev_tol": round(dev, 4),
        "xla_flag": FLAG in os.environ.get("XLA_FLAGS", ""),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--policy", default="sqrtn")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default="experiments/results/apply_benchmark.csv")
    a = p.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        t = time.perf_counter()
        try:
            row = run_one(name, MODELS[name], a.policy, a.runs)
        except Exception as e:  # noqa: BLE001 - recorded in the output, the sweep goes on
            print(f"{name}: FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        rows.append(row)
        print(f"{name}: {row} ({time.perf_counter() - t:.1f} s)", flush=True)
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
