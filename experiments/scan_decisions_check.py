"""Which per-iteration decision the drop-in takes on the GPU benchmark's full-size scan, on the CPU.

The Flax ``nn.scan`` transformer of :mod:`experiments.bench_models` at full size (12 x 1024,
batch 16, sequence 512) is planned from abstract shapes and compiled, never run (its no-remat
step needs 20 GB of temp): per (policy, budget) ``remat.value_and_grad(loss, policy,
budget="B%")`` and its compiled-budget loop, then the loop's compiled temp over the no-remat
step's, the scan decisions (saved equations of the body, nesting group) and the plan's
modelled compute cost (host profile, calibrated at each run). It shows the decision the
hierarchical policy takes against ScanLayers' on the graph whose GPU step times are in
``gpu_hierarchical_scan_h200.csv``.

XLA:CPU with the ``cse_barrier_expander`` pass disabled (set below, before JAX starts)::

    python experiments/scan_decisions_check.py --code 8e54f07 \
        --out experiments/results/scan_decisions_check.csv
    git worktree add /tmp/before 8e54f07~1   # before the scan candidates within the budget
    PYTHONPATH=/tmp/before python experiments/scan_decisions_check.py --policies hierarchical \
        --code 8e54f07~1 --append --out experiments/results/scan_decisions_check.csv

Rows are written as they are made.  Shown on ``docs/results/hierarchical.md``.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_disable_hlo_passes=cse_barrier_expander").strip()

import argparse  # noqa: E402
import csv  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

FIELDS = ["code", "policy", "budget", "compiled_temp_bytes", "temp_x", "scans", "compute_cost",
          "dropin_s", "jax"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", nargs="*", default=["hierarchical", "scan_layers"])
    ap.add_argument("--budgets", nargs="*", default=["30%", "43%"])
    ap.add_argument("--code", default="", help="a label for the code that ran (a commit)")
    ap.add_argument("--append", action="store_true", help="add rows to --out")
    args = ap.parse_args(argv)

    import jax

    import remat
    from experiments.bench_models import build

    m = build("flax_scan", "full")
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (m.params, m.batch))
    base = jax.jit(jax.value_and_grad(m.loss)).lower(*abstract).compile()
    base_temp = int(base.memory_analysis().temp_size_in_bytes)
    with open(args.out, "a" if args.append else "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if not args.append:
            w.writeheader()
        w.writerow(dict(code=args.code, policy="none", compiled_temp_bytes=base_temp,
                        temp_x=1.0, jax=jax.__version__))
        for budget in args.budgets:
            for policy in args.policies:
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    app = remat.value_and_grad(m.loss, policy, budget=budget).applied(*abstract)
                scans = ";".join(f"saved={sorted(d.saved)} group={d.group}"
                                 for d in app.plan.meta.get("scans", ()))
                w.writerow(dict(code=args.code, policy=policy, budget=budget,
                                compiled_temp_bytes=app.compiled_temp_bytes,
                                temp_x=round(app.compiled_temp_bytes / base_temp, 4), scans=scans,
                                compute_cost=round(float(app.plan.meta.get("compute_cost")), 3),
                                dropin_s=round(time.perf_counter() - t0, 1), jax=jax.__version__))
                f.flush()
                print(policy, budget, round(app.compiled_temp_bytes / base_temp, 3), scans,
                      flush=True)


if __name__ == "__main__":
    main()
