"""kvcanary_numba: SGLang's kv-canary KV-cache corruption detector on Numba-CUDA and NumPy."""

from __future__ import annotations

from ._arrays import gpu_available, simulator_enabled
from .constants import (
    CANARY_CHAIN_ANCHOR,
    CANARY_CHAIN_HEAD,
    CANARY_SLOT_BYTES,
    MAX_REAL_KV_SOURCES,
    OUT_OF_RANGE_SLOT,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
)
from .context import CanaryContext, RealKvSource
from .errors import KvCanaryError, KvCanaryTypeError
from .hashing import chain_head, splitmix64, splitmix64_mix3
from .plans import VerifyPlan, WritePlan

__version__ = "0.1.0"

__all__ = [
    "CANARY_CHAIN_ANCHOR",
    "CANARY_CHAIN_HEAD",
    "CANARY_SLOT_BYTES",
    "MAX_REAL_KV_SOURCES",
    "OUT_OF_RANGE_SLOT",
    "CanaryContext",
    "CanaryLaunchTag",
    "FailReason",
    "KvCanaryError",
    "KvCanaryTypeError",
    "RealKvHashMode",
    "RealKvSource",
    "VerifyPlan",
    "WritePlan",
    "chain_head",
    "gpu_available",
    "simulator_enabled",
    "splitmix64",
    "splitmix64_mix3",
]
