"""Specification of the verdict word (``kernels/verdict.py``) and of its merge across ranks.

A monitor that takes part in a job of several ranks (processes, or GPUs of one process)
sums up each step in one small word, int32 ``[VERDICT_LANES]``, written on the device at the
end of the step's TAIL phase from its status block and ring, with no host read. An
engine combines the words of all ranks with its own collective, one element-wise max
(:func:`merge_verdicts` is that max on the host), and hands the result back to every
monitor, which then acts on the same combined word on every rank.

Lanes (``kvcanary_numba.constants``; every lane >= 0):

=========================  ===============================================================
``VERDICT_FORMAT`` (0)     ``VERDICT_MAGIC``
``VERDICT_SEQ`` (1)        verdicts written by this monitor (``state[1]`` after this one)
``VERDICT_NEW_ROWS`` (2)   write index now minus the write index the previous verdict saw
``VERDICT_RANK`` (3)       ``rank + 1`` when lane 2 is positive, else 0
``VERDICT_RING_FULL`` (4)  1 when the write index exceeds the ring's capacity
``VERDICT_PLAN_OVERFLOW``  1 when some group's plan ``enable`` lane is 0 (its verify was
(5)                        skipped this step: the plan overflowed its capacity)
``VERDICT_STALLED`` (6)    1 when ``stalled[0]`` is non-zero (the host's health flag)
``VERDICT_FAIL_BITS`` + b  1 when a row stored since the previous verdict (ring rows
(7 .. 15)                  ``[min(seen, cap), min(index, cap))``) has FailReason bit ``1 << b``
=========================  ===============================================================

Counts saturate at ``2**31 - 1``. Rows recorded past the ring's capacity count in lane 2
but add no fail bits (they are not stored). ``state`` (int64 [2]) then holds the write
index just read and the number of verdicts written.
"""

from __future__ import annotations

import numpy as np

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

__all__ = ["merge_verdicts", "write_verdict"]

_INT32_MAX = 2**31 - 1


def write_verdict(
    *, status_lanes, ring, state, stalled, word, first_plan_lane: int, plan_lane_stride: int, num_groups: int, rank: int
) -> None:
    """Write the verdict ``word`` of one step (NumPy arrays, in place).

    Parameters
    ----------
    status_lanes : int32 [2 * status words]
        The monitor's status block seen as int32 lanes (lane 0: the ring's write index).
    ring : int64 [capacity, 8]
        The violation ring.
    state : int64 [2]
        The write index the previous verdict saw and the verdicts written so far; updated.
    stalled : int32 [1]
        Non-zero once the host's health check found launches that did not run.
    word : int32 [VERDICT_LANES]
        Output.
    first_plan_lane, plan_lane_stride, num_groups : int
        Group ``g``'s plan ``enable`` is ``status_lanes[first_plan_lane + g * plan_lane_stride]``.
    rank : int
        This monitor's rank (>= 0).
    """
    index, seen = int(status_lanes[0]), int(state[0])
    capacity = ring.shape[0]
    start, stop = min(max(seen, 0), capacity), min(max(index, 0), capacity)
    bits = int(np.bitwise_or.reduce(ring[start:stop, ROW_FAIL_REASON], initial=0))
    new_rows = max(index - seen, 0)
    seq = int(state[1]) + 1
    lanes = [int(status_lanes[first_plan_lane + g * plan_lane_stride]) for g in range(num_groups)]
    out = np.zeros(VERDICT_LANES, dtype=np.int32)
    out[VERDICT_FORMAT] = VERDICT_MAGIC
    out[VERDICT_SEQ] = min(seq, _INT32_MAX)
    out[VERDICT_NEW_ROWS] = min(new_rows, _INT32_MAX)
    out[VERDICT_RANK] = rank + 1 if new_rows > 0 else 0
    out[VERDICT_RING_FULL] = int(index > capacity)
    out[VERDICT_PLAN_OVERFLOW] = int(any(lane == 0 for lane in lanes))
    out[VERDICT_STALLED] = int(int(stalled[0]) != 0)
    for b in range(VERDICT_LANES - VERDICT_FAIL_BITS):
        out[VERDICT_FAIL_BITS + b] = (bits >> b) & 1
    word[:] = out
    state[0] = max(index, seen)
    state[1] = seq


def merge_verdicts(words) -> np.ndarray:
    """The combined word of several ranks' words: their element-wise max (int32 [VERDICT_LANES]).

    What a max all-reduce over the ranks computes; every flag lane is then "some rank", each
    count "the largest", lane ``VERDICT_RANK`` the highest rank (+ 1) with new rows.
    """
    return np.maximum.reduce([np.asarray(w, dtype=np.int32) for w in words])
