"""The docs say what the code does: their examples run, their commands exist, their paths and
names resolve, and every results file has a page with its command.

* The ``python`` code blocks of ``docs/quickstart.md`` run as written, in order, in one fresh
  interpreter; so do the README's (the drop-in).
* ``remat --help`` (``experiments/cli.py``) lists exactly the subcommands of the quickstart's
  table, and every ``remat SUBCOMMAND --flag`` written in the README or the docs exists.
* Every repository path and every ``remat.`` / ``policies.`` / ``solvers.`` / ``experiments.``
  name written in code in the README or the docs exists; library and experiment docstrings cite
  only paths that exist in the repository, and no file outside it (``../``, ``shared/``, notes).
* ``docs/results_pages.py`` has an entry, with its command, for every file in
  ``experiments/results/``; every CSV/JSON there is named by a docs page or by that registry,
  and the page each entry names says the file's name.
* Every script of ``experiments/`` (not the CLI, the harness and other helpers) has a module
  docstring with the command that runs it and the result file it makes, and names each
  results file whose registered command runs it.

The Sphinx build itself (``sphinx-build -W``) runs in ``.ci/run``, not here.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
#: Generated at build time (not committed) or build output: not checked.
GENERATED = (os.path.join(DOCS, "_build"), os.path.join(DOCS, "results", "data"))
#: Top-level folders a path written in the docs may start with.
TOP = ("remat", "policies", "solvers", "experiments", "tests", "examples", "notebooks", "docs",
       "constraints", ".ci")
#: Packages whose dotted names written in the docs must import.
PACKAGES = ("remat", "policies", "solvers", "experiments")
RESULTS_DIR = os.path.join(ROOT, "experiments", "results")
#: Modules of ``experiments/`` that are not scripts making a result (CLI, helpers, registries).
NOT_SCRIPTS = ("__init__", "bench_models", "cli", "cli_args", "figures_index", "harness",
               "plotstyle", "tables")
#: Seconds a page's code may take (about a minute on 2 loaded cores).
CODE_TIMEOUT_S = 900


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def doc_files() -> list[str]:
    """README.md and every Markdown page under docs/ that is not generated."""
    out = [os.path.join(ROOT, "README.md")]
    for d, _, files in os.walk(DOCS):
        if any(d == g or d.startswith(g + os.sep) for g in GENERATED):
            continue
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
    return out


_FENCE = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1\s*$", re.M | re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(info string, body)`` of each fenced code block of a Markdown text, in order."""
    return [(m.group(2).strip(), m.group(3)) for m in _FENCE.finditer(text)]


def python_blocks(text: str) -> list[str]:
    """The bodies of the ``python`` blocks (not directives such as ``{literalinclude}``)."""
    return [body for info, body in fenced_blocks(text) if info.split()[:1] == ["python"]]


def inline_code(text: str) -> list[str]:
    """The inline code spans of a Markdown text outside its fenced blocks."""
    prose = _FENCE.sub("", text)
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", prose)]


def run_code(code: str, timeout: float = CODE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in the repository root."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def cli_help(*argv: str) -> str:
    """What ``remat *argv --help`` prints."""
    from experiments.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return out.getvalue()


def subcommands() -> set[str]:
    """The subcommands ``remat --help`` lists."""
    m = re.search(r"\{([a-z_,]+)\}", cli_help())
    assert m, "remat --help lists no subcommands"
    return set(m.group(1).split(","))


def command_lines(text: str) -> list[str]:
    """Every ``remat ...`` command written in a text: lines of shell blocks (continuations
    joined, ``for ...; do`` loops split) and inline code spans."""
    lines: list[str] = []
    for info, body in fenced_blocks(text):
        if info.split()[:1] not in (["bash"], ["sh"], ["console"], ["shell"]):
            continue
        lines += body.replace("\\\n", " ").splitlines()
    lines += inline_code(text)
    out = []
    for line in lines:
        for part in re.split(r";|&&|\bdo\b", line):
            part = part.strip().removeprefix("$ ").strip()
            if part.startswith("remat "):
                out.append(part.split(" #")[0].strip())
    return out


def check_commands(text: str, known: set[str]) -> list[str]:
    """Problems with the ``remat`` commands of ``text``: unknown subcommands and flags."""
    problems = []
    helps: dict[str, str] = {}
    for cmd in command_lines(text):
        words = cmd.split()
        sub = words[1] if len(words) > 1 else ""
        if not re.fullmatch(r"[a-z_]+", sub):
            continue  # `remat --help`, `remat SUBCOMMAND --help`: placeholders
        if sub not in known:
            problems.append(f"{cmd!r}: no subcommand {sub!r} in `remat --help` ({sorted(known)})")
            continue
        if sub not in helps:
            helps[sub] = cli_help(sub)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", cmd):
            if not re.search(re.escape(flag) + r"(?![\w-])", helps[sub]):
                problems.append(f"{cmd!r}: `remat {sub} --help` has no {flag}")
    return problems


_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP)
                   + r")/[\w./{}*<>,\-]*[\w/])")


