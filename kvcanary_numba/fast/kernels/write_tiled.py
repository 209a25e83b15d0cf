"""Tiled write kernels: stamp a long request in parallel from a published chain.

The consumer of ``write_shared.py`` walks each request's chunks serially in one
warp, so even with no recurrence to run it is as serial as the chain it reuses.
Once a chain is published (``chain.py`` ``chain_publish``, layout in
``share.py``), nothing else in a request is serial except "the last
entry of a slot wins". ``write_tiled`` therefore gives each request a whole
block (grid-striding over requests) and walks it in tiles of
``blockDim.x * TILE_ITEMS`` consecutive entries (512 on a GPU), in order, with block barriers
between the phases of a tile:

1. every thread compares its entries' token, position and skip with the
   published ones (a mismatch lowers the tile's first difference, a shared
   atomic min) and enters each in-range slot into a shared hash table
   (slot -> largest entry index of the tile, linear probing, ``atomic.cas`` /
   ``atomic.max``);
2. entries before the first difference are stamped in parallel from the
   published chain state (prev_hash, expected chain position) with every
   check of the serial kernel (input assert, chain position, slot range,
   counters); only an entry that is the last of its slot in the tile stores
   (a later tile stores after the barrier, so it wins, as in the reference);
3. the table is cleared; a tile with a difference ends the parallel part.

A request whose seed state in this buffer differs from the published one
(or a launch whose scratch is too small) has its first difference at its
start. From the first difference on, warp 0 walks the rest of the request
with the serial kernel's chunk loop (``write_shared.walk_shared``), from the
published state before that entry (exact, since every earlier entry
matched) or from its own seed state; its stores come after the parallel
part's, so the last entry of a slot still wins. Records are byte-equal to a
launch that runs its own chain; rows are the same multiset.

Only explicit barriers order the threads (no warp-synchronous code: the
warp-vote attempt of benchmarks/NOTES.md section 24 did not survive
compute-sanitizer). Under the simulator, whose ``warp_sync`` is a block
barrier, every warp runs the serial walk with only warp 0 acting, so the
block's barrier counts match.

The kernel's body is :func:`make_tiled_body`, a device function: ``write_tiled`` runs it on
its whole grid, ``tiled_endpoints.py`` on one part of a launch per endpoint (K and V of
a monitor phase stamped by one launch).

Variants: ``input_assert`` x ``nsrc``, named ``write_tiled_assert{0|1}_src{0..4}``;
arguments are those of ``write_shared`` (``chain_role`` is CONSUME, or OWN to walk
every request serially).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ...constants import MAX_REAL_KV_SOURCES, WARP_SIZE
from ...kernels import ON_SIMULATOR
from ...kernels.write_chunk import entry_checks, real_kv, request_range, seed_state, store_record
from .share import CONSUME, share_role, switch_state
from .write_shared import SIGNATURE, single_write_kernel, walk_shared

__all__ = [
    "KERNELS",
    "MAX_TILED_WARPS",
    "SIGNATURES",
    "TABLE_SIZE",
    "TILED_WARPS",
    "TILE_ITEMS",
    "kernel_name",
    "make_tiled_body",
]

#: Warps per block (a block per request) and entries per thread of a tile. On a GPU one
#: entry per thread: a thread's loads of several entries would wait one after another
#: (the atomics and stores between them keep the compiler from hoisting them).
TILED_WARPS = 1 if ON_SIMULATOR else 16
MAX_TILED_WARPS = 4 if ON_SIMULATOR else TILED_WARPS
TILE_ITEMS = 2 if ON_SIMULATOR else 1
_LOG_TABLE = int(np.log2(2 * MAX_TILED_WARPS * WARP_SIZE * TILE_ITEMS))
#: Buckets of the per-tile slot table: twice the largest tile, so probing stays short and ends.
TABLE_SIZE = 1 << _LOG_TABLE
_MASK = np.int64(TABLE_SIZE - 1)
_SHIFT = np.uint64(64 - _LOG_TABLE)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: strided slots spread over the table
_EMPTY = np.int64(-1)
_NONE = np.int64(np.iinfo(np.int64).max)
_ZERO, _ONE = np.int64(0), np.int64(1)
_WARP = np.int64(WARP_SIZE)
_ITEMS = np.int64(TILE_ITEMS)
_HASH, _EXPECT, _TOKEN, _POSITION, _SLOT = (np.int64(i) for i in range(5))


@cuda.jit(device=True)
def _bucket(slot):
    return int64((uint64(slot) * _GOLDEN) >> _SHIFT)


@cuda.jit(device=True)
def _insert(keys, last, slot, index):
    """Enter ``slot`` (in range, so >= 0) with tile entry ``index``; the bucket keeps the largest index."""
    h = _bucket(slot)
    while True:
        old = cuda.atomic.cas(keys, h, _EMPTY, slot)
        if old == _EMPTY or old == slot:
            cuda.atomic.max(last, h, index)
            return
        h = (h + _ONE) & _MASK


@cuda.jit(device=True)
def _is_last(keys, last, slot, index):
    """Whether tile entry ``index`` is the last of the tile with ``slot`` (entered before the barrier)."""
    h = _bucket(slot)
    while keys[h] != slot:
        h = (h + _ONE) & _MASK
    return last[h] == index


@cuda.jit(device=True)
def _clear(keys, last, tid, block):
    for h in range(tid, TABLE_SIZE, block):
        keys[h] = _EMPTY
        last[h] = _EMPTY


@cuda.jit(device=True)
def _differs(i, slot, input_ids, positions, published):
    p_slot = published[_SLOT, i]
    return (
        input_ids[i] != published[_TOKEN, i]
        or positions[i] != published[_POSITION, i]
        or ((slot < _ZERO) != (p_slot < _ZERO))
    )


def make_tiled_body(input_assert: bool, nsrc: int):
    """The tiled write of one endpoint as a device function: the body of ``write_tiled`` and of
    the tiled endpoint kernels (``tiled_endpoints.py``).

    ``part``, ``nparts``: this block's index among the blocks that run it and their number
    (the plain kernel passes ``blockIdx.x`` and ``gridDim.x``, an endpoint kernel the block's
    index within its endpoint's part and the part's size). The other arguments are the kernel's.
    """

    @cuda.jit(device=True)
    def body(
        part,
        nparts,
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
        tid = int64(cuda.threadIdx.x)
        lane = tid % _WARP
        warp = cuda.threadIdx.x // WARP_SIZE
        block = int64(cuda.blockDim.x)
        keys = cuda.shared.array(TABLE_SIZE, int64)
        last = cuda.shared.array(TABLE_SIZE, int64)
        first = cuda.shared.array(1, int64)  # the tile's first difference
        total = cuda.shared.array(1, int64)  # the block's entries counted
        s_slot = cuda.shared.array((MAX_TILED_WARPS, WARP_SIZE), int64)[warp]
        s_token = cuda.shared.array((MAX_TILED_WARPS, WARP_SIZE), int64)[warp]
        s_position = cuda.shared.array((MAX_TILED_WARPS, WARP_SIZE), int64)[warp]
        s_switch = cuda.shared.array((MAX_TILED_WARPS, WARP_SIZE), int64)[warp]
        if part == 0 and tid == _ZERO:
            cuda.atomic.add(kernel_counter, 0, _ONE)
        _clear(keys, last, tid, block)
        if tid == _ZERO:
            first[0] = _NONE
            total[0] = _ZERO
        cuda.syncthreads()
        num_reqs = min(max(int64(num_valid_reqs[0]), _ZERO), int64(seeds.shape[0]))
        num_tokens = int64(input_ids.shape[0])
        num_slots = int64(buf.shape[0])
        chain_on = chain_flag[0] != 0
        role = share_role(chain_role, num_tokens, num_reqs, published, published_seeds)
        tile = block * _ITEMS
        stored = _ZERO
        # Everything that decides a barrier below is the same on every thread of the block.
        for r in range(int64(part), num_reqs, int64(nparts)):
            lo, hi = request_range(offsets, r, num_tokens, ring, write_index, kind, tid == _ZERO)
            if hi <= lo:
                continue
            seed = seeds[r]
            track = chain_on and seed >= _ZERO and seed < num_slots
            running, prev_position = seed_state(buf, seed, num_slots, ring, write_index, kind, tid == _ZERO)
            split = lo  # first entry the serial walk takes
            if role == CONSUME and int64(running) == published_seeds[0, r] and prev_position == published_seeds[1, r]:
                split = hi
                for t0 in range(lo, hi, tile):
                    for e in range(_ITEMS):  # phase 1: differences and the slot table
                        k = e * block + tid
                        i = t0 + k
                        if i < hi:
                            slot = out_cache_loc[i]
                            if _differs(i, slot, input_ids, positions, published):
                                cuda.atomic.min(first, 0, k)
                            if slot >= _ZERO and slot < num_slots:
                                _insert(keys, last, slot, k)
                    cuda.syncthreads()
                    cut = first[0]
                    for e in range(_ITEMS):  # phase 2: stamp the entries before the difference
                        k = e * block + tid
                        i = t0 + k
                        if i < hi and k < cut:
                            slot = out_cache_loc[i]
                            if slot >= _ZERO:
                                token = input_ids[i]
                                position = positions[i]
                                chain_hash = published[_HASH, i]
                                expected_token = expected_tokens[i] if input_assert else _ZERO
                                expected_position = expected_positions[i] if input_assert else _ZERO
                                real = real_kv(slot, num_slots, nsrc, w0, w1, w2, w3, params)
                                if entry_checks(
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
                                    published[_EXPECT, i],
                                    num_slots,
                                ):
                                    stored += _ONE
                                    if _is_last(keys, last, slot, k):
                                        store_record(buf, slot, token, position, chain_hash, real)
                    cuda.syncthreads()  # every lookup is done
                    _clear(keys, last, tid, block)
                    if tid == _ZERO:
                        first[0] = _NONE
                    cuda.syncthreads()
                    if cut < tile:
                        split = t0 + cut
                        break
                if split < hi:
                    running, prev_position = switch_state(published, split)
            if split < hi and (warp == 0 or ON_SIMULATOR):
                n = walk_shared(
                    lane,
                    split,
                    hi,
                    running,
                    prev_position,
                    False,
                    False,
                    track,
                    warp == 0,
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
                if tid == _ZERO:  # every lane of the walk counts the same entries
                    stored += n
        if stored > _ZERO:
            cuda.atomic.add(total, 0, stored)
        cuda.syncthreads()
        if tid == _ZERO and total[0] > _ZERO:
            cuda.atomic.add(slot_counter, 0, total[0])

    return body


def _make_tiled(input_assert: bool, nsrc: int):
    return single_write_kernel(make_tiled_body(input_assert, nsrc), kernel_name(input_assert, nsrc))


def kernel_name(input_assert: bool, nsrc: int) -> str:
    """Name of the ``write_tiled`` variant in :data:`KERNELS`."""
    return f"write_tiled_assert{int(bool(input_assert))}_src{int(nsrc)}"


KERNELS = {kernel_name(flag, n): _make_tiled(flag, n) for flag in (False, True) for n in range(MAX_REAL_KV_SOURCES + 1)}
#: Same arguments as ``write_shared``'s.
SIGNATURES = {name: (SIGNATURE,) for name in KERNELS}
