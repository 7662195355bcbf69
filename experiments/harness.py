"""Sweeps over (model, batch, policy, budget, device) with one tidy row each, resumable, on one
machine or as Ray tasks.

``sweep(models, policies, budgets, out=...)`` writes a row as soon as it is finished (CSV, one
``flush`` per row), so an interrupted sweep keeps every finished row, and a re-run skips the rows
already in ``out`` (the key is :data:`KEY`).  A truncated last line (a process killed while
writing) is dropped on resume.  A store written with fewer columns (an older :data:`FIELDS`) is
moved to the current columns on resume, its rows kept with the new columns blank and not re-run
(delete a row to measure it again).  Parquet (``out`` ending in ``.parquet``, or ``formats``) is
written from the same rows, with typed columns, next to the CSV that stays the resumable store.

``backend="ray"`` runs every row as a Ray task (``ray.init(address=...)`` for an existing
cluster, a local one when ``address`` is ``None``); each task builds its policy with its own
``threads`` (default 1) and ``time_limit``, each worker builds each model once (a per-process
cache), and rows are written to the same table as tasks complete.  Ray and pyarrow are the
optional extra ``[cluster]`` and are imported only when asked for
(:class:`remat.core.errors.MissingDependencyError` otherwise).

Columns (:data:`FIELDS`; bytes are activation bytes, parameters excluded; times in seconds of
the device model, or the graph's own cost units without a device; energy in joules):
``peak_bytes`` (simulated peak, ``remat.simulate``), ``predicted_residual_bytes`` /
``realised_residual_bytes`` (bytes the plan keeps for the backward pass, and what
``jax.checkpoint`` really saves, ``remat.apply_plan``; only for models given with their function
and ``residuals=True``), ``executor_peak_bytes`` / ``executor_grad_max_rel_err`` (measured
peak of the plan run stage by stage by :func:`remat.execute` on the model's own ``(params,
batch)``, and its gradients' error; only for models given with their function and
``execute=True``, see :func:`evaluate`), ``overhead`` (compute time over checkpoint-all's, eq. 1
of Checkmate), ``compute_time_s``, ``energy_j`` (compute + paging), ``paging_time_s``,
``paging_energy_j``, ``bytes_paged``, solver ``status``/``gap``/``objective``/``lower_bound``
(in ``objective_unit``: seconds, joules or bytes, per policy)/``solve_time_s``, and
``min_feasible_bytes`` for an infeasible budget.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from remat.core.errors import (
    InfeasibleBudgetError,
    MissingDependencyError,
    NotApplicableError,
    RematError,
)

#: The row key: one row per (model, batch, policy, budget, device).
KEY = ("model", "batch_size", "policy", "budget_spec", "device")

_INT = {"batch_size", "budget_bytes", "no_remat_peak_bytes", "peak_bytes",
        "predicted_residual_bytes", "realised_residual_bytes", "executor_peak_bytes",
        "recomputations", "bytes_paged", "min_feasible_bytes"}
_FLOAT = {"overhead", "compute_time_s", "energy_j", "paging_time_s", "paging_energy_j",
          "solve_time_s", "gap", "objective", "lower_bound", "row_time_s",
          "executor_grad_max_rel_err"}

FIELDS = [
    *KEY, "budget_bytes", "no_remat_peak_bytes", "status", "peak_bytes",
    "predicted_residual_bytes", "realised_residual_bytes", "executor_peak_bytes",
    "executor_grad_max_rel_err", "overhead", "compute_time_s",
    "energy_j", "paging_time_s", "paging_energy_j", "bytes_paged", "recomputations",
    "solve_time_s", "gap", "objective", "lower_bound", "objective_unit", "min_feasible_bytes",
    "row_time_s", "error",
]

#: Columns that do not depend on timing (equal across backends and re-runs).
DETERMINISTIC = [
    *KEY, "budget_bytes", "no_remat_peak_bytes", "status", "peak_bytes",
    "predicted_residual_bytes", "realised_residual_bytes", "executor_peak_bytes", "overhead",
    "compute_time_s", "energy_j", "paging_time_s", "paging_energy_j", "bytes_paged",
    "recomputations", "min_feasible_bytes",
]


def _require(package: str, what: str):
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise MissingDependencyError(package, "cluster", what) from None


def _key(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple("" if row.get(k) is None else str(row.get(k, "")) for k in KEY)


def _typed(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row with numbers as ``int``/``float`` and blanks as ``None`` (CSV reads give str)."""
    out: dict[str, Any] = {}
    for k in FIELDS:
        v = row.get(k)
        if v is None or v == "":
            out[k] = None
        elif k in _INT:
            out[k] = int(float(v))
        elif k in _FLOAT:
            out[k] = float(v)
        else:
            out[k] = str(v)
    return out


