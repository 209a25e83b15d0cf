"""Record-move kernels: take records out into a pack, put a pack back (``reference/move.py``).

A record is 4 int64 words; the canary buffer and every pack reach a kernel as ``int64[:, ::1]``
``[rows, stride // 8]`` / ``[n, 4]`` views, so a record moves as four 8-byte loads and stores.
One persistent grid strides over the entries. Without real-KV sources a thread moves one
word of a record (four lanes a record: a warp loads 8 whole records and stores 256 contiguous
bytes per instruction); with sources a warp takes 32 consecutive entries, so that it can fold
its lanes' slots together (:func:`moved_kv_hash`), and each lane loads its record before the
KV, so that both are in flight at once.

``gather_src{n}``
    ``out[i] = buf[slots[i]]`` (zeros for a skipped or out-of-range slot), and with ``n``
    sources the departing slot's live fingerprint against the record's field 3. ``count``
    0 leaves the counters alone (the first half of a move).
``scatter_src{n}``
    ``buf[slots[i]] = records[i]``, and with sources the landed slot's live fingerprint
    against the record. ``guarded`` 1 skips entry ``i`` when ``guard[i]`` is not a slot of
    the buffer (the second half of a move: its source was skipped or reported).

Rows: a slot outside ``[0, num_slots)`` records bit 64; a fingerprint mismatch bit 4 with
the record's fields and the live fingerprint as ``expected_aux``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ..constants import FAIL_REAL_KV as _REAL_KV_BIT, FAIL_SLOT_RANGE as _SLOT_RANGE_BIT, MAX_REAL_KV_SOURCES, WARP_SIZE
from .fingerprint import SOURCE_SIGNATURE, TILE_PITCH, one_vector_each, one_vector_kv_hash, warp_real_kv_hash
from .hashing import MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO
from .verify import record_violation

__all__ = [
    "KERNELS",
    "MOVE_THREADS",
    "SIGNATURES",
    "in_pool",
    "moved_kv_hash",
    "out_of_range_row",
    "record_of",
    "staging_shapes",
    "take_entry",
]

#: Threads per block on a GPU (verify's: the fold variants share its shared-memory tiles).
MOVE_THREADS = 256
_WARPS = MOVE_THREADS // WARP_SIZE
_WARP = np.int64(WARP_SIZE)
_FOUR = np.int64(4)  # int64 words of a record


@cuda.jit(device=True)
def in_pool(slot, num_slots):
    """Whether ``slot`` is a record of the buffer other than the padding slot 0."""
    return slot > ZERO and slot < num_slots


@cuda.jit(device=True)
def out_of_range_row(ring, write_index, kind, slot, position, num_slots):
    """The bit-64 row of a slot outside ``[0, num_slots)``: nothing was read there."""
    record_violation(ring, write_index, kind, slot, position, MINUS_ONE, MINUS_ONE, ZERO, num_slots, _SLOT_RANGE_BIT)


@cuda.jit(device=True)
def _fingerprint_row(ring, write_index, kind, slot, fields, row, live):
    """The bit-4 row of a record (``fields[row]``) whose fingerprint is not the slot's live one."""
    record_violation(
        ring,
        write_index,
        kind,
        slot,
        fields[row, POSITION],
        fields[row, TOKEN],
        MINUS_ONE,
        fields[row, PREV_HASH],
        live,
        _REAL_KV_BIT,
    )


@cuda.jit(device=True)
def moved_kv_hash(tile, bases, lane, slot, slot_ok, nsrc, w0, w1, w2, w3, p):
    """The live fingerprint of each lane's slot for the move and digest kernels; uint64.

    Where every source reads one vector per slot (PARTIAL), each lane loads all its vectors
    before folding (:func:`.fingerprint.one_vector_kv_hash`); otherwise the warp folds its
    slots together (:func:`.fingerprint.warp_real_kv_hash`). All 32 lanes must call it.
    """
    if one_vector_each(nsrc, p):
        return one_vector_kv_hash(slot, slot_ok, nsrc, w0, w1, w2, w3, p)
    return warp_real_kv_hash(tile, bases, lane, slot, slot_ok, nsrc, w0, w1, w2, w3, p)


