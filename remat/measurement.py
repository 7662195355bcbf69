"""Measure what a plan really does to a training step: residuals, executor peak, XLA sizes,
FLOPs and wall time, each figure labelled with how it was obtained.

Honest memory on XLA:CPU needs ``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`` set
before JAX starts: without it XLA strips the optimization barriers of ``jax.checkpoint`` and CSE
merges the recomputation back, so ``memory_analysis()`` shows no saving (see
``docs/guide/measuring.md``).  :func:`measure` checks whether the
rematerialization survived compilation (the compiled HLO of the remat'd step keeps
``opt-barrier`` ops, or more dot/convolution ops than the un-remat'd step) and adds a warning
label when JAX emitted barriers that XLA then removed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["Measurement", "measure", "residual_bytes", "step_flops", "hlo_counts", "FLAG"]

from remat import microbatch
from remat._jax_compat import dce_jaxpr, open_jaxpr, saved_residuals
from remat.apply import value_and_grad
from remat.compiled_budget import FLAG  # noqa: E402  (re-exported)
from remat.core.plan import checkpoint_all_plan  # noqa: E402
from remat.extraction import extract
from remat.flops import jaxpr_flops
from remat.microbatch import microbatch_args


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Measured cost of one training step (``value_and_grad``) of a function under a plan.

    Byte figures are bytes; ``wall_s`` seconds; ``flops`` floating-point operations.

    Attributes:
      residual_bytes: bytes of the values the transformed function saves for its backward pass
        (JAX's private ``saved_residuals``, arguments excluded; per micro-batch).
      predicted_residual_bytes: what the plan says it keeps from the forward pass
        (:func:`remat.apply.predicted_residual_bytes`, per micro-batch); ``None`` without a plan.
        A realisation above it by more than 10% adds a warning.
      executor_peak_bytes: peak live activation bytes measured by :func:`remat.execute` running
        the plan op by op (per micro-batch), or ``None`` when not run.
      xla_temp_bytes, xla_argument_bytes, xla_output_bytes, xla_alias_bytes: the compiled step's
        ``memory_analysis()``.
      xla_total_bytes: ``argument + output + temp - alias`` (``peak_memory_in_bytes`` on CPU
        counts only arguments and outputs).
      flops: ``cost_analysis()["flops"]`` of the compiled step (a ``while``/``scan`` body counted
        once).
      jaxpr_flops: FLOPs of the step's jaxpr by :func:`step_flops` (loops times their trip
        count, recomputation included).
      wall_s: median wall time of ``runs`` calls of the compiled step (after one warm-up).
      compile_s: lowering + compilation time.
      plan_time_s: extraction + planning + application time (0 without a policy).
      remat_emitted: JAX emitted optimization barriers (the plan recomputes something).
      remat_survived: the compiled HLO kept the rematerialization (``None``: nothing to check).
      hlo_dots, hlo_dots_baseline, hlo_opt_barriers: compiled dot+convolution counts of this step
        and of the un-remat'd step, and opt-barrier count of this step.
      labels: how each figure was obtained; warnings under keys starting with ``"warning"``
        (``"warning"``: XLA removed the recomputation; ``"warning_fidelity"``: the realisation
        keeps more than the plan counted).
    """

    residual_bytes: int
    predicted_residual_bytes: int | None
    executor_peak_bytes: int | None
    xla_temp_bytes: int
    xla_argument_bytes: int
    xla_output_bytes: int
    xla_alias_bytes: int
    xla_total_bytes: int
    flops: float
    jaxpr_flops: float
    wall_s: float
    compile_s: float
    plan_time_s: float
    remat_emitted: bool
    remat_survived: bool | None
    hlo_dots: int
    hlo_dots_baseline: int
    hlo_opt_barriers: int
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def xla_total(self) -> int:
        """``xla_argument_bytes + xla_output_bytes + xla_temp_bytes - xla_alias_bytes``."""
        return self.xla_total_bytes

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(v for k, v in self.labels.items() if k.startswith("warning"))


