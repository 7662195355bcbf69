"""Write the docs' data pages from the committed files in ``experiments/results/``.

``docs/conf.py`` calls :func:`write_pages` at the start of every Sphinx build. Each file in
:data:`RESULTS` becomes one page, ``docs/results/data/<file stem>.md``: the command that made it,
the page of the docs that discusses it, and its rows as a table (CSV and JSON lists of records),
its text (``.txt``) or the file itself (``.md``). The results pages (``docs/results/*.md``)
include the tables of :data:`VIEWS`, written to ``docs/results/data/views/``: chosen columns
and rows of one or more files, each file with its command. The pages are rebuilt on every build
and are not committed (``docs/results/data/`` is git-ignored).

Run it alone to check the registry: ``python docs/results_pages.py`` lists the files of
``experiments/results/`` that have no entry (``tests/test_docs.py`` fails on any).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable
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
           "python experiments/extract_benchmark.py --repeats 2 --check-flops",
           "results/extraction",
           f"One record per zoo model at its default size, `stages=\"auto\"` ({_CPU})."),
    Result("executor_vs_simulator.json", "Executor against simulator",
           "XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander "
           "python experiments/extract_benchmark.py --executor",
           "results/extraction",
           "One record per (zoo model, policy): simulated peak, the executor's bookkeeping and "
           "measured peaks (MiB), gradient error."),
    Result("calibrate_cpu.json", "Host calibration",
           "python experiments/calibrate_report.py --out experiments/results/calibrate_cpu.json"
           "   # once per JAX version (0.12.0.1, 0.8.0); each run adds its entry",
           "results/compiled_memory",
           "The `host` device profile measured on the project machine, once per JAX version."),
    # the drop-in
    Result("fidelity.csv", "Drop-in fidelity: predicted and realised saved bytes",
           "python experiments/fidelity_benchmark.py --out experiments/results/fidelity.csv",
           "results/fidelity",
           "One row per (zoo model at reduced size, policy, budget): planned, predicted and "
           "realised residual bytes, XLA temp and FLOPs (XLA flag on)."),
    Result("apply_benchmark.csv", "Applying plans in JAX",
           "XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander "
           "python experiments/apply_benchmark.py --runs 15 "
           "--out experiments/results/apply_benchmark.csv",
           "results/apply",
           "One row per zoo model with SqrtN applied by `remat.value_and_grad`: residual bytes, "
           "HLO dot counts, compile and wall times against the unmodified step."),
    Result("compiled_budget_jax0.12.0.1.csv", "Compiled budgets (jax 0.12.0.1)",
           "python experiments/compiled_budget_report.py "
           "--out experiments/results/compiled_budget_jax0.12.0.1.csv",
           "results/compiled_memory",
           "One row per (model, policy, percent of the compiled no-remat temp): the compiled "
           "temp the drop-in reached, rounds and compiles of the budget loop (XLA:CPU, flag on)."),
    Result("memory_model_jax0.12.0.1.csv", "XLA memory model (jax 0.12.0.1)",
           "python experiments/memory_model_report.py "
           "--out experiments/results/memory_model_jax0.12.0.1.csv   # in a jax 0.12.0.1 venv",
           "results/compiled_memory",
           "`remat.xla_memory.predict_temp_bytes` against the compiled temp, per (model, plan)."),
    Result("memory_model_jax0.8.0.csv", "XLA memory model (jax 0.8.0)",
           "python experiments/memory_model_report.py "
           "--out experiments/results/memory_model_jax0.8.0.csv   # in a jax 0.8.0 venv",
           "results/compiled_memory",
           "The same report at the oldest supported JAX."),
    Result("gpu_benchmark_h200_before_loop.csv", "GPU benchmark on one H200 (before the "
           "compiled-budget loop)",
           "git worktree add /tmp/gpu ff517fe   # the benchmark's first version, before the "
           "compiled-budget loop\n"
           "(cd /tmp/gpu && OUT=/tmp/gpu_out bash experiments/gpu_bench_run.sh)   "
           "# on the H200: python -m experiments.gpu_benchmark --size full --deadline-s 330\n"
           "cp /tmp/gpu_out/gpu_benchmark.csv "
           "experiments/results/gpu_benchmark_h200_before_loop.csv",
           "results/compiled_memory",
           "jax 0.11.2 on one H200, made before the compiled-budget loop existed: budgets were "
           "still modelled (a share of the graph's modelled peak, not of XLA's bytes). 24 of 44 "
           "configurations were measured before the deadline."),
    # scans
    Result("scan_pareto.csv", "ScanLayers against JAX's built-in policies",
           "python experiments/scan_pareto.py --out experiments/results/scan_pareto.csv --plot",
           "results/scans",
           "One row per compiled training step of the scanned gpt2/bert (8 blocks): XLA temp, "
           "FLOPs, residual bytes, and which plan dominates it."),
    # chains and the Checkmate MILP
    Result("solver_benchmark.csv", "Solvers on chains",
           "python -m experiments.solver_benchmark --stages 20 50 100 200 400 --fracs 0.3 0.5 "
           "--dp-stages 20 50 100 200 400 1000 --time-limit 60 --threads 2 "
           "--out experiments/results/solver_benchmark.csv",
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
           "results/milp",
           "100-layer Flax MLPs with random widths 16-96 (202 nodes), 5 seeds, 60 s; `solver` "
           "`highs` (path cuts on) and `highs-no-path-cuts` solve the same instances."),
    Result("milp_unseen_600s.csv", "Checkmate on unseen MLPs at 600 s",
           "python experiments/milp_unseen.py --budgets 30% --time-limit 600 "
           "--out experiments/results/milp_unseen_600s.csv",
           "results/milp",
           "The whole memory chain (made before the lazy chain was the default, so today's "
           "code solves a different model), 600 s per solve."),
    Result("milp_unseen_portfolio.csv", "Checkmate on unseen MLPs: HiGHS seed portfolio",
           "python experiments/milp_unseen.py --portfolio both "
           "--out experiments/results/milp_unseen_portfolio.csv",
           "results/milp",
           "Paired run on one calibration: two HiGHS searches against one."),
    Result("milp_unseen_portfolio_repeats.csv", "Checkmate on unseen MLPs: repeated calibrations",
           "python experiments/milp_unseen.py --budgets 30% --out /tmp/run_K.csv "
           "[--save-instances DIR]   # K = 2..5, one run per host calibration\n"
           "# rows of the four runs concatenated, with columns calibration_run (K) and "
           "stall_rounds (the cut loop's rule: 8, 16 from run 5)",
           "results/milp",
           "Four more calibrations at 30 % with the defaults (each run its own instances)."),
    Result("milp_variants.csv", "Checkmate MILP variants",
           "python -m experiments.milp_variants --instances 0:30% 2:50% --time-limit 60\n"
           "python -m experiments.milp_variants --variants no_memory_chain "
           "no_memory_chain_useful --instances 0:30% 1:30% 2:30% 3:30% 4:30% 0:50% 1:50% "
           "2:50% 3:50% 4:50%",
           "results/milp",
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
    Result("hierarchical_vs_checkmate.csv", "Hierarchical against Checkmate on six models",
           "python -m experiments.hierarchical_vs_checkmate",
           "results/hierarchical",
           "One row per (model, budget fraction, policy): hierarchical at equation granularity, "
           "the Checkmate MILP on the stage graph and on the equation graph (<= 400 nodes); "
           f"modelled (replayed) bytes, jaxpr FLOPs of executed nodes ({_CPU})."),
    Result("hierarchical_dropin_jax0.12.0.1.csv", "The hierarchical drop-in at 50 % on the zoo "
           "and outside models",
           "python experiments/hierarchical_dropin.py "
           "--out experiments/results/hierarchical_dropin_jax0.12.0.1.csv",
           "results/hierarchical",
           "One row per model: remat.value_and_grad(loss, 'hierarchical', budget='50%') with "
           "the CSE flag, its planning and set-up time, the independently compiled temp against "
           f"the budget and the no-remat step, the gradient error; a 48-layer planning row ({_CPU})."),
    Result("compiled_budget_hierarchical_jax0.12.0.1.csv", "The hierarchical drop-in on the "
           "compiled-memory models, 30-90 %",
           "python experiments/compiled_budget_report.py --policies hierarchical "
           "--pcts 30 50 70 90 --fixed-host "
           "--out experiments/results/compiled_budget_hierarchical_jax0.12.0.1.csv",
           "results/hierarchical",
           "The six models of the compiled-memory report at 30/50/70/90 % of the compiled no-remat "
           "temp: compiled temp, loop rounds and compiles, predicted temp, gradient error, the "
           f"applied step's jaxpr FLOPs over jax.value_and_grad's ({_CPU})."),
    Result("compiled_budget_hierarchical_tanh_rerun_jax0.12.0.1.csv", "The hierarchical "
           "drop-in on the tanh MLP at 30 and 50 %, rerun after the memory model's barrier rules",
           "python experiments/compiled_budget_report.py --models tanh_mlp --policies "
           "hierarchical --pcts 30 50 --out "
           "experiments/results/compiled_budget_hierarchical_tanh_rerun_jax0.12.0.1.csv",
           "results/hierarchical",
           "The two budgets at which hierarchical ran more FLOPs than Checkmate-stage in the "
           "sweep, rerun when the predicted temp of its plans became exact: the same columns as "
           f"the sweep ({_CPU})."),
    Result("compiled_budget_checkmate_sweep_jax0.12.0.1.csv", "Checkmate (stage level) on the "
           "compiled-memory models, 30-90 %",
           "python experiments/compiled_budget_report.py --policies checkmate "
           "--pcts 30 50 70 90 --out experiments/results/compiled_budget_checkmate_sweep_jax0.12.0.1.csv",
           "results/hierarchical",
           "As the hierarchical sweep, for the Checkmate MILP (20 s) at the drop-in's default stage "
           f"granularity: the reference of hierarchical's FLOPs in XLA's bytes ({_CPU})."),
    Result("compiled_budget_checkmate_cap_jax0.12.0.1.csv", "Checkmate (stage level) on three "
           "compiled-memory models, 30-90 %, the budget as a cap",
           "python experiments/compiled_budget_report.py --policies checkmate "
           "--pcts 30 50 70 90 --fixed-host "
           "--out experiments/results/compiled_budget_checkmate_cap_jax0.12.0.1.csv",
           "results/hierarchical",
           "The Checkmate sweep rerun with the budget as a cap, the host profile fixed and each "
           "plan of the loop given the whole 20 s; stopped after the tanh MLP, the plain "
           f"transformer and gpt2_small ({_CPU})."),
    Result("hierarchical_dropin_floors_jax0.12.0.1.csv", "Where hierarchical is refused at 50 %: "
           "every policy's smallest compiled temp",
           "python experiments/hierarchical_dropin.py --policies hierarchical checkmate sqrtn "
           "--models resnet50 vgg16 mobilenet_v2 squeezenet unet densenet "
           "--out experiments/results/hierarchical_dropin_floors_jax0.12.0.1.csv",
           "results/hierarchical",
           "The drop-in at '50%' with three policies on the models hierarchical refuses: a fit, "
           f"or the refusal's smallest compiled temp ({_CPU})."),
    Result("gpu_hierarchical_h200.csv", "Hierarchical on one H200: step time at 10-50 %",
           "# on the H200, in one command (experiments/gpu_bench_run.sh three times):\n"
           "export XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/atc\n"
           "OUT=$OUT/scan TOTAL_S=150 DEADLINE_S=135 bash experiments/gpu_bench_run.sh "
           "--models flax_scan --policies hierarchical,scan_layers@25 --budgets 10,12,25,43 "
           "--builtins dots_saveable,dots_with_no_batch_dims_saveable,nothing_saveable,"
           "offload_dot_with_no_batch_dims\n"
           "OUT=$OUT/tf TOTAL_S=160 DEADLINE_S=145 bash experiments/gpu_bench_run.sh "
           "--models transformer --policies hierarchical --budgets 25,50 "
           "--builtins dots_with_no_batch_dims_saveable,nothing_saveable\n"
           "OUT=$OUT/gpt2 TOTAL_S=250 DEADLINE_S=235 bash experiments/gpu_bench_run.sh "
           "--models gpt2_small --policies hierarchical --budgets 25,50 "
           "--builtins dots_with_no_batch_dims_saveable\n"
           "# here: the three gpu_benchmark.csv files concatenated (scan, tf, gpt2), one header",
           "results/hierarchical",
           "jax 0.11.2, flax 0.12.10 on one H200 (driver 580.159.04): the drop-in "
           "`remat.value_and_grad(loss, 'hierarchical', budget='B%')` at full size against "
           "jax.value_and_grad and JAX's built-in policies per block. Budgets are shares of the "
           "compiled no-remat step's temp (the compiled-budget loop). The autotune cache only "
           "shortens compiles; the deadline skipped 2 configurations."),
    Result("gpu_hand_policies_h200.csv", "Hand-written save policies on one H200 at 50 %",
           "# on the H200 (a second machine of the same kind), in one command:\n"
           "export XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/atc\n"
           "OUT=$OUT/tf TOTAL_S=150 DEADLINE_S=135 bash experiments/gpu_bench_run.sh "
           "--models transformer --policies hierarchical@50 --builtins "
           "dots_with_no_batch_dims_saveable,dots_no_batch_and_softmax,dots_saveable\n"
           "OUT=$OUT/gpt2 TOTAL_S=160 DEADLINE_S=145 bash experiments/gpu_bench_run.sh "
           "--models gpt2_small --policies '' --builtins dots_no_batch_and_softmax,dots_saveable\n"
           "# here: the two gpu_benchmark.csv files concatenated (tf, gpt2), one header",
           "results/hierarchical",
           "As gpu_hierarchical_h200.csv, on another H200 machine: is there a plan near 50 % of "
           "the no-remat temp at +5 % step time? `dots_no_batch_and_softmax` "
           "(experiments/gpu_benchmark.py) keeps every matmul without batch dimensions and the "
           "attention probabilities, so the backward recomputes only elementwise work."),
    Result("gpu_hierarchical_scan_h200.csv", "Hierarchical on the scanned transformer, one "
           "H200: 30 and 43 %",
           "# on the H200 (a third machine of the same kind), before commit 8e54f07:\n"
           "export XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/atc\n"
           "OUT=$OUT/scan TOTAL_S=150 DEADLINE_S=138 bash experiments/gpu_bench_run.sh "
           "--models flax_scan --policies hierarchical,scan_layers@30 --budgets 30,43 "
           "--builtins dots_with_no_batch_dims_saveable,nothing_saveable\n"
           "cp $OUT/scan/gpu_benchmark.csv experiments/results/gpu_hierarchical_scan_h200.csv",
           "results/hierarchical",
           "The budgets gpu_hierarchical_h200.csv skipped, with ScanLayers at 30 %: hierarchical "
           "kept the same 0.128x decision at 30 and 43 % (the scan-candidate gap fixed in 8e54f07, "
           "not rerun on a GPU)."),
    Result("gpu_hierarchical_h200_rerun.csv", "Hierarchical on one H200, rerun after the scan "
           "candidates and the loop's ceiling",
           "# on the H200 (jax 0.11.2; highspy carried as a wheel on PYTHONPATH), code 25a30b0,\n"
           "# two commands on one machine (runs 1-3, then 4-5):\n"
           "export XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/atc\n"
           "OUT=$OUT/scan TOTAL_S=170 DEADLINE_S=158 bash experiments/gpu_bench_run.sh "
           "--models flax_scan --policies hierarchical --budgets 12,30,43 "
           "--builtins dots_with_no_batch_dims_saveable,nothing_saveable\n"
           "OUT=$OUT/tf TOTAL_S=170 DEADLINE_S=158 bash experiments/gpu_bench_run.sh "
           "--models transformer --policies hierarchical --budgets 25,50 "
           "--builtins dots_with_no_batch_dims_saveable\n"
           "OUT=$OUT/gpt2 TOTAL_S=185 DEADLINE_S=173 bash experiments/gpu_bench_run.sh "
           "--models gpt2_small --policies hierarchical --budgets 50 --builtins ''\n"
           "OUT=$OUT/scan2 TOTAL_S=130 DEADLINE_S=120 bash experiments/gpu_bench_run.sh "
           "--models flax_scan --policies hierarchical --budgets 25,27 --builtins dots_saveable\n"
           "OUT=$OUT/gpt2b TOTAL_S=170 DEADLINE_S=160 bash experiments/gpu_bench_run.sh "
           "--models gpt2_small --policies hierarchical --budgets 25 "
           "--builtins dots_with_no_batch_dims_saveable\n"
           "# here: the five gpu_benchmark.csv files concatenated in that order, one header, "
           "with a `run` column (1-5)",
           "results/hierarchical",
           "A fourth H200 machine, after commit 8e54f07 (a scan planned around its cheapest "
           "decisions within the budget) and the loop's ceiling compile: hierarchical against "
           "JAX's built-ins on the scanned transformer, and the #35 budgets on the plain "
           "transformer and gpt2_small. `step_overhead` is against the same run's no-remat step; "
           "`jaxpr_flops` counts recomputation (a scan body times its length)."),
    Result("gpu_plan_diagnosis_h200.jsonl", "What gpt2_small's 25 % and 50 % plans recompute, "
           "one H200",
           "# on the H200 (jax 0.11.2; highspy carried as a wheel on PYTHONPATH), code 1613687:\n"
           "export XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/atc\n"
           "python -m experiments.gpu_plan_diagnosis --model gpt2_small --budgets 50 25 "
           "--out $OUT/diagnosis.jsonl",
           "results/hierarchical",
           "The calibrated profile, the no-remat step and the drop-in's hierarchical plans at 50 "
           "and 25 %: compiled temp, median step time (10 steps), jaxpr and XLA cost-analysis "
           "FLOPs and bytes, the plan's modelled cost against the no-remat graph's, and the "
           "forward nodes each plan runs twice (FLOPs, output bytes, modelled time; contraction "
           "nodes apart)."),
    Result("scan_decisions_check.csv", "The drop-in's scan decision on the full-size Flax scan",
           "python experiments/scan_decisions_check.py --code 8e54f07 "
           "--out experiments/results/scan_decisions_check.csv\n"
           "git worktree add /tmp/before 8e54f07~1\n"
           "PYTHONPATH=/tmp/before python experiments/scan_decisions_check.py --policies "
           "hierarchical --code 8e54f07~1 --append "
           "--out experiments/results/scan_decisions_check.csv",
           "results/hierarchical",
           "The GPU benchmark's scanned transformer at full size, planned from abstract shapes "
           "and compiled on XLA:CPU (flag on), never run: the compiled temp and the scan "
           "decision of hierarchical (before and after 8e54f07) and ScanLayers at 30 and 43 %. "
           f"Modelled costs compare only within one run of the command ({_CPU})."),
    Result("sharded_budget.csv", "Sharded steps: per-device budgets",
           "python -m experiments.sharded_budget",
           "results/sharded",
           "One row per (layout, model, per-device budget) on 8 host devices: no-remat and "
           "applied per-device compiled temp, the modelled prediction, the gradient error "
           f"against the unsharded jax.value_and_grad, FSDP regathers, bytes ({_CPU})."),
    Result("sharded_fsdp_choices.csv", "FSDP: regather or keep the gathered weights",
           "python -m experiments.sharded_budget --fsdp-choices",
           "results/sharded",
           "One row per (model, per-device budget, choice) under FSDP on 8 host devices: the "
           "drop-in's plan and the same plan keeping the stages it recomputes that read a "
           "gathered weight; modelled peak and time (compute, all-gathers, other collectives), "
           f"predicted and compiled per-device temp, compiled all-gathers ({_CPU})."),
    Result("sharded_plan16.csv", "A sharded transformer planned from abstract shapes",
           "python -m experiments.sharded_budget --mesh16",
           "results/sharded",
           "One row per budget (of the per-device graph's modelled no-remat peak) on a 16-device "
           "8 x 2 mesh, from jax.ShapeDtypeStructs only: modelled and compiled per-device bytes."),
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
           "results/published_graphs",
           "The bounds the searches had reached on n = 250 at m = 0.6 before the pebbling "
           "witness search decided it."),
    Result("refactor_check.csv", "Refactor check: published rows re-planned",
           "git worktree add /tmp/ref 5ab16ef && cp experiments/refactor_check.py "
           "/tmp/ref/experiments/\n"
           "(cd /tmp/ref && PYTHONPATH=/tmp/ref python -m experiments.refactor_check "
           "--out /tmp/ref.csv)\n"
           "python -m experiments.refactor_check --reference /tmp/ref.csv "
           "--out experiments/results/refactor_check.csv   # at 9e95684: fb16233's library code",
           "results/published_graphs",
           "Every deterministic row of published_benchmark.csv re-planned with the code before "
           "(5ab16ef) and after (fb16233) the layering refactor; `same` says whether objective "
           "and peak are unchanged."),
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


def _flat(record: dict, prefix: str = "") -> dict:
    """Nested dicts as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``)."""
    out: dict = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
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
    if name.endswith(".jsonl"):  # one JSON object per line: a table of the flattened lines
        with open(path) as f:
            records = [_flat(json.loads(line)) for line in f if line.strip()]
        return [f"{len(records)} lines.", ""] + _records(records)
    if name.endswith(".md"):
        return ["```{include} " + rel, ":heading-offset: 1", "```"]
    with open(path) as f:
        text = f.read()
    return ["```text", text.rstrip("\n"), "```"]


# --------------------------------------------------------------------------------------------
# Views: the tables that results pages include


@dataclass(frozen=True)
class View:
    """A table that a results page includes, generated from committed files at each build.

    ``docs/results/data/views/<name>.md`` says, for each file it reads, the file's path, a link
    to its data page and the command that made it (the file's :data:`RESULTS` entry), then the
    table. A page includes it with ``{include}`` (``docs/results/compiled_memory.md``).

    Attributes:
      name: the view's file name, without ``.md``.
      files: the result files it reads (each has a :data:`RESULTS` entry).
      table: ``table(results_dir) -> lines``: a sentence (optional) and the table, Markdown.
    """

    name: str
    files: tuple[str, ...]
    table: Callable[[str], list[str]]


#: Where views are written, under the data pages' folder (git-ignored; ``docs/conf.py``
#: excludes it from the documents, since the views are only included).
VIEWS_DIR = "views"


def _rows(results_dir: str, file: str) -> list[dict]:
    with open(os.path.join(results_dir, file), newline="") as f:
        return list(csv.DictReader(f))


def _mib(value) -> str:
    """Bytes as MiB with two decimals (empty stays empty)."""
    return "" if value in ("", None) else f"{float(value) / 2**20:.2f}"


def _gib(value) -> str:
    """Bytes as GiB with two decimals (empty stays empty)."""
    return "" if value in ("", None) else f"{float(value) / 2**30:.2f}"


def _tflops(value) -> str:
    """FLOPs as TFLOPs with three decimals (empty stays empty)."""
    return "" if value in ("", None) else f"{float(value) / 1e12:.3f}"


def _short(value) -> str:
    """An error cell's type only (``InfeasibleBudgetError: ...`` -> ``InfeasibleBudgetError``)."""
    return str(value).split(":")[0]


def _columns(rows: list[dict], columns) -> list[str]:
    """A table of ``rows`` with ``columns``: ``(header, key)`` or ``(header, key, format)``."""
    header = [c[0] for c in columns]
    body = [[(c[2] if len(c) > 2 else str)(r.get(c[1], "")) for c in columns] for r in rows]
    return _table(header, body)


def csv_view(name: str, file: str, columns, where: Callable[[dict], bool] | None = None,
             note: Callable[[list[dict]], str] | None = None) -> View:
    """A view of some columns (and, with ``where``, some rows) of one CSV."""

    def table(results_dir: str) -> list[str]:
        rows = _rows(results_dir, file)
        out = [note(rows), ""] if note else []
        return out + _columns([r for r in rows if where is None or where(r)], columns)

    return View(name, (file,), table)


def _status_counts(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return (f"{len(rows)} rows: "
            + ", ".join(f"{n} `{s}`" for s, n in sorted(counts.items(), key=lambda x: -x[1]))
            + ".")


def _memory_models(results_dir: str) -> list[str]:
    """``memory_model_jax*.csv`` side by side: one row per (model, policy, budget)."""
    files = [("0.12.0.1", "memory_model_jax0.12.0.1.csv"), ("0.8.0", "memory_model_jax0.8.0.csv")]
    by_version = {v: {(r["model"], r["policy"], r["budget"]): r for r in _rows(results_dir, f)}
                  for v, f in files}
    keys = list(by_version["0.12.0.1"])
    keys += [k for k in by_version["0.8.0"] if k not in keys]
    header = ["model", "policy", "budget"]
    for v, _ in files:
        header += [f"compiled MiB ({v})", f"predicted / compiled ({v})",
                   f"modelled peak / compiled ({v})"]
    body = []
    for key in keys:
        row = list(key)
        for v, _ in files:
            r = by_version[v].get(key)
            if r is None:
                row += ["", "", ""]
            elif r["status"] != "ok":
                row += [_short(r["status"]), "", ""]
            else:
                row += [_mib(r["compiled_temp_bytes"]), r["ratio_new"], r["ratio_old"]]
        body.append(row)
    ratios = {v: [float(r["ratio_new"]) for r in by_version[v].values() if r["ratio_new"]]
              for v, _ in files}
    summary = "; ".join(f"jax {v}: {min(x):.2f}–{max(x):.2f}" for v, x in ratios.items())
    return ([f"Predicted over compiled temp, over every plan that compiled: {summary}.", ""]
            + _table(header, body))


def _calibration(results_dir: str) -> list[str]:
    """``calibrate_cpu.json``: one column per run (JAX version), one row per measured figure."""
    with open(os.path.join(results_dir, "calibrate_cpu.json")) as f:
        runs = json.load(f)["runs"]
    fields = [
        ("Python", lambda r: r["machine"]["python"]),
        ("load average (1 min)", lambda r: r["machine"]["loadavg_1min"]),
        ("first calibrate() call, s", lambda r: f"{r['calibrate_first_call_s']:.2f}"),
        ("matmul GFLOP/s", lambda r: f"{r['profile']['matmul_flops_per_s'] / 1e9:.1f}"),
        ("conv GFLOP/s", lambda r: f"{r['profile']['conv_flops_per_s'] / 1e9:.1f}"),
        ("memory bandwidth, GB/s", lambda r: f"{r['profile']['memory_bandwidth'] / 1e9:.1f}"),
        ("launch per kernel, µs", lambda r: f"{r['profile']['launch_s'] * 1e6:.2f}"),
        ("dispatch per call, µs", lambda r: f"{r['calibration']['dispatch_s'] * 1e6:.1f}"),
        ("MLP step, modelled s", lambda r: f"{r['plan']['modelled_step_s']:.4f}"),
        ("MLP step, measured jax.jit s", lambda r: f"{r['plan']['measured_jit_step_s']:.4f}"),
        ("Checkmate at 60 %: status", lambda r: r["plan"]["status"]),
        ("Checkmate at 60 %: overhead", lambda r: f"{r['plan']['overhead']:.3f}"),
    ]
    names = sorted(runs, reverse=True)
    return _table(["", *names], [[label, *(get(runs[n]) for n in names)] for label, get in fields])


#: Every view, by name.
VIEWS: tuple[View, ...] = (
    # results/compiled_memory
    csv_view("compiled_budget", "compiled_budget_jax0.12.0.1.csv", [
        ("model", "model"), ("policy", "policy"), ("budget %", "pct"),
        ("status", "status", _short), ("no-remat temp MiB", "baseline_temp_bytes", _mib),
        ("budget MiB", "budget_bytes", _mib), ("compiled MiB", "compiled_temp_bytes", _mib),
        ("compiled / budget", "x_budget"), ("rounds", "rounds"), ("compiles", "compiles"),
        ("predicted / compiled", "predicted_x_compiled"), ("jaxpr FLOPs / no remat", "flops_x")],
        note=_status_counts),
    View("memory_model", ("memory_model_jax0.12.0.1.csv", "memory_model_jax0.8.0.csv"),
         _memory_models),
    View("calibration", ("calibrate_cpu.json",), _calibration),
    csv_view("gpu_before_loop", "gpu_benchmark_h200_before_loop.csv", [
        ("model", "model"), ("config", "config"), ("policy", "policy"), ("budget %", "budget"),
        ("status", "status"), ("temp GiB", "temp_bytes", _gib), ("temp / none", "temp_x"),
        ("compiled / budget", "compiled_vs_budget"), ("step ms", "step_ms"),
        ("step overhead", "step_overhead"), ("grad rel. err", "grad_rel_err"),
        ("error", "error", _short)],
        where=lambda r: r["status"] != "skipped", note=lambda rows: _status_counts(rows)
        + " Rows `skipped` (the deadline, or no per-block hook) are left out here."),
    csv_view("gpu_hierarchical", "gpu_hierarchical_h200.csv", [
        ("model", "model"), ("config", "config"), ("policy", "policy"), ("budget %", "budget"),
        ("temp GiB", "temp_bytes", _gib), ("temp / none", "temp_x"),
        ("compiled / budget", "compiled_vs_budget"), ("step ms", "step_ms"),
        ("step overhead", "step_overhead"), ("J / step", "energy_j_per_step"),
        ("grad rel. err", "grad_rel_err"), ("plan s", "plan_s"), ("notes", "notes", _short)],
        where=lambda r: r["status"] != "skipped", note=lambda rows: _status_counts(rows)
        + " Rows `skipped` (the deadline) are left out here."),
    csv_view("gpu_hierarchical_scan", "gpu_hierarchical_scan_h200.csv", [
        ("config", "config"), ("policy", "policy"), ("budget %", "budget"),
        ("temp GiB", "temp_bytes", _gib), ("temp / none", "temp_x"), ("step ms", "step_ms"),
        ("step overhead", "step_overhead"), ("grad rel. err", "grad_rel_err")]),
    csv_view("gpu_hierarchical_rerun", "gpu_hierarchical_h200_rerun.csv", [
        ("run", "run"), ("model", "model"), ("config", "config"), ("policy", "policy"),
        ("budget %", "budget"), ("temp GiB", "temp_bytes", _gib), ("temp / none", "temp_x"),
        ("step ms", "step_ms"), ("step overhead", "step_overhead"),
        ("jaxpr TFLOPs", "jaxpr_flops", _tflops), ("grad rel. err", "grad_rel_err"),
        ("plan s", "plan_s"), ("notes", "notes", _short)]),
    csv_view("gpu_hand_policies", "gpu_hand_policies_h200.csv", [
        ("model", "model"), ("config", "config"), ("policy", "policy"), ("budget %", "budget"),
        ("temp GiB", "temp_bytes", _gib), ("temp / none", "temp_x"), ("step ms", "step_ms"),
        ("step overhead", "step_overhead"), ("J / step", "energy_j_per_step"),
        ("grad rel. err", "grad_rel_err")]),
    # results/milp
    csv_view("milp_unseen", "milp_unseen.csv", [
        ("seed", "seed"), ("budget", "budget"), ("solver", "solver"), ("wall s", "wall_s"),
        ("status", "status"), ("overhead", "overhead"), ("gap", "gap")], note=_status_counts),
    csv_view("milp_unseen_600s", "milp_unseen_600s.csv", [
        ("seed", "seed"), ("budget", "budget"), ("wall s", "wall_s"), ("status", "status"),
        ("overhead", "overhead"), ("gap", "gap")]),
    csv_view("milp_unseen_portfolio", "milp_unseen_portfolio.csv", [
        ("seed", "seed"), ("budget", "budget"), ("solver", "solver"), ("wall s", "wall_s"),
        ("status", "status"), ("overhead", "overhead"), ("gap", "gap")], note=_status_counts),
    csv_view("milp_unseen_portfolio_repeats", "milp_unseen_portfolio_repeats.csv", [
        ("calibration", "calibration_run"), ("seed", "seed"), ("budget", "budget"),
        ("stall rounds", "stall_rounds"), ("wall s", "wall_s"), ("status", "status"),
        ("overhead", "overhead"), ("gap", "gap")], note=_status_counts),
    csv_view("milp_variants", "milp_variants.csv", [
        ("seed", "seed"), ("budget", "budget"), ("variant", "variant"), ("kind", "kind"),
        ("wall s", "wall_s"), ("status", "status"), ("overhead", "overhead"),
        ("bound", "lower_bound_overhead"), ("gap", "gap"), ("fits", "fits")]),
    # results/published_graphs
    csv_view("open_instances", "open_instances.csv", [
        ("graph", "graph"), ("m", "m"), ("budget B", "budget_bytes"),
        ("single-step need B", "min_step_bytes"), ("proven floor B", "memory_floor_bytes"),
        ("best plan's peak B", "best_peak_bytes"), ("found by", "best_peak_source"),
        ("program-order LP", "lp_status"), ("LP bound (overhead)", "lp_bound_overhead")]),
    csv_view("refactor_check", "refactor_check.csv", [
        ("graph", "graph"), ("m", "m"), ("method", "method"), ("policy", "policy"),
        ("objective before", "objective_before"), ("objective after", "objective_after"),
        ("peak before", "peak_before"), ("peak after", "peak_after"),
        ("status after", "status_after")],
        where=lambda r: r["same"] != "True",
        note=lambda rows: f"{len(rows)} rows, {sum(r['same'] == 'True' for r in rows)} "
        "unchanged; the others:"),
)


def write_views(results_dir: str, out_dir: str) -> list[str]:
    """Write every :data:`VIEWS` entry into ``out_dir`` (``docs/results/data/views``).

    Returns:
      The written view names.
    """
    os.makedirs(out_dir, exist_ok=True)
    by_file = {r.file: r for r in RESULTS}
    names = []
    for view in VIEWS:
        lines: list[str] = []
        for file in view.files:
            r = by_file[file]
            stem = file.replace(".", "_")
            lines += [f"`experiments/results/{file}` ({{doc}}`/results/data/{stem}`), made by:",
                      "", "```bash", r.command, "```", ""]
        lines += view.table(results_dir)
        _write(os.path.join(out_dir, view.name + ".md"), "\n".join(lines) + "\n")
        names.append(view.name)
    return names


def write_pages(results_dir: str, out_dir: str) -> list[str]:
    """Write one page per :data:`RESULTS` entry and an index into ``out_dir``, and the
    :data:`VIEWS` into its ``views`` folder.

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
    write_views(results_dir, os.path.join(out_dir, VIEWS_DIR))
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
