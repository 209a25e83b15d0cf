"""Write kernels: stamp the canary records of the slots a forward pass writes.

Semantics: docs/concepts/semantics.md ("Write", "Ring") and reference notes §4.

The chain is serial within a request: each stored prev_hash is the running
hash of the entries before it. Everything else is not, so in ``write`` each
warp walks one request at a time (grid-striding over requests, ``WRITE_WARPS``
warps per block) in chunks of 32 entries:

1. every lane loads one entry (slot, token, position, expected values) into
   registers; the next chunk's loads are issued before this chunk's chain, so
   their latency hides behind it;
2. slot / token / position go to the warp's shared rows, and *every* lane runs
   the recurrence over them (warp-uniform, registers only; the next entry's
   row is read before this entry's ``mix3``), keeping the prev_hash and
   expected chain position of its own entry and noting whether a later entry
   of the chunk targets its slot. The loop is bound by the latency of the
   dependent ``mix3``; the redundant lanes cost no extra time (SIMT);
3. every lane folds its slot's real-KV bytes, records its rows and stores its
   record unless it was not the last (so the last entry wins, as in the
   sequential reference; chunks are stored in order).

With ``chain_role`` PUBLISH the launch also leaves every entry's chain state
in a step scratch; with CONSUME it reuses one published by an earlier launch of
the same step wherever it applies to this buffer and these inputs, and a chunk
that reuses it entirely runs no recurrence (``kernels/share.py``). That serial
consumer serves decode-shaped steps; a long write (a prefill-shaped monitor step,
or a public write of long requests) publishes with ``kernels/chain.py``
``chain_publish`` and stamps with ``kernels/write_tiled.py`` (a block per
request), see ``launch.chain.write_chain``.

A warp per request (not a block) keeps decode batches, one entry per request,
as parallel as the baseline, while a long prefill request still does only the
recurrence serially.

The loop above is :func:`make_write_body`, a device function: ``write`` runs it on
its whole grid, ``kernels/endpoints.py`` on one part of a launch per endpoint.

Requests run concurrently, so two requests of one launch writing the same slot
race (as in SGLang). ``benchmarks/baseline_kernels.py`` holds SGLang's design (one
thread per request, everything serial) with the same semantics, which the
benchmarks compare against.

Variants of ``write``: ``input_assert`` (compare with the expected inputs) x
``nsrc`` (real-KV sources folded), named ``write_assert{0|1}_src{0..4}``.
"""

from __future__ import annotations

from numba import cuda, int64, uint64

from ..constants import MAX_REAL_KV_SOURCES, WARP_SIZE
from . import ON_SIMULATOR
from .fingerprint import SOURCE_SIGNATURE, real_kv_hash
from .hashing import ONE, ZERO, mix3
from .share import PUBLISH, request_role, share_role
from .write_chunk import entry_checks, request_range, seed_state, store_record, walk_chunks

__all__ = ["KERNELS", "MAX_WRITE_WARPS", "SIGNATURES", "WRITE_WARPS", "kernel_name", "make_write_body", "single_write_kernel"]

#: Warps per block of ``write``; each warp walks its own requests (one under the
#: simulator, which has no warp barrier and so synchronises whole blocks).
WRITE_WARPS = 1 if ON_SIMULATOR else 8
#: Most warps per block the shared rows hold; the kernel walks ``blockDim.x // 32`` warps
#: (tests run several under the simulator: ``launch._common.simulated_shapes``).
MAX_WRITE_WARPS = 4 if ON_SIMULATOR else WRITE_WARPS


