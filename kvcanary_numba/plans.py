"""VerifyPlan and WritePlan: the flat per-step work lists the plan kernels fill.

Both are plain holders of arrays (NumPy or CUDA), allocated once at their
capacity and refilled in place every step, so that a captured CUDA graph keeps
pointing at the same memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._runtime import INT32_MAX, array_module, coded_allocation
from ._validate import check_int
from .constants import EXPECTED_TOKEN_UNCHECKED, NO_PREDECESSOR

__all__ = ["ENTRY_FIELDS", "VerifyPlan", "WritePlan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyPlan:
    """Flat verify entries: one (slot, expected token, position, predecessor) per entry.

    Attributes
    ----------
    verify_slot_indices : int64 [verify_capacity]
        Canary slot of each entry (already SWA-translated for SWA groups).
    verify_expected_tokens : int64 [verify_capacity]
        Expected token id, or -1 to skip the token check.
    verify_expected_positions : int64 [verify_capacity]
        Position the plan expects the slot to hold.
    verify_prev_slot_indices : int64 [verify_capacity]
        Chain predecessor slot; negative means chain head (anchor), 0 means
        "unreachable" (chain check skipped).
    verify_num_valid : int32 [1]
        Active entries; verify reads ``[0, min(num_valid, capacity))``.
    enable : int32 [1]
        1 runs verify; 0 (plan overflow) skips it for the step.
    """

    verify_slot_indices: Any
    verify_expected_tokens: Any
    verify_expected_positions: Any
    verify_prev_slot_indices: Any
    verify_num_valid: Any
    enable: Any

    @property
    def verify_capacity(self) -> int:
        return int(self.verify_slot_indices.shape[0])

    @staticmethod
    def allocation_bytes(verify_capacity: int) -> int:
        """Device bytes of a plan of ``verify_capacity`` entries."""
        return 4 * verify_capacity * 8 + 2 * 4

    @classmethod
    def allocate(cls, *, verify_capacity: int, device: str = "cpu") -> VerifyPlan:
        """Allocate a zeroed plan (``enable`` = 1, expected tokens = -1).

        Parameters
        ----------
        verify_capacity : int
            Entries the plan can hold, in ``[1, 2**31 - 1]`` (KVC-C011; the
            count is int32 on the device). KVC-C015 when it does not fit in memory.
        device : {"cpu", "cuda"}
            NumPy or CuPy arrays (KVC-C009, KVC-C008).

        Raises
        ------
        KvCanaryError
            KVC-C011, KVC-C015, KVC-C009, KVC-C008.
        """
        capacity = check_int("VerifyPlan.allocate", "verify_capacity", verify_capacity, low=1, high=INT32_MAX)
        xp = array_module("VerifyPlan.allocate", device)
        nbytes = cls.allocation_bytes(capacity)
        with coded_allocation("VerifyPlan.allocate", "verify_capacity", capacity, what="verify plan", nbytes=nbytes):
            return cls(
                verify_slot_indices=xp.zeros(capacity, dtype=np.int64),
                verify_expected_tokens=xp.full(capacity, EXPECTED_TOKEN_UNCHECKED, dtype=np.int64),
                verify_expected_positions=xp.zeros(capacity, dtype=np.int64),
                verify_prev_slot_indices=xp.zeros(capacity, dtype=np.int64),
                verify_num_valid=xp.zeros(1, dtype=np.int32),
                enable=xp.ones(1, dtype=np.int32),
            )

    def arrays(self) -> dict[str, Any]:
        """Field name -> array, in declaration order."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True, kw_only=True)
class WritePlan:
    """Per-request write metadata: token ranges and chain seeds.

    Attributes
    ----------
    write_offsets : int64 [write_req_capacity + 1]
        Exclusive prefix sum: request r owns token entries
        ``[write_offsets[r], write_offsets[r + 1])`` of input_ids / positions /
        out_cache_loc. Note the ``+ 1``.
    write_seed_slot_indices : int64 [write_req_capacity]
        Slot whose record continues into the request's first new token;
        -1 anchors the chain.
    write_num_valid_reqs : int32 [1]
        Requests the write kernel walks.
    """

    write_offsets: Any
    write_seed_slot_indices: Any
    write_num_valid_reqs: Any

    @property
    def write_req_capacity(self) -> int:
        return int(self.write_seed_slot_indices.shape[0])

    @staticmethod
    def allocation_bytes(write_req_capacity: int) -> int:
        """Device bytes of a plan for ``write_req_capacity`` requests."""
        return (2 * write_req_capacity + 1) * 8 + 4

    @classmethod
    def allocate(cls, *, write_req_capacity: int, device: str = "cpu") -> WritePlan:
        """Allocate an empty plan with ``write_req_capacity + 1`` offsets.

        Parameters
        ----------
        write_req_capacity : int
            Largest batch (requests) the plan describes, in ``[1, 2**31 - 2]``
            (KVC-C011); KVC-C015 when it does not fit in memory.
        device : {"cpu", "cuda"}
            NumPy or CuPy arrays.

        Raises
        ------
        KvCanaryError
            KVC-C011, KVC-C015, KVC-C009, KVC-C008.
        """
        function = "WritePlan.allocate"
        capacity = check_int(function, "write_req_capacity", write_req_capacity, low=1, high=INT32_MAX - 1)
        xp = array_module(function, device)
        nbytes = cls.allocation_bytes(capacity)
        with coded_allocation(function, "write_req_capacity", capacity, what="write plan", nbytes=nbytes):
            return cls(
                write_offsets=xp.zeros(capacity + 1, dtype=np.int64),
                write_seed_slot_indices=xp.full(capacity, NO_PREDECESSOR, dtype=np.int64),
                write_num_valid_reqs=xp.zeros(1, dtype=np.int32),
            )

    def arrays(self) -> dict[str, Any]:
        """Field name -> array, in declaration order."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


#: A verify plan's per-entry arrays: one length each, the plan's capacity.
ENTRY_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
)
