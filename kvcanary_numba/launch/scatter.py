"""CUDA launch glue of scatter_req_token_ids (kernel: :mod:`kvcanary_numba.kernels.scatter`).

Called by :mod:`kvcanary_numba.scatter` with validated public keyword arguments
(minus ``backend``). The work is ``bs x ceil(width / SCATTER_BLOCK)`` items
(request, column tile), walked by a persistent grid; the request lengths stay
on the device. Runs outside CUDA graphs in practice (the engine refills the pool
between steps), but it allocates nothing and never syncs, so it can be captured.
"""

from __future__ import annotations

from ..kernels import scatter as kernels
from . import _launch as common

__all__ = ["SCATTER_BLOCK", "scatter_req_token_ids"]

#: Threads per block (= columns per tile) on a GPU.
SCATTER_BLOCK = 256

_SIG = kernels.SIGNATURES["scatter"][0]


def scatter_req_token_ids(*, flat_in, offsets, req_pool_indices, pool_out, stream: int | None = None) -> None:
    """Scatter on the device (see :func:`kvcanary_numba.scatter.scatter_req_token_ids`)."""
    bs = int(req_pool_indices.shape[0])
    width = int(pool_out.shape[1])
    if bs == 0 or width == 0 or int(flat_in.shape[0]) == 0:
        return  # nothing to write or nothing readable: skip the launch
    block = common.block_size(SCATTER_BLOCK)
    col_tiles = common.grid_for(width, block)
    grid = common.persistent_grid(bs * col_tiles, 1, blocks_per_sm=common.THREADS_PER_SM // block)
    arr = common.kernel_array
    args = (arr(flat_in), arr(offsets), arr(req_pool_indices), arr(pool_out, persistent=True), col_tiles)
    common.launch(kernels.scatter_kernel, _SIG, grid, block, args, stream)
