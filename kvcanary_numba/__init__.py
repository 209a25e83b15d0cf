"""kvcanary_numba: SGLang's kv-canary KV-cache corruption detector on Numba-CUDA and NumPy.

The operations exported here are the fast wing's (``kvcanary_numba/fast/calls.py``): the
core operations (``kvcanary_numba/verify.py`` and its siblings: validate, then the NumPy
specification or one kernel launch) wrapped with a validation memo, raw driver launches
and the optimised CPU path. Same arguments, results and errors.
"""

from __future__ import annotations

from ._runtime import gpu_available, simulator_enabled
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
from .fast.calls import (
    compute_real_kv_hash,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_plan_offsets_kernel,
    scatter_req_token_ids,
)
from .hashing import chain_head, splitmix64, splitmix64_mix3
from .monitor import (
    CanaryMonitor,
    CanaryStalledError,
    CanaryViolationError,
    KvGroup,
    SlotChain,
    StepBatch,
    Violation,
)
from .plans import VerifyPlan, WritePlan
from .write import CanarySlotZeroWarning

__version__ = "0.1.0"

__all__ = [
    "CANARY_CHAIN_ANCHOR",
    "CanaryMonitor",
    "CanarySlotZeroWarning",
    "CanaryStalledError",
    "CanaryViolationError",
    "KvGroup",
    "SlotChain",
    "StepBatch",
    "Violation",
    "compute_real_kv_hash",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_plan_offsets_kernel",
    "scatter_req_token_ids",
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
