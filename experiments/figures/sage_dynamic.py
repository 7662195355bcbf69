"""Sage Fig. 12 style: training under a changing memory budget.  A budget trace
``[(step, bytes), ...]`` is replayed over training steps; Sage re-plans at each change
(:func:`policies.sage.plans_for_trace`) and each step runs op by op
(:func:`remat.microbatch.execute`) on a fresh batch, its measured peak and gradients checked
against the budget and the full batch's ``jax.value_and_grad``.

Model: ResNet-50 without BatchNorm (bottlenecks 3-4-6-3, widths 16-128, :mod:`sage_common`),
batch 32 at 32 px (``--quick``: batch 8 at 16 px).  The trace: no limit, then 50 %, 20 %, 6 %,
the hybrid's minimum, 30 % and no limit again (fractions of the full-batch no-remat peak, never
below the hybrid's minimum).

Writes ``experiments/results/sage_dynamic.csv`` (per step: budget, micro-batches, method,
modelled and measured peak bytes, modelled pixel-4 throughput, gradient error against the full
batch, ``grad_rel_err``, and against plain JAX gradient accumulation over the same ``k``
micro-batches without rematerialisation, ``grad_rel_err_vs_accumulation``: the full-batch
difference of a micro-batched step is float32 summation order, which accumulation without
remat shows too) and
``figures/sage_dynamic.png``:

    nice -n 10 python experiments/figures/sage_dynamic.py --quick   # ~3 min on 2 cores
    nice -n 10 python experiments/figures/sage_dynamic.py           # ~5 min
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sage_common as sc  # noqa: E402

from experiments.tables import write_rows
from policies.sage import Sage, plans_for_trace  # noqa: E402
from remat.microbatch import accumulate  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "sage_dynamic.csv"
PNG = ROOT / "figures" / "sage_dynamic.png"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--png", type=pathlib.Path, default=PNG)
    a = ap.parse_args(argv)
    f, p, b, g, ctx = sc.setup("resnet50", a.quick)
    peak = g.no_remat_peak()
    pol = Sage(device="pixel-4")
    lo = pol.min_feasible_budget(g, ctx)
    def at(x):  # a fraction of the peak, never below the hybrid's minimum
        return max(int(x * peak), lo)

    trace = [(0, None), (1, at(0.5)), (2, at(0.2)), (3, at(0.06)), (4, lo), (6, at(0.3)),
             (7, None)]
    steps = plans_for_trace(pol, g, trace, 8, ctx)
    rng = np.random.default_rng(1)
    rows = []
    for s, bud, plan in steps:
        t0 = time.perf_counter()
        batch = {"image": jnp.asarray(rng.standard_normal(np.shape(b["image"]), np.float32)),
                 "label": jnp.asarray(rng.integers(0, 10, np.shape(b["label"]), np.int32))}
        ref = jax.value_and_grad(f)(p, batch)
        v, grads, st = sc.run(g, ctx, plan, p, batch)
        err = sc.grad_error(grads, ref[1])
        k = int(plan.microbatches)
        acc = accumulate(jax.value_and_grad(f), (p, batch), 0, k)[1] if k > 1 else ref[1]
        err_acc = sc.grad_error(grads, acc)
        limit = peak if bud is None else int(bud)
        row = dict(step=s, budget_bytes=limit, limited=bud is not None,
                   replanned=bool(plan.meta["replanned"]), microbatches=int(plan.microbatches),
                   method=plan.meta["method"], modelled_peak_bytes=int(plan.meta["peak_bytes"]),
                   measured_peak_bytes=int(st.peak_bytes), within_budget=st.peak_bytes <= limit,
                   throughput_pixel4=float(plan.meta["throughput_samples_per_s"]),
                   grad_rel_err=err, grad_rel_err_vs_accumulation=err_acc,
                   wall_s=time.perf_counter() - t0)
        rows.append(row)
        print(f"step {s}: budget {limit / 2**20:8.2f} MiB -> k={row['microbatches']:2d} "
              f"{row['method']:10s} measured {st.peak_bytes / 2**20:8.2f} MiB, "
              f"{row['throughput_pixel4']:.2f} samples/s (pixel-4), grad err {err:.1e}",
              flush=True)
    print("wrote", write_rows(a.out, rows, float_format=".4g"))
    _plot(rows, a.png)


def _plot(rows, png: pathlib.Path = PNG) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    st = [r["step"] for r in rows]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    sage = ps.style("sage")  # every step is a plan of the sage policy
    ax.step(st, [r["budget_bytes"] / 2**20 for r in rows], where="mid", color="k", ls="--",
            lw=1, label="budget")
    ax.plot(st, [r["measured_peak_bytes"] / 2**20 for r in rows], linestyle="none",
            marker=sage["marker"], color=sage["color"], mec="k", mew=0.5, ms=7,
            label="sage, executor-measured peak")
    ax.set_yscale("log")
    ax.set_ylabel("memory (MiB, log)")
    ax.legend(fontsize=8)
    ax.set_title("Sage under a dynamic budget (Fig. 12 style)")
    ax2.bar(st, [r["microbatches"] for r in rows], color=sage["color"], alpha=0.6,
            edgecolor="k", linewidth=0.4, label="micro-batches")
    for r in rows:
        ax2.annotate(r["method"], (r["step"], r["microbatches"]), fontsize=7, ha="center",
                     va="bottom")
    ax2.set_ylabel("micro-batches k (#)")
    ax2.set_xlabel("training step (#)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print("wrote", png)


if __name__ == "__main__":
    main()