def read_rows(path: str | os.PathLike, *, typed: bool = False) -> list[dict]:
    """Rows already in a results CSV (empty list when the file does not exist); ``typed``
    converts numbers (see :func:`_typed`)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [_typed(r) for r in rows] if typed else rows


def _repair(path: str) -> None:
    """Drop a truncated last line and move a file with another header to :data:`FIELDS`."""
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if header != FIELDS:
        rows = read_rows(path)
        tmp = f"{path}.tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, path)


def write_parquet(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Write rows (str or typed) to Parquet with one typed column per :data:`FIELDS` entry."""
    pa = _require("pyarrow", "Parquet output")
    pq = _require("pyarrow.parquet", "Parquet output")
    typed = [_typed(r) for r in rows]
    kinds = {k: pa.int64() if k in _INT else pa.float64() if k in _FLOAT else pa.string()
             for k in FIELDS}
    schema = pa.schema([(k, kinds[k]) for k in FIELDS])
    table = pa.table({k: pa.array([r[k] for r in typed], type=kinds[k]) for k in FIELDS},
                     schema=schema)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(table, str(path))


def reference_value_and_grad(graph, fn_args: tuple) -> tuple:
    """``jax.jit(jax.value_and_grad(loss_fn, argnums))(*args)`` of ``fn_args = (loss_fn, args)``,
    with the ``argnums``/``has_aux`` ``graph`` was extracted with (the executor's reference)."""
    import jax

    prog = graph.program
    fn = jax.value_and_grad(fn_args[0], argnums=prog.argnums,
                            has_aux=getattr(prog, "has_aux", False))
    return jax.block_until_ready(jax.jit(fn)(*fn_args[1]))


def max_rel_err(got: Any, ref: Any) -> float:
    """Largest normwise relative error over the leaves of two pytrees:
    ``max_leaf max|got - ref| / max(max|ref|, 1e-30)`` (``inf`` when the structures or shapes
    differ).  Per leaf, not per element, so entries near zero do not blow it up."""
    import jax
    import numpy as np

    gl, gt = jax.tree_util.tree_flatten(got)
    rl, rt = jax.tree_util.tree_flatten(ref)
    if gt != rt:
        return float("inf")
    err = 0.0
    for a, b in zip(gl, rl):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return float("inf")
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-30)
        err = max(err, float(np.max(np.abs(a - b), initial=0.0)) / scale)
    return err


