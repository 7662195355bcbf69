"""Write the docs' data pages from the committed files in ``experiments/results/``.

``docs/conf.py`` calls :func:`write_pages` at the start of every Sphinx build. Each file in
:data:`RESULTS` becomes one page, ``docs/results/data/<file stem>.md``: the command that made it,
the page of the docs that discusses it, and its rows as a table (CSV and JSON lists of records),
its text (``.txt``) or the file itself (``.md``). The pages are rebuilt on every build and are not
committed (``docs/results/data/`` is git-ignored).

Run it alone to check the registry: ``python docs/results_pages.py`` lists the files of
``experiments/results/`` that have no entry (``tests/test_docs.py`` fails on any).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """One committed results file.

    Attributes:
      file: the file name under ``experiments/results/``.
      title: the page title.
      command: the command (or commands, one per line) that made the file.
      page: the docs page that discusses the numbers (a Sphinx document name).
      about: one or two sentences: what a row is, the machine, anything to know when reading it.
    """

    file: str
    title: str
    command: str
    page: str
    about: str = ""


_CPU = "2-core x86_64 CPU, XLA:CPU"

#: Every file in ``experiments/results/``, grouped as the results index lists them.
RESULTS: tuple[Result, ...] = (
    # extraction and execution
    Result("extract_timing.json", "Extraction time and FLOPs",
           "python experiments/extract_benchmark.py --check-flops",
           "results/extraction",
           f"One record per zoo model at its default size, `stages=\"auto\"` ({_CPU})."),
    Result("executor_vs_simulator.json", "Executor against simulator",
           "XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander "
           "python experiments/extract_benchmark.py --executor",
           "results/extraction",
           "One record per (zoo model, policy): simulated peak, the executor's bookkeeping and "
           "measured peaks (MiB), gradient error."),
    Result("calibrate_cpu.json", "Host calibration",
           "python experiments/calibrate_report.py --out experiments/results/calibrate_cpu.json",
           "guide/measuring",
           "The `host` device profile measured on the project machine, once per JAX version."),
    # the drop-in
    Result("fidelity.csv", "Drop-in fidelity: predicted and realised saved bytes",
           "python experiments/fidelity_benchmark.py --out experiments/results/fidelity.csv",
           "results/fidelity",
           "One row per (zoo model at reduced size, policy, budget): planned, predicted and "
           "realised residual bytes, XLA temp and FLOPs (XLA flag on)."),
    Result("apply_benchmark.csv", "Applying plans in JAX",
           "python experiments/apply_benchmark.py --runs 15 "
           "--out experiments/results/apply_benchmark.csv",
           "results/apply",
           "One row per zoo model with SqrtN applied by `remat.value_and_grad`: residual bytes, "
           "HLO dot counts, compile and wall times against the unmodified step."),
    Result("compiled_budget_jax0.12.0.1.csv", "Compiled budgets (jax 0.12.0.1)",
           "python experiments/compiled_budget_report.py "
           "--out experiments/results/compiled_budget_jax0.12.0.1.csv",
           "guide/budgets",
           "One row per (model, policy, percent of the compiled no-remat temp): the compiled "
           "temp the drop-in reached, rounds and compiles of the budget loop (XLA:CPU, flag on)."),
    Result("memory_model_jax0.12.0.1.csv", "XLA memory model (jax 0.12.0.1)",
           "python experiments/memory_model_report.py "
           "--out experiments/results/memory_model_jax0.12.0.1.csv",
           "guide/budgets",
           "`remat.xla_memory.predict_temp_bytes` against the compiled temp, per (model, plan)."),
    Result("memory_model_jax0.8.0.csv", "XLA memory model (jax 0.8.0)",
           "python experiments/memory_model_report.py "
           "--out experiments/results/memory_model_jax0.8.0.csv   # in a jax 0.8.0 venv",
           "guide/budgets",
           "The same report at the oldest supported JAX."),
    Result("gpu_benchmark_h200_before_loop.csv", "GPU benchmark on one H200 (before the "
           "compiled-budget loop)",
           "python -m experiments.gpu_benchmark --size full --deadline-s 330   "
           "# via experiments/gpu_bench_run.sh, first version",
           "results/index",
           "jax 0.11.2 on one H200; budgets were still modelled. 24 of 44 configurations were "
           "measured before the deadline."),
    # scans
    Result("scan_pareto.csv", "ScanLayers against JAX's built-in policies",
           "python experiments/scan_pareto.py --out experiments/results/scan_pareto.csv --plot",
           "results/scans",
           "One row per compiled training step of the scanned gpt2/bert (8 blocks): XLA temp, "
           "FLOPs, residual bytes, and which plan dominates it."),
    # chains and the Checkmate MILP
    Result("solver_benchmark.csv", "Solvers on chains",
           "python -m experiments.solver_benchmark",
           "results/chain_solvers",
           "Random chains (sizes 1-8 MiB), 60 s limit, 2 threads."),
    Result("chain_dp_timing.csv", "ChainDP wall time",
           "nice -n 10 python -m experiments.chain_dp_timing",
           "results/chain_dp",
           "Medians of seven `plan()` calls per (chain length, mode)."),
    Result("chain_dp_levels.csv", "ChainDP against the unrounded persistent optimum",
           "python -m experiments.chain_dp_levels",
           "results/chain_dp",
           "One row per (chain, budget, method); `gap` is relative to the exact persistent "
           "optimum computed without rounding."),
    Result("milp_unseen.csv", "Checkmate on unseen MLPs (paired path cuts)",
           "python experiments/milp_unseen.py --path-cuts both\n"
           "python experiments/milp_unseen.py --solver cpsat --seeds 0",
           "design/decisions/0003-path-cuts",
           "100-layer Flax MLPs with random widths 16-96 (202 nodes), 5 seeds, 60 s."),
    Result("milp_unseen_600s.csv", "Checkmate on unseen MLPs at 600 s",
           "python experiments/milp_unseen.py --budgets 30% --time-limit 600 "
           "--out experiments/results/milp_unseen_600s.csv",
           "design/decisions/0003-path-cuts",
           "The whole memory chain (before the lazy chain), 600 s per solve."),
    Result("milp_unseen_portfolio.csv", "Checkmate on unseen MLPs: HiGHS seed portfolio",
           "python experiments/milp_unseen.py --portfolio both "
           "--out experiments/results/milp_unseen_portfolio.csv",
           "design/decisions/0004-highs-seed-portfolio",
           "Paired run on one calibration: two HiGHS searches against one."),
    Result("milp_unseen_portfolio_repeats.csv", "Checkmate on unseen MLPs: repeated calibrations",
           "python experiments/milp_unseen.py --budgets 30% --out FILE [--save-instances DIR]",
           "design/decisions/0004-highs-seed-portfolio",
           "Three more calibrations at 30 % with the defaults (each run its own instances)."),
    Result("milp_variants.csv", "Checkmate MILP variants",
           "python -m experiments.milp_variants",
           "design/decisions/0002-lazy-memory-chain",
           "One change at a time on seed 0 at 30 % and seed 2 at 50 %, 60 s each."),
    Result("path_cuts_paired.csv", "Path cuts, paired solves",
           "not reproducible by a kept command: a probe script on pickled instances of "
           "random_width_mlp (calibrations A and B)",
           "design/decisions/0003-path-cuts",
           "Paired with/without path-cut solves of two calibrations."),
    Result("cpsat_benchmark.csv", "CP-SAT against HiGHS on the zoo",
           "python -m experiments.cpsat_benchmark",
           "design/decisions/0005-cpsat-and-race",
           "Zoo models, 20 s (the CLI's limit), measured with two other jobs on the 2 cores."),
    Result("lazy_memory_zoo.csv", "Lazy memory chain on the zoo",
           "python -m experiments.cpsat_benchmark --solvers highs highs-full "
           "--out experiments/results/lazy_memory_zoo.csv",
           "design/decisions/0002-lazy-memory-chain",
           "`highs` is the lazy chain, `highs-full` the whole chain; 20 s."),
    Result("lazy_race_zoo.csv", "Lazy race on the zoo",
           "python -m experiments.cpsat_benchmark --solvers race race-full "
           "--out experiments/results/lazy_race_zoo.csv",
           "design/decisions/0002-lazy-memory-chain",
           "`race` is the lazy HiGHS loop against CP-SAT, `race-full` the former one-model "
           "race; 20 s."),
    Result("budget_sweep.csv", "Budget sweep (Checkmate Figure 4 style)",
           "python -m experiments.figures.budget_sweep",
           "results/budget_sweep",
           "One row per (model, policy, budget fraction): peak, overhead, status."),
    # published graphs
    Result("published_benchmark.csv", "Published Checkmate / Moccasin graphs (rows)",
           "python -m experiments.solver_benchmark_published   "
           "# exact commands in published_benchmark.md and the command column",
           "results/published_graphs",
           "One row per (graph, budget multiple m, method); every peak is replayed."),
    Result("published_benchmark.md", "Published Checkmate / Moccasin graphs (summary)",
           "python -m experiments.solver_benchmark_published   # the exact commands are in it",
           "results/published_graphs"),
    Result("published_progress.csv", "Published graphs: time against the earlier benchmark",
           "python -m experiments.published_progress --before /tmp/before.csv   "
           "# before.csv: published_benchmark.csv as of commit 21a69fe",
           "results/published_graphs",
           "Per feasible m = 0.9/0.8 instance: the fastest plan within 5 % of its bound now "
           "against the best plan then."),
    Result("lns_published.csv", "Checkmate LNS on published graphs",
           "python -m experiments.lns_published --graphs ResNet50 --mults 0.9 0.8 0.7 0.6 "
           "--time-limit 120\n"
           "python -m experiments.lns_published --graphs n100 n250 --mults 0.9 0.8 0.7 "
           "--time-limit 120 --keep",
           "results/published_graphs",
           "120 s per `plan()`, replayed peaks checked against the budget."),
    Result("min_budget.csv", "Smallest budgets of the published random DAGs",
           "python -m experiments.min_budget",
           "results/published_graphs",
           "Bisection with witnesses (schedules) and proofs (exhausted searches)."),
    Result("open_instances.csv", "The last open instance, before the witness search",
           "python -m experiments.open_instances --proof-time 15 --steps 8 --lp-time 90 "
           "--shave-orders 16 --force",
           "design/decisions/0010-pebbling-witness-search"),
    Result("refactor_check.csv", "Refactor check: published rows re-planned",
           "python -m experiments.refactor_check --reference /tmp/ref.csv "
           "--out experiments/results/refactor_check.csv",
           "design/solvers",
           "Every deterministic row of published_benchmark.csv re-planned before and after the "
           "split of the Checkmate solver; `same` says whether the plan is identical."),
    Result("compare_zoo_50.txt", "`remat compare` on the zoo at 50 %",
           "for m in mlp resnet18; do remat compare $m --budget 50%; done\n"
           "for m in gpt2_small mobilenet_v2 resnet50 squeezenet unet vgg16 bert_small; do "
           "remat compare $m --budget 50% --policies checkmate poet; done",
           "guide/cli"),
    # seed systems
    Result("poet_energy.csv", "POET: energy against remat-only and paging-only",
           "python -m experiments.figures.poet_energy",
           "seeds/poet",
           "ResNet-18 and VGG16 (CIFAR, batch 1) on Cortex-A72 and Cortex-M4 profiles."),
    Result("poet_deadline_sweep.csv", "POET: deadline sweep",
           "python -m experiments.poet_deadline_sweep",
           "seeds/poet"),
    Result("olla_layout.csv", "OLLA: order and address ILPs on the zoo",
           "python -m experiments.figures.olla_layout",
           "seeds/olla",
           "Equation-level and module-level training graphs at batch 1, 60 s per phase."),
    Result("melon_pool.csv", "Melon: memory pools",
           "python experiments/figures/melon_pool.py",
           "seeds/melon",
           "42 settings: 3 models, 32 and 224 px, batch 2 to 128, stage and equation graphs."),
    Result("melon_batch.csv", "Melon: largest batch under a 3 GiB pool",
           "python experiments/figures/melon_batch.py",
           "seeds/melon"),
    Result("melon_adapt.csv", "Melon: budget adaptation",
           "python experiments/figures/melon_adapt.py",
           "seeds/melon"),
    Result("nntrainer_planners.csv", "NNTrainer: planners and swap",
           "python experiments/figures/nntrainer_planners.py",
           "seeds/nntrainer"),
    Result("nntrainer_vgg16.csv", "NNTrainer: VGG16 swap, executed",
           "python experiments/figures/nntrainer_vgg16.py",
           "seeds/nntrainer"),
    Result("sage_passes.csv", "Sage: graph passes",
           "python experiments/figures/sage_passes.py",
           "seeds/sage"),
    Result("sage_min_memory.csv", "Sage: minimum memory",
           "python experiments/figures/sage_min_memory.py",
           "seeds/sage"),
    Result("sage_throughput.csv", "Sage: throughput against budget",
           "python experiments/figures/sage_throughput.py",
           "seeds/sage"),
    Result("sage_dynamic.csv", "Sage: a budget trace",
           "python experiments/figures/sage_dynamic.py",
           "seeds/sage"),
)

#: Files in ``experiments/results/`` that are not results (logs, scratch).
IGNORED_SUFFIXES = (".log",)
#: Cells longer than this are cut (with an ellipsis); the full text is in the file.
MAX_CELL = 90


def unregistered(results_dir: str) -> list[str]:
    """Files in ``results_dir`` with no :data:`RESULTS` entry (sorted)."""
    known = {r.file for r in RESULTS}
    return sorted(f for f in os.listdir(results_dir)
                  if os.path.isfile(os.path.join(results_dir, f))
                  and not f.endswith(IGNORED_SUFFIXES) and f not in known)


def _cell(value) -> str:
    text = "" if value is None else str(value)
    text = " ".join(text.split())
    if len(text) > MAX_CELL:
        text = text[:MAX_CELL - 1] + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "'").replace("*", "\\*")


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |",
           "|" + "---|" * len(header)]
    for row in rows:
        row = list(row) + [""] * (len(header) - len(row))
        out.append("| " + " | ".join(_cell(c) for c in row[:len(header)]) + " |")
    return out


def _records(records: list[dict]) -> list[str]:
    header: list[str] = []
    for r in records:
        header += [k for k in r if k not in header]
    flat = [[json.dumps(r[k]) if isinstance(r.get(k), dict | list) else r.get(k, "")
             for k in header] for r in records]
    return _table(header, flat)


def _body(path: str, rel: str) -> list[str]:
    name = os.path.basename(path)
    if name.endswith(".csv"):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return ["The file is empty."]
        return [f"{len(rows) - 1} rows.", ""] + _table(rows[0], rows[1:])
    if name.endswith(".json"):
        with open(path) as f:
            data = json.load(f)
        out: list[str] = []
        lists = {k: v for k, v in data.items() if isinstance(v, list) and v
                 and all(isinstance(x, dict) for x in v)}
        meta = data.get("meta")
        if isinstance(meta, dict):
            out += ["Made with: " + ", ".join(f"{k} `{v}`" for k, v in meta.items()
                                                if k != "command") + ".", ""]
        for key, records in lists.items():
            out += [f"`{key}`: {len(records)} records.", ""] + _records(records) + [""]
        if not lists:
            out += ["```json", json.dumps(data, indent=1), "```"]
        return out
    if name.endswith(".md"):
        return ["```{include} " + rel, ":heading-offset: 1", "```"]
    with open(path) as f:
        text = f.read()
    return ["```text", text.rstrip("\n"), "```"]


def write_pages(results_dir: str, out_dir: str) -> list[str]:
    """Write one page per :data:`RESULTS` entry and an index into ``out_dir``.

    Args:
      results_dir: ``experiments/results``.
      out_dir: ``docs/results/data`` (created; its pages are overwritten).

    Returns:
      The written page names (without ``.md``), index first.
    """
    os.makedirs(out_dir, exist_ok=True)
    pages = []
    for r in RESULTS:
        path = os.path.join(results_dir, r.file)
        if not os.path.exists(path):
            continue
        stem = r.file.replace(".", "_")
        rel = os.path.relpath(path, out_dir).replace(os.sep, "/")
        lines = [f"# {r.title}", "",
                 f"`experiments/results/{r.file}`, discussed in {{doc}}`/{r.page}`.", ""]
        if r.about:
            lines += [r.about, ""]
        lines += ["Made by:", "", "```bash", r.command, "```", ""]
        lines += _body(path, rel)
        _write(os.path.join(out_dir, stem + ".md"), "\n".join(lines) + "\n")
        pages.append(stem)
    index = ["# Data", "",
             "Every committed file of `experiments/results/`, as a table, with the command that "
             "made it. These pages are generated from the files at each docs build "
             "(`docs/results_pages.py`).", "",
             "```{toctree}", ":maxdepth: 1", ""] + pages + ["```", ""]
    _write(os.path.join(out_dir, "index.md"), "\n".join(index))
    return ["index", *pages]


def _write(path: str, text: str) -> None:
    # unchanged pages keep their mtime, so Sphinx re-reads only what changed
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    missing = unregistered(os.path.join(root, "experiments", "results"))
    print("\n".join(missing) if missing else "every results file has an entry")
    sys.exit(1 if missing else 0)
