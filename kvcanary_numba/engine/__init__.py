"""A toy paged KV engine with fault injection, to show (and test) the canary catching KV bugs."""

from __future__ import annotations

from .config import EngineConfig
from .engine import ToyEngine
from .faults import FAULT_CLASSES, FaultRecord

__all__ = ["FAULT_CLASSES", "EngineConfig", "FaultRecord", "ToyEngine"]
