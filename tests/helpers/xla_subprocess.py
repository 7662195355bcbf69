"""Run a measurement script in a fresh Python with chosen ``XLA_FLAGS``.

XLA reads ``XLA_FLAGS`` once, when JAX starts, so a test that measures XLA:CPU memory with
``cse_barrier_expander`` disabled (``remat.measurement.FLAG``) runs its script in a subprocess.
The script prints one JSON object as its last line of output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remat.measurement import FLAG


def run_json(code: str, *, flags: str = FLAG, timeout: float = 600) -> dict:
    """Run ``code`` with ``XLA_FLAGS=flags`` on the CPU; return its last stdout line as JSON.

    Raises:
      AssertionError: the script failed (its stderr's tail is the message).
    """
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