def missing_paths(text: str) -> list[str]:
    """Repository paths written in ``text`` that do not exist (globs, placeholders, outputs
    such as PNGs and build folders are skipped)."""
    out = []
    for path in _PATH.findall(text):
        if any(c in path for c in "{}*<>,") or path.endswith(".png"):
            continue
        if path.startswith(("docs/_build", "docs/results/data")):
            continue
        if not os.path.exists(os.path.join(ROOT, path)):
            out.append(path)
    return out


_NAME = re.compile(r"(?<![\w.])((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)")


def resolves(name: str) -> bool:
    """Whether a dotted name imports: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unresolved_names(text: str) -> list[str]:
    """Dotted names written in the inline code of ``text`` that do not resolve."""
    names = {n for span in inline_code(text) for n in _NAME.findall(span)}
    return sorted(n for n in names if not resolves(n))


# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quickstart_code_runs():
    code = "\n".join(python_blocks(_read(os.path.join(DOCS, "quickstart.md"))))
    assert "remat.value_and_grad" in code, "the quickstart has lost its drop-in example"
    r = run_code(code)
    assert r.returncode == 0, f"docs/quickstart.md's code failed:\n{r.stderr[-4000:]}"


@pytest.mark.slow
def test_readme_code_runs():
    blocks = python_blocks(_read(os.path.join(ROOT, "README.md")))
    assert blocks, "the README has no python block (the drop-in)"
    r = run_code("\n".join(blocks))
    assert r.returncode == 0, f"README.md's code failed:\n{r.stderr[-4000:]}"


def test_quickstart_lists_the_cli_subcommands():
    text = _read(os.path.join(DOCS, "quickstart.md"))
    table = set(re.findall(r"^\| `remat ([a-z_]+)` \|", text, re.M))
    assert table == subcommands(), ("the quickstart's table of subcommands and `remat --help` "
                                    f"differ: {sorted(table)} vs {sorted(subcommands())}")


def test_commands_in_docs_exist():
    known = subcommands()
    problems = [f"{os.path.relpath(p, ROOT)}: {msg}"
                for p in doc_files() for msg in check_commands(_read(p), known)]
    assert not problems, "\n".join(problems)


def missing_links(path: str) -> list[str]:
    """Relative Markdown link targets of the file ``path`` that do not exist."""
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _FENCE.sub("", _read(path))):
        target = target.split("#")[0]
        if not target or re.match(r"[a-z]+:", target):
            continue
        if not os.path.exists(os.path.join(os.path.dirname(path), target)):
            out.append(target)
    return out


def test_paths_in_docs_exist():
    problems = [f"{os.path.relpath(p, ROOT)}: {path}" for p in doc_files()
                for path in missing_paths("\n".join(inline_code(_read(p)))) + missing_links(p)]
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)


def test_names_in_docs_resolve():
    problems = [f"{os.path.relpath(p, ROOT)}: {name}"
                for p in doc_files() for name in unresolved_names(_read(p))]
    assert not problems, "names that do not resolve:\n" + "\n".join(problems)


def test_readme_is_short_and_keeps_the_ci_commands():
    text = _read(os.path.join(ROOT, "README.md"))
    assert len(text.splitlines()) < 200
    lines = text.splitlines()
    assert 'pip install -e ".[dev]" && pytest -n auto' in lines
    assert 'pip install -e ".[dev]" && remat compare mlp --budget 50%' in lines


#: Citations of files outside the repository: a parent folder (``../x``), the shared folder of
#: the project's working notes (``shared/...``) or its design notes (``notes/...``, ``notes §2``).
_OUTSIDE = re.compile(r"(?<![\w.-])(?:\.\./[\w./-]*\w|(?:shared|notes)/[\w./-]*\w|notes\s+§)")
#: An output path in a command (``--out PATH``): made by the command, not cited.
_OUT_ARG = re.compile(r"--out[ =]\S+")


def docstring_citation_problems(source: str) -> list[str]:
    """The paths the docstrings of the Python ``source`` cite that are not in the repository:
    repository paths that do not exist and any citation of a file outside it."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = _OUT_ARG.sub("", ast.get_docstring(node) or "")
            problems += missing_paths(doc)
            problems += [f"{p} (outside the repository)" for p in _OUTSIDE.findall(doc)]
    return problems