def evaluate(graph, policy, budget, *, device=None, model: str = "", policy_name: str = "",
             batch_size: int | None = None, fn_args: tuple | None = None,
             residuals: bool = True, execute: bool = False,
             reference: tuple | Callable[[], tuple] | None = None) -> dict:
    """Plan ``graph`` with ``policy`` at ``budget`` and simulate; never raises for an error of
    the policy (the row records it in ``status``/``error``).

    Args:
      graph: the training graph.
      policy: an object with ``plan(graph, budget=...)``.
      budget: bytes or a spec (``"60%"``, ``"512MiB"``).
      device: a ``remat.devices`` profile (or name) for modelled time/energy/paging, or ``None``.
      fn_args: ``(loss_fn, args)`` the graph was extracted from (``args = (params, batch)``,
        concrete arrays: for a zoo model its random initial parameters and random batch).
      residuals: with ``fn_args``, add the realised residual bytes of the plan applied with
        ``jax.checkpoint`` (``remat.apply_plan``).
      execute: with ``fn_args``, run the plan with :func:`remat.execute` on ``args`` (not for
        ``microbatches > 1``; a failure is noted in ``error``).  ``executor_peak_bytes``: its
        *measured* peak, bytes of live device arrays above those alive at its entry, so
        parameters, batch and anything else already resident are excluded: the quantity of
        ``peak_bytes`` (outputs of resident nodes), but on real buffers, not summed from the
        graph's ``out_bytes``; finished gradients (copied to the host) and XLA's scratch inside
        a stage are in neither.  For graphs from :func:`remat.extract` the two are equal
        (checked on every zoo model at tiny sizes), so a difference flags wrong node sizes or
        an executor holding more than the plan says.  ``executor_grad_max_rel_err``:
        :func:`max_rel_err` of its ``(value, grads)`` against ``jax.value_and_grad`` of the
        original (float32: about 1e-6 for a correct plan).
      reference: ``jax.value_and_grad``'s ``(value, grads)`` on ``args``, or a function
        returning it (called only when needed; default: :func:`reference_value_and_grad`).

    Returns:
      One row (see :data:`FIELDS`; bytes, seconds, joules).
    """
    import remat

    t_row = time.perf_counter()
    dev_name = "" if device is None else getattr(device, "name", str(device))
    row: dict[str, Any] = {
        "model": model or graph.name,
        "batch_size": batch_size,
        "policy": policy_name or getattr(policy, "name", type(policy).__name__),
        "budget_spec": str(budget),
        "device": dev_name,
        "no_remat_peak_bytes": graph.no_remat_peak(),
    }
    try:
        row["budget_bytes"] = remat.resolve_budget(budget, graph)
        t0 = time.perf_counter()
        plan = policy.plan(graph, budget=budget)
        wall = time.perf_counter() - t0
        rep = remat.simulate(graph, plan, device=device)
        row.update(
            status=plan.meta.get("status", "unknown"),
            peak_bytes=rep.peak_bytes,
            overhead=rep.overhead,
            compute_time_s=rep.compute_time_s,
            energy_j=rep.energy_j,
            paging_time_s=rep.paging_time_s,
            paging_energy_j=rep.paging_energy_j,
            bytes_paged=rep.bytes_paged,
            recomputations=rep.recomputations,
            solve_time_s=plan.meta.get("solve_time_s", wall),
            gap=plan.meta.get("gap", ""),
            objective=plan.meta.get("objective", ""),
            lower_bound=plan.meta.get("lower_bound", ""),
            objective_unit=plan.meta.get("objective_unit", ""),
        )
        single = getattr(plan, "microbatches", 1) == 1
        if fn_args is not None and residuals and single:
            try:
                from remat.apply import apply_plan

                app = apply_plan(fn_args[0], fn_args[1], None, graph=graph, plan=plan,
                                 warn=False)
                row.update(predicted_residual_bytes=app.predicted_residual_bytes,
                           realised_residual_bytes=app.residual_bytes)
            except Exception as exc:  # the plan stands; only its realisation is not measured
                row["error"] = f"residuals not measured: {type(exc).__name__}: {exc}"
        if fn_args is not None and execute and single:
            try:
                value, grads, stats = remat.execute(graph, plan, *fn_args[1])
                ref = reference() if callable(reference) else reference
                if ref is None:
                    ref = reference_value_and_grad(graph, fn_args)
                row.update(executor_peak_bytes=int(stats.peak_bytes),
                           executor_grad_max_rel_err=max_rel_err((value, grads), ref))
            except Exception as exc:  # the plan stands; only its execution is not measured
                msg = f"not executed: {type(exc).__name__}: {exc}"
                row["error"] = f"{row['error']}; {msg}" if row.get("error") else msg
    except InfeasibleBudgetError as exc:
        row.update(status="infeasible", min_feasible_bytes=exc.min_feasible_bytes, error=str(exc))
    except NotApplicableError as exc:  # another kind of graph, not a failure
        row.update(status="n/a", error=str(exc))
    except RematError as exc:
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # recorded, never silently dropped
        row.update(status="crash", error=f"{type(exc).__name__}: {exc} | {traceback.format_exc(limit=2)}")
    row["row_time_s"] = time.perf_counter() - t_row
    return row


# --------------------------------------------------------------------------- building a row
def configure_policy(policy: Any, *, threads: int | None = None,
                     time_limit: float | None = None, device: Any = None) -> Any:
    """The policy a row runs: a registry name is built with ``threads``/``time_limit``/
    ``device`` where it takes them; a dataclass policy object gets ``threads``/``time_limit``
    by ``dataclasses.replace`` (its own ``device`` is kept); any other object is used as is."""
    import policies as registry

    given = {"threads": threads, "time_limit": time_limit, "device": device}
    if isinstance(policy, str):
        opts = registry.option_names(policy)
        return registry.get(policy, **{k: v for k, v in given.items()
                                       if v is not None and k in opts})
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        names = {f.name for f in dataclasses.fields(policy) if f.init}
        kw = {k: v for k, v in given.items() if v is not None and k in names and k != "device"}
        return dataclasses.replace(policy, **kw) if kw else policy
    return policy


