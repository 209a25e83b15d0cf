"""Verdict kernel: a monitor's status block and ring, summed up in one small word per step.

Semantics: :mod:`kvcanary_numba.reference.verdict`. Lanes: ``VERDICT_*`` in
:mod:`kvcanary_numba.constants`. One block of one warp: its threads OR the fail bits of
the rows new since the previous verdict (a clean step has none), then thread 0 writes the
word and moves the state on. Every argument is a long-lived array or a constant of the
monitor, so the launch is recorded into the TAIL phase and captured with it.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from ..constants import (
    ROW_FAIL_REASON,
    VERDICT_FAIL_BITS,
    VERDICT_FORMAT,
    VERDICT_LANES,
    VERDICT_MAGIC,
    VERDICT_NEW_ROWS,
    VERDICT_PLAN_OVERFLOW,
    VERDICT_RANK,
    VERDICT_RING_FULL,
    VERDICT_SEQ,
    VERDICT_STALLED,
)

__all__ = ["KERNELS", "SIGNATURES", "VERDICT_BLOCK", "verdict_kernel"]

#: Threads of the one block.
VERDICT_BLOCK = 32
_INT32_MAX = 2**31 - 1
_FAIL_LANES = VERDICT_LANES - VERDICT_FAIL_BITS

#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {
    "verdict": ("void(int32[::1], int64[:, ::1], int64[::1], int32[::1], int32[::1], int64, int64, int64, int64)",)
}


@cuda.jit
def verdict_kernel(status_lanes, ring, state, stalled, word, first_plan_lane, plan_lane_stride, num_groups, rank):
    """Write ``word`` (int32 [VERDICT_LANES]) from the status block's int32 lanes and the ring.

    ``state`` (int64 [2]): the write index the previous verdict saw, verdicts written.
    ``stalled`` (int32 [1]): the host's sticky health flag. Group ``g``'s plan ``enable``
    is ``status_lanes[first_plan_lane + g * plan_lane_stride]``.
    """
    bits = cuda.shared.array(1, int64)
    tid = cuda.threadIdx.x
    if tid == 0:
        bits[0] = 0
    cuda.syncthreads()
    index = int64(status_lanes[0])
    seen = state[0]
    capacity = int64(ring.shape[0])
    start = min(max(seen, int64(0)), capacity)
    stop = min(max(index, int64(0)), capacity)
    local = int64(0)
    for row in range(start + tid, stop, cuda.blockDim.x):
        local |= ring[row, ROW_FAIL_REASON]
    if local != 0:
        cuda.atomic.or_(bits, 0, local)
    cuda.syncthreads()
    if tid != 0:
        return
    new_rows = max(index - seen, int64(0))
    seq = state[1] + 1
    overflow = int32(0)
    for g in range(num_groups):
        if status_lanes[first_plan_lane + g * plan_lane_stride] == 0:
            overflow = int32(1)
    word[VERDICT_FORMAT] = int32(VERDICT_MAGIC)
    word[VERDICT_SEQ] = int32(min(seq, int64(_INT32_MAX)))
    word[VERDICT_NEW_ROWS] = int32(min(new_rows, int64(_INT32_MAX)))
    word[VERDICT_RANK] = int32(rank + 1) if new_rows > 0 else int32(0)
    word[VERDICT_RING_FULL] = int32(1) if index > capacity else int32(0)
    word[VERDICT_PLAN_OVERFLOW] = overflow
    word[VERDICT_STALLED] = int32(1) if stalled[0] != 0 else int32(0)
    folded = bits[0]
    for b in range(_FAIL_LANES):
        word[VERDICT_FAIL_BITS + b] = int32((folded >> b) & 1)
    state[0] = max(index, seen)
    state[1] = seq


KERNELS = {"verdict": verdict_kernel}
