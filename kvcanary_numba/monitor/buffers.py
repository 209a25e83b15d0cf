"""The monitor's sizes and device memory, allocated once: status block, ring, groups, token pool.

Every array a step launches on is allocated here when the monitor is built, after
every size is checked (KVC-C011: an int in ``[1, 2**31 - 1]``, the int32 device
counters' range); nothing is allocated per step. A request that does not fit in
memory raises KVC-C015 with the bytes it asked for.
"""

from __future__ import annotations

import numpy as np

from .._runtime import INT32_MAX, coded_allocation
from .._validate import check_int
from ..constants import VIOLATION_FIELDS, RealKvHashMode
from ..errors import error
from .groups import GroupState, KvGroup
from .status import StatusBlock

__all__ = ["MonitorBuffers"]


class MonitorBuffers:
    """The arrays of one monitor.

    Parameters
    ----------
    function : str
        The public function allocating (error messages).
    groups : list of KvGroup
        FULL, then SWA if any (checked).
    xp : module
        ``numpy`` or ``cupy``.
    device : {"cpu", "cuda"}
        Where the arrays live.
    hash_mode : RealKvHashMode
        The real-KV hash mode the groups' contexts carry.
    chain_assert : bool
        Initial value of the write chain-position assert (off during warm-up).
    ring_capacity, write_req_capacity : int
        Violation rows the ring keeps; largest batch (requests) of a step.
    write_token_capacity, verify_capacity, sweep_capacity : int or None
        Largest number of new tokens of a step, verify entries per step and group, slots
        one sweep covers; None: FULL slots, 3 x FULL slots, FULL slots.
    token_pool : (max_requests, max_context_len) or None
        Shape of the expected-token pool (None: no pool; a None size raises KVC-M008).

    Attributes
    ----------
    caps : dict
        The checked ``write_req_capacity``, ``write_token_capacity``, ``verify_capacity`` and
        ``sweep_capacity``.
    status : StatusBlock
        Write index, run counters and plan flags in one int64 array.
    ring : int64 [ring_capacity, VIOLATION_FIELDS]
        The violation ring.
    enable_chain_position_assert : int32 [1]
        The write chain-position assert flag all groups share.
    groups : list of GroupState
        Each group's canary buffers, plans and launch contexts.
    token_pool, valid_lens : int32 [max_requests, max_context_len], int64 [write_req_capacity] or None
        The expected-token pool and its valid lengths per request.
    """

    def __init__(
        self,
        function: str,
        groups: list[KvGroup],
        *,
        xp,
        device: str,
        hash_mode: RealKvHashMode,
        chain_assert: bool,
        ring_capacity: int,
        write_req_capacity: int,
        write_token_capacity: int | None,
        verify_capacity: int | None,
        sweep_capacity: int | None,
        token_pool: tuple | None,
    ):
        slots = groups[0].num_slots

        def size(name: str, value, default: int | None = None, high: int = INT32_MAX) -> int:
            return check_int(function, name, default if value is None else value, low=1, high=high)

        ring_capacity = size("ring_capacity", ring_capacity)
        self.caps = caps = dict(
            write_req_capacity=size("write_req_capacity", write_req_capacity, high=INT32_MAX - 1),
            write_token_capacity=size("write_token_capacity", write_token_capacity, slots),
            verify_capacity=size("verify_capacity", verify_capacity, min(3 * slots, INT32_MAX)),
            sweep_capacity=size("sweep_capacity", sweep_capacity, slots),
        )
        nbytes = ring_capacity * VIOLATION_FIELDS * 8 + sum(GroupState.allocation_bytes(g, **caps) for g in groups)
        what = "ring, canary buffers and plans"
        with coded_allocation(function, "ring_capacity", ring_capacity, what=what, nbytes=nbytes):
            self.status = StatusBlock(xp, len(groups))
            self.ring = xp.zeros((ring_capacity, VIOLATION_FIELDS), dtype=np.int64)
            self.enable_chain_position_assert = xp.full(1, int(chain_assert), dtype=np.int32)
            shared = dict(violation_ring=self.ring, enable_chain_position_assert=self.enable_chain_position_assert)
            self.groups = [
                GroupState(
                    g, xp=xp, device=device, mode=hash_mode, shared=dict(shared, **self.status.launch_views(i)), **caps
                )
                for i, g in enumerate(groups)
            ]
        self.token_pool = self.valid_lens = None
        if token_pool is not None:
            rows, cols = token_pool
            self.token_pool, self.valid_lens = allocate_token_pool(
                function, xp, max_requests=rows, max_context_len=cols, write_req_capacity=caps["write_req_capacity"]
            )


def allocate_token_pool(function: str, xp, *, max_requests, max_context_len, write_req_capacity: int):
    """The expected-token pool int32 [max_requests, max_context_len] and valid lengths int64 [capacity].

    Raises
    ------
    KvCanaryError
        KVC-M008 when a size is missing, KVC-C011 when it is not an int in ``[1, 2**31 - 1]``,
        KVC-C015 when the pool does not fit in memory.
    """
    for name, value in (("max_requests", max_requests), ("max_context_len", max_context_len)):
        if value is None:
            raise error("KVC-M008", function=function, argument=name)
    rows = check_int(function, "max_requests", max_requests, low=1, high=INT32_MAX)
    cols = check_int(function, "max_context_len", max_context_len, low=1, high=INT32_MAX)
    nbytes = rows * cols * 4 + write_req_capacity * 8
    with coded_allocation(function, "max_context_len", cols, what="expected-token pool", nbytes=nbytes):
        return xp.zeros((rows, cols), dtype=np.int32), xp.zeros(write_req_capacity, dtype=np.int64)