def build_model(spec: Any, batch_size: int | None, stages: Any = "auto"):
    """``(graph, fn_args)`` of a model spec: a ``Graph``; a zoo name or a ``.json`` graph path;
    or a callable (called with ``batch_size=`` when one is given, else with no argument)
    returning a ``Graph`` or a ``(loss_fn, params, batch)`` triple.  ``fn_args`` is
    ``(loss_fn, (params, batch))`` when the function is known, else ``None``."""
    import remat

    if isinstance(spec, str):
        if spec.endswith(".json"):
            return remat.load_graph(spec), None
        spec_fn = spec

        def spec(batch_size=8):  # noqa: F811 - a zoo name
            return remat.zoo.get(spec_fn, batch_size=batch_size)

        if batch_size is None:
            batch_size = 8
    if callable(spec) and not hasattr(spec, "no_remat_peak"):
        spec = spec(batch_size=batch_size) if batch_size is not None else spec()
    if isinstance(spec, tuple) and len(spec) == 3:
        loss_fn, params, batch = spec
        g = remat.extract(loss_fn, params, batch, stages=stages)
        return g, (loss_fn, (params, batch))
    return spec, None


_MODEL_CACHE: dict[tuple, tuple] = {}
_REF_CACHE: dict[tuple, tuple] = {}  # the same keys: jax.value_and_grad's (value, grads)


def _run_row(spec, name: str, batch, policy, pname: str, budget, device, *, token: str,
             threads, time_limit, residuals: bool, stages, execute: bool = False) -> dict:
    """One row, in this process (local backend) or a Ray worker; each model is built once per
    process and sweep (``token``), and its reference gradients computed at most once."""
    import remat

    ck = (token, name, batch, str(stages))
    if ck not in _MODEL_CACHE:
        _MODEL_CACHE[ck] = build_model(spec, batch, stages)
    graph, fn_args = _MODEL_CACHE[ck]

    def reference():
        if ck not in _REF_CACHE:
            _REF_CACHE[ck] = reference_value_and_grad(graph, fn_args)
        return _REF_CACHE[ck]

    dev = None if device in (None, "") else remat.devices.get(device)
    pol = configure_policy(policy, threads=threads, time_limit=time_limit, device=dev)
    return evaluate(graph, pol, budget, device=dev, model=name, policy_name=pname,
                    batch_size=batch, fn_args=fn_args, residuals=residuals, execute=execute,
                    reference=reference)


