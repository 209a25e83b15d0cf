"""The write kernel with the chain shared by the launches of one monitor step.

The core's ``write`` (``kvcanary_numba/kernels/write.py``) walks each request's
chunks in one warp and runs the request's own chain. The write launches of one
monitor step all compute the same chain (``share.py``), so here a launch takes a
role: ``PUBLISH`` leaves every entry's chain state in the step scratch,
``CONSUME`` reuses a published one wherever it applies to this buffer and these
inputs (a chunk that reuses it entirely runs no recurrence), ``OWN`` runs its own
chain as the core kernel does. That serial consumer serves decode-shaped steps; a
long write publishes with ``chain.py`` ``chain_publish`` and stamps with
``write_tiled.py`` (a block per request), whose requests fall back to
:func:`walk_shared` after the first entry that differs from the published chain.

Built from the core's device helpers (``kernels/write_chunk.py``). The chunk walk
and the recurrence are small duplicates of the core's ``walk_chunks`` and
``chunk_chain`` with the reuse and publish steps added: a copy here keeps the
core's teaching kernel free of arguments only the fast wing's launches use.

:func:`make_shared_body` is a device function: ``write_shared`` runs it on its whole
grid, ``endpoints.py`` on one part of a launch per endpoint.

Variants: ``input_assert`` x ``nsrc``, named ``write_shared_assert{0|1}_src{0..4}``;
arguments are the core ``write``'s, then the chain role, ``published`` and
``published_seeds`` (``share.py``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ...constants import MAX_REAL_KV_SOURCES, WARP_SIZE
from ...kernels.fingerprint import warp_sync
from ...kernels.hashing import ONE, ZERO, mix3
from ...kernels.write import ARGUMENTS, MAX_WRITE_WARPS
from ...kernels.write_chunk import entry_checks, load_entry, real_kv, request_range, seed_state, store_record
from .share import (
    PUBLISH,
    first_difference,
    load_published,
    publish,
    request_role,
    same_entry,
    share_role,
    switch_state,
)

__all__ = [
    "KERNELS",
    "SIGNATURE",
    "SIGNATURES",
    "chunk_chain_from",
    "kernel_name",
    "make_shared_body",
    "single_write_kernel",
    "walk_shared",
]

_WARP = np.int64(WARP_SIZE)


@cuda.jit(device=True)
def chunk_chain_from(lane, n, start, slot, s_slot, s_token, s_position, running, prev_position, num_slots):
    """``write_chunk.chunk_chain`` from entry ``start`` of the chunk on: the entries before it
    keep the published chain (only their bookkeeping runs, no ``mix3``). Returns what
    ``chunk_chain`` returns; the prev_hash and expected position are meaningless below ``start``."""
    counted = ZERO
    mine = ZERO
    expect = ZERO
    later = ZERO
    for k in range(start):
        cs = s_slot[k]
        live = cs >= ZERO
        later = later | (int64(live) & int64(k > lane) & int64(cs == slot))
        counted += int64(live and cs < num_slots)
    first = min(start, _WARP - ONE)
    ks = s_slot[first]
    kt = s_token[first]
    kp = s_position[first]
    for k in range(start, n):  # as in chunk_chain (see there why branch-free)
        cs, ct, cp = ks, kt, kp
        nk = min(k + ONE, _WARP - ONE)
        ks = s_slot[nk]
        kt = s_token[nk]
        kp = s_position[nk]
        hit = -int64(k == lane)
        mine = (mine & ~hit) | (int64(running) & hit)
        expect = (expect & ~hit) | ((prev_position + ONE) & hit)
        live = cs >= ZERO
        later = later | (int64(live) & int64(k > lane) & int64(cs == slot))
        counted += int64(live and cs < num_slots)
        stepped = mix3(running, uint64(ct), uint64(cp))
        running = stepped if live else running
        # Tracked whatever the chain-position assert says: a published expected
        # position must hold for a consumer that asserts it.
        prev_position = cp if live else prev_position
    return running, prev_position, counted, mine, expect, later == ZERO


@cuda.jit(device=True)
def walk_shared(
    lane,
    lo,
    hi,
    running,
    prev_position,
    reuse,
    publishing,
    track,
    act,
    s_slot,
    s_token,
    s_position,
    s_switch,
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
    published,
    num_slots,
):
    """One warp walks entries ``[lo, hi)`` of a request in chunks of 32 (the core's ``walk_chunks``).

    ``running``, ``prev_position``: the chain state before ``lo``. ``reuse``:
    the published chain applies from ``lo`` on (a consumer), until the first
    entry whose inputs differ. ``publishing``: leave every entry's chain state
    in ``published``. ``act``: record rows and store (False: the lanes only
    take part in the warp's barriers; the simulator's stand-in for an idle
    warp of ``write_tiled``). ``s_*``: the warp's shared rows. Returns the
    entries counted (the same value on every lane).
    """
    stored = ZERO
    nxt = load_entry(
        lo + lane, hi, out_cache_loc, input_ids, positions, expected_tokens, expected_positions, input_assert
    )
    pub = load_published(lo + lane, hi, reuse, published)
    for c0 in range(lo, hi, _WARP):
        n = min(_WARP, hi - c0)
        slot, token, position, expected_token, expected_position = nxt
        p_hash, p_expect, p_token, p_position, p_slot = pub
        warp_sync()  # every lane has finished reading the previous chunk's rows
        s_slot[lane] = slot
        s_token[lane] = token
        s_position[lane] = position
        if reuse:
            s_switch[lane] = same_entry(lane, n, slot, token, position, p_token, p_position, p_slot)
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
        start = ZERO
        if reuse:
            start = first_difference(n, s_switch)
            if start < n:  # this chunk's inputs differ from the published ones: own chain from here
                reuse = False
                running, prev_position = switch_state(published, c0 + start)
            else:
                pub = load_published(c0 + _WARP + lane, hi, True, published)
        running, prev_position, counted, chain_hash, chain_position, last = chunk_chain_from(
            lane, n, start, slot, s_slot, s_token, s_position, running, prev_position, num_slots
        )
        if lane < start:  # entries before the switch keep the published chain
            chain_hash, chain_position = p_hash, p_expect
        if publishing and lane < n:
            publish(published, c0 + lane, chain_hash, chain_position, token, position, slot)
        stored += counted
        if act and slot >= ZERO:
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


def make_shared_body(input_assert: bool, nsrc: int):
    """The shared-chain write of one endpoint as a device function: the body of ``write_shared``
    and of the endpoint kernels (``endpoints.py``).

    ``block``, ``nblocks``: this block's index among the blocks that run it and their
    number (``write_shared`` passes ``blockIdx.x`` and ``gridDim.x``, an endpoint kernel
    the block's index within its endpoint's part and the part's size). The other
    arguments are the kernel's.
    """

    @cuda.jit(device=True)
    def body(
        block,
        nblocks,
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
        chain_role,
        published,
        published_seeds,
    ):
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
        # Requests go to blocks first (request r: block r % nblocks), as in the core kernel.
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
            stored += walk_shared(
                lane,
                lo,
                hi,
                running,
                prev_position,
                reuse,
                role == PUBLISH,
                track,
                True,
                s_slot,
                s_token,
                s_position,
                s_switch,
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
                published,
                num_slots,
            )
        if lane == ZERO and stored > ZERO:
            cuda.atomic.add(slot_counter, 0, stored)

    return body


def single_write_kernel(body, name: str):
    """The kernel running write body ``body`` (:func:`make_shared_body`, or ``write_tiled``'s
    ``make_tiled_body``: same arguments) over the whole grid for one context, named ``name``."""

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
        chain_role,
        published,
        published_seeds,
    ):
        body(
            cuda.blockIdx.x,
            cuda.gridDim.x,
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
            chain_role,
            published,
            published_seeds,
        )

    write.__name__ = write.__qualname__ = name
    return cuda.jit(write)


def kernel_name(input_assert: bool, nsrc: int) -> str:
    """Name of the ``write_shared`` variant in :data:`KERNELS`."""
    return f"write_shared_assert{int(bool(input_assert))}_src{int(nsrc)}"


KERNELS = {
    kernel_name(flag, n): single_write_kernel(make_shared_body(flag, n), kernel_name(flag, n))
    for flag in (False, True)
    for n in range(MAX_REAL_KV_SOURCES + 1)
}
#: The core write's arguments, then the chain role and the step scratch (``share.py``).
SIGNATURE = f"void({ARGUMENTS}, int64, int64[:, ::1], int64[:, ::1])"
SIGNATURES = {name: (SIGNATURE,) for name in KERNELS}
