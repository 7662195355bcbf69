"""Structure rules of DESIGN.md, read from the source files (ast), not from the running code.

* no import cycles among the project's modules (imports at module level);
* layering: ``solvers`` imports no jax, no ``policies``/``experiments``; ``remat`` and
  ``policies`` never import ``experiments``; ``remat`` imports ``policies`` only inside
  functions (the drop-in resolves registry names lazily);
* no module over 500 lines without a ``Length:`` paragraph in its docstring saying why;
* JAX internals (``jax._src``) are named in ``remat/_jax_compat.py`` only (tests included, but
  ``tests/test_jax_compat.py``, which lists them).
"""

from __future__ import annotations

import ast
import pathlib

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("remat", "policies", "solvers", "experiments")
MAX_LINES = 500


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(path: pathlib.Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # `if TYPE_CHECKING:` blocks do not import at run time
        nodes = [n for n in nodes if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test))]
    names = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            names.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            names.add(n.module)
            names.update(f"{n.module}.{a.name}" for a in n.names)
    return names


def _resolve(name: str, mods: dict) -> str | None:
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def test_no_import_cycles():
    mods = _modules()
    g = nx.DiGraph()
    for m, path in mods.items():
        g.add_node(m)
        for imp in _imports(path, top_level_only=True):
            target = _resolve(imp, mods)
            if target and target != m and not m.startswith(target + "."):
                g.add_edge(m, target)
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles[:5]}"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_layering(pkg):
    mods = _modules()
    forbidden_anywhere = {
        "solvers": ("jax", "flax", "policies", "experiments"),
        "remat": ("experiments",),
        "policies": ("experiments", "jax", "flax"),
        "experiments": (),
    }[pkg]
    forbidden_top = {"remat": ("policies",)}.get(pkg, ())
    bad = []
    for m, path in mods.items():
        if m.split(".")[0] != pkg:
            continue
        for imp in _imports(path, top_level_only=False):
            if imp.split(".")[0] in forbidden_anywhere:
                bad.append((m, imp))
        for imp in _imports(path, top_level_only=True):
            if imp.split(".")[0] in forbidden_top:
                bad.append((m, imp))
    assert not bad, f"{pkg} imports what its layer must not: {bad}"


def test_long_modules_say_why():
    long = []
    for m, path in _modules().items():
        text = path.read_text()
        n = text.count("\n")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if n > MAX_LINES and "Length:" not in doc:
            long.append((m, n))
    assert not long, f"modules over {MAX_LINES} lines without a 'Length:' reason: {long}"


def test_jax_internals_only_in_the_compat_module():
    allowed = {ROOT / "remat" / "_jax_compat.py", ROOT / "tests" / "test_jax_compat.py",
               pathlib.Path(__file__).resolve()}
    paths = [*_modules().values(), *sorted((ROOT / "tests").glob("*.py"))]
    private = "jax." + "_src"
    bad = sorted(str(p.relative_to(ROOT)) for p in paths if p not in allowed
                 and (private in p.read_text() or "from jax import _src" in p.read_text()))
    assert not bad, f"jax internals outside remat/_jax_compat.py: {bad}"
