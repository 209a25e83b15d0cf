"""The monitor's expected-token scatter and valid lengths in one kernel (its HEAD phase's first launch).

Each column is :func:`kvcanary_numba.kernels.scatter.scatter_column`; the lengths are what the
plans read as ``req_to_verify_expected_tokens_valid_lens``.
"""

from __future__ import annotations

from numba import cuda, int64

from ...kernels.scatter import scatter_column

SIGNATURES = {"scatter_lens": ("void(int64[::1], int64[::1], int64[::1], int32[:, ::1], int64, int64[::1])",)}


@cuda.jit
def scatter_lens_kernel(flat_in, offsets, req_pool_indices, pool_out, col_tiles, lens_out):
    """:func:`scatter_kernel`, and ``lens_out[r] = offsets[r + 1] - offsets[r]`` for every request
    (int64, wrapping; whatever its row or length): the monitor's expected-token scatter and the
    valid lengths its plans read, in one launch. ``col_tiles >= 1``, so every request has an item."""
    bs = int64(req_pool_indices.shape[0])
    tile_width = int64(cuda.blockDim.x)
    for item in range(int64(cuda.blockIdx.x), bs * col_tiles, int64(cuda.gridDim.x)):
        r = item // col_tiles
        tile = item - r * col_tiles
        if tile == 0 and cuda.threadIdx.x == 0:
            lens_out[r] = int64(offsets[r + 1]) - int64(offsets[r])
        scatter_column(r, tile * tile_width + int64(cuda.threadIdx.x), flat_in, offsets, req_pool_indices, pool_out)


KERNELS = {"scatter_lens": scatter_lens_kernel}
