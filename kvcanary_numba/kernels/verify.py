"""Verify kernel: check planned prefix slots against their canary records.

Semantics: docs/concepts/semantics.md ("Verify", "Ring"); SGLang's behaviour: docs/concepts/sglang.md#verify.
One persistent grid (sized by occupancy) strides over the plan's entries; reads
of the plan are coalesced and each entry reads its slot's record (and its
predecessor's). In NONE mode a thread takes one entry at a time; with real-KV
sources a warp takes 32 consecutive entries, so that it can fold its lanes'
slots together (:func:`.fingerprint.warp_real_kv_hash`, 16-byte vector loads).
Nothing is written except violation rows and counters.

``slot_run_counter`` grows by the number of submitted entries, which is known
before the loop (``min(verify_num_valid, capacity)``), so one thread adds it:
no per-thread counting or reduction is needed.

Variants (compile-time closure constants): ``check_token`` (read the expected
tokens or not) x ``nsrc`` (real-KV sources folded, 0 in NONE mode), named
``verify_tok{0|1}_src{0..4}``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, int64, uint64

from ..constants import (  # fail bits as int64 scalars, under this module's short names
    FAIL_CHAIN as _CHAIN_BIT,
    FAIL_POSITION as _POSITION_BIT,
    FAIL_PREV_RANGE as _PREV_RANGE_BIT,
    FAIL_REAL_KV as _REAL_KV_BIT,
    FAIL_SLOT_RANGE as _SLOT_RANGE_BIT,
    FAIL_TOKEN as _TOKEN_BIT,
    MAX_REAL_KV_SOURCES,
    VIOLATION_INDEX_SATURATED,
    WARP_SIZE,
)
from ..hashing import to_signed
from . import ON_SIMULATOR
from .fingerprint import SOURCE_SIGNATURE, TILE_PITCH, warp_real_kv_hash
from .hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, slot_hash

__all__ = ["KERNELS", "SIGNATURES", "VERIFY_THREADS", "kernel_name", "launch_options", "record_violation"]

#: Threads per block on a GPU (SGLang uses 512; 256 packs more blocks per SM
#: at the register counts of the fold variants).
VERIFY_THREADS = 256
_WARPS = VERIFY_THREADS // WARP_SIZE
_WARP = np.int64(WARP_SIZE)

_CHAIN_HEAD_I64 = np.int64(to_signed(int(CHAIN_HEAD)))
_SATURATED = np.int32(VIOLATION_INDEX_SATURATED)


@cuda.jit(device=True)
def record_violation(ring, write_index, kind, slot, position, stored_token, expected_token, chain_hash, aux, bits):
    """Append one 8-field row to the fill-once ring (all values int64).

    The index keeps counting past the capacity (rows that do not fit are dropped) up to
    ``VIOLATION_INDEX_SATURATED``, where it stays: a saturated index is not added to,
    and a thread whose add landed at or past it takes the add back (``reference/ring.py``).
    """
    if write_index[0] >= _SATURATED:  # saturated: it never drops below again, a stale read is safe
        return
    seq = cuda.atomic.add(write_index, 0, int32(1))
    if seq >= _SATURATED:  # others reached the limit since the read: the count stays there
        cuda.atomic.sub(write_index, 0, int32(1))
    elif seq >= 0 and seq < ring.shape[0]:  # a negative ticket (a caller's index) is never stored
        ring[seq, 0] = kind
        ring[seq, 1] = slot
        ring[seq, 2] = position
        ring[seq, 3] = stored_token
        ring[seq, 4] = expected_token
        ring[seq, 5] = chain_hash
        ring[seq, 6] = aux
        ring[seq, 7] = bits
        cuda.threadfence_system()  # rows reach a host mapping before the index is seen


@cuda.jit(device=True)
def _check_entry(buf, num_slots, slot, token, position, prev, nsrc, real, ring, write_index, kind):
    """Checks of one entry with a non-padding ``slot``; records its row if any check fails.

    ``real`` is the slot's fingerprint when ``nsrc > 0`` and ``slot`` is in range.
    """
    if uint64(slot) >= uint64(num_slots):  # negative or past the buffer: no load
        record_violation(ring, write_index, kind, slot, position, MINUS_ONE, token, ZERO, num_slots, _SLOT_RANGE_BIT)
        return
    stored_token = buf[slot, TOKEN]
    stored_position = buf[slot, POSITION]
    stored_hash = buf[slot, PREV_HASH]
    stored_real = buf[slot, REAL_KV]
    bits = ZERO
    aux = stored_hash  # prev == 0: predecessor unreachable, chain not checked
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
    if token != MINUS_ONE and stored_token != token:
        bits |= _TOKEN_BIT
    if stored_position != position:
        bits |= _POSITION_BIT
    if stored_real != (int64(real) if nsrc > 0 else ZERO):
        bits |= _REAL_KV_BIT
    if bits != ZERO:
        record_violation(ring, write_index, kind, slot, stored_position, stored_token, token, stored_hash, aux, bits)


def _make_verify(check_token: bool, nsrc: int):
    def verify(
        buf,
        slots,
        expected_tokens,
        expected_positions,
        prev_slots,
        num_valid,
        enable,
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
        if tid == 0:
            cuda.atomic.add(kernel_counter, 0, int64(1))
        if enable[0] == 0:
            return
        capacity = int64(slots.shape[0])
        active = min(max(int64(num_valid[0]), ZERO), capacity)
        if tid == 0 and active > 0:
            cuda.atomic.add(slot_counter, 0, active)
        num_slots = int64(buf.shape[0])
        # The grid size is read here, in the loop's header: verify_tok0_src0 fits 32
        # registers only so (tests/test_ptx.py checks for spills).
        if nsrc == 0:  # thread per entry
            for i in range(int64(tid), active, int64(cuda.gridsize(1))):
                slot = slots[i]
                if slot != ZERO:  # padding slot: never verified
                    token = expected_tokens[i] if check_token else MINUS_ONE
                    _check_entry(
                        buf,
                        num_slots,
                        slot,
                        token,
                        expected_positions[i],
                        prev_slots[i],
                        nsrc,
                        ZERO,
                        ring,
                        write_index,
                        kind,
                    )
            return
        # Real-KV variants: a warp per 32 consecutive entries, so that the warp can fold
        # its lanes' slots together (warp_real_kv_hash); every lane runs every tile.
        warp = cuda.threadIdx.x // WARP_SIZE
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        tile = cuda.shared.array((_WARPS, WARP_SIZE, TILE_PITCH), uint64)[warp]
        bases = cuda.shared.array((_WARPS, WARP_SIZE), int64)[warp]
        warps = int64(cuda.gridsize(1)) // _WARP
        for t in range(int64(tid // WARP_SIZE), (active + _WARP - ONE) // _WARP, warps):
            i = t * _WARP + lane
            slot = slots[i] if i < active else ZERO
            fold = slot != ZERO and uint64(slot) < uint64(num_slots)
            real = warp_real_kv_hash(tile, bases, lane, slot, fold, nsrc, w0, w1, w2, w3, params)
            if slot != ZERO:
                token = expected_tokens[i] if check_token else MINUS_ONE
                _check_entry(
                    buf,
                    num_slots,
                    slot,
                    token,
                    expected_positions[i],
                    prev_slots[i],
                    nsrc,
                    real,
                    ring,
                    write_index,
                    kind,
                )

    verify.__name__ = verify.__qualname__ = kernel_name(check_token, nsrc)
    return cuda.jit(verify, **launch_options(check_token, nsrc))


def launch_options(check_token: bool, nsrc: int) -> dict:
    """``cuda.jit`` options of a verify kernel variant."""
    if nsrc == 0 and not check_token and not ON_SIMULATOR:
        # Fits 32 registers without spilling (checked by tests/test_ptx.py): full occupancy.
        return {"launch_bounds": (VERIFY_THREADS, 2048 // VERIFY_THREADS)}
    return {}


def kernel_name(check_token: bool, nsrc: int) -> str:
    """Name of the variant in :data:`KERNELS`."""
    return f"verify_tok{int(bool(check_token))}_src{int(nsrc)}"


KERNELS = {
    kernel_name(check, n): _make_verify(check, n) for check in (False, True) for n in range(MAX_REAL_KV_SOURCES + 1)
}
SIGNATURE = (
    "void(int64[:, ::1], int64[::1], int64[::1], int64[::1], int64[::1], int32[::1], int32[::1], "
    f"int64[:, ::1], int32[::1], int64[::1], int64[::1], int64, {SOURCE_SIGNATURE})"
)
SIGNATURES = {name: (SIGNATURE,) for name in KERNELS}
