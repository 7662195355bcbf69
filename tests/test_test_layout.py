"""Tests read as specifications (issue #34, item 7): a ``tests/test_*.py`` module is imported by
pytest only, never by another module.

What two test modules share (model builders, toy graphs and problems, oracles, shared checks,
the solver time limits) lives in the package ``tests/helpers/``, imported as
``from helpers.<module> import ...`` (pytest puts ``tests/`` on ``sys.path``, the folder of a
test module outside any package), or, for fixtures, in ``tests/conftest.py``.  Read from the
source with ``ast``, every module under ``tests/``:

* imports no ``test_*`` module (nor ``conftest``): at module level, inside a function, or in a
  script that a test runs in a subprocess (a string holding Python source);
* is a test module or ``conftest.py`` at the top of ``tests/``, or a helper in ``tests/helpers/``.

Both checkers run on planted violations too, so they are shown to fail.
"""

from __future__ import annotations

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
HELPERS = "helpers"

#: an import statement on a line of a string (a script run with ``python -c``)
_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(.+)|import[ \t]+(.+))$",
                          re.M)


def _names_a_test_module(dotted: str) -> bool:
    """``dotted`` (``test_x``, ``tests.test_x``, ``conftest``) is or lies in a test module."""
    return any(p.startswith("test_") or p == "conftest" for p in dotted.split(".") if p)


def _bad(module: str | None, names: list[str]) -> bool:
    """An import ``from module import names`` (``module`` None: ``import names``) binds a test
    module or something from one (``from tests import test_x`` and ``from . import test_x``
    included)."""
    if module is None:
        return any(_names_a_test_module(n) for n in names)
    return _names_a_test_module(module) or any(_names_a_test_module(n) for n in names)


def _script_imports(text: str) -> list[tuple[int, str, bool]]:
    """``(line offset, statement, bad)`` for every import line of a string of source."""
    out = []
    for m in _IMPORT_LINE.finditer(text):
        frm, what, plain = m.groups()
        listed = (what or plain).strip().strip("()")
        names = [a.split(" as ")[0].strip() for a in listed.split(",") if a.strip()]
        out.append((text.count("\n", 0, m.start()), m.group(0).strip(), _bad(frm, names)))
    return out


def imports_of_test_modules(path: pathlib.Path) -> list[str]:
    """Every import of a test module in ``path``, as ``"file:line: statement"``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            if _bad(None, [a.name for a in n.names]):
                found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.ImportFrom):
            if _bad(n.module or "", [a.name for a in n.names]):
                found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and "import" in n.value:
            found += [(n.lineno + k, stmt) for k, stmt, bad in _script_imports(n.value) if bad]
    return [f"{path.name}:{line}: {stmt}" for line, stmt in sorted(found)]



def misplaced_modules(tests: pathlib.Path) -> list[str]:
    """Python files under ``tests`` that are neither a test module nor ``conftest.py`` at its
    top, nor a helper (a module not named ``test_*``) in ``tests/helpers/``."""
    bad = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        top = len(rel.parts) == 1
        if top and (path.name.startswith("test_") or path.name == "conftest.py"):
            continue
        if rel.parts[0] == HELPERS and not top and not path.name.startswith("test_"):
            continue
        bad.append(rel.as_posix())
    return bad


def test_no_module_under_tests_imports_a_test_module():
    modules = sorted(TESTS.rglob("*.py"))
    assert len([p for p in modules if p.name.startswith("test_")]) >= 10  # the right folder
    assert (TESTS / HELPERS / "__init__.py").is_file()
    found = [v for p in modules for v in imports_of_test_modules(p)]
    assert not found, "test modules imported (move what they share to tests/helpers/): " + \
        "; ".join(found)


def test_tests_holds_test_modules_conftest_and_helpers_only():
    bad = misplaced_modules(TESTS)
    assert not bad, f"modules outside tests/helpers/ that are not test modules: {bad}"


def test_checkers_fail_on_planted_violations(tmp_path):
    # the planted source names test modules through {t} ("test_") and {c} ("conftest"), so that
    # this file's own strings hold no import of one
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "import textwrap\n"
        "from {t}executor import assert_same\n"                       # 2: module level
        "from tests.{t}fidelity import tanh_chain\n"                  # 3: through the folder
        "from tests import {t}olla\n"                                 # 4: the module itself
        "from . import {t}reorder\n"                                  # 5: relative
        "import {c}\n"                                                # 6: the conftest
        "\n"
        "\n"
        "def helper():\n"
        "    import {t}checkmate as tc\n"                             # 10: inside a function
        "\n"
        "    return tc\n"
        "\n"
        "\n"
        "SCRIPT = textwrap.dedent(\n"
        '    """\n'                                                   # 16: the string starts
        "    import sys\n"
        "    sys.path.insert(0, {{tests!r}})\n"
        "    from {t}scans import MODELS, scan_mlp as mlp\n"          # 19: in a subprocess
        '    """\n'
        ")\n".format(t="test_", c="conftest"))
    assert imports_of_test_modules(planted) == [
        "test_planted.py:2: from test_executor import assert_same",
        "test_planted.py:3: from tests.test_fidelity import tanh_chain",
        "test_planted.py:4: from tests import test_olla",
        "test_planted.py:5: from . import test_reorder",
        "test_planted.py:6: import conftest",
        "test_planted.py:10: import test_checkmate as tc",
        "test_planted.py:19: from test_scans import MODELS, scan_mlp as mlp",
    ]
    clean = tmp_path / "test_clean.py"
    clean.write_text(
        "import pytest\n"
        "from helpers.checks import assert_same\n"
        "from helpers import generated_models\n"
        "from hypothesis import strategies as st\n"
        "from numpy.testing import assert_allclose\n"
        "SCRIPT = 'import sys\\nfrom helpers.scan_models import MODELS\\n'\n"
        "DOC = 'importing the tests is what this checks'\n")
    assert imports_of_test_modules(clean) == []

    tree = tmp_path / "tests"
    for rel in ("test_a.py", "conftest.py", "helpers/__init__.py", "helpers/graphs.py",
                "bench_graphs.py", "helpers/test_b.py", "data/models.py"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("")
    assert misplaced_modules(tree) == ["bench_graphs.py", "data/models.py", "helpers/test_b.py"]
