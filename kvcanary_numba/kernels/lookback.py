"""Device helpers of the plan's offsets kernel: a block scan and the tile look-back.

The offsets kernel scans tiles of requests, one tile per block, and chains the
tiles with a single-pass decoupled look-back: each tile publishes its own sums
as soon as its block scan ends, then walks back over earlier tiles, adding
their published sums until it meets one that has published its inclusive
prefix. The state lives in one int64 scratch array that the last tile resets,
so consecutive launches reuse it without a memset.
"""

from __future__ import annotations

from numba import cuda, int64

__all__ = [
    "LOOKBACK_HEADER",
    "LOOKBACK_STRIDE",
    "atomic_load",
    "block_inclusive_scan2",
    "look_back",
    "release_lookback",
]

# Look-back scratch (int64): [ticket, done, then per tile: status, agg_v, agg_w, inc_v, inc_w].
LOOKBACK_HEADER = 2
LOOKBACK_STRIDE = 5
_STATUS_EMPTY = 0
_STATUS_AGGREGATE = 1
_STATUS_INCLUSIVE = 2


@cuda.jit(device=True, inline=True)
def block_inclusive_scan2(sv, sw, tid, nthreads):
    """In-place inclusive scan of ``sv[:nthreads]`` and ``sw[:nthreads]`` (Hillis-Steele).

    Shared memory only: the simulator has no warp shuffles. Every thread of the
    block must call it.
    """
    cuda.syncthreads()
    step = 1
    while step < nthreads:
        add_v = int64(0)
        add_w = int64(0)
        if tid >= step:
            add_v = sv[tid - step]
            add_w = sw[tid - step]
        cuda.syncthreads()
        sv[tid] += add_v
        sw[tid] += add_w
        cuda.syncthreads()
        step *= 2


@cuda.jit(device=True, inline=True)
def atomic_load(arr, i):
    """Coherent read of a value another block publishes (bypasses a stale L1 line)."""
    return cuda.atomic.add(arr, i, int64(0))


@cuda.jit(device=True, inline=True)
def look_back(lookback, tile, agg_v, agg_w):
    """Publish this tile's sums and return the sums of all tiles before it (thread 0 only)."""
    base = LOOKBACK_HEADER + tile * LOOKBACK_STRIDE
    prefix_v = int64(0)
    prefix_w = int64(0)
    if tile > 0:
        lookback[base + 1] = agg_v
        lookback[base + 2] = agg_w
        cuda.threadfence()
        cuda.atomic.exch(lookback, base, int64(_STATUS_AGGREGATE))
        j = tile - 1
        while j >= 0:
            other = LOOKBACK_HEADER + j * LOOKBACK_STRIDE
            status = atomic_load(lookback, other)
            if status == _STATUS_EMPTY:
                continue  # tile j took its ticket earlier, so it is running: spin
            cuda.threadfence()
            if status == _STATUS_INCLUSIVE:
                prefix_v += atomic_load(lookback, other + 3)
                prefix_w += atomic_load(lookback, other + 4)
                break
            prefix_v += atomic_load(lookback, other + 1)
            prefix_w += atomic_load(lookback, other + 2)
            j -= 1
    lookback[base + 3] = prefix_v + agg_v
    lookback[base + 4] = prefix_w + agg_w
    cuda.threadfence()
    cuda.atomic.exch(lookback, base, int64(_STATUS_INCLUSIVE))
    return prefix_v, prefix_w


@cuda.jit(device=True, inline=True)
def release_lookback(lookback, num_tiles):
    """Count this tile done; the last one resets the state for the next launch (thread 0 only)."""
    cuda.threadfence()
    if cuda.atomic.add(lookback, 1, int64(1)) == num_tiles - 1:
        # Every other tile has finished its look-back: nobody reads the state any more.
        for j in range(num_tiles):
            lookback[LOOKBACK_HEADER + j * LOOKBACK_STRIDE] = int64(_STATUS_EMPTY)
        lookback[0] = int64(0)
        lookback[1] = int64(0)
