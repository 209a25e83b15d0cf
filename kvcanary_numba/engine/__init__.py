"""A toy paged KV engine with fault injection, to show (and test) the canary catching KV bugs."""

from __future__ import annotations

from .config import EngineConfig
from .engine import ToyEngine
from .faults import ALL_FAULT_CLASSES, FAULT_CLASSES, TRANSIT_FAULT_CLASSES, FaultRecord
from .host_tier import HostTier
from .pair import EnginePair

__all__ = [
    "ALL_FAULT_CLASSES",
    "FAULT_CLASSES",
    "TRANSIT_FAULT_CLASSES",
    "EngineConfig",
    "EnginePair",
    "FaultRecord",
    "HostTier",
    "ToyEngine",
]
