"""``remat figures``: the registry of figure scripts, a runner, and ``figures/index.md``.

Every :class:`Figure` names the paper figure it mirrors, the script step(s) that make it (run one
at a time, each in its own ``python -m`` subprocess with
``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`` so compiled-memory numbers are
measured the same way as the committed ones), the CSV and PNG(s) it writes into the output folder,
and a ``headline`` that reads our number back from that CSV to put it next to the paper's.  A
failing step is recorded (exit status, last lines of its log) and the next figure runs.  The
committed results under ``experiments/results/`` are never written: every step gets ``--out``
(and ``--png`` / ``--fig-dir``) pointing into the output folder.

    remat figures --quick                       # every figure, each script's quick sizes
    remat figures --only melon_pool sage_passes --out /tmp/figs
"""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from remat.core.errors import RematError

ROOT = pathlib.Path(__file__).resolve().parents[1]
XLA_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"


class UnknownFigureError(RematError):
    """An ``--only`` name that is not in :data:`FIGURES`."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One ``python -m module`` run: ``args(out_dir, quick)`` gives its command-line arguments."""

    module: str
    args: Callable[[pathlib.Path, bool], list[str]]


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure: its steps, files (names inside the output folder) and paper comparison.

    ``headline(rows)`` turns the CSV rows (``csv.DictReader`` dicts) into our headline number;
    ``paper`` is the paper's number for the same quantity; ``differs`` is the measured cause
    (from the README) when ours differs by more than 2x, else empty.
    """

    name: str
    mirrors: str
    steps: tuple[Step, ...]
    csv: str
    pngs: tuple[str, ...]
    headline: Callable[[list[dict]], str]
    paper: str
    differs: str = ""


def _f(x) -> float:
    return float(x) if x not in ("", None) else float("nan")


# ---------------------------------------------------------------------------- headlines


def _h_budget_sweep(rows):
    out = []
    for m in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == m and r["budget_frac"] and r["overhead"]]
        best = {}  # budget -> best overhead of each policy
        for r in rs:
            best.setdefault(r["budget_frac"], {})[r["policy"]] = _f(r["overhead"])
        opt = ("chain_dp", "checkmate")
        ok = all(min(v[p] for p in opt if p in v) <= min(v.values()) + 1e-9
                 for v in best.values() if any(p in v for p in opt))
        tight = [r for r in rs if r["policy"] in opt]
        t = min(tight, key=lambda r: _f(r["peak_bytes"])) if tight else None
        if t:
            out.append(f"{m}: {t['policy']} {_f(t['overhead']):.3f}x overhead at "
                       f"{_f(t['peak_bytes']) / _f(t['no_remat_peak_bytes']):.0%} of the "
                       f"checkpoint-all peak; optimal solver <= every heuristic at every budget: {ok}")
    return "; ".join(out)


def _h_melon_pool(rows):
    od = max(rows, key=lambda r: _f(r["waste"]) if r["placement"] == "on_demand" else -1)
    mp = max(_f(r["fragmentation"]) for r in rows if r["placement"] == "melon_pool")
    return (f"on-demand waste up to {100 * _f(od['waste']):.1f}% ({od['model']}, "
            f"stages={od['stages']}, bs {od['batch_size']}); Melon pool fragmentation "
            f"<= {100 * mp:.2f}%")


def _h_melon_batch(rows):
    out = []
    for m in dict.fromkeys(r["model"] for r in rows):
        def mx(meth, m=m):
            b = [int(r["batch_size"]) for r in rows
                 if r["model"] == m and r["method"] == meth and r["fits"] == "True"]
            return max(b) if b else 0
        ca, me = mx("checkpoint_all"), mx("melon")
        out.append(f"{m}: max batch {me} vs {ca} ({me / ca:.2f}x)" if ca else f"{m}: melon {me}")
    return "; ".join(out)


def _h_melon_adapt(rows):
    ov = [_f(r["overhead"]) for r in rows if _f(r["stop_restart_s"]) > 0]
    return (f"adaptation costs {100 * min(ov):.2f}-{100 * max(ov):.1f}% of stop-restart, mean "
            f"saving {100 * (1 - sum(ov) / len(ov)):.1f}%")


def _h_nntrainer_planners(rows):
    rs = [r for r in rows if r["table"] == "planner"]

    def worst(v):
        x = [_f(r["arena_bytes"]) / _f(r["bound_bytes"]) for r in rs if r["variant"] == v]
        return max(x) if x else float("nan")
    return (f"arena / max-live bound, worst graph: basic {worst('basic'):.2f}x, optimized V1 "
            f"{worst('optimized_v1'):.2f}x, V3 {worst('optimized_v3'):.3f}x, OLLA ILP "
            f"{worst('olla'):.3f}x")


def _h_nntrainer_swap(rows):
    by = {r["variant"]: r for r in rows}
    parts = [f"{v} {_f(r['exec_peak_bytes']) / 2**20:.1f} MiB (+{100 * _f(r['latency_overhead']):.1f}%)"
             for v, r in by.items()]
    ns, od = by.get("no_swap"), by.get("on_demand")
    ratio = (f"; no-swap / on-demand peak {_f(ns['exec_peak_bytes']) / _f(od['exec_peak_bytes']):.2f}x"
             if ns and od else "")
    return f"vgg16 bs {rows[0]['batch_size']}, executor peaks: " + ", ".join(parts) + ratio


def _h_olla(rows):
    eqn = [r for r in rows if r["stages"] == "eqn"]
    red = [_f(r["peak_reduction_pct"]) for r in eqn]
    frag = max(_f(r["olla_fragmentation_pct"]) for r in rows)
    return (f"reordering lowers the peak by {sum(red) / len(red):.1f}% on average over "
            f"{len(red)} equation graphs (max {max(red):.1f}%); arena fragmentation <= {frag:.2f}%")


def _h_poet(rows):
    from experiments.figures.poet_energy import summarize

    num = [{k: (_num(v) if k not in ("model", "device", "config", "status", "error",
                                      "warm_start") else v) for k, v in r.items()} for r in rows]
    s = summarize(num)
    return (f"best energy saving over the better ablation {100 * s['saving']:.1f}% of total "
            f"energy at {s['where']} ({100 * s.get('max_saving_overhead', 0):.1f}% of the energy "
            f"above checkpoint-all); never worse than an ablation: {s['never_worse']}")


def _num(v):
    try:
        return float(v) if v not in ("", None) else None
    except ValueError:
        return v


def _h_poet_deadline(rows):
    out = []
    for r in rows:
        if r["config"] == "poet" and r["runtime_model"] == "async" and r["recomputations"]:
            out.append(f"{r['deadline_x']}x: {r['recomputations']} recomputations / "
                       f"{r['page_moves']} page moves")
    return f"{rows[0]['model']} / {rows[0]['device']} POET: " + ", ".join(out[:6])


def _h_sage_passes(rows):
    return "; ".join(f"{r['model']}: reduction {100 * _f(r['reduction_peak_change']):+.1f}% peak "
                     f"({100 * _f(r['reduction_flop_change']):+.2f}% FLOPs), fusion "
                     f"{100 * _f(r['fusion_peak_change']):+.1f}%" for r in rows)


def _h_sage_min_memory(rows):
    out = []
    for m in dict.fromkeys(r["model"] for r in rows):
        s = [r for r in rows if r["model"] == m and r["method"] == "sage"]
        if s:
            out.append(f"{m} {_f(s[0]['reduction_vs_baseline']):.1f}x "
                       f"(exact: {s[0]['exact']})")
    return "Sage minimum memory below the no-remat baseline (executor-measured): " + ", ".join(out)


def _h_sage_throughput(rows):
    out = []
    for r in rows:
        if r["order"] == "mean" and r["method"] in ("accumulate_first", "checkpoint_first"):
            out.append(f"{r['model']}/{r['device']} {r['method']} {_f(r['throughput']):.1f}")
    return "mean modelled samples/s: " + ", ".join(out)


def _h_sage_dynamic(rows):
    ok = all(r["within_budget"] == "True" for r in rows)
    ks = " -> ".join(r["microbatches"] for r in rows)
    err = max(_f(r["grad_rel_err"]) for r in rows)
    return f"{len(rows)} steps, micro-batches {ks}, all within budget: {ok}, max grad error {err:.1e}"


def _h_scan_pareto(rows):
    jx = [r for r in rows if r["kind"] == "jax"]
    dom = [r for r in jx if r["dominated_by"]]
    return f"{len(dom)} of {len(jx)} built-in jax.checkpoint policy points dominated by a ScanLayers plan"


# ---------------------------------------------------------------------------- registry


def _simple(module: str, csv_name: str, png: str | None = None, quick=("--quick",), full=()):
    def args(out: pathlib.Path, quick_mode: bool) -> list[str]:
        a = list(quick if quick_mode else full) + ["--out", str(out / csv_name)]
        return a + (["--png", str(out / png)] if png else [])
    return (Step(module, args),)


_F = "experiments.figures."


def _nnt_plots(which: str) -> Step:
    return Step(_F + "nntrainer_plots",
                lambda o, q: ["--results-dir", str(o), "--fig-dir", str(o), "--which", which])


FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure("budget_sweep", "Checkmate Fig. 4 (overhead vs budget)",
           (Step(_F + "budget_sweep", lambda o, q: (["--quick"] if q else [])
                 + ["--out", str(o / "budget_sweep.csv"), "--fig-dir", str(o)]),),
           "budget_sweep.csv", ("budget_sweep_vgg16.png",), _h_budget_sweep,
           "Checkmate: the MILP matches or beats every baseline at every budget"),
    Figure("melon_pool", "Melon Fig. 6 / Sec. 2 (pool waste)",
           _simple(_F + "melon_pool", "melon_pool.csv", "melon_pool.png"),
           "melon_pool.csv", ("melon_pool.png",), _h_melon_pool,
           "up to 42% of MNN's on-demand pool wasted",
           "Not reproduced (ours <= 9%): our on-demand baseline is an exact-lifetime offline "
           "first-fit, not MNN's pool (README, Melon)."),
    Figure("melon_batch", "Melon Fig. 8 / Fig. 14 (max batch, throughput)",
           _simple(_F + "melon_batch", "melon_batch.csv", "melon_batch.png"),
           "melon_batch.csv", ("melon_batch.png",), _h_melon_batch,
           "up to 4.33x larger batch under the same memory budget"),
    Figure("melon_adapt", "Melon Fig. 10 (budget-change adaptation)",
           _simple(_F + "melon_adapt", "melon_adapt.csv", "melon_adapt.png"),
           "melon_adapt.csv", ("melon_adapt.png",), _h_melon_adapt,
           "adaptation costs 4.27-54.50% of stop-restart, mean saving 78.59%"),
    Figure("nntrainer_planners", "NNTrainer planner comparison (Sec. 5, Figs. 12-13 table)",
           _simple(_F + "nntrainer_planners", "nntrainer_planners.csv") + (_nnt_plots("planners"),),
           "nntrainer_planners.csv", ("nntrainer_planners.png",), _h_nntrainer_planners,
           "optimized planners reach the lower bound in the paper's examples (no per-graph table)"),
    Figure("nntrainer_swap", "NNTrainer Sec. 5.2 / Figs. 12-13 (vgg16 swap)",
           _simple(_F + "nntrainer_vgg16", "nntrainer_vgg16.csv", quick=("--batch", "8"),
                   full=()) + (_nnt_plots("swap"),),
           "nntrainer_vgg16.csv", ("nntrainer_swap.png",), _h_nntrainer_swap,
           "181 / 71 / 51 MiB at +0 / +20.1 / +35.5% (no swap / proactive / on-demand; 3.5x)",
           ""),
    Figure("olla_layout", "OLLA Figs. 7-8 (reordering, address ILP)",
           _simple(_F + "olla_layout", "olla_layout.csv", "olla_layout.png"),
           "olla_layout.csv", ("olla_layout.png",), _h_olla,
           "22.5% peak reduction at batch 1 (up to 38%), fragmentation ~0",
           "Reordering gains are smaller (full run: mean 5.7% vs 22.5%, ~4x): the baseline is "
           "the Jaxpr order, not PyTorch's, and resnet18 / squeezenet / unet stay at a local "
           "optimum of the search (README, OLLA)."),
    Figure("poet_energy", "POET Fig. 4 (energy vs memory budget)",
           _simple(_F + "poet_energy", "poet_energy.csv", "poet_energy.png"),
           "poet_energy.csv", ("poet_energy.png",), _h_poet,
           "up to 40% energy saving over the ablations",
           "3.0% of total energy (full run) vs 'up to 40%': measured as a share of total energy "
           "the compute energy that no schedule can avoid dominates; as a share of the energy "
           "above checkpoint-all the saving reaches 48.6% (ResNet-18 / A72) (README, POET)."),
    Figure("poet_deadline", "POET runtime-budget trade-off (paging vs recompute)",
           _simple("experiments.poet_deadline_sweep", "poet_deadline_sweep.csv"),
           "poet_deadline_sweep.csv", (), _h_poet_deadline,
           "paging replaces recomputation as the runtime budget tightens (qualitative)"),
    Figure("sage_passes", "Sage Sec. 3.2 (fusion, subgraph reduction)",
           _simple(_F + "sage_passes", "sage_passes.csv"),
           "sage_passes.csv", (), _h_sage_passes,
           "graph passes reduce training memory (no per-model number)"),
    Figure("sage_min_memory", "Sage Fig. 8 (minimum memory per method)",
           _simple(_F + "sage_min_memory", "sage_min_memory.csv", "sage_min_memory.png"),
           "sage_min_memory.csv", ("sage_min_memory.png",), _h_sage_min_memory,
           "20-fold memory reduction vs baselines"),
    Figure("sage_throughput", "Sage Figs. 9-11 (throughput vs budget)",
           _simple(_F + "sage_throughput", "sage_throughput.csv", "sage_throughput.png"),
           "sage_throughput.csv", ("sage_throughput.png",), _h_sage_throughput,
           "accumulation-first wins on phones, checkpoint-first on a desktop GPU"),
    Figure("sage_dynamic", "Sage Fig. 12 (dynamic budget)",
           _simple(_F + "sage_dynamic", "sage_dynamic.csv", "sage_dynamic.png"),
           "sage_dynamic.csv", ("sage_dynamic.png",), _h_sage_dynamic,
           "training continues within every budget of the trace"),
    Figure("scan_pareto", "JAX built-in checkpoint policies vs ScanLayers (no paper figure)",
           (Step("experiments.scan_pareto", lambda o, q: (["--models", "gpt2_small"] if q else [])
                 + ["--out", str(o / "scan_pareto.csv"), "--plot"]),),
           "scan_pareto.csv", ("scan_pareto_gpt2_small.png",), _h_scan_pareto, "n/a"),
)}


@dataclasses.dataclass
class Result:
    """What running one figure gave: ``status`` is ``ok`` or ``failed`` (with ``error``)."""

    figure: Figure
    status: str
    wall_s: float
    error: str = ""
    headline: str = ""


def select(only: Sequence[str] | None) -> list[Figure]:
    """The figures named by ``--only`` (all when empty), in registry order.

    Raises:
      UnknownFigureError: a name not in :data:`FIGURES` (the message lists what exists).
    """
    if not only:
        return list(FIGURES.values())
    bad = [n for n in only if n not in FIGURES]
    if bad:
        raise UnknownFigureError(f"unknown figure {', '.join(map(repr, bad))}; "
                                 f"available: {', '.join(FIGURES)}")
    return [f for n, f in FIGURES.items() if n in only]


def run_figure(fig: Figure, out: pathlib.Path, quick: bool, timeout_s: float | None = None) -> Result:
    """Run ``fig``'s steps one after another (stopping at the first failure), each logged to
    ``out/logs/<figure>.log``; then check its CSV and PNGs exist and read its headline."""
    t0 = time.perf_counter()
    log = out / "logs" / f"{fig.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if XLA_FLAG not in env.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + XLA_FLAG).strip()
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    with open(log, "w") as fh:
        for st in fig.steps:
            cmd = [sys.executable, "-m", st.module, *st.args(out, quick)]
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                return Result(fig, "failed", time.perf_counter() - t0, f"timed out after {timeout_s} s")
            if rc != 0:
                tail = log.read_text().strip().splitlines()[-1:] or [""]
                return Result(fig, "failed", time.perf_counter() - t0,
                              f"{st.module} exited {rc}: {tail[0][:200]}")
    missing = [n for n in (fig.csv, *fig.pngs) if not (out / n).exists()]
    if missing:
        return Result(fig, "failed", time.perf_counter() - t0, f"not written: {', '.join(missing)}")
    try:
        with open(out / fig.csv, newline="") as fh:
            head = fig.headline(list(csv.DictReader(fh)))
    except Exception as exc:  # a headline bug must not lose the figure
        head = f"(headline failed: {type(exc).__name__}: {exc})"
    return Result(fig, "ok", time.perf_counter() - t0, headline=head)


def write_index(out: pathlib.Path, results: Sequence[Result], quick: bool, wall_s: float) -> pathlib.Path:
    """Write ``out/index.md``: one section per figure (PNG, CSV, paper figure, our headline next
    to the paper's, the cause when they differ by more than 2x)."""
    lines = ["# remat figures", "",
             f"{'Quick' if quick else 'Full'} run: {len(results)} figure(s), "
             f"{sum(r.status == 'ok' for r in results)} ok, {wall_s:.0f} s wall.", ""]
    if quick:
        lines += ["Quick sizes are smaller than the committed full runs "
                  "(`experiments/results/`), so headline numbers differ from the README's.", ""]
    for r in results:
        f = r.figure
        lines += [f"## {f.name}", "", f"- mirrors: {f.mirrors}",
                  f"- status: {r.status} ({r.wall_s:.0f} s)" + (f": {r.error}" if r.error else ""),
                  f"- CSV: [{f.csv}]({f.csv})"]
        for p in f.pngs:
            lines.append(f"- PNG: [{p}]({p})")
        lines += [f"- ours: {r.headline or 'n/a'}", f"- paper: {f.paper}"]
        if f.differs:
            lines.append(f"- differs >2x: {f.differs}")
        lines += [f"- log: [logs/{f.name}.log](logs/{f.name}.log)", ""]
        lines += [f"![{f.name}]({p})" for p in f.pngs] + ([""] if f.pngs else [])
    path = out / "index.md"
    path.write_text("\n".join(lines))
    return path


def run_figures(only: Sequence[str] | None = None, out: str | os.PathLike = "figures",
                quick: bool = False, timeout_s: float | None = None,
                echo: Callable[[str], None] = print) -> list[Result]:
    """Run the selected figures one at a time into ``out`` and write ``out/index.md``.

    Returns one :class:`Result` per figure; failures are reported, not raised.
    Raises:
      UnknownFigureError: an unknown name in ``only``.
    """
    figs = select(only)
    outp = pathlib.Path(out).resolve()
    outp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    for f in figs:
        echo(f"[{len(results) + 1}/{len(figs)}] {f.name} ...")
        r = run_figure(f, outp, quick, timeout_s)
        results.append(r)
        echo(f"    {r.status} in {r.wall_s:.0f} s" + (f": {r.error}" if r.error else f": {r.headline}"))
    idx = write_index(outp, results, quick, time.perf_counter() - t0)
    echo(f"index written to {idx}")
    return results
