"""The drop-in's budget on XLA's bytes: plan, compile, read the temp, correct, re-plan.

A policy plans under a *modelled* budget (the graph's replayed peak).  What a user can act on is
the compiled step's temporary bytes, ``memory_analysis().temp_size_in_bytes`` of
``jax.jit(value_and_grad(f))`` on the backend that runs it.  The two differ where XLA fuses
values away or buffers gradients its own way (3-6x on GPU transformers), so :func:`fit`
closes the loop: with ``T`` the user's budget in compiled bytes,

1. plan under the internal budget ``b_0 = T * peak_model / temp_no_remat`` (the ratio of the
   modelled to the compiled no-remat step); with a predictor (the drop-in's: XLA's temp
   predicted by :mod:`remat.xla_memory`, calibrated by the no-remat step's compiled over
   predicted temp), first step the same way on up to ``MAX_PREDICTIONS`` predicted temps,
   compiling nothing, and start from the largest internal budget predicted to fit;
2. lower and compile the applied plan ahead of time (nothing runs), read its temp ``t_k``;
3. keep the best round with ``t_k <= T (1 + tol)`` (:data:`TOLERANCE`, 0: the budget is a
   cap): of least modelled compute cost where the caller gives costs, as the drop-in does,
   else of the largest temp; stop when one uses at least ``ACCEPT * T`` or recomputes nothing;
   otherwise ``b_{k+1} = b_k * T / t_k`` (the local ratio) on the first compile, then the
   secant through the last two compiled rounds aimed at ``(1 + ACCEPT) T / 2``, kept inside
   the bracket of internal budgets known to fit / not to fit (their geometric mean when it
   falls outside), from which predictions rescaled by the compile's error step on (1.);
4. at most ``max_compiles`` compiles of distinct plans (a plan met again reuses its figure;
   :func:`plan_key`: where paging is offloaded, a plan's page-outs make it distinct); when
   none fits, compile the plan at the caller's ceiling (an internal budget at which nothing is
   recomputed: the compiled temp is not monotone in the internal budget, and a plan that keeps
   every stage can compile smaller than one that recomputes, where XLA holds only what the
   backward reads), then the plan at the policy's smallest feasible internal budget, and raise
   :class:`~remat.core.errors.InfeasibleBudgetError` naming the smallest compiled temp reached.

Every round is recorded (:class:`Round`).  The figures are *compiled*, not measured or
modelled, and count device memory only: where a plan's page-outs are offloaded
(:mod:`remat.offload`), the host copies are not in the temp, so a paging plan is held to the
budget by the device bytes it leaves.  XLA:CPU keeps ``jax.checkpoint`` only with the
``cse_barrier_expander`` pass off on some JAX versions (``remat.measurement.FLAG``);
:func:`keeps_checkpoint` probes the backend once per process, and where it does not keep it the
budget cannot be steered (the caller falls back to the modelled budget and says so).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from remat.core.budget import Modelled, resolve_against
from remat.core.errors import InfeasibleBudgetError, RematError, format_bytes

__all__ = ["FLAG", "budget_semantics", "compiled_notes", "recomputes", "takes_budget", "Round", "Fit", "ACCEPT", "TOLERANCE", "NO_SAVING", "MAX_COMPILES", "temp_bytes", "step_compiled", "step_temp_bytes",
           "keeps_checkpoint", "plan_key", "fit"]

FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
"""The ``XLA_FLAGS`` value that keeps ``jax.checkpoint`` on XLA:CPU (set before JAX starts)."""
TOLERANCE = 0.0
"""A round fits when its compiled temp is at most the budget times ``1 + TOLERANCE``: the
budget is a cap (a caller of :func:`fit` may pass a looser ``tolerance``)."""
NO_SAVING = 0.95
"""A plan that recomputes and compiles to at least this fraction of the no-remat temp saves
nothing worth its recomputation (a warning)."""
ACCEPT = 0.95
"""The loop stops at a fitting round that uses at least this fraction of the budget."""
MAX_COMPILES = 4
"""Compiles of distinct plans per fit (the no-remat baseline not counted)."""
MAX_PREDICTIONS = 4
"""Predictions (no compile) per fit that choose its first internal budget, when it has a
predictor."""


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of the closed loop.

    Attributes:
      internal_budget: the modelled budget the policy planned under, bytes.
      planned_peak: the plan's modelled peak (``plan.meta["peak"]``), bytes, or ``None``.
      compiled_temp: the compiled step's temp bytes; ``None`` when the policy refused the
        internal budget (``note`` says why).
      reused: the plan equals an earlier round's, whose compiled figure is reused (no compile).
      note: the policy's typed error at this budget, if any.
      predicted_temp: a round of the predicted search (``compiled_temp`` ``None``): the
        calibrated predicted temp of the plan, bytes (nothing compiled).
    """

    internal_budget: int
    planned_peak: int | None
    compiled_temp: int | None
    reused: bool = False
    note: str = ""
    predicted_temp: int | None = None