# --------------------------------------------------------------------------- the sweep
def sweep(
    models: Mapping[str, Any] | Iterable[tuple[str, Any]],
    policies: Mapping[str, Any] | Sequence[str],
    budgets: Sequence[Any],
    *,
    out: str | os.PathLike,
    batch_sizes: Sequence[int | None] = (None,),
    devices: Sequence[str | None] = (None,),
    backend: str = "local",
    address: str | None = None,
    num_cpus: int | None = None,
    threads: int | None = None,
    time_limit: float | None = None,
    residuals: bool = True,
    execute: bool = False,
    stages: Any = "auto",
    quick: bool = False,
    formats: Sequence[str] | None = None,
    progress: bool = True,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every (model, batch, policy, budget, device) missing from ``out``; one row each.

    Args:
      models: name -> spec (a ``Graph``, a zoo name or ``.json`` path, or a callable returning
        a ``Graph`` or ``(loss_fn, params, batch)``; built lazily, once per process).
      policies: name -> policy object, or registry names (built per row with ``threads`` and
        ``time_limit``; a policy with a ``device`` option gets the row's device).
      budgets: budget specs (bytes, ``"60%"``, ``"512MiB"``).
      out: the CSV store (``*.csv``) or a ``*.parquet`` path (the CSV store is then the same
        path with ``.csv``); finished rows are kept and skipped.
      batch_sizes: batch sizes for zoo names / callables (``None``: the model's default).
      devices: ``remat.devices`` names (``None``: the graph's own costs; for a zoo model those
        of the ``host`` profile, calibrated by timing in the process that extracts it, so they
        differ between processes and machines -- name a device for reproducible rows).
      backend: ``"local"`` (this process) or ``"ray"`` (one Ray task per row).
      address: Ray cluster address (``None``: start a local cluster with ``num_cpus``).
      threads, time_limit: solver threads / seconds of each row's policy (Ray default: 1 thread).
      residuals: measure realised residual bytes when the model's function is known.
      execute: run each plan with :func:`remat.execute` when the model's function is known:
        ``executor_peak_bytes`` (measured activation bytes, the quantity of ``peak_bytes``) and
        ``executor_grad_max_rel_err`` (:func:`evaluate`); rows already in ``out`` are kept.
      quick: time limit at most 5 s, only the first batch size and device, at most three
        budgets (first, middle, last), no residual measurement, no execution.
      formats: subset of ``("csv", "parquet")`` (default: from ``out``'s suffix).
      on_row: called with each new row after it is written (progress hooks, tests).

    Returns:
      Every row of the store after the sweep (old and new), typed (:func:`read_rows`).
    """
    from tqdm.auto import tqdm

    out = os.fspath(out)
    fmts = set(formats or (("parquet",) if out.endswith(".parquet") else ("csv",)))
    if fmts - {"csv", "parquet"} or not fmts:
        raise RematError(f"unknown formats {sorted(fmts)}; available: csv, parquet")
    if backend not in ("local", "ray"):
        raise RematError(f"unknown backend {backend!r}; available: local, ray")
    store = out[: -len(".parquet")] + ".csv" if out.endswith(".parquet") else out
    pq_path = store[: -len(".csv")] + ".parquet" if store.endswith(".csv") else store + ".parquet"
    if "parquet" in fmts:
        _require("pyarrow", "Parquet output")
    pols = dict(policies) if isinstance(policies, Mapping) else {p: p for p in policies}
    items = dict(models.items() if isinstance(models, Mapping) else models)
    budgets, batch_sizes, devices = list(budgets), list(batch_sizes), list(devices)
    if quick:
        time_limit = min(time_limit or 5.0, 5.0)
        batch_sizes, devices, residuals, execute = batch_sizes[:1], devices[:1], False, False
        if len(budgets) > 3:
            budgets = [budgets[0], budgets[len(budgets) // 2], budgets[-1]]
    if backend == "ray" and threads is None:
        threads = 1

    os.makedirs(os.path.dirname(os.path.abspath(store)), exist_ok=True)
    if os.path.exists(store) and os.path.getsize(store):
        _repair(store)
    done = {_key(r) for r in read_rows(store)}
    todo = [
        (m, bs, p, b, d)
        for m in items for bs in batch_sizes for p in pols for b in budgets for d in devices
        if _key({"model": m, "batch_size": bs, "policy": p, "budget_spec": b,
                 "device": d or ""}) not in done
    ]
    new_file = not os.path.exists(store) or not os.path.getsize(store)
    token = uuid.uuid4().hex
    try:
        with open(store, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            if new_file:
                writer.writeheader()
                f.flush()

            def emit(row):
                writer.writerow(row)
                f.flush()
                bar.update(1)
                if on_row is not None:
                    on_row(row)

            with tqdm(total=len(todo), disable=not progress, desc=f"sweep[{backend}]") as bar:
                args = dict(token=token, threads=threads, time_limit=time_limit,
                            residuals=residuals, stages=stages, execute=execute)
                if backend == "local":
                    for m, bs, p, b, d in todo:
                        emit(_run_row(items[m], m, bs, pols[p], p, b, d, **args))
                else:
                    _run_ray(todo, items, pols, args, emit, address=address, num_cpus=num_cpus)
    finally:
        for cache in (_MODEL_CACHE, _REF_CACHE):
            for k in [k for k in cache if k[0] == token]:
                del cache[k]
        if "parquet" in fmts:
            write_parquet(read_rows(store), pq_path)
    return read_rows(store, typed=True)


def _run_ray(todo, items, pols, args, emit, *, address, num_cpus) -> None:
    """Submit every row as a Ray task and ``emit`` each as it completes; pending tasks are
    cancelled when the driver stops early (an interrupt, an error of ``emit``)."""
    ray = _require("ray", "backend='ray'")
    started = False
    if not ray.is_initialized():
        kw = {"address": address} if address else {"num_cpus": num_cpus}
        ray.init(**kw, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False)
        started = True
    pending: list = []
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_run_row)
        refs = {m: ray.put(items[m]) for m in {t[0] for t in todo}}
        pending = [task.remote(refs[m], m, bs, pols[p], p, b, d, **args)
                   for m, bs, p, b, d in todo]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            emit(ray.get(ready[0]))
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if pending:  # return only once the cancelled tasks are gone
            ray.wait(pending, num_returns=len(pending), timeout=30)
        if started:
            ray.shutdown()
