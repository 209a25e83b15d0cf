"""Plan kernels: batch metadata -> write plan, verify offsets, verify entries.

Two launches make one plan step:

1. :func:`plan_offsets_kernel` -- one pass over the batch. Each block scans a tile
   of ``blockDim.x * items`` requests (both lengths at once: verify entries and
   write tokens), writes per-request seeds, and chains its tile to the tiles before
   it with a single-pass decoupled look-back (:mod:`.lookback`), so ``bs`` has no
   cap and no launch syncs with the host. A batch that fits one tile (1024
   requests with the GPU launch shape) never touches the look-back state.
2. :func:`plan_entries_kernel` -- warps over tiles of consecutive verify entries
   on a persistent grid. The entry count is read on the device
   (``verify_offsets[bs]``); one binary search per tile finds the first owner,
   then each lane follows request ends forward.

Semantics (docs/concepts/semantics.md, plan section) are those of
:mod:`kvcanary_numba.reference.plan`; every index read from an array is
bounds-checked, unresolvable slots become ``OUT_OF_RANGE_SLOT``.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from ..constants import EXPECTED_TOKEN_UNCHECKED, NO_PREDECESSOR, OUT_OF_RANGE_SLOT, WARP_SIZE
from . import ON_SIMULATOR
from .lookback import LOOKBACK_HEADER, LOOKBACK_STRIDE, block_inclusive_scan2, look_back, release_lookback

# The look-back layout is part of this module's interface (the launch glue sizes its scratch).
__all__ = [
    "ENTRIES_PER_THREAD",
    "ENTRIES_PER_TILE",
    "KERNELS",
    "LOOKBACK_HEADER",
    "LOOKBACK_STRIDE",
    "MAX_SCAN_BLOCK",
    "SIGNATURES",
    "look_back",
]

#: Entries of one warp's tile in the entries kernel (4 per lane: measured best of 2, 4, 8).
ENTRIES_PER_TILE = 4 * WARP_SIZE
#: Entries each thread of the entries kernel writes per tile (the launch sizes its grid with it).
ENTRIES_PER_THREAD = ENTRIES_PER_TILE // WARP_SIZE
_TILE = int64(ENTRIES_PER_TILE)
_WARP = int64(WARP_SIZE)

#: Largest block the offsets kernel supports (size of its shared scan arrays);
#: simulated blocks are tiny, so the simulator allocates less.
MAX_SCAN_BLOCK = 64 if ON_SIMULATOR else 1024

_OOR = int64(OUT_OF_RANGE_SLOT)
_NO_PRED = int64(NO_PREDECESSOR)
_UNCHECKED = int64(EXPECTED_TOKEN_UNCHECKED)

#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {
    "plan_offsets": (
        "void(int64[::1], int64[::1], int64[::1], int32[:, ::1], int64[::1], int64, int64, int64, "
        "int64, int64[::1], int64[::1], int64[::1], int32[::1], int32[::1], int32[::1], int64[::1])",
    ),
    "plan_entries": (
        "void(int64[::1], int64[::1], int32[:, ::1], int64[::1], int64, int64, int32[:, ::1], "
        "int64[::1], int64, int64, int64[::1], int32[::1], int64[::1], int64[::1], int64[::1], "
        "int64[::1])",
    ),
}


@cuda.jit(device=True, inline=True)
def request_lengths(r, req_pool_indices, prefix_lens, extend_seq_lens, window):
    """(verify entries, write tokens) of request ``r``; padding rows and negative lengths give 0."""
    # All three loads before the padding test, so they are in flight together.
    row = req_pool_indices[r]
    prefix = max(int64(prefix_lens[r]), int64(0))
    extend = max(int64(extend_seq_lens[r]), int64(0))
    if row == 0:
        return int64(0), int64(0)
    if window > 0:
        prefix = min(prefix, window)
    return prefix, extend


@cuda.jit(device=True, inline=True)
def window_start(prefix, window):
    """First verified position of a request with ``prefix`` tokens (SWA window clip)."""
    if window > 0 and prefix > window:
        return prefix - window
    return int64(0)


@cuda.jit(device=True, inline=True)
def resolve_slot(req_to_token, rp, pos, lut, has_lut):
    """Slot of ``req_to_token[rp, pos]``, LUT-translated; OUT_OF_RANGE_SLOT when unresolvable."""
    if rp < 0 or rp >= req_to_token.shape[0] or pos < 0 or pos >= req_to_token.shape[1]:
        return _OOR
    slot = int64(req_to_token[rp, pos])
    if has_lut != 0 and slot >= 0:
        if slot >= lut.shape[0]:
            return _OOR
        return int64(lut[slot])
    return slot


@cuda.jit
def plan_offsets_kernel(
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    lut,
    has_lut,
    window,
    verify_capacity,
    items,
    out_verify_offsets,
    out_write_offsets,
    out_write_seed_slot_indices,
    out_verify_num_valid,
    out_verify_enable,
    out_write_num_valid_reqs,
    lookback,
):
    """Exclusive sums, seeds, counts and flags of one batch; grid = ceil(bs / tile) blocks.

    ``items`` requests per thread, tile = ``blockDim.x * items``. ``lookback`` is
    the zeroed (and self-resetting) look-back state with room for every tile;
    unused when the grid has one block.
    """
    sv = cuda.shared.array(MAX_SCAN_BLOCK, int64)
    sw = cuda.shared.array(MAX_SCAN_BLOCK, int64)
    shared = cuda.shared.array(3, int64)
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    num_tiles = cuda.gridDim.x
    bs = req_pool_indices.shape[0]
    if num_tiles == 1:
        shared[0] = int64(0)
    elif tid == 0:
        # Tiles are numbered in start order, so a tile only waits on running tiles.
        shared[0] = cuda.atomic.add(lookback, 0, int64(1))
    cuda.syncthreads()
    tile = shared[0]
    first = tile * nthreads * items + tid * items
    last = min(first + items, bs)

    own_v = int64(0)
    own_w = int64(0)
    for i in range(first, last):
        v, w = request_lengths(i, req_pool_indices, prefix_lens, extend_seq_lens, window)
        own_v += min(v, verify_capacity + 1)  # alone it overflows; capped so the sum cannot wrap
        own_w += w
        # Seeds do not depend on the scan: resolving them here overlaps their dependent
        # req_to_token (and LUT) loads with the scan instead of adding them after it.
        seed = _NO_PRED
        prefix = int64(prefix_lens[i])
        if w > 0 and prefix > 0:  # w > 0 implies an active row
            seed = resolve_slot(req_to_token, int64(req_pool_indices[i]), prefix - 1, lut, has_lut)
        out_write_seed_slot_indices[i] = seed
    sv[tid] = own_v
    sw[tid] = own_w
    block_inclusive_scan2(sv, sw, tid, nthreads)
    if tid == 0:
        if num_tiles == 1:
            shared[1] = int64(0)
            shared[2] = int64(0)
        else:
            shared[1], shared[2] = look_back(lookback, tile, sv[nthreads - 1], sw[nthreads - 1])
    cuda.syncthreads()
    run_v = shared[1] + sv[tid] - own_v
    run_w = shared[2] + sw[tid] - own_w
    for i in range(first, last):
        out_verify_offsets[i] = run_v
        out_write_offsets[i] = run_w
        v, w = request_lengths(i, req_pool_indices, prefix_lens, extend_seq_lens, window)  # L1 hits now
        v = min(v, verify_capacity + 1)
        run_v += v
        run_w += w

    if tid == 0 and tile == num_tiles - 1:
        total_v = shared[1] + sv[nthreads - 1]
        total_w = shared[2] + sw[nthreads - 1]
        out_verify_offsets[bs] = total_v
        out_write_offsets[bs] = total_w
        out_write_num_valid_reqs[0] = int32(bs)
        if total_v > verify_capacity:
            out_verify_num_valid[0] = int32(verify_capacity)
            out_verify_enable[0] = int32(0)
        else:
            out_verify_num_valid[0] = int32(total_v)
            out_verify_enable[0] = int32(1)
    if tid == 0 and num_tiles > 1:
        release_lookback(lookback, num_tiles)

    # Tails past the batch: offsets 0, seeds -1, so no stale request survives a smaller batch.
    capacity = out_write_seed_slot_indices.shape[0]
    for j in range(bs + tile * nthreads + tid, capacity + 1, num_tiles * nthreads):
        if j > bs:
            out_write_offsets[j] = int64(0)
        if j < capacity:
            out_write_seed_slot_indices[j] = _NO_PRED


@cuda.jit(device=True, inline=True)
def owner(verify_offsets, lo, hi, e):
    """Request owning entry ``e``: the largest ``r`` in ``[lo, hi]`` with ``verify_offsets[r] <= e``.

    Requires ``verify_offsets[lo] <= e`` (offsets are non-decreasing).
    """
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if verify_offsets[mid] <= e:
            lo = mid
        else:
            hi = mid - 1
    return lo


@cuda.jit(device=True, inline=True)
def emit_entry(
    e,
    r,
    req_pool_indices,
    prefix_lens,
    req_to_token,
    lut,
    has_lut,
    window,
    pool,
    valid_lens,
    has_pool,
    token_offset,
    verify_offsets,
    out_slots,
    out_tokens,
    out_positions,
    out_prev,
):
    """Write verify entry ``e`` of request ``r``."""
    rp = int64(req_pool_indices[r])
    prefix = max(int64(prefix_lens[r]), int64(0))
    pos = window_start(prefix, window) + (e - verify_offsets[r])
    out_slots[e] = resolve_slot(req_to_token, rp, pos, lut, has_lut)
    prev = _NO_PRED
    if pos > 0:
        prev = resolve_slot(req_to_token, rp, pos - 1, lut, has_lut)
    out_prev[e] = prev
    out_positions[e] = pos
    token = _UNCHECKED
    if has_pool != 0:
        col = pos + token_offset
        limit = min(int64(valid_lens[r]), int64(pool.shape[1]))
        if 0 <= rp < pool.shape[0] and 0 <= col < limit:
            token = int64(pool[rp, col])
    out_tokens[e] = token


@cuda.jit
def plan_entries_kernel(
    req_pool_indices,
    prefix_lens,
    req_to_token,
    lut,
    has_lut,
    window,
    pool,
    valid_lens,
    has_pool,
    token_offset,
    verify_offsets,
    verify_enable,
    out_slots,
    out_tokens,
    out_positions,
    out_prev,
):
    """Fill verify entries ``[0, verify_offsets[bs])``; nothing when disabled.

    ``verify_offsets`` is the offsets kernel's output (length >= bs + 1). Warps
    grid-stride over tiles of ``ENTRIES_PER_TILE`` consecutive entries: one
    binary search finds the owner of a tile's first entry, then each lane moves
    its request forward as its entries pass request ends (usually one compare,
    a search only past a run of requests).
    """
    if verify_enable[0] == 0:
        return  # overflow: the entry arrays stay as they were
    bs = req_pool_indices.shape[0]
    last = int64(bs - 1)
    total = min(verify_offsets[bs], int64(out_slots.shape[0]))
    lane = int64(cuda.threadIdx.x % WARP_SIZE)
    warps = int64(cuda.gridsize(1) // WARP_SIZE)
    tiles = (total + _TILE - 1) // _TILE
    for tile in range(int64(cuda.grid(1) // WARP_SIZE), tiles, warps):
        first = tile * _TILE
        r = owner(verify_offsets, int64(0), last, first)
        for e in range(first + lane, min(first + _TILE, total), _WARP):
            if r < last and verify_offsets[r + 1] <= e:
                r = owner(verify_offsets, r + 1, last, e)
            emit_entry(
                e,
                r,
                req_pool_indices,
                prefix_lens,
                req_to_token,
                lut,
                has_lut,
                window,
                pool,
                valid_lens,
                has_pool,
                token_offset,
                verify_offsets,
                out_slots,
                out_tokens,
                out_positions,
                out_prev,
            )


KERNELS = {"plan_offsets": plan_offsets_kernel, "plan_entries": plan_entries_kernel}