@dataclasses.dataclass(frozen=True)
class Fit:
    """The outcome of :func:`fit`: the chosen round's applied object and every round."""

    applied: Any
    compiled_temp: int
    rounds: tuple[Round, ...]
    compiles: int


def temp_bytes(compiled) -> int:
    """``memory_analysis().temp_size_in_bytes`` of a compiled executable."""
    return int(compiled.memory_analysis().temp_size_in_bytes)


def step_compiled(fn: Callable, abstract: Sequence[Any], *, argnums: int | Sequence[int] = 0,
                  has_aux: bool = False):
    """``jax.jit(jax.value_and_grad(fn, argnums, has_aux))`` lowered and compiled ahead of time at
    the abstract arguments (nothing runs).  Arguments carrying shardings
    (:func:`remat.sharding.abstract`) compile the SPMD program: its figures are per device."""
    step = jax.jit(jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux))
    return step.lower(*abstract).compile()


def step_temp_bytes(fn: Callable, abstract: Sequence[Any], *, argnums: int | Sequence[int] = 0,
                    has_aux: bool = False) -> int:
    """Compiled temp bytes of ``jax.jit(jax.value_and_grad(fn, argnums, has_aux))`` at the
    abstract arguments (per device for sharded arguments, :func:`step_compiled`)."""
    return temp_bytes(step_compiled(fn, abstract, argnums=argnums, has_aux=has_aux))


@functools.cache
def keeps_checkpoint(platform: str | None = None) -> bool:
    """Whether the backend's compiler keeps ``jax.checkpoint``'s recomputation (probed once per
    process): a 16-layer tanh chain checkpointed in 4 segments must compile to at most 0.8x the
    temp of the plain chain."""
    dev = jax.devices(platform)[0] if platform else jax.devices()[0]

    def chain(ws, x, segments):
        per = len(ws) // segments

        def seg(ws_, h):
            for w in ws_:
                h = jnp.tanh(h @ w)
            return h

        for s in range(segments):
            part = ws[s * per:(s + 1) * per]
            h = jax.checkpoint(seg)(part, x) if segments > 1 else seg(part, x)
            x = h
        return jnp.sum(x * x)

    ws = [jax.ShapeDtypeStruct((128, 128), jnp.float32)] * 16
    x = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    with jax.default_device(dev):
        plain = step_temp_bytes(lambda w, h: chain(w, h, 1), (ws, x))
        seg = step_temp_bytes(lambda w, h: chain(w, h, 4), (ws, x))
    return seg <= 0.8 * plain


