"""Device helpers of the write kernel: an entry's loads, checks and store, a request's range
and seed state, and the chain recurrence over one chunk of 32 entries.

``kernels/write.py`` puts them together (see its docstring for the loop they make up). The
fast wing's write kernels (``kvcanary_numba/fast/kernels/``) are built from the same helpers.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ..constants import (  # fail bits as int64 scalars, under this module's short names
    FAIL_PREV_RANGE as _SEED_RANGE_BIT,
    FAIL_SLOT_RANGE as _SLOT_RANGE_BIT,
    FAIL_WRITE_POSITION as _POSITION_BIT,
    FAIL_WRITE_RANGE as _RANGE_BIT,
    FAIL_WRITE_TOKEN as _TOKEN_BIT,
    WARP_SIZE,
)
from .fingerprint import real_kv_hash
from .hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, mix3, slot_hash
from .verify import record_violation

__all__ = ["chunk_chain", "entry_checks", "load_entry", "real_kv", "request_range", "seed_state", "store_record"]

_WARP = np.int64(WARP_SIZE)


@cuda.jit(device=True)
def entry_checks(
    ring,
    write_index,
    kind,
    slot,
    token,
    position,
    chain_hash,
    input_assert,
    expected_token,
    expected_position,
    track,
    chain_position,
    num_slots,
):
    """Rows of one non-skipped entry, in the reference's order; True if its slot can be stored."""
    if input_assert:
        bits = ZERO
        if token != expected_token:
            bits |= _TOKEN_BIT
        if position != expected_position:
            bits |= _POSITION_BIT
        if bits != ZERO:
            record_violation(
                ring, write_index, kind, slot, position, token, expected_token, chain_hash, expected_position, bits
            )
    if track and position != chain_position:
        record_violation(
            ring, write_index, kind, slot, position, token, token, chain_hash, chain_position, _POSITION_BIT
        )
    if slot >= num_slots:
        record_violation(ring, write_index, kind, slot, position, token, token, chain_hash, num_slots, _SLOT_RANGE_BIT)
        return False
    return True


@cuda.jit(device=True)
def store_record(buf, slot, token, position, chain_hash, real):
    buf[slot, TOKEN] = token
    buf[slot, POSITION] = position
    buf[slot, PREV_HASH] = chain_hash
    buf[slot, REAL_KV] = real


@cuda.jit(device=True)
def request_range(offsets, r, num_tokens, ring, write_index, kind, report):
    """Clipped entry range of request ``r``; records the range row if clipping changed it and ``report``."""
    start = offsets[r]
    end = offsets[r + ONE]
    if end <= start:
        return ZERO, ZERO
    lo = max(start, ZERO)
    hi = min(end, num_tokens)
    if report and (lo != start or hi != end):
        record_violation(ring, write_index, kind, MINUS_ONE, MINUS_ONE, start, end, ZERO, num_tokens, _RANGE_BIT)
    return lo, hi


@cuda.jit(device=True)
def seed_state(buf, seed, num_slots, ring, write_index, kind, report):
    """(running hash, stored seed position) at a request's start; records the seed row if ``report``."""
    if seed >= num_slots:
        if report:
            record_violation(
                ring, write_index, kind, seed, MINUS_ONE, MINUS_ONE, MINUS_ONE, ZERO, num_slots, _SEED_RANGE_BIT
            )
    elif seed >= ZERO:
        return slot_hash(buf, seed), buf[seed, POSITION]
    return CHAIN_HEAD, ZERO


@cuda.jit(device=True)
def real_kv(slot, num_slots, nsrc, w0, w1, w2, w3, params):
    """Real-KV hash of an in-range slot's live KV (0 without sources)."""
    if nsrc > 0 and slot >= ZERO and slot < num_slots:
        return int64(real_kv_hash(slot, nsrc, w0, w1, w2, w3, params))
    return ZERO


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
def chunk_chain(lane, n, slot, s_slot, s_token, s_position, running, prev_position, num_slots):
    """The recurrence over one chunk's ``n`` shared rows, run by every lane (warp-uniform).

    Returns (running, prev_position, entries counted, this lane's prev_hash,
    its expected chain position, whether no later entry of the chunk has its
    slot); the prev_hash and expected position are those the chain has before
    the lane's entry (also for a skipped entry). The next entry's row is read
    before this entry's ``mix3``, so the shared-memory latency overlaps the
    dependent math; nothing in the loop stores, so the loads need no ordering.
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
        # A skipped entry (slot -1): no store, no count, chain unchanged. Selects, not
        # branches, for the same reason (the compiler cannot tell ``cs`` is
        # warp-uniform); the mix3 of a skipped entry is computed and dropped.
        live = cs >= ZERO
        later = later | (int64(live) & int64(k > lane) & int64(cs == slot))
        counted += int64(live and cs < num_slots)
        stepped = mix3(running, uint64(ct), uint64(cp))
        running = stepped if live else running
        # Tracked whatever the chain-position assert says (a row is recorded only when it is on).
        prev_position = cp if live else prev_position
    return running, prev_position, counted, mine, expect, later == ZERO