def test_docstrings_cite_existing_files():
    problems = []
    for pkg in ("remat", "policies", "solvers", "examples", "experiments"):
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(d, f)
                    problems += [f"{os.path.relpath(path, ROOT)}: {p}"
                                 for p in docstring_citation_problems(_read(path))]
    assert not problems, "docstrings cite files that do not exist:\n" + "\n".join(problems)


def test_docstring_check_catches_planted_citations():
    """A docstring citing a missing repository file, a design note or a file beside the
    repository is caught; one citing an existing file, a paper or an output path is not."""
    def cites(doc: str) -> list[str]:
        return docstring_citation_problems(f'"""{doc}"""\n\ndef f():\n    """{doc}"""\n')

    assert cites("See ``solvers/no_such.py``.") == ["solvers/no_such.py"] * 2
    assert cites("Restated in ``notes/seeds-poet-olla.md`` A.5.") == [
        "notes/seeds-poet-olla.md (outside the repository)"] * 2
    assert cites("Graphs of ``../shared/benchmarks/checkmate-graphs``.") == [
        "../shared/benchmarks/checkmate-graphs (outside the repository)"] * 2
    assert cites("The table of ``shared/notes/gpu-1.md``.") == [
        "shared/notes/gpu-1.md (outside the repository)"] * 2
    assert cites("Request rules (notes §2.3).") == ["notes § (outside the repository)"] * 2
    assert cites("See ``solvers/bounds.py`` and ``docs/design/decisions/0003-path-cuts.md``; "
                 "Patil et al., POET, ICML 2022; python -m x --out experiments/results/new.csv; "
                 "the notes that leave paged bytes; fwd/bwd notes.") == []


def test_every_results_file_has_a_page_and_command():
    results_pages = _results_pages()
    assert results_pages.unregistered(RESULTS_DIR) == []
    for r in results_pages.RESULTS:
        assert r.command.strip(), f"{r.file}: no command"
        assert os.path.exists(os.path.join(DOCS, r.page + ".md")), f"{r.file}: no page {r.page}"


def _results_pages():
    sys.path.insert(0, DOCS)
    try:
        import results_pages
    finally:
        sys.path.remove(DOCS)
    return results_pages


def page_sources() -> dict[str, str]:
    """The text of every hand-written docs page and of ``docs/results_pages.py`` (which
    generates the data pages and the tables the results pages include), by path."""
    paths = [p for p in doc_files() if p.startswith(DOCS + os.sep)]
    paths.append(os.path.join(DOCS, "results_pages.py"))
    return {p: _read(p) for p in paths}


def names_result(text: str, file: str) -> bool:
    """Whether ``text`` names the result file ``file``: its whole name (``melon_pool.csv``, not
    inside ``old_melon_pool.csv``) or its data page (``data/melon_pool_csv``)."""
    stem = file.replace(".", "_")
    return bool(re.search(rf"(?<![\w.-]){re.escape(file)}(?![\w])", text)
                or re.search(rf"data/{re.escape(stem)}(?!\w)", text))


def unreferenced_results(files, sources: dict[str, str]) -> set[str]:
    """The CSV/JSON result files among ``files`` that no text of ``sources`` names."""
    text = "\n".join(sources.values())
    return {f for f in files if f.endswith((".csv", ".json")) and not names_result(text, f)}


def pages_missing_their_files(results) -> list[str]:
    """Registry entries whose page (``Result.page``) names neither the file nor its data page."""
    out = []
    for r in results:
        path = os.path.join(DOCS, r.page + ".md")
        if not names_result(_read(path) if os.path.exists(path) else "", r.file):
            out.append(f"{r.file}: docs/{r.page}.md does not name it")
    return out