def plan_key(app) -> bytes:
    """What makes two applied plans compile alike: ``R``, the micro-batches, the checkpoint
    regions (``meta["regions"]``), the scan decisions (``meta["scans"]``), segment trimming
    and, where the step offloads paged values (``app.offloaded_bytes``), ``page_out``; plans
    differing in paging alone compile alike where paging is kept on the device."""
    plan = app.plan
    meta = plan.meta
    scans = tuple((d.leaf, tuple(sorted(d.saved)), d.group)
                  for d in (getattr(plan, "scans", None) or meta.get("scans") or ()))
    applied_as = (meta.get("regions") or (), scans, meta.get("trim_segments"))
    key = (np.asarray(plan.R).tobytes() + bytes(str(plan.microbatches), "ascii")
           + repr(applied_as).encode())
    if getattr(app, "offloaded_bytes", 0) and getattr(plan, "page_out", None) is not None:
        key += b"page_out" + np.asarray(plan.page_out).tobytes()
    return key


def _next_budget(b: int, target: int, temp: int, lo: int, hi: float, power: int = 1,
                 prev: tuple[int, int] | None = None, aim: float = 1.0) -> int:
    """The secant through ``prev`` (an earlier ``(budget, temp)``) and ``(b, temp)`` aimed at
    ``aim * target``, where the two differ and the temp grows with the budget; else
    ``b (target / temp)^power`` (the local ratio; ``power`` doubles each time a step leaves
    the figure as it was, so a step too small to change it grows).  Outside the bracket
    ``(lo, hi)`` of internal budgets known to fit / not to fit: its geometric mean (twice
    ``b`` while ``hi`` is open)."""
    if prev is not None and prev[0] != b and (temp - prev[1]) * (b - prev[0]) > 0:
        nxt = int(b + (aim * target - temp) * (b - prev[0]) / (temp - prev[1]))
    else:
        ratio = (target / max(temp, 1)) ** min(power, 64)
        nxt = int(b * ratio) if math.isfinite(b * ratio) else -1
    if not lo < nxt < hi:
        nxt = int(math.sqrt(max(lo, 1) * hi)) if math.isfinite(hi) else 2 * max(b, lo, 1)
    return nxt


def _predicted_start(plan_at, predict_of, recomputes_of, target: int, first_budget: int,
                     accept: float, max_predictions: int, rounds: list,
                     bracket: tuple[int, float] = (0, math.inf), onward: bool = False) -> int:
    """The internal budget to compile next: the largest of the budgets tried (the same ratio
    steps as the compiled loop, inside ``bracket``, the internal budgets known to fit / not
    to fit) whose plan's predicted temp is within ``target``, else ``first_budget`` (with
    ``onward``, the step after the last budget tried); tries stop when ``rounds`` holds
    ``max_predictions`` predicted rounds, each recorded there."""
    lo, hi = bracket
    b, best = max(int(first_budget), 0), None
    tried_min = False
    power, prev_p = 1, None
    for _ in range(2 * max_predictions):
        if sum(r.predicted_temp is not None for r in rounds) >= max_predictions:
            break
        try:
            app = plan_at(b)
        except InfeasibleBudgetError as e:
            rounds.append(Round(b, None, None, note=str(e)))
            if tried_min or not e.min_feasible_bytes > b or not math.isfinite(e.min_feasible_bytes):
                break
            b, tried_min = int(math.ceil(e.min_feasible_bytes)), True
            continue
        try:
            p = int(predict_of(app))
        except RematError as e:  # the model does not predict this plan: compile from here
            rounds.append(Round(b, app.plan.meta.get("peak_bytes"), None,
                                note=f"not predicted: {e}"))
            break
        rounds.append(Round(b, app.plan.meta.get("peak_bytes"), None, predicted_temp=p))
        if p <= target:
            lo, best = max(lo, b), max(b, best or 0)
            if p >= accept * target or not recomputes_of(app):
                break
        else:
            hi = min(hi, b)
        power, prev_p = (2 * power if p == prev_p else 1), p
        nxt = _next_budget(b, target, p, lo, hi, power)
        if nxt == b:
            break
        b = nxt
    if best is None:
        return b if onward else int(first_budget)
    return best


