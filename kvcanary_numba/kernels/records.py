"""Kernel of ``verify_canary_records``: check runs of moved slots where they rest (``reference/records.py``).

Entry ``i`` belongs to the run ``r`` with ``run_offsets[r] <= i < run_offsets[r + 1]``; its
expected position is ``run_start_positions[r] + (i - run_offsets[r])`` and its predecessor the
entry before it, or ``run_prev_slots[r]`` for a run's first entry. The checks are verify's with
the token unchecked. Each warp of one persistent grid takes a contiguous chunk of 32-entry tiles
(:func:`warp_chunk`; with real-KV sources the warp folds its lanes' slots together, as verify
does), and each lane keeps the span of its last run, searching the offsets again (forward from
that run, :func:`run_span`) only when its next entry leaves it (:func:`run_of`).

The offsets are device data: the host checks them only for host arrays. A run whose range
is not inside ``[0, n]``, goes down, or leaves entries of ``[0, n)`` outside every run records
one row with bit 256 (slot -1, position -1, stored token = start, expected token = end,
``expected_aux = n``), and an entry no run holds is not checked, so nothing outside the
arrays is ever read.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ..constants import (
    CANARY_CHAIN_HEAD,
    FAIL_CHAIN as _CHAIN_BIT,
    FAIL_POSITION as _POSITION_BIT,
    FAIL_PREV_RANGE as _PREV_RANGE_BIT,
    FAIL_REAL_KV as _REAL_KV_BIT,
    FAIL_WRITE_RANGE as _RUN_RANGE_BIT,
    MAX_REAL_KV_SOURCES,
    WARP_SIZE,
)
from .fingerprint import SOURCE_SIGNATURE
from .hashing import MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, slot_hash
from .move import MOVE_THREADS, in_pool, moved_kv_hash, out_of_range_row, staging_shapes
from .verify import record_violation

__all__ = ["KERNELS", "SIGNATURES", "check_run", "run_of", "run_span", "warp_chunk"]

_WARPS = MOVE_THREADS // WARP_SIZE
_WARP = np.int64(WARP_SIZE)
_TWO = np.int64(2)
_CHAIN_HEAD_I64 = np.uint64(CANARY_CHAIN_HEAD).view(np.int64)


@cuda.jit(device=True)
def run_span(offsets, runs, i, hint):
    """(run, its first entry, its end) of the run holding entry ``i``, (-1, 0, 0) when none; the
    search starts at run ``hint`` when that is the run of an entry before ``i`` (-1: unknown, a
    binary search of the whole table).

    From the hint: one run a step, then doubling steps, then a binary search of the last step, so
    the entries of consecutive tiles find their run in one or two loads where a whole search takes
    log2(runs). On a valid table every search returns the same run; on any table it reads only
    ``offsets[0 .. runs]``.
    """
    if runs <= ZERO:
        return MINUS_ONE, ZERO, ZERO
    lo = ZERO
    hi = runs
    if hint >= ZERO and hint < runs and offsets[hint] <= i:
        lo = hint
        step = ONE
        hi = lo + ONE
        while hi < runs and offsets[hi] <= i:  # then offsets[lo] <= i < offsets[hi], or hi >= runs
            lo = hi
            step *= _TWO
            hi = lo + step
        hi = min(hi, runs)
    while hi - lo > ONE:  # the last run starting at or before i
        mid = (lo + hi) // _TWO
        if offsets[mid] <= i:
            lo = mid
        else:
            hi = mid
    start = offsets[lo]
    end = offsets[lo + ONE]
    if start <= i and i < end:
        return lo, start, end
    return MINUS_ONE, ZERO, ZERO


@cuda.jit(device=True)
def warp_chunk(n):
    """``[first, last)``: the 32-entry tiles of ``n`` entries the calling thread's warp takes, one
    contiguous chunk per warp, so that a lane's next entry is 32 further (:func:`run_of`)."""
    tiles = (n + _WARP - ONE) // _WARP
    warps = int64(cuda.gridsize(1)) // _WARP
    chunk = (tiles + warps - ONE) // warps
    first = int64(cuda.grid(1) // WARP_SIZE) * chunk
    return first, min(first + chunk, tiles)


@cuda.jit(device=True)
def run_of(offsets, runs, i, n, run, start, end):
    """(run, index in the run) of entry ``i`` ((-1, 0) past ``n`` or in no run), then the lane's kept
    span ``run, start, end`` (-1, 0, 0 at first), searched again only when ``i`` leaves it."""
    if i >= n:
        return MINUS_ONE, ZERO, run, start, end
    if not (start <= i and i < end):
        run, start, end = run_span(offsets, runs, i, run)
    if run >= ZERO:
        return run, i - start, run, start, end
    return MINUS_ONE, ZERO, run, start, end


@cuda.jit(device=True)
def check_run(offsets, runs, r, n, ring, write_index, kind):
    """Record the bit-256 row of run ``r`` if its range does not fit a valid run table over ``n`` entries."""
    lo = offsets[r]
    hi = offsets[r + ONE]
    bad = lo > hi or lo < ZERO or hi > n or (r == ZERO and lo != ZERO) or (r == runs - ONE and hi != n)
    if bad:
        record_violation(ring, write_index, kind, MINUS_ONE, MINUS_ONE, lo, hi, ZERO, n, _RUN_RANGE_BIT)


@cuda.jit(device=True)
def _check_record(buf, num_slots, slots, starts, prevs, i, r, e, nsrc, real, ring, write_index, kind):
    """Verify's checks of entry ``i`` (run ``r``, index ``e``), expected token unchecked."""
    slot = slots[i]
    if slot == ZERO:  # padding: an SWA slot outside the window
        return
    position = starts[r] + e
    if uint64(slot) >= uint64(num_slots):
        out_of_range_row(ring, write_index, kind, slot, position, num_slots)
        return
    prev = slots[i - ONE] if e > ZERO else prevs[r]
    stored_position = buf[slot, POSITION]
    stored_hash = buf[slot, PREV_HASH]
    bits = ZERO
    aux = stored_hash  # predecessor 0: not checked
    if prev < ZERO:
        aux = _CHAIN_HEAD_I64
        if stored_hash != aux:
            bits |= _CHAIN_BIT
    elif prev >= num_slots:
        aux = prev
        bits |= _PREV_RANGE_BIT
    elif prev != ZERO:
        aux = int64(slot_hash(buf, prev))
        if stored_hash != aux:
            bits |= _CHAIN_BIT
    if stored_position != position:
        bits |= _POSITION_BIT
    if buf[slot, REAL_KV] != (int64(real) if nsrc > 0 else ZERO):
        bits |= _REAL_KV_BIT
    if bits != ZERO:
        record_violation(
            ring, write_index, kind, slot, stored_position, buf[slot, TOKEN], MINUS_ONE, stored_hash, aux, bits
        )


def _make_verify_records(nsrc: int):
    tile_shape, bases_shape = staging_shapes(nsrc)

    def verify_records(
        buf,
        slots,
        offsets,
        starts,
        prevs,
        ring,
        write_index,
        slot_counter,
        kernel_counter,
        kind,
        w0,
        w1,
        w2,
        w3,
        params,
    ):
        tid = cuda.grid(1)
        n = int64(slots.shape[0])
        runs = int64(offsets.shape[0]) - ONE
        if tid == 0:
            cuda.atomic.add(kernel_counter, 0, ONE)
            if n > 0:
                cuda.atomic.add(slot_counter, 0, n)
        stride = int64(cuda.gridsize(1))
        for r in range(int64(tid), runs, stride):
            check_run(offsets, runs, r, n, ring, write_index, kind)
        num_slots = int64(buf.shape[0])
        warp = cuda.threadIdx.x // WARP_SIZE
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        tile = cuda.shared.array(tile_shape, uint64)[warp]
        bases = cuda.shared.array(bases_shape, int64)[warp]
        first, last = warp_chunk(n)
        run, start, end = MINUS_ONE, ZERO, ZERO  # the lane's last run and its span [start, end)
        for t in range(first, last):
            i = t * _WARP + lane
            r, e, run, start, end = run_of(offsets, runs, i, n, run, start, end)
            real = uint64(0)
            if nsrc > 0:
                slot = slots[i] if r >= ZERO else ZERO
                real = moved_kv_hash(tile, bases, lane, slot, in_pool(slot, num_slots), nsrc, w0, w1, w2, w3, params)
            if r >= ZERO:
                _check_record(buf, num_slots, slots, starts, prevs, i, r, e, nsrc, real, ring, write_index, kind)

    verify_records.__name__ = verify_records.__qualname__ = f"verify_records_src{nsrc}"
    return cuda.jit(verify_records)


KERNELS = {f"verify_records_src{n}": _make_verify_records(n) for n in range(MAX_REAL_KV_SOURCES + 1)}
_SIGNATURE = (
    "void(int64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], "
    f"int64[:, ::1], int32[::1], int64[::1], int64[::1], int64, {SOURCE_SIGNATURE})"
)
SIGNATURES = {name: (_SIGNATURE,) for name in KERNELS}
