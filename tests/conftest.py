"""Collection order for a parallel run (``pytest -n auto``): tests marked ``slow`` first.

pytest-xdist hands tests to its workers in collection order, so a long test collected last
keeps one worker busy while the others idle; collected first, the short tests fill in around
it.  (An expensive module-scoped fixture runs once per worker that gets one of its tests, so
the modules here give each expensive subprocess to one test.)
"""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
