"""Structure rules (``docs/architecture.md``), read from the source files with ``ast``.

Layers, bottom to top: ``remat.core`` (numpy) < ``solvers`` < ``policies`` < ``remat`` (the JAX
side: everything in ``remat`` outside ``remat.core``) < ``experiments``. Every import between the
project's modules, at module level or inside a function, goes to the same layer or a lower one,
and the imports within a layer form no cycle. ``remat.core``, ``solvers`` and ``policies``
load no JAX (checked by importing them in a fresh interpreter). Also:

* no module over 500 lines without a ``Length:`` paragraph in its docstring saying why;
* JAX internals (``jax._src``) are named in ``remat/_jax_compat.py`` only (tests included, but
  ``tests/test_jax_compat.py``, which lists them).

The checker runs on planted violations too (an upward import, a cycle hidden in a function), so
it is shown to fail.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("remat", "policies", "solvers", "experiments")
LAYERS = ("remat.core", "solvers", "policies", "remat", "experiments")  # bottom to top
JAX_FREE = ("remat.core", "solvers", "policies")
MAX_LINES = 500


def modules(root: pathlib.Path = ROOT, packages=PACKAGES) -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every module of ``packages`` under ``root``."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imported_names(path: pathlib.Path, module: str) -> set[str]:
    """Every module name ``path`` imports, at any depth (functions included; ``if
    TYPE_CHECKING:`` blocks excluded), relative imports resolved against ``module``."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and "TYPE_CHECKING" in
            ast.dump(b.test) for n in ast.walk(b)}
    is_pkg = path.name == "__init__.py"
    names = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            names.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = module.split(".")
                parts = parts if is_pkg else parts[:-1]
                parts = parts[: len(parts) - (n.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in n.names)
    return names


def _resolve(name: str, mods: dict) -> str | None:
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def layer(module: str) -> int:
    """Index in :data:`LAYERS` of the most specific layer prefix of ``module``."""
    best, depth = -1, -1
    for i, pre in enumerate(LAYERS):
        if (module == pre or module.startswith(pre + ".")) and pre.count(".") > depth:
            best, depth = i, pre.count(".")
    return best


def import_graph(mods: dict[str, pathlib.Path]) -> nx.DiGraph:
    """Edges ``a -> b``: module ``a`` imports project module ``b`` (anywhere in its source). A
    package's ``__init__`` is not an edge target of its own submodules' parent lookups."""
    g = nx.DiGraph()
    for m, path in mods.items():
        g.add_node(m)
        for imp in imported_names(path, m):
            target = _resolve(imp, mods)
            if target and target != m and not m.startswith(target + "."):
                g.add_edge(m, target)
    return g


def violations(mods: dict[str, pathlib.Path]) -> tuple[list, list]:
    """``(upward imports, cycles)``: ``(importer, imported)`` pairs going to a higher layer, and
    the import cycles (within a layer)."""
    g = import_graph(mods)
    upward = sorted((a, b) for a, b in g.edges if layer(b) > layer(a))
    cycles = sorted(sorted(c) for c in nx.simple_cycles(g))
    return upward, cycles


def test_no_upward_imports_and_no_cycles_anywhere():
    upward, cycles = violations(modules())
    assert not upward, f"imports of a higher layer ({' < '.join(LAYERS)}): {upward}"
    assert not cycles, f"import cycles (function-level imports counted): {cycles[:5]}"


def _plant(tmp_path: pathlib.Path, files: dict[str, str]) -> dict[str, pathlib.Path]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for pkg in ("remat", "remat/core", "solvers", "policies", "experiments"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return modules(tmp_path)


def test_checker_finds_a_planted_upward_import_inside_a_function(tmp_path):
    mods = _plant(tmp_path, {
        "remat/core/graph.py": "def f():\n    from policies.base import x\n    return x\n",
        "policies/base.py": "from remat.core.graph import f\nx = 1\n",
    })
    upward, _ = violations(mods)
    assert ("remat.core.graph", "policies.base") in upward


def test_checker_finds_a_planted_cycle_hidden_in_a_function(tmp_path):
    mods = _plant(tmp_path, {
        "solvers/a.py": "from solvers.b import g\n",
        "solvers/b.py": "def g():\n    from solvers import a\n    return a\n",
    })
    upward, cycles = violations(mods)
    assert not upward and ["solvers.a", "solvers.b"] in cycles


def test_checker_resolves_relative_imports(tmp_path):
    mods = _plant(tmp_path, {"solvers/a.py": "from ..policies import base\n",
                             "policies/base.py": "x = 1\n"})
    assert ("solvers.a", "policies.base") in violations(mods)[0]


def test_the_numpy_layers_load_no_jax():
    core = sorted(m for m in modules() if layer(m) in (0, 1, 2))
    code = ("import importlib, json, sys\n"
            f"for m in {core!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in "
            "('jax', 'jaxlib', 'flax', 'optax'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not loaded, f"importing {', '.join(JAX_FREE)} loaded {loaded[:5]}"


@pytest.mark.parametrize("pkg", ["solvers", "policies", "remat.core"])
def test_lower_layers_import_no_jax_or_flax_directly(pkg):
    bad = [(m, imp) for m, path in modules().items() if m == pkg or m.startswith(pkg + ".")
           for imp in imported_names(path, m) if imp.split(".")[0] in ("jax", "flax", "optax")]
    assert not bad, f"{pkg} imports what its layer must not: {bad}"


def test_long_modules_say_why():
    long = []
    for m, path in modules().items():
        text = path.read_text()
        n = text.count("\n")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if n > MAX_LINES and "Length:" not in doc:
            long.append((m, n))
    assert not long, f"modules over {MAX_LINES} lines without a 'Length:' reason: {long}"


def test_jax_internals_only_in_the_compat_module():
    allowed = {ROOT / "remat" / "_jax_compat.py", ROOT / "tests" / "test_jax_compat.py",
               pathlib.Path(__file__).resolve()}
    paths = [*modules().values(), *sorted((ROOT / "tests").rglob("*.py"))]
    private = "jax." + "_src"
    bad = sorted(str(p.relative_to(ROOT)) for p in paths if p not in allowed
                 and (private in p.read_text() or "from jax import _src" in p.read_text()))
    assert not bad, f"jax internals outside remat/_jax_compat.py: {bad}"
