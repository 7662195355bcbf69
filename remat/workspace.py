"""Scratch bytes XLA allocates while one equation runs, beyond its operands and result.

One rule, read off XLA:CPU's buffer assignment (jaxlib 0.8 to 0.12): a convolution with
``batch_group_count = G > 1`` (the weight gradient JAX emits for a depthwise or grouped
convolution) is lowered by XLA:CPU's group converter to a dense convolution over all ``G``
groups' pairs, whose result is ``G`` times the grouped one's, followed by a transposed, masked
copy of it that keeps the diagonal blocks, then a reduction to the grouped result::

    workspace = 2 * G * bytes(result)        # [C, kh, kw, C] and its [kh, kw, C, C] copy

(a depthwise 3x3 convolution of ``C = 240`` channels: two ``f32[3,3,240,240]``, 4147200 bytes,
whatever the activations' size).  No rematerialization removes it; a plan can only avoid
holding other values while it runs.  Other backends: 0 (no rule measured).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from remat.core.errors import ExtractionError

__all__ = ["eqn_workspace_bytes"]


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def eqn_workspace_bytes(eqn: Any, backend: str = "cpu") -> int:
    """Workspace bytes of ``eqn`` (a ``JaxprEqn``, or anything with ``primitive``, ``params``
    and ``outvars``) on ``backend`` (see the module docstring).

    Raises:
      ExtractionError: ``eqn`` is not an equation.
    """
    if not all(hasattr(eqn, a) for a in ("primitive", "params", "outvars")):
        raise ExtractionError(f"eqn_workspace_bytes needs a jaxpr equation, got {type(eqn).__name__}")
    if backend != "cpu" or eqn.primitive.name != "conv_general_dilated":
        return 0
    g = int(eqn.params.get("batch_group_count", 1) or 1)
    if g <= 1:
        return 0
    return 2 * g * _nbytes(eqn.outvars[0].aval)
