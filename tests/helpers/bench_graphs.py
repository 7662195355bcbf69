"""Where the published benchmark graphs are (shared by the tests that use them).

Tests that need them skip when the folder is absent (a user's install without ``shared/``).
Override the location with ``REMAT_BENCHMARKS``.
"""

import os
from pathlib import Path

import pytest

BENCH = Path(
    os.environ.get(
        "REMAT_BENCHMARKS",
        Path(__file__).resolve().parents[2] / ".." / "shared" / "benchmarks" / "checkmate-graphs",
    )
)
FILES = sorted(BENCH.glob("*.json")) if BENCH.is_dir() else []
needs_bench = pytest.mark.skipif(not FILES, reason=f"benchmark graphs not installed ({BENCH})")
