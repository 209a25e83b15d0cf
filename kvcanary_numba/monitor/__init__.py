"""The user-level detector: CanaryMonitor, its step batches, sweeps and readable reports."""

from __future__ import annotations

from .batch import StepBatch
from .groups import KvGroup
from .health import CanaryStalledError, HealthReport
from .monitor import MODES, CanaryMonitor, CanaryViolationError
from .report import BIT_EXPLANATIONS, Violation, decode_rows
from .sweep import SlotChain

__all__ = [
    "BIT_EXPLANATIONS",
    "MODES",
    "CanaryMonitor",
    "CanaryStalledError",
    "CanaryViolationError",
    "HealthReport",
    "KvGroup",
    "SlotChain",
    "StepBatch",
    "Violation",
    "decode_rows",
]