def fit(plan_at: Callable[[int], Any], temp_of: Callable[[Any], int], target: int, *,
        first_budget: int, recomputes: Callable[[Any], bool], policy_name: str = "the policy",
        max_compiles: int = MAX_COMPILES, tolerance: float = TOLERANCE,
        accept: float = ACCEPT, predict_of: Callable[[Any], int] | None = None,
        max_predictions: int = MAX_PREDICTIONS,
        cost_of: Callable[[Any], float] | None = None,
        ceiling_budget: int | None = None) -> Fit:
    """The closed loop (module docstring).

    Args:
      plan_at: ``plan_at(b)`` -> an applied plan made under the modelled budget ``b`` bytes;
        raises :class:`InfeasibleBudgetError` (``min_feasible_bytes`` modelled) below the
        policy's smallest feasible budget.  Its result has ``.plan`` (``plan.R``, ``plan.meta``).
      temp_of: compiled temp bytes of an applied plan's step.
      target: the user's budget ``T``, compiled temp bytes.
      first_budget: ``b_0``, modelled bytes.
      recomputes: whether an applied plan recomputes anything (a fitting plan that does not
        needs no larger budget).
      predict_of: an applied plan's predicted compiled temp, bytes, without compiling (a
        calibrated :func:`remat.xla_memory.predict_temp_bytes`); when given, up to
        ``max_predictions`` plans are predicted first and the loop compiles from the largest
        internal budget predicted to fit, and after each compile up to ``max_predictions // 2``
        more, scaled by that compile's compiled over predicted temp, choose the next budget
        (every plan it returns is still compiled).
      cost_of: an applied plan's modelled compute cost; when given, the loop returns the
        fitting round of least cost (then the largest temp), else the fitting round of the
        largest temp.  A plan that keeps more may compile smaller than one that recomputes
        (XLA drops what a kept stage does not need); its cost says it is the better plan.
      ceiling_budget: a modelled budget at which the policy recomputes nothing (the drop-in's:
        the graph's no-remat peak); when no round fits, its plan is compiled before the loop
        refuses (one compile over ``max_compiles``), and returned if it fits.

    Raises:
      InfeasibleBudgetError: no plan compiled within ``T (1 + tolerance)``; ``min_feasible_bytes``
        is the smallest compiled temp of the plans compiled (the policy's smallest feasible
        plan and the ceiling's among them).
    """
    limit = target * (1 + tolerance)
    rounds: list[Round] = []
    seen: dict[bytes, int] = {}
    best, best_t = None, -1

    def better(app, t) -> bool:
        if best is None:
            return True
        if cost_of is not None:
            c, cb = cost_of(app), cost_of(best)
            if c != cb:
                return c < cb
        return t > best_t

    lo, hi = 0, math.inf  # internal budgets known to fit / not to fit
    compiles = 0
    tried_min = False
    power, prev_t, prev_pt = 1, None, None
    b = max(int(first_budget), 0)
    if predict_of is not None and max_predictions > 0:
        made: dict[int, Any] = {}
        plan_once = plan_at

        def plan_at(b_, _plan=plan_once, _made=made):  # the predicted search's plans are reused
            if b_ not in _made:
                _made[b_] = _plan(b_)
            return _made[b_]

        b = _predicted_start(plan_at, predict_of, recomputes, target, b, accept, max_predictions,
                             rounds)

    def _recalibrated_next(app, t: int, nxt: int, bracket) -> int:
        """After a compile: the predictor scaled by this plan's compiled over predicted temp
        (its error nearest the plans to come) steps from ``nxt`` on up to
        ``max_predictions // 2`` more predictions (:func:`_predicted_start`); where none is
        predicted to fit, the compile goes past the last of them."""
        try:
            scale = t / max(int(predict_of(app)), 1)
        except RematError:
            return nxt
        done = sum(r.predicted_temp is not None for r in rounds)
        return _predicted_start(plan_at, lambda a: scale * predict_of(a), recomputes, target, nxt,
                                accept, done + max(max_predictions // 2, 1), rounds, bracket,
                                onward=True)
    for _ in range(3 * max_compiles + 2):  # planning refusals cost no compile
        try:
            app = plan_at(b)
        except InfeasibleBudgetError as e:
            rounds.append(Round(b, None, None, note=str(e)))
            if tried_min or e.min_feasible_bytes <= b:
                break
            b, tried_min = int(math.ceil(e.min_feasible_bytes)), True
            continue
        key = plan_key(app)
        peak = app.plan.meta.get("peak_bytes")
        if key in seen:
            t = seen[key]
            rounds.append(Round(b, peak, t, reused=True))
        else:
            if compiles >= max_compiles:
                break
            t = int(temp_of(app))
            compiles += 1
            seen[key] = t
            rounds.append(Round(b, peak, t))
        if t <= limit:
            lo = max(lo, b)
            if better(app, t):
                best, best_t = app, t
            if t >= accept * target or not recomputes(app):
                break
        else:
            hi = min(hi, b)
        stalled = rounds[-1].reused or t == prev_t  # the step did not change the figure
        power, prev_t = (2 * power if stalled else 1), t
        nxt = _next_budget(b, target, t, lo, hi, power, None if stalled else prev_pt,
                           aim=(1 + accept) / 2)
        prev_pt = (b, t)
        if nxt == b or (rounds[-1].reused and nxt in {r.internal_budget for r in rounds}):
            if best is not None or tried_min:
                break
            nxt = 0  # nothing fits yet: go to the policy's smallest budget
        elif predict_of is not None and not rounds[-1].reused and lo < nxt < hi:
            nxt = _recalibrated_next(app, t, nxt, (lo, hi))
        b = nxt

    def compile_round(app, b: int) -> int:
        """The compiled temp of ``app`` (an earlier round's figure where it was met), recorded
        as a round at internal budget ``b``."""
        nonlocal compiles
        key = plan_key(app)
        reused = key in seen
        if not reused:
            seen[key] = int(temp_of(app))
            compiles += 1
        rounds.append(Round(b, app.plan.meta.get("peak_bytes"), seen[key], reused=reused))
        return seen[key]

    if best is None and ceiling_budget is not None:
        # the compiled temp is not monotone in the internal budget: try the plan that keeps all
        try:
            app = plan_at(int(ceiling_budget))
        except InfeasibleBudgetError as e:
            rounds.append(Round(int(ceiling_budget), None, None, note=str(e)))
            app = None
        if app is not None:
            t = compile_round(app, int(ceiling_budget))
            if t <= limit:
                best, best_t = app, t
    if best is None and not tried_min and compiles < max_compiles + 2:
        # the smallest compiled temp this policy reaches: plan at its smallest feasible budget
        try:
            app = plan_at(0)
        except InfeasibleBudgetError as e:
            rounds.append(Round(0, None, None, note=str(e)))
            try:
                app = plan_at(int(math.ceil(e.min_feasible_bytes)))
            except InfeasibleBudgetError as e2:
                rounds.append(Round(int(e.min_feasible_bytes), None, None, note=str(e2)))
                app = None
        if app is not None:
            t = compile_round(app, int(app.plan.meta.get("budget") or 0))
            if t <= limit:
                best, best_t = app, t
    if best is None:
        reached = [r.compiled_temp for r in rounds if r.compiled_temp is not None]
        budgets = [r.internal_budget for r in rounds if r.compiled_temp is not None]
        if not reached:  # the policy refused every internal budget: its own error says why
            raise InfeasibleBudgetError(target, math.inf, f"{policy_name} refused every internal "
                                        f"budget: {rounds[-1].note if rounds else ''}")
        smallest = min(reached)
        at = min((r for r in rounds if r.compiled_temp == smallest), key=lambda r: r.internal_budget)
        raise InfeasibleBudgetError(
            target, smallest,
            f"the compiled step's temp: the smallest of {compiles} distinct plan(s) of "
            f"{policy_name} compiled (planned under modelled budgets {format_bytes(min(budgets))} "
            f"to {format_bytes(max(budgets))}), reached at {format_bytes(at.internal_budget)}")
    return Fit(best, best_t, tuple(rounds), compiles)


def takes_budget(pol) -> bool:
    """Whether ``pol`` has a ``budget`` option (a policy dataclass field)."""
    return dataclasses.is_dataclass(pol) and any(f.name == "budget"
                                                for f in dataclasses.fields(pol))


def recomputes(app) -> bool:
    """Whether an applied plan computes some forward value twice or decides a scan."""
    return bool((np.asarray(app.plan.R).sum(axis=0) >= 2).any() or app.plan.meta.get("scans"))


def budget_semantics(budget, plan, baseline_temp: Callable[[], int]):
    """``(semantics, target bytes, baseline temp bytes, notes)`` of a drop-in budget:
    ``"compiled"`` (bytes of the compiled step; ``baseline_temp()`` compiles the no-remat step),
    ``"modelled"`` (the graph's peak: a :class:`~remat.core.budget.Modelled` budget, or none given and
    the policy's own), ``"modelled-fallback"`` (the compiler undoes ``jax.checkpoint``) or
    ``"none"`` (a plan was given)."""
    if plan is not None:
        return "none", None, None, []
    if budget is None or isinstance(budget, Modelled):
        return "modelled", None, None, []
    platform = jax.default_backend()
    if not keeps_checkpoint(platform):
        msg = (f"warning: the {platform} compiler undoes jax.checkpoint here (XLA:CPU needs "
               f"XLA_FLAGS={FLAG} before JAX starts), so the budget {budget!r} is applied to the "
               "graph's modelled peak, not to the compiled step's bytes")
        return "modelled-fallback", None, None, [msg]
    baseline = int(baseline_temp())
    return "compiled", resolve_against(budget, baseline), baseline, []


def compiled_notes(app, compiled, target, baseline, rounds) -> list[str]:
    """What the compiled figures say: a plan over the budget, a plan that keeps less than it
    may, a plan made below the policy's modelled floor (``meta["over_modelled_budget"]``), a
    predicted saving the compiled step does not show (``"warning: "`` prefixed)."""
    notes = []
    if rounds:
        notes.append(f"closed loop: {len(rounds)} round(s), compiled temp "
                     f"{format_bytes(compiled)} for a budget of {format_bytes(target)} "
                     f"(no remat {format_bytes(baseline)})")
    if target is not None and compiled > target * (1 + TOLERANCE):
        notes.append(f"warning: the plan compiles to {format_bytes(compiled)} of temp, over the "
                     f"budget {format_bytes(target)} (this policy takes no budget)")
    elif target is not None and compiled < 0.6 * target:
        why = (f"{getattr(app.plan, 'meta', {}).get('policy')} found no plan between it and "
               "the budget within the closed loop's compiles") if recomputes(app) else (
            "the plan keeps every stage output, and the drop-in recomputes the cheap work inside "
            "kept stages (segment trimming), so even keeping everything compiles below the "
            "budget; keeping values inside stages is an op-level choice stage plans cannot make")
        notes.append(f"the plan uses {compiled / max(target, 1):.2f}x of the budget: {why}")
    over = getattr(app.plan, "meta", {}).get("over_modelled_budget") if app.plan else None
    if over:
        notes.append(f"the plan was made below the policy's modelled floor: its modelled peak is "
                     f"{format_bytes(over)} over the internal budget it was planned under, "
                     f"and its compiled temp is {format_bytes(compiled)}")
    if recomputes(app) and compiled >= NO_SAVING * baseline:
        notes.append(f"warning: the plan recomputes but its compiled temp "
                     f"{format_bytes(compiled)} saves nothing against the no-remat step's "
                     f"{format_bytes(baseline)}")
    return notes
