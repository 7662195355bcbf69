"""Writing the small result tables of ``experiments/`` (one module, so every script writes CSV
the same way)."""

from __future__ import annotations

import csv
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["write_rows"]


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