def residual_bytes(fn: Callable, *args) -> tuple[int, str]:
    """Bytes of the residuals ``jax.vjp(fn, *args)`` saves, arguments excluded, and a label.

    Uses JAX's private ``saved_residuals`` (:mod:`remat._jax_compat`; abstract, runs nothing);
    falls back to the leaves of ``jax.vjp``'s pullback minus the input arrays (runs the forward
    pass) where the installed JAX lacks it.
    """

    try:
        res = saved_residuals(fn, *args)
        total = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a, d in res if "argument" not in d)
        return total, "jax saved_residuals (arguments excluded)"
    except ImportError:  # pragma: no cover - depends on the jax version
        _, pullback = jax.vjp(fn, *args)
        ids = {id(x) for x in jax.tree_util.tree_leaves(args)}
        leaves = [x for x in jax.tree_util.tree_leaves(pullback) if id(x) not in ids and hasattr(x, "nbytes")]
        return int(sum(x.nbytes for x in leaves)), "jax.vjp pullback leaves minus the inputs"


def step_flops(step: Callable, *args) -> float:
    """FLOPs of ``step(*args)`` counted on its jaxpr with :mod:`remat.flops` (a loop body times
    its trip count, recomputation included), after dead-code elimination (XLA never runs what
    no output reads, e.g. loop-invariant values JAX hoists out of a scan twice).  XLA's
    ``cost_analysis()`` counts the body of a ``while`` loop (a compiled ``lax.scan``) once, so
    it under-counts scanned models."""

    jaxpr = open_jaxpr(jax.make_jaxpr(step)(*args))
    try:
        jaxpr = dce_jaxpr(jaxpr)
    except Exception:  # noqa: BLE001 - private API; count the jaxpr as traced
        pass
    return float(jaxpr_flops(jaxpr))


_DOT = re.compile(r"\s(dot|convolution)\(")


def hlo_counts(compiled_text: str) -> tuple[int, int]:
    """``(dot + convolution ops, opt-barrier ops)`` in a compiled HLO module's text."""
    return len(_DOT.findall(compiled_text)), compiled_text.count("opt-barrier(")


def _cost_flops(compiled) -> float:
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    return float((ca or {}).get("flops", float("nan")))


