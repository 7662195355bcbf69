"""Sphinx configuration of the remat documentation.

Build (CI runs this at its newest end): ``sphinx-build -W --keep-going -b html docs docs/_build/html``.
The results pages under ``results/data/`` and the tables under ``results/data/views/`` that
``results/*.md`` include are generated from ``experiments/results/*.csv`` by
``docs/results_pages.py`` at the start of every build.
"""

from __future__ import annotations

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)
sys.path.insert(0, DOCS)

import results_pages  # noqa: E402

results_pages.write_pages(os.path.join(ROOT, "experiments", "results"),
                          os.path.join(DOCS, "results", "data"))

project = "remat"
author = "the remat authors"
copyright = "2026, the remat authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# the tables results pages include (``{include}``), not documents of their own
exclude_patterns = ["_build", "results/data/views"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True

html_theme = "furo"
html_title = "remat"
html_static_path: list[str] = []
