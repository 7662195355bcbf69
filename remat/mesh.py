"""Which devices and mesh axes the leaves of a pytree of (abstract) arguments are sharded over.

The helpers :mod:`remat.sharding` (the per-device graph) and :mod:`remat.sharded_memory` (the
per-device temp model) both read.
"""

from __future__ import annotations

import jax

__all__ = ["leaf_sharding", "n_devices", "is_sharded", "axis_sizes"]


def leaf_sharding(x):
    """``x``'s sharding when it spans more than one device, else ``None``."""
    s = getattr(x, "sharding", None)
    return s if s is not None and len(getattr(s, "device_set", ())) > 1 else None


def n_devices(args) -> int:
    """The most devices one leaf of ``args`` is sharded over (1: nothing sharded)."""
    return max((len(s.device_set) for x in jax.tree_util.tree_leaves(args)
                if (s := leaf_sharding(x)) is not None), default=1)


def is_sharded(args) -> bool:
    """Some leaf of ``args`` carries a sharding over more than one device."""
    return n_devices(args) > 1


def axis_sizes(args) -> dict:
    """Mesh axis name -> devices, over the meshes of ``args``' sharded leaves."""
    sizes: dict = {}
    for x in jax.tree_util.tree_leaves(args):
        mesh = getattr(leaf_sharding(x), "mesh", None)
        if mesh is not None:
            sizes.update(dict(mesh.shape))
    return sizes
