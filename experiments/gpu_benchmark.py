"""GPU benchmark of the drop-in in one command (its table: ``docs/results/compiled_memory.md``).

    python -m experiments.gpu_benchmark --out experiments/results/gpu_benchmark.csv \\
        [--size full|tiny] [--models gpt2_small,resnet50,...] \\
        [--policies checkmate,sqrtn,scan_layers] [--budgets 30,50,70] \\
        [--steps 8 --warmup 3] [--deadline-s 330] [--time-limit 20] \\
        [--builtins dots_saveable,...] [--plan-workers 4] [--energy-min-s 1]

Models (:mod:`experiments.bench_models`): zoo ``gpt2_small`` (batch 16, sequence 512), zoo
``resnet50`` (batch 64, 224 px), a plain-JAX 12-layer transformer (d=1024, batch 16, seq 512),
a plain-JAX 32 x 4096 tanh MLP (batch 8192) and a Flax ``nn.scan`` transformer 12 x 1024
(GELU); ``--size tiny`` shrinks each to a CPU-sized model (the test suite runs it).

Length: the parent (deadline, one child process per model, rows appended as they come) and the
child (compile, time, energy, gradient error per configuration) are one command's two halves.

Configurations, per model, in this order:

* ``none``: ``jax.jit(jax.value_and_grad(loss))``, the reference every other row is compared
  with (its gradients are computed once per model);
* ``builtin``: JAX's built-in policies per block (``dots_saveable``,
  ``dots_with_no_batch_dims_saveable``, ``nothing_saveable``, and
  ``offload_dot_with_no_batch_dims(offload_src='device', offload_dst='pinned_host')`` only
  where the device has ``pinned_host`` memory), where the model has a per-block hook (a row
  with ``status=skipped`` says when it has none: zoo ``resnet50``);
* ``remat``: the project's policies through the public drop-in,
  ``jax.jit(remat.value_and_grad(loss, policy, budget=f"{b}%"))``.  A ``--policies`` entry
  ``name`` runs at every ``--budgets`` percentage when the policy takes a budget (``sqrtn``,
  ``griewank``, ``checkpoint_all`` and ``recompute_all`` run once, without one), ``name@B``
  at budget ``B`` % only, ``name@-`` without a budget.  ``checkmate`` is built as
  ``policies.get("checkmate", budget=..., time_limit=T)`` with ``T = --time-limit`` (default
  20 s: a small limit, so that the plans fit the six-minute run; the MILP returns its best
  schedule when the limit strikes, ``plan status time_limit`` in ``notes``; at full size on
  an H200 machine it struck on resnet50 and the MLP) or less when the deadline is near.
  ``scan_layers`` runs only on models whose layers are an ``nn.scan``.  A policy that raises
  (``InfeasibleBudgetError``, ``NotApplicableError``, an out-of-memory error) leaves a row
  with the typed error text in ``error``.

Each model runs in its own process (``--one MODEL``, JSON rows on stdout); the parent appends
every row to the CSV as soon as it arrives, so an interrupted run keeps what was measured.
Each configuration is compiled once (``jax.jit(f).lower(*args).compile()``) and that
executable is both measured and timed.  In the child: (1) the reference is compiled and
measured alone; (2) the project's policies plan in ``--plan-workers`` threads (CPU work)
while (3) the built-ins compile, and each plan is compiled as soon as it is ready; (4) once
no planning thread runs, every compiled step is measured, timed loops one at a time (a
planning thread holding the GIL would delay the steps' dispatch).  ``plan_s`` and
``compile_s`` are therefore wall times under that concurrent load; ``--plan-workers 0``
plans one configuration after the other.  With ``--deadline-s`` the parent gives each model
a share of the time left (weighted by :data:`WEIGHTS` at full size; what a model leaves
unused goes to the next), the child skips what it has no time to compile and measure, and
the parent stops launching models (and kills a child that overruns its share by a minute);
rows with ``status=skipped`` or ``killed`` say what was not measured.

Time (one H200, jax 0.11.2, this command's first version, which planned and compiled one
configuration after the other): XLA compilation dominates, 33 s for gpt2_small's reference
step, 13 s resnet50's, 16 s the plain transformer's (10-15 s for its built-ins), 2.5 s the
MLP's, 2-9 s the scanned transformer's; a Checkmate plan at full size took 22-24 s (20 s
time limit struck on resnet50 and the MLP), ``scan_layers`` and ``sqrtn`` under 1 s; a
measurement is 12 steps of 20-190 ms.  Under ``--deadline-s 330`` that run (271 s) measured
21 configurations, met 3 infeasible budgets and skipped 20 (of gpt2_small only the
reference ran); all five models with every configuration need an estimated 8-12 minutes.  For the whole table, run the models in two commands
(``--models gpt2_small,transformer`` and ``--models resnet50,mlp,flax_scan``).

On CPU the child must start with ``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander``
(XLA:CPU otherwise undoes ``jax.checkpoint``; :data:`remat.measurement.FLAG`): the parent sets
it when the child will run on CPU, and a child that finds itself on the other backend than the
parent guessed restarts itself with the right flags.

Columns (:data:`COLUMNS`; bytes are bytes, times milliseconds or seconds as named):

* ``temp_bytes``: the compiled step's ``memory_analysis().temp_size_in_bytes``; ``temp_x``:
  over the ``none`` row's.
* ``peak_bytes_in_use``: ``device.memory_stats()["peak_bytes_in_use"]`` after the
  configuration's timed loop; blank where the backend has no memory stats (CPU).  It is
  monotone within a process (JAX cannot reset it), so a row shows a new peak only when the
  configuration needed more than every earlier one of the same model; ``bytes_in_use_before``
  is ``bytes_in_use`` just before the timed loop (parameters, batch, reference gradients and
  the executable's outputs).
* ``step_ms``: median of the timed steps (``steps``: how many; at least ``--steps``, after
  ``--warmup`` untimed ones; each step waited for); ``step_overhead``: ``step_ms / none's
  step_ms - 1``.
* ``energy_j_per_step``: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``
  through ``pynvml``, the ``gpu`` extra: ``nvidia-ml-py``) read before and after the timed
  loop, divided by its steps; blank where unavailable (no GPU, no ``pynvml``, a GPU that does
  not report it).  The counter moves in coarse steps (a loop of 8 x 42 ms read 750 W on a
  700 W card), so where it is available the timed loop runs at least ``--energy-min-s``
  (default 1 s; at most 20 x ``--steps`` steps).
* ``grad_rel_err``: max over gradient leaves of ``max|g - g_ref| / max|g_ref|`` (a leaf whose
  reference is all zeros, e.g. BatchNorm statistics, contributes ``max|g - g_ref|``);
  ``loss_abs_err``: ``|loss - loss_ref|``.
* ``plan_s``: extraction + planning + application (``step.applied(*args)``), seconds;
  ``compile_s``: lowering + compilation.
* ``rounds``, ``compiled_temp_bytes_applied``: ``Applied.rounds`` / ``.compiled_temp_bytes``
  where the installed drop-in has them (blank otherwise).
* ``compiled_vs_budget``: ``temp_bytes / (B% x none's temp_bytes)``: at most 1 when the
  compiled step fits the budget read as a share of the compiled no-remat step's temporaries.
  ``plan_budget_bytes`` / ``plan_peak_bytes``: the budget and peak in the plan's own memory
  model (``plan.meta``).
* ``flops``: the compiled step's ``cost_analysis()["flops"]`` (a scan body counted once);
  ``jaxpr_flops``: the step's jaxpr FLOPs (:func:`remat.flops.jaxpr_flops`: a scan body
  times its length, recomputation included; what the CPU sweep tables compare);
  ``model_flops``: the analytic count of :func:`experiments.bench_models.model_flops`.
* ``status``: ``ok``, ``error``, ``skipped`` or ``killed``; ``error``: the exception's type and
  text; ``notes``: fidelity warnings and other remarks.

Result files: a run of this version writes ``--out`` (``gpu_benchmark.csv``);
``experiments/results/gpu_hierarchical_h200.csv``, ``gpu_hand_policies_h200.csv`` and
``gpu_hierarchical_scan_h200.csv`` are runs of this version (their commands:
``docs/results_pages.py``).
``experiments/results/gpu_benchmark_h200_before_loop.csv`` was made by this command's first
version (commit ff517fe), before the compiled-budget loop existed (its budgets are shares of
the graph's modelled peak), on one H200::

    git worktree add /tmp/gpu ff517fe
    (cd /tmp/gpu && OUT=/tmp/gpu_out bash experiments/gpu_bench_run.sh)
    cp /tmp/gpu_out/gpu_benchmark.csv experiments/results/gpu_benchmark_h200_before_loop.csv

(``gpu_bench_run.sh`` runs ``python -m experiments.gpu_benchmark --size full --deadline-s 330
--out $OUT/gpu_benchmark.csv``.)  Shown on ``docs/results/compiled_memory.md``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.bench_models import MODELS

COLUMNS = (
    "model", "size", "config", "policy", "budget", "status",
    "temp_bytes", "temp_x", "peak_bytes_in_use", "bytes_in_use_before",
    "step_ms", "step_overhead", "energy_j_per_step",
    "grad_rel_err", "loss_abs_err",
    "plan_s", "compile_s", "rounds", "compiled_vs_budget",
    "plan_budget_bytes", "plan_peak_bytes", "compiled_temp_bytes_applied",
    "predicted_residual_bytes", "residual_bytes", "flops", "jaxpr_flops", "model_flops",
    "time_limit_s",
    "steps", "backend", "device_kind", "jax_version", "notes", "error",
)
BUILTINS = ("dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable",
            "offload_dot_with_no_batch_dims")
DEFAULT_POLICIES = ("checkmate", "sqrtn", "scan_layers")
NO_BUDGET = frozenset({"sqrtn", "griewank", "checkpoint_all", "recompute_all"})
SCAN_ONLY = frozenset({"scan_layers"})
ROW = "@@ROW "
PLAN = "@@PLAN "
FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"  # = remat.measurement.FLAG
# seconds a model needs at least (start, build, reference compile and timing) for the parent
# to launch it
MIN_MODEL_S = {"full": 25.0, "tiny": 3.0}
# a model's share of the time left (full size), from one H200 run (jax 0.11.2): XLA
# compilation dominates (gpt2_small's reference step took 33 s to compile, resnet50's 13 s,
# the transformer's 16 s, the MLP's 2.5 s, the scanned transformer's 9 s)
WEIGHTS = {"gpt2_small": 3.0, "resnet50": 1.5, "transformer": 2.0, "mlp": 1.0,
           "flax_scan": 1.5}
GRACE_S = 15.0  # a child is killed at most 4 x this past its share, this past the deadline


# --------------------------------------------------------------------------- save policies
def dots_no_batch_and_softmax(prim, *avals, **params) -> bool:
    """``dots_with_no_batch_dims_saveable`` plus attention probabilities: the division of an
    ``[..., S, S]`` operand by an ``[..., S, 1]`` one (``jax.nn.softmax``'s ``exp / sum``).

    Kept, the backward recomputes no batched dot and no pass over ``S x S``: the opposite of
    Megatron's selective recomputation, which recomputes exactly that attention core."""
    import jax

    if jax.checkpoint_policies.dots_with_no_batch_dims_saveable(prim, *avals, **params):
        return True
    if prim.name != "div" or len(avals) != 2:
        return False
    a, b = avals
    return (getattr(a, "ndim", 0) >= 3 and a.shape[-1] == a.shape[-2]
            and getattr(b, "ndim", 0) == a.ndim and b.shape[-1] == 1)


#: hand-written save policies, run with ``--builtins NAME`` like JAX's (not by default)
HAND_POLICIES = {"dots_no_batch_and_softmax": dots_no_batch_and_softmax}


def _save_policy(name: str):
    """The ``jax.checkpoint`` policy called ``name`` (a JAX built-in or a hand policy)."""
    import jax

    if name in HAND_POLICIES:
        return HAND_POLICIES[name]
    pol = getattr(jax.checkpoint_policies, name)
    if name.startswith("offload"):
        pol = pol(offload_src="device", offload_dst="pinned_host")
    return pol


# --------------------------------------------------------------------------- configurations
def parse_policies(spec: Sequence[str], budgets: Sequence[float]) -> list[tuple[str, float | None]]:
    """``[(policy, budget %|None)]`` from ``--policies`` entries (``name``, ``name@B``,
    ``name@-``)."""
    import policies

    out: list[tuple[str, float | None]] = []
    for entry in spec:
        entry = entry.strip()
        if not entry:
            continue
        name, _, b = entry.partition("@")
        takes = "budget" in policies.option_names(name)  # raises on unknown names
        if b == "-" or (not b and (name in NO_BUDGET or not takes)):
            out.append((name, None))
        elif b:
            out.append((name, float(b)))
        else:
            out.extend((name, float(x)) for x in budgets)
    return out


def config_list(model, pols, pinned_host: bool, builtins: Sequence[str] = BUILTINS) -> list[dict]:
    """The configurations of one model, in the order they are run."""
    cfgs = [dict(config="none", policy="", budget=None)]
    if model.builtin_loss is None and builtins:
        cfgs.append(dict(config="builtin", policy="*", budget=None,
                         skip=f"no per-block built-ins: {model.builtin_note}"))
    for name in builtins if model.builtin_loss is not None else ():
        if name.startswith("offload") and not pinned_host:
            continue
        cfgs.append(dict(config="builtin", policy=name, budget=None))
    for name, b in pols:
        if name in SCAN_ONLY and not model.scanned:
            continue
        cfgs.append(dict(config="remat", policy=name, budget=b))
    return cfgs


def _fmt_budget(b):
    return "" if b is None else (f"{b:g}")


# --------------------------------------------------------------------------- child
class _Energy:
    """NVML's total-energy counter of the GPU, in joules, or ``None``."""

    def __init__(self, backend: str):
        self.handle = None
        self.note = ""
        if backend != "gpu":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            idx = 0
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            if vis.isdigit():
                idx = int(vis)
            h = pynvml.nvmlDeviceGetHandleByIndex(idx)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            self.handle, self._nvml = h, pynvml
        except Exception as e:  # noqa: BLE001 - no pynvml, no NVML, or not reported
            self.note = f"energy unavailable: {type(e).__name__}: {e}"[:200]

    def read(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        except Exception:  # noqa: BLE001
            return None


def _memory_stats(dev) -> dict:
    try:
        return dict(dev.memory_stats() or {})
    except Exception:  # noqa: BLE001 - backends without memory stats
        return {}


def _flops(compiled) -> float | None:
    try:
        ca = compiled.cost_analysis()
        if isinstance(ca, (list, tuple)):
            ca = ca[0] if ca else {}
        f = (ca or {}).get("flops")
        return None if f is None else float(f)
    except Exception:  # noqa: BLE001
        return None


def _err_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text[:400]


def _grad_errors(jax, jnp):
    def errs(g, gr, loss, loss_ref):
        leaves = jax.tree_util.tree_leaves(g)
        refs = jax.tree_util.tree_leaves(gr)
        if len(leaves) != len(refs):
            raise ValueError(f"gradient trees differ: {len(leaves)} vs {len(refs)} leaves")
        out = []
        for a, r in zip(leaves, refs):
            d = jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32)))
            m = jnp.max(jnp.abs(r.astype(jnp.float32)))
            out.append(jnp.where(m > 0, d / jnp.where(m > 0, m, 1.0), d))
        rel = jnp.max(jnp.stack(out)) if out else jnp.float32(0)
        return rel, jnp.abs(loss - loss_ref)

    return jax.jit(errs)


