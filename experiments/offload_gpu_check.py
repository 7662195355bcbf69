"""Does paging run for real?  POET's page-outs offloaded to ``pinned_host`` (issue #33, item 5).

    python experiments/offload_gpu_check.py [--out offload.json] [--quick]
        [--models mlp,transformer] [--budgets 85,75,65] [--device cortex-m0] [--time-limit 30]
        [--loop-budget 70%] [--no-loop]

For a plain-JAX tanh MLP and a pre-LN transformer (:mod:`experiments.bench_models`; 8 x 4096
MLP at batch 4096 and 4 x d=1024 transformer at batch 8 x 512 tokens, ``--quick``: CPU sizes)
and three modelled budgets (percent of the graph's no-remat peak), POET (``--device`` profile)
plans; per plan, four steps ``jax.jit(jax.value_and_grad(f))`` are compiled:

* ``none``: ``f`` is the loss itself (the reference of every gradient error);
* ``kept``: the plan's segments, paged values left on the device (the drop-in where offloading
  is not realised);
* ``offloaded``: the same segments with the paged values offloaded at segment boundaries
  (:mod:`remat.offload`; built directly, whatever the probe says);
* ``drop_in``: what ``remat`` itself runs for the plan (``offloaded`` where
  :func:`remat.offload.realised`, else ``kept``), with its notes and ``offloaded_bytes``
  (``--quick``: not compiled again; ``drop_in_step`` names which of the two it is).

Per step: the compiled device temp and host temp (``memory_analysis()``), whether the HLO
places buffers in host memory, ``jax.devices()[0].memory_stats()`` before and after one run,
and the relative error of value and gradients against ``none``.  The steps run after all are
compiled, in ascending order of compiled bytes, so that a rise of ``peak_bytes_in_use`` belongs
to the step that ran.  One more row per model: the compiled-budget loop
(``remat.value_and_grad(loss, Poet, budget="70%")``, ``--loop-budget``).  JSON: one line per row on stdout, and
the whole report in ``--out``.  With ``--quick`` (CPU) ``XLA_FLAGS`` gets
``--xla_disable_hlo_passes=cse_barrier_expander`` before JAX starts, so XLA:CPU keeps the
checkpoints.

Not yet run on a GPU: no result file is committed (``docs/results/compiled_memory.md`` says
so).  The command that makes it, on a GPU machine (``experiments/gpu_bench_run.sh`` runs the
same with ``OFFLOAD=1``, into ``$OUT/offload.json``)::

    python experiments/offload_gpu_check.py --out experiments/results/offload_gpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
SIZES = {
    "mlp": {"full": dict(layers=8, width=4096, batch=4096),
            "quick": dict(layers=6, width=64, batch=32)},
    "transformer": {"full": dict(layers=4, d=1024, heads=16, mlp=4096, batch=8, seq=512),
                    "quick": dict(layers=2, d=64, heads=4, mlp=256, batch=4, seq=16)},
}
LOOP_BUDGET = "70%"


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the report (JSON) here")
    ap.add_argument("--quick", action="store_true", help="CPU sizes (under a minute)")
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--budgets", default=None,
                    help="percent of the modelled peak (default 85,75,65; --quick: 90,80,75)")
    ap.add_argument("--device", default="cortex-m0", help="POET's device profile")
    ap.add_argument("--time-limit", type=float, default=30.0, help="POET's MILP limit, s")
    ap.add_argument("--loop-budget", default=LOOP_BUDGET,
                    help="the compiled-budget row's budget (percent of the no-remat temp)")
    ap.add_argument("--no-loop", action="store_true", help="skip the compiled-budget rows")
    return ap.parse_args(argv)


def _memory_stats(dev) -> dict | None:
    try:
        st = dev.memory_stats()
    except Exception:  # noqa: BLE001 - a backend without statistics
        return None
    if not st:
        return None
    keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "pool_bytes",
            "peak_pool_bytes")
    return {k: int(st[k]) for k in keys if k in st}


def _rel_err(got, want) -> float:
    import jax
    import numpy as np

    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
        worst = max(worst, float(np.max(np.abs(a - b))) / scale if a.size else 0.0)
    return worst


def _compile(fn, args) -> dict:
    import jax

    from remat.offload import host_memory_used

    t0 = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
    ma = compiled.memory_analysis()
    return {"compiled": compiled, "compile_s": round(time.perf_counter() - t0, 3),
            "temp_bytes": int(ma.temp_size_in_bytes),
            "host_temp_bytes": int(getattr(ma, "host_temp_size_in_bytes", 0) or 0),
            "argument_bytes": int(ma.argument_size_in_bytes),
            "output_bytes": int(ma.output_size_in_bytes),
            "host_memory_in_hlo": bool(host_memory_used(compiled))}


def _plan_rows(name, bm, budgets, args) -> list[dict]:
    import jax
    import numpy as np

    import policies
    import remat
    from remat.apply import apply_plan
    from remat.interpreter import as_function, interpreter
    from remat.offload import boundary_values, paged_nodes

    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      (bm.params, bm.batch))
    graph = remat.extract(bm.loss, *abstract)
    prog = graph.program
    rows = [{"model": name, "kind": "reference",
             "steps": {"none": _compile(bm.loss, (bm.params, bm.batch))}}]
    for pct in budgets:
        row = {"model": name, "kind": "poet_plan", "budget": f"{pct}%",
               "device_profile": args.device}
        pol = policies.Poet(device=args.device, time_limit=args.time_limit)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                app = apply_plan(bm.loss, abstract, pol, graph=graph,
                                 budget=remat.modelled(f"{pct}%"))
        except Exception as e:  # noqa: BLE001 - a row that says why
            rows.append({**row, "error": f"{type(e).__name__}: {e}"})
            continue
        plan = app.plan
        fwd = [i for i in paged_nodes(graph, plan) if not graph.is_backward_array[i]]
        off = boundary_values(prog.forward, prog.fwd_node, app.segments, fwd)
        kept = as_function(interpreter(prog.forward, app.segments), abstract, prog.fwd_out_tree)
        offl = as_function(interpreter(prog.forward, app.segments, offload=off.tags), abstract,
                           prog.fwd_out_tree)
        row.update({
            "plan_status": plan.meta.get("status"), "plan_peak_bytes": plan.meta.get("peak_bytes"),
            "page_outs": int(np.asarray(plan.page_out).sum()) if plan.page_out is not None else 0,
            "paged_forward_nodes": fwd, "recomputed_nodes": int((plan.R.sum(0) >= 2).sum()),
            "tagged_bytes": off.offloaded_bytes, "untagged_paged_bytes": off.kept_bytes,
            "drop_in_offloaded_bytes": app.offloaded_bytes, "drop_in_notes": list(app.notes),
            "warnings": [str(w.message) for w in caught],
        })
        steps = {"kept": _compile(kept, (bm.params, bm.batch)),
                 "offloaded": _compile(offl, (bm.params, bm.batch))}
        if args.quick:  # the drop-in builds one of the two: say which instead of compiling it
            row["drop_in_step"] = "offloaded" if app.offloaded_bytes else "kept"
        else:
            steps["drop_in"] = _compile(app.fn, (bm.params, bm.batch))
        rows.append({**row, "steps": steps})
    return rows


def _loop_row(name, bm, args) -> dict:
    import jax

    import policies
    import remat

    row = {"model": name, "budget": args.loop_budget, "kind": "compiled_budget_loop"}
    vg = remat.value_and_grad(bm.loss, policies.Poet(device=args.device,
                                                     time_limit=args.time_limit),
                              budget=args.loop_budget)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            app = vg.applied(bm.params, bm.batch)
    except Exception as e:  # noqa: BLE001
        return {**row, "error": f"{type(e).__name__}: {e}"}
    compiled = jax.jit(vg).lower(bm.params, bm.batch).compile()
    ma = compiled.memory_analysis()
    return {**row, "budget_semantics": app.budget_semantics, "budget_bytes": app.budget_bytes,
            "baseline_temp_bytes": app.baseline_temp_bytes,
            "compiled_temp_bytes": app.compiled_temp_bytes,
            "independent_temp_bytes": int(ma.temp_size_in_bytes),
            "host_temp_bytes": int(getattr(ma, "host_temp_size_in_bytes", 0) or 0),
            "offloaded_bytes": app.offloaded_bytes,
            "rounds": [dataclasses.asdict(r) for r in app.rounds],
            "notes": list(app.notes), "warnings": [str(w.message) for w in caught],
            "steps": {"drop_in": {"compiled": compiled, "temp_bytes": int(ma.temp_size_in_bytes)}}}


def _run_steps(rows, refs) -> None:
    """Run every compiled step once, in ascending order of compiled bytes; fill memory_stats
    before/after and the errors against ``jax.value_and_grad`` (``refs``: model ->
    ``(params, batch, loss)``)."""
    import jax

    dev = jax.devices()[0]
    todo = []
    for r in rows:
        for key, st in r.get("steps", {}).items():
            size = st.get("temp_bytes", 0) + st.get("argument_bytes", 0) + st.get("output_bytes", 0)
            todo.append((size, id(r), key, r, st))
    todo.sort(key=lambda t: t[:3])
    want = {name: jax.block_until_ready(jax.jit(jax.value_and_grad(loss))(params, batch))
            for name, (params, batch, loss) in refs.items()}
    for _, _, _, r, st in todo:
        params, batch, _ = refs[r["model"]]
        st["memory_stats_before"] = _memory_stats(dev)
        try:
            out = jax.block_until_ready(st["compiled"](params, batch))
            st["memory_stats_after"] = _memory_stats(dev)
            st["grad_rel_err"] = _rel_err(out, want[r["model"]])
        except Exception as e:  # noqa: BLE001 - an out-of-memory step says so
            st["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        del st["compiled"]


def main(argv=None) -> dict:
    args = _args(argv)
    if args.quick and _FLAG not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
    import jax

    from experiments.bench_models import _mlp, _transformer
    from remat.offload import realised

    t0 = time.perf_counter()
    size = "quick" if args.quick else "full"
    budgets = [int(b) for b in (args.budgets or ("90,80,75" if args.quick else "85,75,65"))
               .split(",")]
    builders = {"mlp": _mlp, "transformer": _transformer}
    dev = jax.devices()[0]
    report = {"jax": jax.__version__, "platform": dev.platform, "device": str(dev),
              "device_kind": getattr(dev, "device_kind", ""), "size": size,
              "memory_kinds": [m.kind for m in dev.addressable_memories()],
              "offload_realised": realised(dev.platform), "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "memory_stats_start": _memory_stats(dev), "rows": []}
    rows, refs = [], {}
    for name in args.models.split(","):
        bm = builders[name](SIZES[name][size], 0)
        refs[name] = (bm.params, bm.batch, bm.loss)
        rows += _plan_rows(name, bm, budgets, args)
        if not args.no_loop:
            rows.append(_loop_row(name, bm, args))
    _run_steps(rows, refs)
    for r in rows:
        print(json.dumps(r, default=str), flush=True)
    report["rows"] = rows
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, default=str), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
