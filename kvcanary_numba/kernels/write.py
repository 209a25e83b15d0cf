"""Write kernel: stamp the canary records of the slots a forward pass writes.

Semantics: docs/concepts/semantics.md ("Write", "Ring"); SGLang's behaviour: docs/concepts/sglang.md#write.

The chain is serial within a request: each stored prev_hash is the running
hash of the entries before it. Everything else is not, so in ``write`` each
warp walks one request at a time (grid-striding over requests, ``WRITE_WARPS``
warps per block) in chunks of 32 entries (:func:`walk_chunks`):

1. every lane loads one entry (slot, token, position, expected values) into
   registers; the next chunk's loads are issued before this chunk's chain, so
   their latency hides behind it;
2. slot / token / position go to the warp's shared rows, and *every* lane runs
   the recurrence over them (``write_chunk.chunk_chain``: warp-uniform,
   registers only; the next entry's row is read before this entry's ``mix3``),
   keeping the prev_hash and expected chain position of its own entry and
   noting whether a later entry of the chunk targets its slot. The loop is
   bound by the latency of the dependent ``mix3``; the redundant lanes cost no
   extra time (SIMT);
3. every lane folds its slot's real-KV bytes, records its rows and stores its
   record unless it was not the last (so the last entry wins, as in the
   sequential reference; chunks are stored in order).

A warp per request (not a block) keeps decode batches, one entry per request,
as parallel as the baseline, while a long prefill request still does only the
recurrence serially.

Requests run concurrently, so two requests of one launch writing the same slot
race (as in SGLang). ``benchmarks/baseline_kernels.py`` holds SGLang's design (one
thread per request, everything serial) with the same semantics, which the
benchmarks compare against. The fast wing (``kvcanary_numba/fast/kernels/``) adds
a chain shared by the launches of one monitor step and a tiled stamp of long
writes, built from the same device helpers (``write_chunk.py``).

Variants: ``input_assert`` (compare with the expected inputs) x ``nsrc``
(real-KV sources folded), named ``write_assert{0|1}_src{0..4}``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64

from ..constants import MAX_REAL_KV_SOURCES, WARP_SIZE
from . import ON_SIMULATOR
from .fingerprint import SOURCE_SIGNATURE, warp_sync
from .hashing import ONE, ZERO
from .write_chunk import chunk_chain, entry_checks, load_entry, real_kv, request_range, seed_state, store_record

__all__ = [
    "ARGUMENTS",
    "KERNELS",
    "MAX_WRITE_WARPS",
    "SIGNATURE",
    "SIGNATURES",
    "WRITE_WARPS",
    "kernel_name",
    "walk_chunks",
]

#: Warps per block of ``write``; each warp walks its own requests (one under the
#: simulator, which has no warp barrier and so synchronises whole blocks).
WRITE_WARPS = 1 if ON_SIMULATOR else 8
#: Most warps per block the shared rows hold; the kernel walks ``blockDim.x // 32`` warps
#: (tests run several under the simulator: ``launch._device.simulated_shapes``).
MAX_WRITE_WARPS = 4 if ON_SIMULATOR else WRITE_WARPS
_WARP = np.int64(WARP_SIZE)


@cuda.jit(device=True)
def walk_chunks(
    lane,
    lo,
    hi,
    running,
    prev_position,
    track,
    s_slot,
    s_token,
    s_position,
    buf,
    out_cache_loc,
    input_ids,
    positions,
    expected_tokens,
    expected_positions,
    input_assert,
    nsrc,
    w0,
    w1,
    w2,
    w3,
    params,
    ring,
    write_index,
    kind,
    num_slots,
):
    """One warp walks entries ``[lo, hi)`` of a request in chunks of 32 (steps 1-3 above).

    ``running``, ``prev_position``: the chain state before ``lo`` (the seed's).
    ``s_*``: the warp's shared rows. Returns the entries counted (the same value
    on every lane).
    """
    stored = ZERO
    nxt = load_entry(
        lo + lane, hi, out_cache_loc, input_ids, positions, expected_tokens, expected_positions, input_assert
    )
    for c0 in range(lo, hi, _WARP):
        n = min(_WARP, hi - c0)
        slot, token, position, expected_token, expected_position = nxt
        warp_sync()  # every lane has finished reading the previous chunk's rows
        s_slot[lane] = slot
        s_token[lane] = token
        s_position[lane] = position
        warp_sync()
        # The next chunk's loads are issued now and land while the chain runs.
        nxt = load_entry(
            c0 + _WARP + lane,
            hi,
            out_cache_loc,
            input_ids,
            positions,
            expected_tokens,
            expected_positions,
            input_assert,
        )
        running, prev_position, counted, chain_hash, chain_position, last = chunk_chain(
            lane, n, slot, s_slot, s_token, s_position, running, prev_position, num_slots
        )
        stored += counted
        if slot >= ZERO:
            real = real_kv(slot, num_slots, nsrc, w0, w1, w2, w3, params)
            ok = entry_checks(
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
            )
            if ok and last:
                store_record(buf, slot, token, position, chain_hash, real)
    return stored


def _make_write(input_assert: bool, nsrc: int):
    def write(
        buf,
        offsets,
        seeds,
        num_valid_reqs,
        input_ids,
        positions,
        out_cache_loc,
        expected_tokens,
        expected_positions,
        chain_flag,
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
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        warp = cuda.threadIdx.x // WARP_SIZE
        s_slot = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        s_token = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        s_position = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            cuda.atomic.add(kernel_counter, 0, ONE)
        num_reqs = min(max(int64(num_valid_reqs[0]), ZERO), int64(seeds.shape[0]))
        num_tokens = int64(input_ids.shape[0])
        num_slots = int64(buf.shape[0])
        chain_on = chain_flag[0] != 0
        stored = ZERO
        blocks = int64(cuda.gridDim.x)
        block_warps = int64(cuda.blockDim.x // WARP_SIZE)  # WRITE_WARPS on a GPU
        # Requests go to blocks first (request r: block r % blocks), so a few long
        # requests run on different SMs instead of sharing one SM's issue slots.
        first = int64(warp) * blocks + int64(cuda.blockIdx.x)
        for r in range(first, num_reqs, blocks * block_warps):
            lo, hi = request_range(offsets, r, num_tokens, ring, write_index, kind, lane == ZERO)
            if hi <= lo:
                continue
            seed = seeds[r]
            track = chain_on and seed >= ZERO and seed < num_slots
            # Every lane runs the recurrence (the seed row is recorded once, by lane 0).
            running, prev_position = seed_state(buf, seed, num_slots, ring, write_index, kind, lane == ZERO)
            stored += walk_chunks(
                lane,
                lo,
                hi,
                running,
                prev_position,
                track,
                s_slot,
                s_token,
                s_position,
                buf,
                out_cache_loc,
                input_ids,
                positions,
                expected_tokens,
                expected_positions,
                input_assert,
                nsrc,
                w0,
                w1,
                w2,
                w3,
                params,
                ring,
                write_index,
                kind,
                num_slots,
            )
        if lane == ZERO and stored > ZERO:
            cuda.atomic.add(slot_counter, 0, stored)

    write.__name__ = write.__qualname__ = kernel_name(input_assert, nsrc)
    return cuda.jit(write)


def kernel_name(input_assert: bool, nsrc: int) -> str:
    """Name of the ``write`` variant in :data:`KERNELS`."""
    return f"write_assert{int(bool(input_assert))}_src{int(nsrc)}"


KERNELS = {kernel_name(flag, n): _make_write(flag, n) for flag in (False, True) for n in range(MAX_REAL_KV_SOURCES + 1)}
#: The kernel's arguments as Numba types (``launch/write.py`` builds them); kernels that
#: take these and more (the fast wing's, the benchmarks' baseline) extend this list.
ARGUMENTS = (
    "int64[:, ::1], int64[::1], int64[::1], int32[::1], int64[::1], int64[::1], int64[::1], int64[::1], "
    f"int64[::1], int32[::1], int64[:, ::1], int32[::1], int64[::1], int64[::1], int64, {SOURCE_SIGNATURE}"
)
SIGNATURE = f"void({ARGUMENTS})"
SIGNATURES = {name: (SIGNATURE,) for name in KERNELS}