def _ensure_backend_flags() -> None:
    """Restart this child with ``FLAG`` in ``XLA_FLAGS`` when it runs on CPU without it (or
    without the flag when it runs elsewhere); once."""
    import jax

    backend = jax.default_backend()
    flags = os.environ.get("XLA_FLAGS", "")
    has = FLAG in flags.split()
    want = backend == "cpu"
    if has == want or os.environ.get("GPU_BENCH_REEXEC"):
        return
    env = dict(os.environ, GPU_BENCH_REEXEC="1")
    parts = [f for f in flags.split() if f != FLAG] + ([FLAG] if want else [])
    env["XLA_FLAGS"] = " ".join(parts)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "experiments.gpu_benchmark", *sys.argv[1:]],
              env)


def run_one(model_name: str, *, size: str, policy_specs: Sequence[str], budgets, steps: int,
            warmup: int, deadline_at: float | None, time_limit: float, emit,
            builtins: Sequence[str] = BUILTINS, plan_workers: int = 4,
            energy_min_s: float = 1.0) -> None:
    """Measure every configuration of one model; ``emit(row)`` per row (child process).

    Phases: (1) the reference is compiled and measured alone; (2) the project's policies
    plan in ``plan_workers`` threads (CPU work) while (3) the built-ins compile; (4) each plan
    is compiled as it is ready; (5) once no planning thread runs, every compiled step is
    measured (gradient error, timed loop), one at a time.  ``plan_workers=0`` plans in phase
    (4), one after the other.
    """
    _ensure_backend_flags()
    import jax
    import jax.numpy as jnp

    import policies
    import remat
    from experiments.bench_models import build
    from remat.fidelity import RematFidelityWarning
    from remat.flops import jaxpr_flops

    warnings.filterwarnings("ignore", category=RematFidelityWarning)

    dev = jax.devices()[0]
    backend = jax.default_backend()
    base = dict(model=model_name, size=size, backend=backend, device_kind=dev.device_kind,
                jax_version=jax.__version__)
    try:
        kinds = {m.kind for m in dev.addressable_memories()}
    except Exception:  # noqa: BLE001
        kinds = set()
    pinned = "pinned_host" in kinds
    energy = _Energy(backend)
    min_loop_s = energy_min_s if energy.handle is not None else 0.0

    def out(cfg, **kw):
        row = dict(base)
        row.update(config=cfg["config"], policy=cfg["policy"], budget=_fmt_budget(cfg["budget"]))
        row.update(kw)
        emit(row)

    model = build(model_name, size)
    base["model_flops"] = model.flops
    params, batch = jax.device_put((model.params, model.batch))
    del model.params, model.batch
    args = (params, batch)
    pols = parse_policies(policy_specs, budgets)
    cfgs = config_list(model, pols, pinned, builtins)
    emit({"__plan__": [[c["config"], c["policy"], _fmt_budget(c["budget"])] for c in cfgs]})
    errs = _grad_errors(jax, jnp)
    ref: dict = {}

    def step_jaxpr_flops(step) -> float | None:
        try:
            return jaxpr_flops(jax.make_jaxpr(step)(*args))
        except Exception:  # noqa: BLE001 - a column, not a reason to lose the row
            return None

    def left() -> float:
        return math.inf if deadline_at is None else deadline_at - time.time()

    def measure(cfg, compiled):
        """Memory, gradient error and the timed loop of one compiled step."""
        row = {}
        mem = compiled.memory_analysis()
        temp = int(mem.temp_size_in_bytes) if mem is not None else None
        row["temp_bytes"] = temp
        row["flops"] = _flops(compiled)
        loss, g = compiled(*args)
        if ref:
            rel, dl = errs(g, ref["g"], loss, ref["loss"])
            row["grad_rel_err"] = float(rel)
            row["loss_abs_err"] = float(dl)
            row["temp_x"] = None if not (temp is not None and ref["temp"]) else temp / ref["temp"]
        else:
            ref.update(loss=loss, g=g, temp=temp)
            row.update(grad_rel_err=0.0, loss_abs_err=0.0, temp_x=1.0)
        del loss, g
        for _ in range(warmup):
            jax.block_until_ready(compiled(*args))
        row["bytes_in_use_before"] = _memory_stats(dev).get("bytes_in_use")
        e0 = energy.read()
        times: list[float] = []
        t_loop = time.perf_counter()
        # at least `steps` steps; on a GPU with an energy counter, at least min_loop_s of them
        while len(times) < steps or (time.perf_counter() - t_loop < min_loop_s
                                     and len(times) < 20 * max(steps, 1)):
            t = time.perf_counter()
            r = compiled(*args)
            jax.block_until_ready(r)
            times.append(time.perf_counter() - t)
            del r
        e1 = energy.read()
        row["steps"] = len(times)
        row["peak_bytes_in_use"] = _memory_stats(dev).get("peak_bytes_in_use")
        row["step_ms"] = 1e3 * statistics.median(times) if times else None
        if e0 is not None and e1 is not None and times:
            row["energy_j_per_step"] = (e1 - e0) / len(times)
        if "step_ms" in ref and row["step_ms"] is not None:
            row["step_overhead"] = row["step_ms"] / ref["step_ms"] - 1.0
        elif row["step_ms"] is not None:
            ref["step_ms"] = row["step_ms"]
            row["step_overhead"] = 0.0
        if cfg["budget"] is not None and temp is not None and ref.get("temp"):
            row["compiled_vs_budget"] = temp / (cfg["budget"] / 100.0 * ref["temp"])
        return row

    # ---- (1) the reference, alone
    t0 = time.perf_counter()
    try:
        compiled = jax.jit(jax.value_and_grad(model.loss)).lower(*args).compile()
        compile_s = time.perf_counter() - t0
        row = measure(cfgs[0], compiled)
        row["jaxpr_flops"] = step_jaxpr_flops(jax.value_and_grad(model.loss))
    except Exception as e:  # noqa: BLE001
        out(cfgs[0], status="error", error=_err_text(e))
        for rest in cfgs[1:]:
            out(rest, status="skipped", error="the no-remat reference failed")
        return
    out(cfgs[0], status="ok", compile_s=compile_s, notes=energy.note, **row)
    del compiled
    compile_times = [compile_s]
    step_s = ref.get("step_ms", 0.0) / 1e3

    def measure_s() -> float:  # a measurement's time, generously (remat steps run longer)
        return (warmup + 1 + steps) * 2.5 * step_s + min_loop_s + 0.5

    def compile_est() -> float:  # with margin: planning threads slow compilation down
        return 1.5 * statistics.median(compile_times)

    todo = cfgs[1:]
    ready: dict[int, tuple] = {}  # cfg index -> (compiled, row fields, notes)

    def reserve(n_compile: int) -> float:
        """Seconds to keep for ``n_compile`` more compilations and for measuring what is
        compiled and the configuration at hand."""
        return n_compile * compile_est() + (len(ready) + 1) * measure_s()

    # ---- (2) plans in threads
    remat_idx = [i for i, c in enumerate(cfgs) if c["config"] == "remat"]

    def plan(cfg) -> dict:
        name, b = cfg["policy"], cfg["budget"]
        res: dict = {"notes": []}
        try:
            budget = None if b is None else f"{b:g}%"
            names = policies.option_names(name)
            opts = {}
            if budget is not None and "budget" in names:
                opts["budget"] = budget
            if "time_limit" in names:
                tl = time_limit
                lt = left()
                if lt != math.inf:  # leave time to compile this plan and measure everything
                    tl = max(1.0, min(tl, lt - reserve(1) - 5.0))
                opts["time_limit"] = res["time_limit_s"] = tl
            vg = remat.value_and_grad(model.loss, policies.get(name, **opts), budget=budget)
            t = time.perf_counter()
            try:
                res["app"] = vg.applied(*args)
            finally:
                res["plan_s"] = time.perf_counter() - t
            # the fidelity warnings, from the Applied object (warnings.catch_warnings is not
            # thread-safe; the child ignores RematFidelityWarning)
            res["notes"] += [str(w)[:200] for w in getattr(res["app"], "warnings", ())]
            res["vg"] = vg
        except Exception as e:  # noqa: BLE001
            res["error"] = _err_text(e)
        return res

    pool = None
    futures: dict[int, Any] = {}
    if plan_workers > 0 and remat_idx:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=min(plan_workers, len(remat_idx)),
                                  thread_name_prefix="plan")
        futures = {i: pool.submit(plan, cfgs[i]) for i in remat_idx}

    def skip(i, why):
        out(cfgs[i], status="skipped", error=why)
        todo.remove(cfgs[i])

    # ---- (3) compile: a plan as soon as it is ready, else the next built-in (while the
    # plans run), else wait for the next plan
    def compile_builtin(i):
        cfg = cfgs[i]
        lt = left()
        if lt < compile_est() + reserve(0):
            skip(i, f"deadline: {lt:.0f} s left, compiling takes about {compile_est():.0f} s")
            return
        t = time.perf_counter()
        try:
            pol = _save_policy(cfg["policy"])
            step = jax.value_and_grad(model.builtin_loss(pol))
            compiled = jax.jit(step).lower(*args).compile()
            c_s = time.perf_counter() - t
            compile_times.append(c_s)
            ready[i] = (compiled, {"compile_s": c_s, "jaxpr_flops": step_jaxpr_flops(step)}, [])
        except Exception as e:  # noqa: BLE001
            out(cfg, status="error", error=_err_text(e))
            todo.remove(cfg)

    def compile_remat(i):
        cfg = cfgs[i]
        if pool is not None:
            lt = left()
            wait = None if lt == math.inf else max(0.0, lt - reserve(0) - compile_est())
            try:
                res = futures[i].result(timeout=wait)
            except Exception:  # noqa: BLE001 - concurrent.futures.TimeoutError
                futures[i].cancel()
                skip(i, f"deadline: planning had not finished with {left():.0f} s left")
                return
        else:
            lt = left()
            if lt < compile_est() + reserve(0) + 3.0:
                skip(i, f"deadline: {lt:.0f} s left, compiling takes about {compile_est():.0f} s")
                return
            res = plan(cfg)
        partial = {k: res.get(k) for k in ("plan_s", "time_limit_s")}
        if "error" in res:
            out(cfg, status="error", error=res["error"], notes="; ".join(res["notes"]), **partial)
            todo.remove(cfg)
            return
        lt = left()
        if lt < compile_est() + reserve(0):
            skip(i, f"deadline: {lt:.0f} s left, compiling takes about {compile_est():.0f} s")
            return
        app, vg = res["app"], res["vg"]
        notes = list(res["notes"])
        meta = dict(getattr(app.plan, "meta", {}) or {})
        if meta.get("status"):
            notes.append(f"plan status {meta['status']}")
        if getattr(app.plan, "microbatches", 1) not in (1, None):
            notes.append(f"{app.plan.microbatches} micro-batches")
        notes += [f"scan saves {sorted(d.saved)} (group {d.group})"
                  for d in meta.get("scans", ())]
        extra = dict(
            partial,
            rounds=getattr(app, "rounds", None),
            compiled_temp_bytes_applied=getattr(app, "compiled_temp_bytes", None),
            jaxpr_flops=step_jaxpr_flops(vg),
            plan_budget_bytes=meta.get("budget"),
            plan_peak_bytes=meta.get("peak_bytes"),
            predicted_residual_bytes=getattr(app, "predicted_residual_bytes", None),
            residual_bytes=getattr(app, "residual_bytes", None),
        )
        t = time.perf_counter()
        try:
            compiled = jax.jit(vg).lower(*args).compile()
            extra["compile_s"] = time.perf_counter() - t
            compile_times.append(extra["compile_s"])
            ready[i] = (compiled, extra, notes)
        except Exception as e:  # noqa: BLE001
            out(cfg, status="error", error=_err_text(e), notes="; ".join(notes), **extra)
            todo.remove(cfg)

    for i, cfg in enumerate(cfgs):
        if cfg["config"] == "builtin" and cfg.get("skip"):
            skip(i, cfg["skip"])
    pending_b = [i for i, c in enumerate(cfgs) if c["config"] == "builtin" and not c.get("skip")]
    pending_r = list(remat_idx)
    while pending_b or pending_r:
        done_r = [i for i in pending_r if pool is not None and futures[i].done()]
        if done_r:
            pending_r.remove(done_r[0])
            compile_remat(done_r[0])
        elif pending_b:
            compile_builtin(pending_b.pop(0))
        else:
            compile_remat(pending_r.pop(0))

    # ---- (5) measure, one at a time, with no planning thread running
    still = ""
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
        if any(f.running() for f in futures.values()):
            still = "a planning thread given up on was still running"
    for i, cfg in enumerate(cfgs):
        if i not in ready:
            continue
        compiled, extra, notes = ready.pop(i)
        lt = left()
        if lt < measure_s():
            out(cfg, status="skipped", error=f"deadline: {lt:.0f} s left to measure", **extra)
            continue
        try:
            row = measure(cfg, compiled)
            row.update(extra)
            out(cfg, status="ok", notes="; ".join(n for n in [*notes, energy.note, still] if n),
                **row)
        except Exception as e:  # noqa: BLE001 - an out-of-memory step, say
            out(cfg, status="error", error=_err_text(e), notes="; ".join(notes), **extra)
        finally:
            del compiled
            gc.collect()
        todo.remove(cfg)
    ref.clear()