def staging_shapes(nsrc: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """Shapes of a block's ``tile`` (uint64) and ``bases`` (int64) shared arrays for
    :func:`moved_kv_hash`: one row per warp of ``MOVE_THREADS``. Without real-KV sources they are
    never read, so a kernel built for ``nsrc == 0`` declares one element per warp and spends no
    shared memory (which would cap the blocks per SM) on them."""
    lanes, pitch = (WARP_SIZE, TILE_PITCH) if nsrc else (1, 1)
    return (_WARPS, lanes, pitch), (_WARPS, lanes)


@cuda.jit(device=True)
def record_of(buf, slot, ok):
    """The four words of ``slot``'s record (zeros where not ``ok``), loaded ahead of the KV fingerprint
    so that the record and the KV vectors are in flight together."""
    r0 = r1 = r2 = r3 = ZERO
    if ok:
        r0, r1, r2, r3 = buf[slot, 0], buf[slot, 1], buf[slot, 2], buf[slot, 3]
    return r0, r1, r2, r3


@cuda.jit(device=True)
def _store(rows, i, record):
    rows[i, 0] = record[0]
    rows[i, 1] = record[1]
    rows[i, 2] = record[2]
    rows[i, 3] = record[3]


@cuda.jit(device=True)
def take_entry(out, i, slot, ok, record, num_slots, real, check, ring, write_index, kind):
    """Entry ``i`` of a gather: ``record`` is ``slot``'s (zeros where not ``ok``); ``check`` compares
    its fingerprint field with the live one, ``real`` (with real-KV sources)."""
    _store(out, i, record)
    if ok:
        if check and record[REAL_KV] != int64(real):
            _fingerprint_row(ring, write_index, kind, slot, out, i, int64(real))
    elif slot != ZERO:
        out_of_range_row(ring, write_index, kind, slot, MINUS_ONE, num_slots)


@cuda.jit(device=True)
def _put(buf, records, i, slot, ok, record, num_slots, real, ring, write_index, kind):
    """Entry ``i`` of a scatter with sources whose guard (if any) passed: ``record`` is ``records[i]``,
    ``ok`` whether ``slot`` is in the pool."""
    if ok:
        _store(buf, slot, record)
        if record[REAL_KV] != int64(real):
            _fingerprint_row(ring, write_index, kind, slot, records, i, int64(real))
    elif slot != ZERO:
        out_of_range_row(ring, write_index, kind, slot, MINUS_ONE, num_slots)


def _make_gather(nsrc: int):
    tile_shape, bases_shape = staging_shapes(nsrc)

    def gather(buf, slots, out, ring, write_index, slot_counter, kernel_counter, kind, count, w0, w1, w2, w3, params):
        tid = cuda.grid(1)
        n = int64(slots.shape[0])
        if tid == 0 and count != ZERO:
            cuda.atomic.add(kernel_counter, 0, ONE)
            if n > 0:
                cuda.atomic.add(slot_counter, 0, n)
        num_slots = int64(buf.shape[0])
        if nsrc == 0:  # a word per thread: a warp moves 8 whole records per load and per store
            for item in range(int64(tid), n * _FOUR, int64(cuda.gridsize(1))):
                i = item // _FOUR
                word = item - i * _FOUR
                slot = slots[i]
                if in_pool(slot, num_slots):
                    out[i, word] = buf[slot, word]
                else:
                    out[i, word] = ZERO
                    if word == ZERO and slot != ZERO:
                        out_of_range_row(ring, write_index, kind, slot, MINUS_ONE, num_slots)
            return
        warp = cuda.threadIdx.x // WARP_SIZE
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        tile = cuda.shared.array(tile_shape, uint64)[warp]
        bases = cuda.shared.array(bases_shape, int64)[warp]
        warps = int64(cuda.gridsize(1)) // _WARP
        for t in range(int64(tid // WARP_SIZE), (n + _WARP - ONE) // _WARP, warps):
            i = t * _WARP + lane
            slot = slots[i] if i < n else ZERO
            ok = in_pool(slot, num_slots)
            record = record_of(buf, slot, ok)
            real = moved_kv_hash(tile, bases, lane, slot, ok, nsrc, w0, w1, w2, w3, params)
            if i < n:
                take_entry(out, i, slot, ok, record, num_slots, real, True, ring, write_index, kind)

    gather.__name__ = gather.__qualname__ = f"gather_src{nsrc}"
    return cuda.jit(gather)


def _make_scatter(nsrc: int):
    tile_shape, bases_shape = staging_shapes(nsrc)

    def scatter(
        buf,
        records,
        slots,
        guard,
        guarded,
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
        if tid == 0:
            cuda.atomic.add(kernel_counter, 0, ONE)
            if n > 0:
                cuda.atomic.add(slot_counter, 0, n)
        num_slots = int64(buf.shape[0])
        if nsrc == 0:  # a word per thread, as the gather
            for item in range(int64(tid), n * _FOUR, int64(cuda.gridsize(1))):
                i = item // _FOUR
                word = item - i * _FOUR
                if guarded == ZERO or in_pool(guard[i], num_slots):
                    slot = slots[i]
                    if in_pool(slot, num_slots):
                        buf[slot, word] = records[i, word]
                    elif word == ZERO and slot != ZERO:
                        out_of_range_row(ring, write_index, kind, slot, MINUS_ONE, num_slots)
            return
        warp = cuda.threadIdx.x // WARP_SIZE
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        tile = cuda.shared.array(tile_shape, uint64)[warp]
        bases = cuda.shared.array(bases_shape, int64)[warp]
        warps = int64(cuda.gridsize(1)) // _WARP
        for t in range(int64(tid // WARP_SIZE), (n + _WARP - ONE) // _WARP, warps):
            i = t * _WARP + lane
            active = i < n and (guarded == ZERO or in_pool(guard[i], num_slots))
            slot = slots[i] if active else ZERO
            ok = in_pool(slot, num_slots)
            record = record_of(records, i, active)  # ahead of the KV loads, as the gather's
            real = moved_kv_hash(tile, bases, lane, slot, ok, nsrc, w0, w1, w2, w3, params)
            if active:
                _put(buf, records, i, slot, ok, record, num_slots, real, ring, write_index, kind)

    scatter.__name__ = scatter.__qualname__ = f"scatter_src{nsrc}"
    return cuda.jit(scatter)


#: Ring, write index, slot and kernel counters, tag: the context's arguments every move kernel takes.
_RING = "int64[:, ::1], int32[::1], int64[::1], int64[::1], int64"
KERNELS = {
    **{f"gather_src{n}": _make_gather(n) for n in range(MAX_REAL_KV_SOURCES + 1)},
    **{f"scatter_src{n}": _make_scatter(n) for n in range(MAX_REAL_KV_SOURCES + 1)},
}
_GATHER = f"void(int64[:, ::1], int64[::1], int64[:, ::1], {_RING}, int64, {SOURCE_SIGNATURE})"
_SCATTER = f"void(int64[:, ::1], int64[:, ::1], int64[::1], int64[::1], int64, {_RING}, {SOURCE_SIGNATURE})"
SIGNATURES = {name: (_GATHER if name.startswith("gather") else _SCATTER,) for name in KERNELS}