def measure(
    fn: Callable,
    *args: Any,
    policy: Any = None,
    budget: Any = None,
    microbatches: int | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    stages: Any = "auto",
    reduction: str = "mean",
    runs: int = 5,
    executor: bool = True,
) -> Measurement:
    """Measure one ``value_and_grad`` step of ``fn`` under ``policy`` (``None``: no remat).

    Args:
      fn, args: the loss function and example (concrete) arguments.
      policy, budget, microbatches, argnums, has_aux, stages, reduction: as in
        :func:`remat.value_and_grad`.
      runs: timed calls of the compiled step (median reported).
      executor: also run the plan op by op with :func:`remat.execute` for its measured peak.

    Returns:
      A :class:`Measurement`.
    """

    labels: dict[str, str] = {}
    vg = value_and_grad(fn, policy, budget=budget, microbatches=microbatches, argnums=argnums,
                        has_aux=has_aux, stages=stages, reduction=reduction)
    app = vg.applied(*args)
    k = vg.microbatches

    margs = microbatch_args(args, argnums, k) if k > 1 else args

    # 1. saved residuals of the transformed function (one micro-batch), against the plan's
    res, how = residual_bytes(app.fn, *margs)
    labels["residual_bytes"] = how + (f"; one micro-batch of {k}" if k > 1 else "")
    if app.plan is not None:
        labels["predicted_residual_bytes"] = (
            "outputs of forward stages the plan computes once that the backward pass or a "
            "recomputation reads (remat.apply.predicted_residual_bytes)")
        if app.notes:
            labels["fidelity"] = "; ".join(app.notes)
        if app.warnings:
            labels["warning_fidelity"] = "; ".join(app.warnings)

    # 2. the op-by-op executor's measured peak
    ex_peak = None
    if executor:
        try:
            ex_peak, how = _executor_peak(fn, args, app, vg, margs)
            labels["executor_peak_bytes"] = how
        except Exception as err:  # noqa: BLE001 - reported, not hidden
            labels["executor_peak_bytes"] = f"not measured: {type(err).__name__}: {err}"
    else:
        labels["executor_peak_bytes"] = "not measured (executor=False)"

    # 3. compile the step; XLA sizes, FLOPs, barrier check
    t0 = time.perf_counter()
    lowered = jax.jit(vg).lower(*args)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    temp, arg = int(ma.temp_size_in_bytes), int(ma.argument_size_in_bytes)
    out, alias = int(ma.output_size_in_bytes), int(ma.alias_size_in_bytes)
    labels["xla"] = "compiled.memory_analysis() of jax.jit(step); total = argument + output + temp - alias"
    flops = _cost_flops(compiled)
    labels["flops"] = "compiled.cost_analysis()['flops'] of the step (loop bodies counted once)"
    jflops = step_flops(vg, *args)
    labels["jaxpr_flops"] = "remat.flops over the step's jaxpr (loops times their trip count)"
    dots, barriers = hlo_counts(compiled.as_text())
    emitted = lowered.as_text().count("optimization_barrier") > 0
    recomputes = app.recompute_dots > 0
    if emitted and recomputes:
        base = value_and_grad(fn, None, microbatches=microbatches, argnums=argnums,
                              has_aux=has_aux, reduction=reduction)
        base_dots, _ = hlo_counts(jax.jit(base).lower(*args).compile().as_text())
        # the recomputed dots must show up (half of them at least: XLA may still merge a few)
        survived = barriers > 0 or dots - base_dots >= max(1, app.recompute_dots // 2)
        flag_set = FLAG in os.environ.get("XLA_FLAGS", "")
        labels["remat_check"] = (
            f"compiled HLO: {dots} dot/conv ops vs {base_dots} without remat ({app.recompute_dots} "
            f"recomputed in the jaxpr), {barriers} opt-barriers; "
            f"XLA_FLAGS {'has' if flag_set else 'lacks'} {FLAG}"
        )
        if not survived:
            labels["warning"] = (
                "XLA removed the rematerialization (no opt-barrier and no extra dot ops survive "
                f"compilation); xla_* sizes do not reflect the plan. Set XLA_FLAGS={FLAG} before "
                "JAX starts (on CPU)."
            )
    else:
        base_dots, survived = dots, None
        labels["remat_check"] = "not applicable: the step recomputes no contraction"

    # 4. wall time of the compiled step
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(max(1, int(runs))):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    labels["wall_s"] = f"median of {len(times)} calls of the compiled step after one warm-up"
    return Measurement(
        residual_bytes=int(res),
        predicted_residual_bytes=app.predicted_residual_bytes,
        executor_peak_bytes=None if ex_peak is None else int(ex_peak),
        xla_temp_bytes=temp,
        xla_argument_bytes=arg,
        xla_output_bytes=out,
        xla_alias_bytes=alias,
        xla_total_bytes=arg + out + temp - alias,
        flops=flops,
        jaxpr_flops=jflops,
        wall_s=float(statistics.median(times)),
        compile_s=compile_s,
        plan_time_s=float(app.plan_time_s),
        remat_emitted=bool(emitted),
        remat_survived=survived,
        hlo_dots=int(dots),
        hlo_dots_baseline=int(base_dots),
        hlo_opt_barriers=int(barriers),
        labels=labels,
    )


def _executor_peak(fn, args, app, vg, margs) -> tuple[int, str]:
    import dataclasses as dc


    loss = fn if not vg.has_aux else (lambda *a: fn(*a)[0])
    graph, plan = app.graph, app.plan
    if graph is None:

        graph = extract(loss, *margs, stages=vg.stages, argnums=vg.argnums)
        plan = checkpoint_all_plan(graph)
        what = "checkpoint-all plan (no policy)"
    else:
        what = f"plan of {plan.meta.get('policy')}"
    plan = dc.replace(plan, microbatches=vg.microbatches)
    _, _, st = microbatch.execute(graph, plan, *args, argnums=vg.argnums, reduction=vg.reduction)
    per = "" if vg.microbatches == 1 else f", max over {vg.microbatches} micro-batches"
    return int(st.peak_bytes), f"remat.execute measured live bytes, {what}{per}"
