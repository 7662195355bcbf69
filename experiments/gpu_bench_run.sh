#!/usr/bin/env bash
# The one script to run on a GPU machine: the GPU benchmark's table (shared/notes/gpu-1.md) at
# full size, plus nvidia-smi and the package versions, all in about 6 minutes.
#
#   OUT=/some/dir bash experiments/gpu_bench_run.sh
#
# Writes $OUT/gpu_benchmark.csv (rows appended as they are measured, so a cut-off run keeps
# them), $OUT/gpu_benchmark.log, $OUT/nvidia-smi.txt and $OUT/versions.txt.  Installs
# nothing (the machine may have no network): it runs the repository in place
# (PYTHONPATH=repo root) with ${PYTHON:-python3}, which needs jax with CUDA, flax, optax,
# numba, scipy, networkx and highspy (Checkmate's MILP); pynvml (nvidia-ml-py, the `gpu`
# extra) gives the energy column and is optional.
#
# With OFFLOAD=1 it then runs experiments/offload_gpu_check.py (POET's page-outs as host
# offloading: device and host temp, memory_stats, gradient error) into $OUT/offload.json when
# at least OFFLOAD_S (120 s) of the total is left.
#
# Time guard: the benchmark gets a deadline of DEADLINE_S (330 s; it stops launching models
# and configurations when it is near and writes rows saying what it skipped) and is killed
# by `timeout` when the whole script reaches TOTAL_S (360 s).
#
# Committed results: experiments/results/gpu_benchmark_h200_before_loop.csv is this script's
# first version (commit ff517fe, before the compiled-budget loop) run on one H200, its
# $OUT/gpu_benchmark.csv copied under that name (the commands are in the docstring of
# experiments/gpu_benchmark.py; shown on docs/results/compiled_memory.md).
# gpu_hierarchical_h200.csv, gpu_hand_policies_h200.csv and gpu_hierarchical_scan_h200.csv are
# this script run three, two and one times in one command, with extra arguments after it
# (docs/results_pages.py gives the commands; shown on docs/results/hierarchical.md). There,
# XLA_FLAGS named --xla_gpu_per_fusion_autotune_cache_dir so that a plan's compile reuses the
# fusions autotuned for earlier ones. The offload check has not run on a GPU yet.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-experiments/results}
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-360}
DEADLINE_S=${DEADLINE_S:-330}
mkdir -p "$OUT"
start=$(date +%s)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm \
    --format=csv; } >"$OUT/nvidia-smi.txt" 2>&1
"$PY" - >"$OUT/versions.txt" 2>&1 <<'EOF'
import importlib, platform, sys
print("python", sys.version.replace("\n", " "), platform.machine())
for m in ("jax", "jaxlib", "flax", "optax", "numpy", "scipy", "numba", "networkx", "highspy",
          "pynvml"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "installed"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING:", type(e).__name__, e)
EOF
cat "$OUT/versions.txt"

left=$(( TOTAL_S - ($(date +%s) - start) ))
if (( left < DEADLINE_S + 5 )); then DEADLINE_S=$(( left > 15 ? left - 10 : 5 )); fi
# SIGTERM first (the parent kills its running child's process group), SIGKILL 5 s later
timeout -k 5 "$left" "$PY" -m experiments.gpu_benchmark --size full --deadline-s "$DEADLINE_S" \
    --out "$OUT/gpu_benchmark.csv" "$@" 2>&1 | tee "$OUT/gpu_benchmark.log"
rc=${PIPESTATUS[0]}
left=$(( TOTAL_S - ($(date +%s) - start) ))
if [ "${OFFLOAD:-0}" = 1 ] && (( left >= ${OFFLOAD_S:-120} )); then
  timeout -k 5 "$left" "$PY" -m experiments.offload_gpu_check --out "$OUT/offload.json" \
      2>&1 | tee "$OUT/offload.log"
fi
echo "gpu_bench_run: $(( $(date +%s) - start )) s in all, exit code $rc" | tee -a "$OUT/gpu_benchmark.log"
exit "$rc"
