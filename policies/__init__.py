"""Rematerialization policies: one module per policy, ``Graph -> Plan``.

``policies.get(name, **options)`` and ``policies.available()`` form the registry.
"""

from policies.base import Policy, available, checkpoint_all_plan, get, register
from policies.checkpoint_all import CheckpointAll
from policies.checkmate import Checkmate
from policies.poet import Poet

__all__ = ["Policy", "available", "get", "register", "checkpoint_all_plan", "CheckpointAll"]
