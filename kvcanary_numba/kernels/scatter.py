"""Scatter kernel: flat per-request token lists -> rows of the expected-token pool.

Request ``r`` owns ``flat_in[offsets[r]:offsets[r + 1]]`` and writes it, cast to
int32, into the start of row ``req_pool_indices[r]`` of ``pool_out``, truncated at
the row width. Semantics are those of :mod:`kvcanary_numba.reference.scatter`:
a row index outside the pool skips the request, and a token index outside
``flat_in`` is never read (that column stays as it was).
"""

from __future__ import annotations

from numba import cuda, int32, int64

#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {
    "scatter": ("void(int64[::1], int64[::1], int64[::1], int32[:, ::1], int64)",),
}


@cuda.jit(device=True)
def scatter_column(r, col, flat_in, offsets, req_pool_indices, pool_out):
    """Column ``col`` of request ``r``: ``pool_out[req_pool_indices[r], col] = flat_in[offsets[r] + col]``
    within the row, the request's length and ``flat_in`` (the module docstring's rules)."""
    rp = int64(req_pool_indices[r])
    if rp < 0 or rp >= int64(pool_out.shape[0]):
        return
    start = int64(offsets[r])
    # Wrap-around subtraction on hostile offsets, as the reference computes it.
    write_len = min(int64(offsets[r + 1]) - start, int64(pool_out.shape[1]))
    if col >= write_len:
        return
    src = start + col
    if 0 <= src < int64(flat_in.shape[0]):
        pool_out[rp, col] = int32(flat_in[src])


@cuda.jit
def scatter_kernel(flat_in, offsets, req_pool_indices, pool_out, col_tiles):
    """Grid-stride over work items ``(request, column tile)``, one column per thread.

    A column tile is ``blockDim.x`` columns wide; ``col_tiles`` tiles cover the
    pool width. The host knows the width but not the request lengths (they are
    on the device), so tiles past a request's length exit after three loads.
    """
    bs = int64(req_pool_indices.shape[0])
    tile_width = int64(cuda.blockDim.x)
    for item in range(int64(cuda.blockIdx.x), bs * col_tiles, int64(cuda.gridDim.x)):
        r = item // col_tiles
        col = (item - r * col_tiles) * tile_width + int64(cuda.threadIdx.x)
        scatter_column(r, col, flat_in, offsets, req_pool_indices, pool_out)


KERNELS = {"scatter": scatter_kernel}
