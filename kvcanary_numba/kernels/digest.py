"""Hand-off digest kernels (``reference/digest.py``): per-run sums of entry hashes.

``digest_clear`` zeroes the digests (and records the bit-256 row of a run whose range does not
fit a valid run table, as ``kernels/records.py`` does); ``digest_src{n}`` adds every entry's
hash to its run's digest. Sums modulo 2**64 do not depend on the order of the additions, so
the GPU's value is the CPU's. ``gather_digest_src{n}`` is the same pass that also does the
gather's work (``kernels/move.py``): each entry's record, already loaded, is stored into the
pack and its fingerprint field checked against the live one already folded, so an offload
reads its records and KV once.

Each warp takes one contiguous chunk of 32-entry tiles. A tile whose 32 entries sit in one run
adds each lane's hash to a lane-private sum; when the run changes, and at the end, the warp
adds its lanes' sums in shared memory and lane 0 adds the total to the run's digest with one
atomic. A tile that straddles runs (at most one per run boundary) adds lane by lane. So a run
of a million entries costs one atomic per warp, not one per entry. Each lane keeps the span of
its last run and searches the run table (forward from that run, ``records.run_span``) only when
its next entry, 32 further, leaves it. With KV sources each lane also loads its next entry's slot
one tile ahead.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ..constants import HANDOFF_DIGEST_ANCHOR, MAX_REAL_KV_SOURCES, WARP_SIZE
from .fingerprint import SOURCE_SIGNATURE, warp_sync
from .hashing import MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, mix3, splitmix64
from .move import MOVE_THREADS, in_pool, moved_kv_hash, out_of_range_row, record_of, staging_shapes, take_entry
from .records import check_run, run_of, warp_chunk

__all__ = ["KERNELS", "SIGNATURES", "entry_hash"]

_WARPS = MOVE_THREADS // WARP_SIZE
_WARP = np.int64(WARP_SIZE)
_LAST_LANE = np.int64(WARP_SIZE - 1)
_TWO = np.int64(2)
_ANCHOR = np.uint64(HANDOFF_DIGEST_ANCHOR)


@cuda.jit(device=True)
def entry_hash(index, record, live):
    """``splitmix64(mix3(mix3(ANCHOR ^ index, token, position), prev_hash, real_kv_hash) ^ live)``; uint64.

    ``record``: the slot's four words (token, position, prev_hash, real_kv_hash).
    """
    a = mix3(uint64(index) ^ _ANCHOR, uint64(record[TOKEN]), uint64(record[POSITION]))
    return splitmix64(mix3(a, uint64(record[PREV_HASH]), uint64(record[REAL_KV])) ^ live)


@cuda.jit(device=True)
def _flush(sums, lane, acc, run, out):
    """Add the warp's lane sums to digest ``run`` (nothing when ``run`` < 0); every lane calls it."""
    sums[lane] = acc
    warp_sync()
    if lane == ZERO and run >= ZERO:
        total = uint64(0)
        for k in range(WARP_SIZE):
            total += sums[k]
        cuda.atomic.add(out, run, int64(total))
    warp_sync()


@cuda.jit(device=True)
def _slot_at(slots, i, n):
    """``slots[i]``, 0 past ``n``."""
    return slots[i] if i < n else ZERO


@cuda.jit
def digest_clear(out, offsets, n, ring, write_index, kind):
    """Zero every digest; record the bit-256 row of each run whose range is not a valid run's."""
    runs = int64(offsets.shape[0]) - ONE
    for r in range(int64(cuda.grid(1)), runs, int64(cuda.gridsize(1))):
        out[r] = ZERO
        check_run(offsets, runs, r, n, ring, write_index, kind)


