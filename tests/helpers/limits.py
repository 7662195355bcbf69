"""Limits for the solver calls of the tests: no test depends on the machine's speed.

A test asserts what holds at any speed, never that a solver finished within some seconds
(issue #32, item 7: four tests failed on a fresh clone while another job shared the two cores).

* A solve whose result a test checks (``status == "optimal"``, an optimum equal to a reference)
  gets :data:`SAFETY_S`: a wall-clock limit far above what its instance needs (each is sized to
  prove in a few seconds on a loaded 2-core machine).  It is there so that a hung solver still
  ends; reaching it is a failure, not an outcome a test checks.
* A test of what happens *at* a limit uses a limit that is already spent, so the outcome is the
  same at any speed: :data:`HIGHS_SPENT` (HiGHS's own ``time_limit`` of 0 s, passed as an
  option: HiGHS stops at its first check, with the warm start as its incumbent when it has one),
  a work limit (HiGHS ``mip_max_nodes``, a search's move or restart count) or a clock the test
  controls (``test_path_cuts.test_cut_loop_time_limit_is_on_its_own_clock``).
* Claims about speed (seconds to prove, time saved) belong in ``experiments/`` benchmarks.
"""

from __future__ import annotations

from types import MappingProxyType

SAFETY_S = 600.0  # wall-clock safety net of a solve whose result is asserted (seconds)

# HiGHS options (read-only): its own time limit, 0 s, reached at its first check
HIGHS_SPENT = MappingProxyType({"time_limit": 0.0})


def pinned_host_profile():
    """A context manager: :mod:`remat.devices`' ``"host"`` profile pinned to fixed rates
    (50 GFLOP/s, 35 GB/s: this 2-core machine's calibration, rounded) instead of the one
    measured by timing JAX ops.  A graph extracted under it has the same costs on every
    machine and under any load, so a MILP built from it is the same instance (with the measured
    profile, a loaded machine gave other costs, another instance, another proof time)."""
    import contextlib
    import dataclasses
    from unittest import mock

    from remat import devices
    from remat.core import devices as registry

    pinned = dataclasses.replace(
        devices.get("cortex-a72"), name="host", flops_per_s=5e10, memory_bandwidth=3.5e10,
        calibration=(), source="tests/helpers/limits.py: fixed rates, not measured")
    stack = contextlib.ExitStack()
    # both ways in: the module function and the registry entry ``devices.get("host")`` reads
    stack.enter_context(mock.patch.object(devices, "host_profile", lambda: pinned))
    stack.enter_context(mock.patch.dict(registry._MEASURED, {"host": lambda: pinned}))
    return stack


def spend_highs_time(monkeypatch) -> None:
    """From here to the end of the test, every :meth:`solvers.milp.MilpModel.solve` runs with
    :data:`HIGHS_SPENT` among its options: HiGHS stops at its first check, whatever the
    machine's speed, for solvers that take no HiGHS options of their own (OLLA's order and
    address ILPs)."""
    from solvers.milp import MilpModel

    real = MilpModel.solve

    def solve(self, *args, options=None, **kwargs):
        return real(self, *args, options={**(options or {}), **HIGHS_SPENT}, **kwargs)

    monkeypatch.setattr(MilpModel, "solve", solve)
