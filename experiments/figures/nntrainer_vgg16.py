"""NNTrainer (Moon et al., ICSE-SEIP 2024) Sec. 5.2 / Figs. 12-13: vgg16 swap, simulated and run.

vgg16 (``remat.zoo``, batch 64, 32x32x3, stage graph ``stages="module"``: one node per layer's
forward or backward) under the ``nntrainer`` policy with no swap, proactive swap (lookahead 1
and 2) and on-demand swap, each planned, simulated (:func:`remat.simulate`) and executed for real
by the op-by-op executor (:func:`remat.execute`: proactive plans with ``paging="async"``, the
background write/read threads prefetching at the plan's page-ins; on-demand with
``paging="sync"``; every plan is also run in the other mode, whose peak must be the same).

Writes ``experiments/results/nntrainer_vgg16.csv``, one row per variant:

* ``sim_peak_bytes``, ``exec_peak_bytes`` (live device bytes measured by the executor, a
  paged-in value counted from its page-in start to its free) and ``peak_ratio`` (exec / sim;
  must lie within 5% of 1), ``exec_peak_bytes_other_mode`` (the other paging mode);
* ``bytes_paged`` (plan) and ``exec_bytes_paged`` (moved by the executor, out + in);
* ``latency_s`` / ``latency_overhead``: modelled on the ``pixel-4`` profile (UFS flash) by
  :func:`policies.nntrainer.latency` (two I/O streams; on-demand transfers synchronous);
* ``arena_bytes`` / ``layout``: the policy's planned arena (``placement="auto"``);
* bounds: ``maxlive_bound_bytes`` (max live bytes of the no-swap schedule: no planner of it does
  better), ``stage_bound_bytes`` (max over nodes of the node's inputs + output on this stage
  graph: no swap plan of this graph can go lower), ``eo_bound_bytes`` (NNTrainer's theoretical
  residency, :func:`solvers.nntrainer_plan.residency`, of the same network as a layer chain:
  fc 4096, JAX's max-pool backward that reads its input) and ``eo_bound_paper_bytes`` with its
  EO label (the paper's configuration as we read it: fc 512 and NNTrainer's index-keeping
  max-pool; its ``c2:CD`` value is ``eo_c2cd_paper_bytes`` = 32.14 MiB, the paper's number);
* ``exec_wall_s``, ``page_wait_s`` (seconds the main thread waited for transfers) for the mode
  run, and the same for the other mode; ``grad_max_rel_err`` (max over leaves of
  ``max|g - g_ref| / max|g_ref|`` against ``jax.value_and_grad`` of the original).

    nice -n 10 python experiments/figures/nntrainer_vgg16.py [--batch 64]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import numpy as np

import policies
import remat
from remat.core.layout import lifetimes, max_live_lower_bound
from solvers.nntrainer_plan import CD, OTHER, POOL, execution_orders, residency

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from nntrainer_planners import vgg16_chain  # noqa: E402

from experiments.tables import write_rows

OUT = pathlib.Path(__file__).resolve().parents[1] / "results" / "nntrainer_vgg16.csv"
FIELDS = ("model", "batch_size", "variant", "paging", "sim_peak_bytes", "exec_peak_bytes",
          "peak_ratio", "exec_peak_bytes_other_mode", "bytes_paged", "exec_bytes_paged",
          "latency_s", "latency_overhead", "arena_bytes", "layout", "maxlive_bound_bytes",
          "stage_bound_bytes", "eo_bound_bytes", "eo_bound_paper_bytes", "eo_bound_paper_at",
          "eo_c2cd_paper_bytes", "exec_wall_s", "page_wait_s", "exec_wall_other_s",
          "page_wait_other_s", "grad_max_rel_err", "nodes")
VARIANTS = {"no_swap": dict(), "proactive_k1": dict(swap=True, lookahead=1),
            "proactive_k2": dict(swap=True, lookahead=2), "on_demand": dict(swap="on_demand")}


def stage_bound(g: remat.Graph) -> int:
    """Max over nodes ``k`` of ``out_bytes[k] + sum(out_bytes of k's inputs)`` (bytes)."""
    need = g.sizes.astype(np.int64).copy()
    e = np.asarray(g.edge_array, dtype=np.int64).reshape(-1, 2)
    np.add.at(need, e[:, 1], g.sizes[e[:, 0]])
    return int(need.max(initial=0))


def eo_bounds(batch: int) -> dict:
    """NNTrainer's theoretical residency of vgg16 as a layer chain, ours and the paper's."""
    ours = residency(vgg16_chain(batch))
    ch = vgg16_chain(batch, fc=512)
    kind = ch.kind.copy()
    kind[kind == OTHER] = POOL
    ch = ch._replace(kind=kind)
    paper = residency(ch)
    eo = execution_orders(ch.n)
    at = int(paper.argmax())
    layer, step = (int(v[0]) for v in np.nonzero(eo == at))
    label = f"L{layer}:{('F', 'CG', 'CD', 'AG')[step]}"
    return dict(eo_bound_bytes=int(ours.max()), eo_bound_paper_bytes=int(paper.max()),
                eo_bound_paper_at=label, eo_c2cd_paper_bytes=int(paper[eo[2, CD]]))


def rel_err(a, b) -> float:
    out = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        out = max(out, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", type=pathlib.Path, default=OUT, help="CSV path")
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    fn, params, data = remat.zoo.get("vgg16", batch_size=args.batch, image_size=32)
    g = remat.extract(fn, params, data, stages="module")
    rv, rg = jax.value_and_grad(fn)(params, data)
    base = policies.checkpoint_all_plan(g)
    lt = lifetimes(base.validate(g))
    common = dict(model="vgg16", batch_size=args.batch, nodes=g.n,
                  maxlive_bound_bytes=max_live_lower_bound(lt.intervals, lt.sizes),
                  stage_bound_bytes=stage_bound(g), **eo_bounds(args.batch))
    rows = []
    for name, kw in VARIANTS.items():
        p = policies.get("nntrainer", device="pixel-4", **kw).plan(g)
        sim = remat.simulate(g, p, device="pixel-4")
        mode = "sync" if name == "on_demand" else "async"
        other = "async" if mode == "sync" else "sync"
        v, gr, st = remat.execute(g, p, params, data, paging=mode)
        err = max(rel_err(v, rv), rel_err(gr, rg))
        v2, gr2, st2 = remat.execute(g, p, params, data, paging=other)
        err = max(err, rel_err(v2, rv), rel_err(gr2, rg))
        m = p.meta
        row = dict(common, variant=name, paging=mode if p.paging else "none",
                   sim_peak_bytes=sim.peak_bytes, exec_peak_bytes=st.peak_bytes,
                   peak_ratio=round(st.peak_bytes / sim.peak_bytes, 5),
                   exec_peak_bytes_other_mode=st2.peak_bytes, bytes_paged=m["bytes_paged"],
                   exec_bytes_paged=st.bytes_paged, latency_s=round(m["latency_s"], 6),
                   latency_overhead=round(m["latency_overhead"], 4),
                   arena_bytes=m["arena_bytes"], layout=m["layout"],
                   exec_wall_s=round(st.wall_s, 3), page_wait_s=round(st.page_wait_s, 3),
                   exec_wall_other_s=round(st2.wall_s, 3),
                   page_wait_other_s=round(st2.page_wait_s, 3), grad_max_rel_err=f"{err:.2e}")
        rows.append(row)
        print({k: row[k] for k in FIELDS if k not in common}, flush=True)
    write_rows(args.out, rows, fields=FIELDS)
    print(common, f"total {time.perf_counter() - t_all:.1f} s")


if __name__ == "__main__":
    main()