def _make_digest(nsrc: int, take: bool):
    """``digest_src{nsrc}``, or with ``take`` ``gather_digest_src{nsrc}``: ``pack`` is then the
    gather's pack (int64 [n, 4]); the digest alone gets ``buf`` there, unused."""
    tile_shape, bases_shape = staging_shapes(nsrc)
    # With KV sources a lane loads its next tile's slot while this tile's record and KV load, so
    # it waits on one load per tile, not a slot and then what it names: PARTIAL rows took 0.89-0.99
    # of the time on an H100. NONE gathers took 0.97-1.07 (no KV loads to overlap), so not there.
    ahead = nsrc > 0

    def digest(
        buf, slots, offsets, out, pack, ring, write_index, slot_counter, kernel_counter, kind, w0, w1, w2, w3, params
    ):
        tid = cuda.grid(1)
        n = int64(slots.shape[0])
        runs = int64(offsets.shape[0]) - ONE
        if tid == 0:
            calls = _TWO if take else ONE  # a gather and a digest count as the two calls they replace
            cuda.atomic.add(kernel_counter, 0, calls)
            if n > 0:
                cuda.atomic.add(slot_counter, 0, calls * n)
        num_slots = int64(buf.shape[0])
        warp = cuda.threadIdx.x // WARP_SIZE
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        tile = cuda.shared.array(tile_shape, uint64)[warp]
        bases = cuda.shared.array(bases_shape, int64)[warp]
        sums = cuda.shared.array((_WARPS, WARP_SIZE), uint64)[warp]
        lane_runs = cuda.shared.array((_WARPS, WARP_SIZE), int64)[warp]
        first, last = warp_chunk(n)
        acc = uint64(0)
        current = MINUS_ONE  # the run the lane sums belong to (the same on every lane)
        run, start, end = MINUS_ONE, ZERO, ZERO  # the lane's last run and its span [start, end)
        upcoming = _slot_at(slots, first * _WARP + lane, n) if ahead and first < last else ZERO
        for t in range(first, last):
            i = t * _WARP + lane
            loaded = upcoming
            if ahead:
                upcoming = _slot_at(slots, i + _WARP, n) if t + ONE < last else ZERO
            r, e, run, start, end = run_of(offsets, runs, i, n, run, start, end)
            taken = take and i < n  # the gather takes every entry, in a run or not
            slot = ZERO
            if r >= ZERO or taken:
                slot = loaded if ahead else slots[i]
            ok = in_pool(slot, num_slots)
            record = record_of(buf, slot, ok)  # ahead of the KV loads: both in flight together
            real = uint64(0)
            if nsrc > 0:
                real = moved_kv_hash(tile, bases, lane, slot, ok, nsrc, w0, w1, w2, w3, params)
            if taken:
                take_entry(pack, i, slot, ok, record, num_slots, real, nsrc > 0, ring, write_index, kind)
            h = entry_hash(e, record, real) if ok and r >= ZERO else uint64(0)
            if r >= ZERO and slot != ZERO and not ok:
                out_of_range_row(ring, write_index, kind, slot, MINUS_ONE, num_slots)
            lane_runs[lane] = r
            warp_sync()
            last_lane = min(_LAST_LANE, n - ONE - t * _WARP)
            whole = lane_runs[0] >= ZERO and lane_runs[0] == lane_runs[last_lane]
            first_run = lane_runs[0]
            warp_sync()
            if whole:
                if first_run != current:
                    _flush(sums, lane, acc, current, out)
                    acc = uint64(0)
                    current = first_run
                acc += h
            elif r >= ZERO:
                cuda.atomic.add(out, r, int64(h))
        _flush(sums, lane, acc, current, out)

    digest.__name__ = digest.__qualname__ = f"{'gather_digest' if take else 'digest'}_src{nsrc}"
    return cuda.jit(digest)


_RING = "int64[:, ::1], int32[::1], int64"
KERNELS = {
    "digest_clear": digest_clear,
    **{f"digest_src{n}": _make_digest(n, False) for n in range(MAX_REAL_KV_SOURCES + 1)},
    **{f"gather_digest_src{n}": _make_digest(n, True) for n in range(MAX_REAL_KV_SOURCES + 1)},
}
_DIGEST = (
    "void(int64[:, ::1], int64[::1], int64[::1], int64[::1], int64[:, ::1], "
    f"int64[:, ::1], int32[::1], int64[::1], int64[::1], int64, {SOURCE_SIGNATURE})"
)
SIGNATURES = {
    "digest_clear": (f"void(int64[::1], int64[::1], int64, {_RING})",),
    **{name: (_DIGEST,) for name in KERNELS if name != "digest_clear"},
}
