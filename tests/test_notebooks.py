"""Every notebook under notebooks/ executes top to bottom, stored without outputs, and prints its
own success line: the asserts inside a notebook (gradients equal JAX's within rtol 1e-5, plans fit
their budgets by ``remat.simulate``, executor peaks equal simulated ones) are tests.

The generated notebooks (``notebooks/make_notebooks.py``) must match their generator, so an edit
to one without the other fails here.

Kernels start with ``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`` whatever the
worker's environment holds, so a notebook runs in one mode (XLA:CPU keeps ``jax.checkpoint`` and
budgets are compiled bytes) on every run and at both ends of the JAX range.
"""

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from remat.compiled_budget import FLAG

DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(DIR.glob("*.ipynb"))

#: notebook stem -> strings its outputs must contain (each notebook's last line, and more)
MARKERS = {
    "quickstart": ("simulated", "peak"),
    "01_policy_tour": ("policy tour: OK", "measured peak"),
    "02_budget_sweep": ("budget sweep: OK",),
    "03_dropin_training": ("dropin training: OK", "scan decisions:"),
    "04_your_own_graph": ("your own graph: OK", "exported and replayed"),
    "05_nnx_training": ("nnx training: OK", "Plan[checkmate]"),
}


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", DIR / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_notebook_has_markers_and_no_stored_outputs():
    assert {p.stem for p in NOTEBOOKS} == set(MARKERS)
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, path.name


def test_generated_notebooks_match_their_generator():
    gen = _generator()
    for name in gen.NOTEBOOKS:
        stored = nbformat.read(DIR / f"{name}.ipynb", as_version=4)
        assert [c.source for c in stored.cells] == [c.source for c in gen.build(name).cells], name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", FLAG)  # the kernel inherits it before JAX starts
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    for marker in MARKERS[path.stem]:
        assert marker in outputs, (path.name, marker, outputs[-2000:])
