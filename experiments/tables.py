"""Writing the small result tables of ``experiments/`` (one module, so every script writes CSV
the same way)."""

from __future__ import annotations

import csv
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["write_rows", "ResumableCsv"]


def write_rows(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]], *,
               fields: Sequence[str] | None = None, float_format: str | None = None
               ) -> pathlib.Path:
    """Write ``rows`` as a CSV at ``path`` (parent folders created) and return the path.

    Args:
      fields: column order (default: the first row's keys); a row's missing keys are empty.
      float_format: e.g. ``".4g"`` to write floats rounded (default: ``repr``-exact).
    """
    rows = list(rows)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(fields) if fields is not None else list(rows[0])
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (format(v, float_format) if float_format and isinstance(v, float)
                            else v) for k, v in ((k, r.get(k, "")) for k in cols)})
    return path


class ResumableCsv:
    """A results CSV that a sweep appends to row by row, so that an interrupted sweep keeps
    every finished row and a rerun skips them.

    ``key(row)`` names a row's configuration; it sees the rows already in the file as strings
    and the rows appended as the script built them, so it should convert (``int(r["L"])``).
    """

    def __init__(self, path: str | os.PathLike, fields: Sequence[str],
                 key: Callable[[Mapping[str, Any]], tuple]) -> None:
        self.path = pathlib.Path(path)
        self.fields = list(fields)
        self.key = key
        self.done: dict[tuple, Mapping[str, Any]] = {}
        if self.path.exists():
            with self.path.open(newline="") as fh:
                for r in csv.DictReader(fh):
                    self.done[key(r)] = r

    def __contains__(self, k: tuple) -> bool:
        return k in self.done

    def get(self, k: tuple, default: Any = None) -> Any:
        """The finished row with key ``k`` (``default`` if none)."""
        return self.done.get(k, default)

    def append(self, row: Mapping[str, Any]) -> None:
        """Write ``row`` at the end of the file (header first in a new file) and flush it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=self.fields)
            if new:
                w.writeheader()
            w.writerow({k: row.get(k, "") for k in self.fields})
        self.done[self.key(row)] = row
