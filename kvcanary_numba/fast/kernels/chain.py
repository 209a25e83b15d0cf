"""``chain_publish``: the write chain alone, for the tiled stamp of long writes.

``chain_publish`` is the write chain with nothing else on its path: one warp
per request runs the recurrence of the core write kernel over a request's
entries and leaves, per entry, the chain state before it and the inputs it
hashed in the step scratch (``share.py``), and per request its seed
state. It checks nothing, stores no record, records no row and counts
nothing: in a long (prefill-shaped) monitor step every write launch, the
publishing buffer's included, then consumes that chain in parallel
(``write_tiled.py``). The expected chain position is always tracked,
so it holds for any consumer that asserts it.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ...constants import WARP_SIZE
from ...kernels.fingerprint import warp_sync
from ...kernels.hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, ZERO, mix3, slot_hash
from .share import OWN, PUBLISH, publish, share_role

__all__ = ["KERNELS", "PUBLISH_WARPS", "SIGNATURES"]

#: Warps per block of ``chain_publish`` (one request per warp at a time; a lightly
#: loaded scheduler is what the floor was measured with).
PUBLISH_WARPS = 1
_WARP = np.int64(WARP_SIZE)


@cuda.jit(device=True)
def _load(i, hi, out_cache_loc, input_ids, positions):
    """(slot, token, position) of entry ``i``; a skipped placeholder past ``hi``."""
    if i >= hi:
        return MINUS_ONE, ZERO, ZERO
    return out_cache_loc[i], input_ids[i], positions[i]


@cuda.jit(device=True)
def _chunk(lane, n, s_slot, s_token, s_position, running, prev_position):
    """The recurrence over a chunk's shared rows, by every lane (warp-uniform); also returns the
    chain state before this lane's entry (branch-free capture, as in ``write_chunk.chunk_chain``)."""
    mine = ZERO
    expect = ZERO
    ks = s_slot[0]
    kt = s_token[0]
    kp = s_position[0]
    for k in range(n):
        cs, ct, cp = ks, kt, kp
        nk = min(k + ONE, _WARP - ONE)
        ks = s_slot[nk]
        kt = s_token[nk]
        kp = s_position[nk]
        hit = -int64(k == lane)
        mine = (mine & ~hit) | (int64(running) & hit)
        expect = (expect & ~hit) | ((prev_position + ONE) & hit)
        # A skipped entry leaves the chain as it is. Selects, not a branch: the compiler
        # cannot tell that ``cs`` is warp-uniform, and a branch's reconvergence would sit
        # on the chain's path (the mix3 of a skipped entry is computed and dropped).
        stepped = mix3(running, uint64(ct), uint64(cp))
        keep = cs < ZERO
        running = running if keep else stepped
        prev_position = prev_position if keep else cp
    return running, prev_position, mine, expect


@cuda.jit
def chain_publish(buf, offsets, seeds, num_valid_reqs, input_ids, positions, out_cache_loc, published, published_seeds):
    """Publish the write chain of every request (see the module docstring); arguments as ``write``'s."""
    lane = int64(cuda.threadIdx.x % WARP_SIZE)
    warp = cuda.threadIdx.x // WARP_SIZE
    s_slot = cuda.shared.array((PUBLISH_WARPS, WARP_SIZE), int64)[warp]
    s_token = cuda.shared.array((PUBLISH_WARPS, WARP_SIZE), int64)[warp]
    s_position = cuda.shared.array((PUBLISH_WARPS, WARP_SIZE), int64)[warp]
    num_reqs = min(max(int64(num_valid_reqs[0]), ZERO), int64(seeds.shape[0]))
    num_tokens = int64(input_ids.shape[0])
    num_slots = int64(buf.shape[0])
    if share_role(PUBLISH, num_tokens, num_reqs, published, published_seeds) == OWN:
        return  # scratch too small: every consumer runs its own chain
    block_warps = int64(cuda.blockDim.x // WARP_SIZE)
    first = int64(warp) * int64(cuda.gridDim.x) + int64(cuda.blockIdx.x)
    for r in range(first, num_reqs, int64(cuda.gridDim.x) * block_warps):
        start = offsets[r]
        end = offsets[r + ONE]
        if end <= start:
            continue
        lo = max(start, ZERO)
        hi = min(end, num_tokens)
        if hi <= lo:
            continue
        seed = seeds[r]
        running = CHAIN_HEAD
        prev_position = ZERO
        if seed >= ZERO and seed < num_slots:
            running = slot_hash(buf, seed)
            prev_position = buf[seed, POSITION]
        if lane == ZERO:
            published_seeds[0, r] = int64(running)
            published_seeds[1, r] = prev_position
        nxt = _load(lo + lane, hi, out_cache_loc, input_ids, positions)
        for c0 in range(lo, hi, _WARP):
            n = min(_WARP, hi - c0)
            slot, token, position = nxt
            warp_sync()  # every lane has finished reading the previous chunk's rows
            s_slot[lane] = slot
            s_token[lane] = token
            s_position[lane] = position
            warp_sync()
            nxt = _load(c0 + _WARP + lane, hi, out_cache_loc, input_ids, positions)  # lands during the chain
            running, prev_position, mine, expect = _chunk(lane, n, s_slot, s_token, s_position, running, prev_position)
            if lane < n:
                publish(published, c0 + lane, mine, expect, token, position, slot)


KERNELS = {"chain_publish": chain_publish}
SIGNATURES = {
    "chain_publish": (
        "void(int64[:, ::1], int64[::1], int64[::1], int32[::1], int64[::1], int64[::1], int64[::1], "
        "int64[:, ::1], int64[:, ::1])",
    ),
}
