"""The user-level detector: CanaryMonitor, its step batches, sweeps, readable reports, triage, bundles, budgets,
and the verdict word that ranks of one job merge."""

from __future__ import annotations

from ..write import CanarySlotZeroWarning
from .batch import StepBatch
from .budget import VerifyBudget
from .bundle import BundleWriteWarning
from .groups import KvGroup
from .health import CanaryStalledError, HealthReport
from .monitor import MODES, CanaryMonitor, CanaryViolationError
from .moves import MovedRecords
from .report import BIT_EXPLANATIONS, Violation, decode_rows
from .sweep import SlotChain
from .triage import CanaryBlindSpotWarning, Diagnosis
from .verdict import CanaryVerdictError, Verdict, merge_verdicts

__all__ = [
    "BIT_EXPLANATIONS",
    "MODES",
    "BundleWriteWarning",
    "CanaryBlindSpotWarning",
    "CanaryMonitor",
    "CanarySlotZeroWarning",
    "CanaryStalledError",
    "CanaryVerdictError",
    "CanaryViolationError",
    "Diagnosis",
    "HealthReport",
    "KvGroup",
    "MovedRecords",
    "SlotChain",
    "StepBatch",
    "Verdict",
    "VerifyBudget",
    "Violation",
    "decode_rows",
    "merge_verdicts",
]