def script_problems(scripts: dict[str, str], results) -> list[str]:
    """What the module docstrings of ``scripts`` (name -> source) lack: a command that runs the
    script (``python ... experiments/NAME.py`` or ``python -m experiments.NAME``), a result file
    (a name in ``results``, or the words "no result file"), and every file of ``results`` whose
    command runs the script."""
    problems = []
    docs = {}
    for name, source in scripts.items():
        doc = ast.get_docstring(ast.parse(source)) or ""
        docs[name] = doc
        if not doc:
            problems.append(f"experiments/{name}.py: no module docstring")
            continue
        if not re.search(rf"python\S* (?:\S+ )*(?:experiments/{name}\.py|-m experiments\.{name})\b",
                         doc):
            problems.append(f"experiments/{name}.py: its docstring has no command that runs it")
        if "no result file" not in doc and not any(r.file in doc for r in results):
            problems.append(f"experiments/{name}.py: its docstring names no result file")
    for r in results:
        for name in set(re.findall(r"experiments[./](\w+)(?:\.py)?\b", r.command)):
            if name in docs and r.file not in docs[name]:
                problems.append(f"experiments/{name}.py: its docstring does not name {r.file}, "
                                f"which its command makes")
    return problems


def experiment_scripts() -> dict[str, str]:
    d = os.path.join(ROOT, "experiments")
    return {f[:-3]: _read(os.path.join(d, f)) for f in sorted(os.listdir(d))
            if f.endswith(".py") and f[:-3] not in NOT_SCRIPTS}


def test_every_results_file_is_named_by_the_docs():
    sources = page_sources()
    assert unreferenced_results(os.listdir(RESULTS_DIR), sources) == set(), (
        "result files no docs page names (add a page, or an entry in docs/results_pages.py)")
    assert pages_missing_their_files(_results_pages().RESULTS) == []


def test_experiment_scripts_state_their_command_and_file():
    problems = script_problems(experiment_scripts(), _results_pages().RESULTS)
    assert not problems, "\n".join(problems)


def test_result_checks_catch_planted_errors():
    """The checks of result files and scripts see a file without a page and a script that does
    not say what it makes."""
    rp = _results_pages()
    sources = page_sources()
    files = ["fidelity.csv", "calibrate_cpu.json", "no_such_result.csv", "no_such.json", "x.log"]
    assert unreferenced_results(files, sources) == {"no_such_result.csv", "no_such.json"}
    assert unreferenced_results(files, {"page.md": "see data/no_such_result_csv"}) == {
        "fidelity.csv", "calibrate_cpu.json", "no_such.json"}
    assert unreferenced_results(["pool.csv"], {"page.md": "`melon_pool.csv`"}) == {"pool.csv"}
    wrong_page = rp.Result("fidelity.csv", "t", "python experiments/fidelity_benchmark.py",
                           "results/apply")
    assert pages_missing_their_files([wrong_page]) == [
        "fidelity.csv: docs/results/apply.md does not name it"]
    assert pages_missing_their_files([rp.Result("fidelity.csv", "t", "c", "results/fidelity")]) == []
    made = rp.Result("made.csv", "t", "python -m experiments.good --out made.csv", "p")
    good = '"""Makes it.\n\n    python -m experiments.good --out experiments/results/made.csv\n"""\n'
    assert script_problems({"good": good}, [made]) == []
    assert script_problems({"good": '"""Makes something."""\n'}, [made]) == [
        "experiments/good.py: its docstring has no command that runs it",
        "experiments/good.py: its docstring names no result file",
        "experiments/good.py: its docstring does not name made.csv, which its command makes"]
    assert script_problems({"bad": "x = 1\n"}, []) == ["experiments/bad.py: no module docstring"]


def test_checks_catch_planted_errors():
    """The checkers above see what they are for (so a checker that goes blind fails)."""
    known = subcommands()
    assert check_commands("```bash\nremat frobnicate mlp\n```\n", known)
    assert check_commands("`remat compare mlp --budgett 50%`", known)
    assert not check_commands("`remat compare mlp --budget 50%`", known)
    assert missing_paths("see `solvers/no_such_module.py`") == ["solvers/no_such_module.py"]
    assert not missing_paths("see `solvers/bounds.py` and `experiments/results/melon_*.csv`")
    assert unresolved_names("`remat.no_such_function(x)`") == ["remat.no_such_function"]
    assert not unresolved_names("`remat.core.graph.Graph`")
    r = run_code("import remat\nremat.no_such_function()", timeout=120)
    assert r.returncode != 0
