"""The GPU benchmark command (``experiments/gpu_benchmark.py``) at its tiny CPU size.

One subprocess run of two models (the parent spawns one child per model, each with
``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`` on CPU): the CSV has every
column, one reference row per model (``temp_x`` 1), built-in rows, project-policy rows whose
gradients match ``jax.value_and_grad``, and an infeasible budget's row that keeps the typed
error; the skip row of a model without a per-block hook is :func:`config_list`'s.  No timing
is asserted.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import bench_models
from experiments.gpu_benchmark import (
    BUILTINS,
    COLUMNS,
    config_list,
    dots_no_batch_and_softmax,
    parse_policies,
)

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *extra, timeout=900):
    out = tmp_path / "gpu_benchmark.csv"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # the parent sets the flag for CPU children
    cmd = [sys.executable, "-m", "experiments.gpu_benchmark", "--size", "tiny",
           "--out", str(out), *extra]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader), r


def test_parse_policies():
    got = parse_policies(["checkmate", "sqrtn", "checkmate@1", "chain_dp@-"], [30, 50])
    assert got == [("checkmate", 30.0), ("checkmate", 50.0), ("sqrtn", None),
                   ("checkmate", 1.0), ("chain_dp", None)]


def test_hand_policy_saves_the_softmax_probabilities_and_no_other_division():
    """``dots_no_batch_and_softmax`` keeps what ``dots_with_no_batch_dims_saveable`` keeps plus
    the ``[b, q, k]`` probabilities, and not the scores divided by a scalar."""
    import jax
    import jax.numpy as jnp

    from remat._jax_compat import saved_residuals

    def f(x, w):
        s = jnp.einsum("bqd,bkd->bqk", x @ w, x) / 8.0
        return jnp.sum(jax.nn.softmax(s, axis=-1) @ x)

    x, w = jnp.ones((2, 6, 4)), jnp.ones((4, 4))

    def shapes(policy):
        res = saved_residuals(jax.checkpoint(f, policy=policy), x, w)
        return sorted(tuple(a.shape) for a, _ in res)

    base = shapes(jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    hand = shapes(dots_no_batch_and_softmax)
    assert sorted(base + [(2, 6, 6)]) == hand


def test_config_list_scan_only_and_skip_row():
    class M:
        scanned = False
        builtin_loss = None
        builtin_note = "no hook"

    cfgs = config_list(M, [("scan_layers", 50.0), ("sqrtn", None)], pinned_host=True)
    assert [c["config"] for c in cfgs] == ["none", "builtin", "remat"]
    assert cfgs[1]["skip"] and "no hook" in cfgs[1]["skip"]
    M.scanned, M.builtin_loss = True, object()
    cfgs = config_list(M, [("scan_layers", 50.0)], pinned_host=False)
    assert [c["policy"] for c in cfgs if c["config"] == "builtin"] == [
        b for b in BUILTINS if not b.startswith("offload")]
    assert cfgs[-1]["policy"] == "scan_layers"


def test_model_flops_full_sizes():
    # the analytic counts used for the GPU time estimate
    assert bench_models.model_flops("mlp", "full") == pytest.approx(3 * 2 * 8192 * 4096**2 * 32)
    for m in bench_models.MODELS:
        assert bench_models.model_flops(m, "full") > 1e12


def test_deadline_skips_every_model(tmp_path):
    # no time left: nothing is launched, every model leaves a skip row
    cols, rows, _ = _run(tmp_path, "--models", "mlp,transformer", "--deadline-s", "0", timeout=120)
    assert tuple(cols) == COLUMNS
    assert [(r["model"], r["status"]) for r in rows] == [("mlp", "skipped"),
                                                           ("transformer", "skipped")]
    assert all("deadline" in r["error"] for r in rows)


@pytest.mark.slow
def test_tiny_run(tmp_path):
    # zoo resnet50's skip row (no per-block hook) is config_list's, tested above
    cols, rows, r = _run(
        tmp_path, "--models", "mlp,flax_scan",
        "--policies", "checkmate@0.5,sqrtn,scan_layers@70",
        "--builtins", "dots_with_no_batch_dims_saveable,nothing_saveable",
        "--steps", "2", "--warmup", "1", "--time-limit", "30")
    assert tuple(cols) == COLUMNS
    by = {(x["model"], x["config"], x["policy"], x["budget"]): x for x in rows}
    for m in ("mlp", "flax_scan"):
        ref = by[(m, "none", "", "")]
        assert ref["status"] == "ok", ref
        assert float(ref["temp_x"]) == 1.0 and float(ref["grad_rel_err"]) == 0.0
        assert int(ref["temp_bytes"]) > 0 and float(ref["step_ms"]) > 0
        assert ref["backend"] == "cpu" and ref["jax_version"]
        # the infeasible budget: a row with the typed error, nothing measured
        bad = by[(m, "remat", "checkmate", "0.5")]
        assert bad["status"] == "error" and "InfeasibleBudgetError" in bad["error"], bad
        assert bad["temp_bytes"] == "" and bad["plan_s"] != ""
        ok = [x for x in rows if x["model"] == m and x["config"] == "remat"
              and x["status"] == "ok"]
        assert ok, [x for x in rows if x["model"] == m]
    # per-block built-ins where the model has a hook, one skip row where it has none
    for m in ("mlp", "flax_scan"):
        for b in ("dots_with_no_batch_dims_saveable", "nothing_saveable"):
            assert by[(m, "builtin", b, "")]["status"] == "ok", by[(m, "builtin", b, "")]
    # scan_layers runs on the scanned model only
    assert ("flax_scan", "remat", "scan_layers", "70") in by
    assert not [x for x in rows if x["policy"] == "scan_layers" and x["model"] != "flax_scan"]
    # every measured row: gradients and loss equal jax.value_and_grad's
    for x in rows:
        if x["status"] == "ok":
            assert float(x["grad_rel_err"]) < 1e-4, x
            assert float(x["loss_abs_err"]) < 1e-4, x
            assert float(x["temp_x"]) > 0
            if x["budget"]:
                assert float(x["compiled_vs_budget"]) > 0
    # the scanned model's nothing_saveable keeps less than no remat: the CPU child ran with
    # cse_barrier_expander disabled (XLA:CPU would merge the recomputation back otherwise)
    assert float(by[("flax_scan", "builtin", "nothing_saveable", "")]["temp_x"]) < 1.0
    # jaxpr FLOPs count the recomputation: nothing_saveable runs the scan body's forward twice
    fl = {p: float(by[("flax_scan", c, p, "")]["jaxpr_flops"])
          for c, p in (("none", ""), ("builtin", "nothing_saveable"))}
    assert fl["nothing_saveable"] > 1.1 * fl[""] > 0, fl
