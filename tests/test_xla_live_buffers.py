"""``experiments/xla_live_buffers.py`` reads what XLA holds live from a dump: on a compiled
step dumped in a subprocess, the temp it reads is ``memory_analysis()``'s, and the live peak it
computes lies between the largest buffer and the temp plus in-place overlaps."""

from __future__ import annotations

import glob

from helpers.xla_subprocess import run_json

from experiments.xla_live_buffers import live_peak
from remat.measurement import FLAG

_SCRIPT = """
import json
import jax, jax.numpy as jnp
def loss(ws, x):
    h = x
    for w in ws:
        h = jnp.tanh(h @ w)
    return jnp.mean(h * h)
ws = [jnp.full((64, 64), 0.01) for _ in range(4)]
x = jnp.ones((256, 64))
c = jax.jit(jax.value_and_grad(loss)).lower(ws, x).compile()
print(json.dumps({"temp": int(c.memory_analysis().temp_size_in_bytes)}))
"""


def test_live_peak_of_a_dumped_step(tmp_path):
    r = run_json(_SCRIPT, flags=f"--xla_dump_to={tmp_path} --xla_dump_hlo_pass_re=NONE {FLAG}")
    prefixes = [p[: -len("-buffer-assignment.txt")]
                for p in glob.glob(str(tmp_path / "*jit_loss*after_optimizations-buffer-assignment.txt"))]
    assert len(prefixes) == 1, prefixes
    peak = live_peak(prefixes[0])
    assert peak.temp == r["temp"] > 0
    largest = max(b for b, *_ in peak.live)
    assert largest >= 256 * 64 * 4  # an activation is live at the peak
    assert largest <= peak.peak <= 1.5 * peak.temp, peak
    assert sum(b for b, *_ in peak.live) == peak.peak
    assert peak.name and 0 <= peak.at
