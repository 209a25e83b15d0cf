"""Device helpers of the write kernel's chunk loop: an entry's loads and the chunk's chain.

Used by ``kernels/write.py`` (see its docstring for the loop they make up).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ..constants import WARP_SIZE
from .hashing import MINUS_ONE, ONE, ZERO, mix3

__all__ = ["chunk_chain", "load_entry"]

_WARP = np.int64(WARP_SIZE)


@cuda.jit(device=True)
def load_entry(i, hi, out_cache_loc, input_ids, positions, expected_tokens, expected_positions, input_assert):
    """(slot, token, position, expected token, expected position) of entry ``i``; a skipped
    placeholder (slot -1) past ``hi``."""
    if i >= hi:
        return MINUS_ONE, ZERO, ZERO, ZERO, ZERO
    if input_assert:
        return out_cache_loc[i], input_ids[i], positions[i], expected_tokens[i], expected_positions[i]
    return out_cache_loc[i], input_ids[i], positions[i], ZERO, ZERO


@cuda.jit(device=True)
def chunk_chain(lane, n, start, slot, s_slot, s_token, s_position, running, prev_position, track, num_slots):
    """The recurrence over one chunk's shared rows from entry ``start`` on, run by every lane (warp-uniform).

    Returns (running, prev_position, entries counted, this lane's prev_hash,
    its expected chain position, whether no later entry of the chunk has its
    slot); the prev_hash and expected position are those the chain has before
    the lane's entry (also for a skipped entry; meaningless below ``start``).
    The next entry's row is read before this entry's ``mix3``, so the
    shared-memory latency overlaps the dependent math; nothing in the loop
    stores, so the loads need no ordering.
    """
    counted = ZERO
    mine = ZERO
    expect = ZERO
    later = ZERO
    ks = s_slot[0]
    kt = s_token[0]
    kp = s_position[0]
    for k in range(n):
        cs, ct, cp = ks, kt, kp
        nk = min(k + ONE, _WARP - ONE)  # a harmless re-read on the last entry
        ks = s_slot[nk]
        kt = s_token[nk]
        kp = s_position[nk]
        # Branch-free per-lane bookkeeping: a divergent branch here would put
        # the warp's reconvergence on the chain's critical path.
        hit = -int64(k == lane)  # all ones in lane k
        mine = (mine & ~hit) | (int64(running) & hit)
        expect = (expect & ~hit) | ((prev_position + ONE) & hit)
        if cs < ZERO:
            continue  # skipped: no store, no count, chain unchanged
        later = later | (int64(k > lane) & int64(cs == slot))
        if cs < num_slots:
            counted += ONE
        if k >= start:
            if track:
                prev_position = cp
            running = mix3(running, uint64(ct), uint64(cp))
    return running, prev_position, counted, mine, expect, later == ZERO