def make_write_body(input_assert: bool, nsrc: int):
    """The write of one endpoint as a device function: the body of ``write`` and of the
    endpoint kernels (``kernels/endpoints.py``).

    ``block``, ``nblocks``: this block's index among the blocks that run it and their
    number (the plain kernel passes ``blockIdx.x`` and ``gridDim.x``, an endpoint kernel
    the block's index within its endpoint's part and the part's size; the plain kernel's
    PTX is the same as before the body moved here). The other arguments are the kernel's.
    """

    @cuda.jit(device=True)
    def body(
        block, nblocks, buf, offsets, seeds, num_valid_reqs, input_ids, positions, out_cache_loc, expected_tokens,
        expected_positions, chain_flag, ring, write_index, slot_counter, kernel_counter, kind,
        w0, w1, w2, w3, params, chain_role, published, published_seeds,
    ):  # fmt: skip
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        warp = cuda.threadIdx.x // WARP_SIZE
        s_slot = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        s_token = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        s_position = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        s_switch = cuda.shared.array((MAX_WRITE_WARPS, WARP_SIZE), int64)[warp]
        if block == 0 and cuda.threadIdx.x == 0:
            cuda.atomic.add(kernel_counter, 0, ONE)
        num_reqs = min(max(int64(num_valid_reqs[0]), ZERO), int64(seeds.shape[0]))
        num_tokens = int64(input_ids.shape[0])
        num_slots = int64(buf.shape[0])
        chain_on = chain_flag[0] != 0
        role = share_role(chain_role, num_tokens, num_reqs, published, published_seeds)
        stored = ZERO
        block_warps = int64(cuda.blockDim.x // WARP_SIZE)  # WRITE_WARPS on a GPU
        # Requests go to blocks first (request r: block r % nblocks), so a few long
        # requests run on different SMs instead of sharing one SM's issue slots.
        first = int64(warp) * int64(nblocks) + int64(block)
        for r in range(first, num_reqs, int64(nblocks) * block_warps):
            lo, hi = request_range(offsets, r, num_tokens, ring, write_index, kind, lane == ZERO)
            if hi <= lo:
                continue
            seed = seeds[r]
            track = chain_on and seed >= ZERO and seed < num_slots
            # Every lane runs the recurrence (the seed row is recorded once, by lane 0).
            running, prev_position = seed_state(buf, seed, num_slots, ring, write_index, kind, lane == ZERO)
            reuse = request_role(role, r, running, prev_position, published_seeds, lane)
            stored += walk_chunks(lane, lo, hi, running, prev_position, reuse, role == PUBLISH, track, True, s_slot,
                                  s_token, s_position, s_switch, buf, out_cache_loc, input_ids, positions,
                                  expected_tokens, expected_positions, input_assert, nsrc, w0, w1, w2, w3, params,
                                  ring, write_index, kind, published, num_slots)  # fmt: skip
        if lane == ZERO and stored > ZERO:
            cuda.atomic.add(slot_counter, 0, stored)

    return body


def single_write_kernel(body, name: str):
    """The kernel running write body ``body`` (:func:`make_write_body`, or ``write_tiled``'s
    ``make_tiled_body``: same arguments) over the whole grid for one context, named ``name``."""

    def write(
        buf, offsets, seeds, num_valid_reqs, input_ids, positions, out_cache_loc, expected_tokens,
        expected_positions, chain_flag, ring, write_index, slot_counter, kernel_counter, kind,
        w0, w1, w2, w3, params, chain_role, published, published_seeds,
    ):  # fmt: skip
        body(cuda.blockIdx.x, cuda.gridDim.x, buf, offsets, seeds, num_valid_reqs, input_ids, positions,
             out_cache_loc, expected_tokens, expected_positions, chain_flag, ring, write_index, slot_counter,
             kernel_counter, kind, w0, w1, w2, w3, params, chain_role, published, published_seeds)  # fmt: skip

    write.__name__ = write.__qualname__ = name
    return cuda.jit(write)


def _make_write(input_assert: bool, nsrc: int):
    return single_write_kernel(make_write_body(input_assert, nsrc), kernel_name(input_assert, nsrc))


def kernel_name(input_assert: bool, nsrc: int) -> str:
    """Name of the ``write`` variant in :data:`KERNELS`."""
    return f"write_assert{int(bool(input_assert))}_src{int(nsrc)}"


KERNELS = {
    kernel_name(flag, n): _make_write(flag, n) for flag in (False, True) for n in range(MAX_REAL_KV_SOURCES + 1)
}

SIGNATURE = (
    "void(int64[:, ::1], int64[::1], int64[::1], int32[::1], int64[::1], int64[::1], int64[::1], int64[::1], "
    f"int64[::1], int32[::1], int64[:, ::1], int32[::1], int64[::1], int64[::1], int64, {SOURCE_SIGNATURE}"
)
SIGNATURES = {name: (SIGNATURE + ", int64, int64[:, ::1], int64[:, ::1])",) for name in KERNELS}
