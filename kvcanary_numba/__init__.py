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
    compute_handoff_digest,
    compute_real_kv_hash,
    gather_canary_records,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_plan_offsets_kernel,
    move_canary_records,
    scatter_canary_records,
    scatter_req_token_ids,
    verify_canary_records,
)
from .handoff import CanaryHandoffWarning, HandoffDigest, HandoffSignature, check_handoff_digest
from .hashing import chain_head, splitmix64, splitmix64_mix3
from .monitor import (
    CanaryMonitor,
    CanaryStalledError,
    CanaryViolationError,
    KvGroup,
    MovedRecords,
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
    "MovedRecords",
    "SlotChain",
    "StepBatch",
    "Violation",
    "CanaryHandoffWarning",
    "HandoffDigest",
    "HandoffSignature",
    "check_handoff_digest",
    "compute_handoff_digest",
    "compute_real_kv_hash",
    "gather_canary_records",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_plan_offsets_kernel",
    "move_canary_records",
    "scatter_canary_records",
    "scatter_req_token_ids",
    "verify_canary_records",
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