# --------------------------------------------------------------------------- parent
def _will_run_on_cpu() -> bool:
    plat = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if plat:
        return plat.split(",")[0] == "cpu"
    return shutil.which("nvidia-smi") is None


def _child_env() -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f != FLAG]
    if _will_run_on_cpu():
        flags.append(FLAG)
    env["XLA_FLAGS"] = " ".join(flags)
    env.pop("GPU_BENCH_REEXEC", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Csv:
    def __init__(self, path: Path, append: bool):
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not append or not path.exists() or path.stat().st_size == 0
        self.f = open(path, "w" if not append else "a", newline="")  # noqa: SIM115
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, extrasaction="ignore")
        if fresh:
            self.w.writeheader()
            self.f.flush()

    def write(self, row: dict) -> None:
        clean = {}
        for k in COLUMNS:
            v = row.get(k)
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                clean[k] = ""
            elif isinstance(v, float):
                clean[k] = f"{v:.6g}"
            else:
                clean[k] = v
        self.w.writerow(clean)
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def _pump(stream, q: queue.Queue, tag: str) -> None:
    for line in iter(stream.readline, ""):
        q.put((tag, line))
    q.put((tag, None))


def run_model(model: str, argv_rest: list[str], *, deadline_at: float | None,
              hard_deadline: float | None, sink, size: str) -> None:
    """Run one model's child process, writing its rows to ``sink`` as they arrive."""
    cmd = [sys.executable, "-m", "experiments.gpu_benchmark", "--one", model, *argv_rest]
    if deadline_at is not None:
        cmd += ["--deadline-at", f"{deadline_at:.3f}"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_child_env(), start_new_session=True)
    q: queue.Queue = queue.Queue()
    threads = [threading.Thread(target=_pump, args=(proc.stdout, q, "out"), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, q, "err"), daemon=True)]
    for t in threads:
        t.start()
    planned: list[tuple[str, str, str]] = []
    done: set[tuple[str, str, str]] = set()
    tail: list[str] = []
    killed = False
    try:
        killed = _follow(proc, q, model, hard_deadline, planned, done, tail, sink)
    finally:
        if proc.poll() is None:  # the parent was interrupted: take the child down with it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rc = proc.wait()
    base = dict(model=model, size=size)
    if killed:
        msg = f"child killed at the deadline after {time.time() - t0:.0f} s"
        missing = [p for p in planned if p not in done] or [("", "", "")]
        for c, p, b in missing:
            sink(dict(base, config=c or "*", policy=p, budget=b, status="killed", error=msg))
    elif rc != 0:
        msg = f"child exited with code {rc}: " + " | ".join(tail)[-400:]
        missing = [p for p in planned if p not in done] or [("", "", "")]
        for c, p, b in missing:
            sink(dict(base, config=c or "*", policy=p, budget=b, status="error", error=msg))


