"""Sage Fig. 8: minimum memory to train, per model and method, measured by the op-by-op
executor (:func:`remat.microbatch.execute`), with the gradients compared to the full batch's
(``jax.value_and_grad``).

Methods (batch 32; models of :mod:`sage_common`):

* ``baseline``: no rematerialisation, full batch (checkpoint-all);
* ``sqrtn``: Chen et al.'s SqrtN checkpoints, full batch (``policies.SqrtN()``);
* ``half_batch``: static accumulation over two micro-batches of 16, no recomputation (SGA);
* ``dgc``: Sage's dynamic checkpointing alone at its minimum budget (``Sage(accumulate=False)``);
* ``dga``: Sage's dynamic accumulation alone at its minimum (``Sage(checkpoint=False)``: the
  smallest micro-batch, no recomputation);
* ``sage``: the hybrid at its minimum feasible budget (``Sage()``, accumulate-first).

Minimum budgets are each policy's own (:meth:`policies.sage.Sage.min_feasible_budget`,
bisection to 1 %); ``measured_peak_bytes`` is the executor's peak of live device bytes over the
micro-batches; the gradient accumulator that micro-batched methods hold across micro-batches
(``accumulator_bytes``, the size of the gradients) is not in it and is added in
``measured_plus_accumulator_bytes`` / ``reduction_with_accumulator`` (the baseline's own
gradients are node outputs, inside its measured peak).  For ``resnet50_bn``
(BatchNorm) the accumulating methods run with ``coupled="accumulate"``: each micro-batch
normalises with its own statistics (ghost batch norm), so their gradients differ from the full
batch's (``grad_rel_err``); ``sage`` there is checkpoint-only (the policy's default for
batch-coupled graphs) and exact.

Writes ``experiments/results/sage_min_memory.csv`` and ``figures/sage_min_memory.png``:

    nice -n 10 python experiments/figures/sage_min_memory.py          # ~6 min on 2 cores
    nice -n 10 python experiments/figures/sage_min_memory.py --quick  # batch 8, ~1 min
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sage_common as sc  # noqa: E402

import policies  # noqa: E402
from experiments.tables import write_rows
from policies.sage import Sage  # noqa: E402
from remat.core.schedule import replay  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "sage_min_memory.csv"
PNG = ROOT / "figures" / "sage_min_memory.png"
MODELS = ("resnet50", "bert_small", "resnet50_bn")
METHODS = ("baseline", "sqrtn", "half_batch", "dgc", "dga", "sage")


def _plans(g, ctx, coupled: bool):
    """``{method: (plan, note)}``."""
    acc = "accumulate" if coupled else "checkpoint_only"
    out = {"baseline": (policies.checkpoint_all_plan(g), "")}
    out["sqrtn"] = (policies.SqrtN().plan(g), "")
    half = policies.checkpoint_all_plan(ctx.graph_at(2))
    out["half_batch"] = (dataclasses.replace(half, microbatches=2),
                         "ghost batch norm" if coupled else "")
    dgc = Sage(accumulate=False)
    out["dgc"] = (dgc.plan(g, budget=dgc.min_feasible_budget(g, ctx), ctx=ctx), "")
    dga = Sage(checkpoint=False, coupled="accumulate")
    out["dga"] = (dga.plan(g, budget=dga.min_feasible_budget(g, ctx), ctx=ctx),
                  "ghost batch norm" if coupled else "")
    sage = Sage()
    out["sage"] = (sage.plan(g, budget=sage.min_feasible_budget(g, ctx), ctx=ctx),
                   "checkpoint-only (BatchNorm)" if coupled else "")
    if coupled:
        ghost = Sage(coupled=acc)
        out["sage_ghost_bn"] = (ghost.plan(g, budget=ghost.min_feasible_budget(g, ctx), ctx=ctx),
                                "ghost batch norm")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--png", type=pathlib.Path, default=PNG)
    a = ap.parse_args(argv)
    rows = []
    for name in a.models:
        f, p, b, g, ctx = sc.setup(name, a.quick)
        ref = jax.value_and_grad(f)(p, b)
        base_measured = None
        for method, (plan, note) in _plans(g, ctx, ctx.batch_coupled).items():
            t0 = time.perf_counter()
            k = int(plan.microbatches)
            gk = g if k == 1 else ctx.graph_at(k)
            modelled = int(replay(gk, plan).peak_bytes)
            v, grads, st = sc.run(g, ctx, plan, p, b)
            if method == "baseline":
                base_measured = st.peak_bytes
            err = sc.grad_error(grads, ref[1])
            row = dict(model=name, method=method, batch=ctx.batch_size, microbatches=k,
                       recomputations=int(plan.R.sum() - gk.n),
                       modelled_peak_bytes=modelled, measured_peak_bytes=int(st.peak_bytes),
                       accumulator_bytes=int(st.accumulator_bytes),
                       reduction_vs_baseline=base_measured / st.peak_bytes,
                       measured_plus_accumulator_bytes=int(st.peak_bytes + st.accumulator_bytes),
                       reduction_with_accumulator=base_measured
                       / (st.peak_bytes + st.accumulator_bytes),
                       grad_rel_err=err, exact=err < 1e-4, note=note,
                       wall_s=time.perf_counter() - t0)
            rows.append(row)
            print(f"{name:12s} {method:14s} k={k:3d} measured {st.peak_bytes / 2**20:9.2f} MiB "
                  f"({row['reduction_vs_baseline']:7.1f}x below baseline) grad err {err:.1e} "
                  f"{note}", flush=True)
    print("wrote", write_rows(a.out, rows, float_format=".4g"))
    _plot(rows, a.png)


def _plot(rows, png: pathlib.Path = PNG) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    models = list(dict.fromkeys(r["model"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    w = 0.8 / len(methods)
    for j, m in enumerate(methods):
        xs, ys = [], []
        for i, mod in enumerate(models):
            r = [r for r in rows if r["model"] == mod and r["method"] == m]
            if r:
                xs.append(i + j * w)
                ys.append(r[0]["measured_peak_bytes"] / 2**20)
        # the baseline is checkpoint-all (no remat, full batch): drawn as that policy
        ax.bar(xs, ys, w, **ps.bar_kw("checkpoint_all" if m == "baseline" else m,
                                      label="baseline (checkpoint_all)" if m == "baseline" else m))
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(models))], models)
    ax.set_yscale("log")
    ax.set_ylabel("executor-measured peak (MiB, log)")
    ax.set_title("Minimum training memory per method (Sage Fig. 8 style; batch 32)")
    ax.legend(fontsize=7, ncol=4)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print("wrote", png)


if __name__ == "__main__":
    main()
