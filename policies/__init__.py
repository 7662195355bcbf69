"""Rematerialization policies: one module per policy, ``Graph -> Plan``.

``policies.get(name, **options)`` and ``policies.available()`` form the registry;
:mod:`policies.combinators` composes policies (``WarmStarted``, ``Reordered``, ``BestOf``,
``Fallback``).
"""

from policies.base import (
    BasePolicy,
    Policy,
    PolicyContext,
    available,
    checkpoint_all_plan,
    get,
    option_names,
    register,
)
from policies.chain_dp import ChainDP
from policies.checkmate import Checkmate, CheckmateMILP
from policies.checkpoint_all import CheckpointAll
from policies.combinators import BestOf, Fallback, Reordered, WarmStarted
from policies.greedy_remat import GreedyRemat
from policies.griewank import Griewank
from policies.hierarchical import Hierarchical
from policies.jax_policy import JaxPolicy
from policies.melon import Melon
from policies.nntrainer import NNTrainer
from policies.olla import Olla
from policies.peak_shave import PeakShave
from policies.pebbling import Pebbling
from policies.poet import Poet
from policies.recompute_all import RecomputeAll
from policies.sage import Sage
from policies.scan_layers import ScanLayers
from policies.sqrtn import SqrtN

__all__ = [
    "BasePolicy", "Policy", "PolicyContext", "available", "get", "option_names", "register",
    "checkpoint_all_plan", "ScanLayers", "BestOf", "Fallback", "Reordered", "WarmStarted",
    "CheckpointAll", "RecomputeAll", "JaxPolicy", "SqrtN", "Griewank", "ChainDP",
    "Checkmate", "CheckmateMILP", "Poet", "GreedyRemat", "Pebbling", "PeakShave", "Olla", "Melon", "NNTrainer", "Sage",
    "Hierarchical",
]