def _follow(proc, q, model, hard_deadline, planned, done, tail, sink) -> bool:
    """Pass the child's rows to ``sink`` until it ends; ``True`` when it was killed at
    ``hard_deadline``."""
    open_streams = 2
    while open_streams:
        timeout = None if hard_deadline is None else max(0.1, hard_deadline - time.time())
        try:
            tag, line = q.get(timeout=timeout)
        except queue.Empty:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group
            return True
        if line is None:
            open_streams -= 1
            continue
        if tag == "err":
            sys.stderr.write(f"[{model}] {line}")
            tail[:] = (tail + [line.rstrip()])[-8:]
            continue
        if line.startswith(PLAN):
            planned[:] = [tuple(x) for x in json.loads(line[len(PLAN):])]
        elif line.startswith(ROW):
            row = json.loads(line[len(ROW):])
            done.add((row.get("config", ""), row.get("policy", ""), row.get("budget", "")))
            sink(row)
            print(_summary(row), flush=True)
        else:
            sys.stdout.write(f"[{model}] {line}")
    return False


def _summary(row: dict) -> str:
    def f(k, fmt):
        v = row.get(k)
        return "" if v is None or v == "" else fmt.format(v)

    return (f"{row.get('model')} {row.get('config')} {row.get('policy') or ''}"
            f"{'@' + row['budget'] if row.get('budget') else ''}: {row.get('status')} "
            f"temp {f('temp_bytes', '{:.4g}')} x{f('temp_x', '{:.3f}')} "
            f"{f('step_ms', '{:.2f}')} ms err {f('grad_rel_err', '{:.1e}')} "
            f"{row.get('error') or ''}").strip()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_benchmark",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="experiments/results/gpu_benchmark.csv")
    p.add_argument("--size", choices=("full", "tiny"), default="full")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    p.add_argument("--budgets", default="30,50,70")
    p.add_argument("--builtins", default=",".join(BUILTINS),
                   help="JAX built-in policies to run per block ('' for none)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--time-limit", type=float, default=20.0,
                   help="seconds for a policy's time_limit option (checkmate)")
    p.add_argument("--plan-workers", type=int, default=4,
                   help="threads planning the project's policies while the built-ins compile "
                        "(0: plan one after the other)")
    p.add_argument("--energy-min-s", type=float, default=1.0,
                   help="with an energy counter, time at least this long (more steps)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="stop launching models / configurations after this many seconds")
    p.add_argument("--append", action="store_true", help="append to --out instead of starting it")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline-at", type=float, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    budgets = [float(x) for x in a.budgets.split(",") if x.strip()]
    pol_specs = [x for x in a.policies.split(",") if x.strip()]
    builtins = [x.strip() for x in a.builtins.split(",") if x.strip()]
    known = BUILTINS + tuple(HAND_POLICIES)
    unknown = [b for b in builtins if b not in known]
    if unknown:
        p.error(f"unknown built-in policies {unknown}; known: {', '.join(known)}")

    if a.one:
        def emit(row):
            if "__plan__" in row:
                sys.stdout.write(PLAN + json.dumps(row["__plan__"]) + "\n")
            else:
                sys.stdout.write(ROW + json.dumps(row, default=_json_default) + "\n")
            sys.stdout.flush()

        run_one(a.one, size=a.size, policy_specs=pol_specs, budgets=budgets, steps=a.steps,
                warmup=a.warmup, deadline_at=a.deadline_at, time_limit=a.time_limit, emit=emit,
                builtins=builtins, plan_workers=a.plan_workers, energy_min_s=a.energy_min_s)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # do not wait for a planning thread given up on at the deadline

    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; known: {', '.join(MODELS)}")
    parse_policies(pol_specs, budgets)  # fail fast on unknown policy names
    rest = ["--size", a.size, "--policies", a.policies, "--budgets", a.budgets,
            "--builtins", a.builtins,
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--time-limit", str(a.time_limit),
            "--plan-workers", str(a.plan_workers), "--energy-min-s", str(a.energy_min_s)]
    t0 = time.time()
    end = None if a.deadline_s is None else t0 + a.deadline_s
    sink = _Csv(Path(a.out), a.append)

    def _stop(signum, frame):  # timeout(1)'s SIGTERM: end the running child, keep the rows
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _stop)
    try:
        for k, m in enumerate(models):
            now = time.time()
            child_deadline = hard = None
            if end is not None:
                left = end - now
                if left < MIN_MODEL_S[a.size]:
                    sink.write(dict(model=m, size=a.size, config="*", status="skipped",
                                    error=f"deadline: {left:.0f} s left of {a.deadline_s:g} s, "
                                          "model not started"))
                    print(f"{m}: skipped ({left:.0f} s left)", flush=True)
                    continue
                # its share of what is left (what a model leaves unused goes to the next)
                w = [WEIGHTS.get(x, 1.0) if a.size == "full" else 1.0 for x in models[k:]]
                child_deadline = now + left * w[0] / sum(w)
                hard = min(end + GRACE_S, child_deadline + 4 * GRACE_S)
            run_model(m, rest, deadline_at=child_deadline, hard_deadline=hard, sink=sink.write,
                      size=a.size)
    finally:
        sink.close()
    print(f"wrote {a.out} in {time.time() - t0:.0f} s", flush=True)
    return 0


def _json_default(x):
    try:
        return float(x)
    except Exception:  # noqa: BLE001
        return str(x)


if __name__ == "__main__":
    sys.exit(main())
