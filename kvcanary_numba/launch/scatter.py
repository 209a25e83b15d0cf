"""CUDA launch glue of scatter_req_token_ids (kernel: :mod:`kvcanary_numba.kernels.scatter`).

Called by :mod:`kvcanary_numba.scatter` with validated public keyword arguments
(minus ``backend``). The work is ``bs x ceil(width / SCATTER_BLOCK)`` items
(request, column tile), walked by a persistent grid; the request lengths stay
on the device. Runs outside CUDA graphs in practice (the engine refills the pool
between steps), but it allocates nothing and never syncs, so it can be captured.
"""

from __future__ import annotations

from ..kernels import scatter as kernels
from . import _common as common

__all__ = ["scatter_req_token_ids", "scatter_tokens_and_lens"]

#: Threads per block (= columns per tile) on a GPU.
SCATTER_BLOCK = 256

_SIG = kernels.SIGNATURES["scatter"][0]
_LENS_SIG = kernels.SIGNATURES["scatter_lens"][0]


def scatter_req_token_ids(*, flat_in, offsets, req_pool_indices, pool_out) -> None:
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
    common.launch(kernels.scatter_kernel, _SIG, grid, block, args)


def scatter_tokens_and_lens(*, flat_in, offsets, req_pool_indices, pool_out, lens_out) -> None:
    """The monitor's per-step token work in one launch: :func:`scatter_req_token_ids`, and
    ``lens_out[:bs] = offsets[1:] - offsets[:-1]`` (what the plans read as valid lengths).

    Arguments as :func:`scatter_req_token_ids` (checked by the monitor's batch checks: int64
    token arrays, ``offsets`` of ``bs + 1``), ``lens_out`` int64 ``[bs]`` (a per-step view of
    the monitor's buffer). Launched whenever ``bs > 0``, even with nothing to scatter: the
    lengths are written anyway. Recorded into the monitor's HEAD phase (``monitor/fastpath.py``),
    so a prepared step makes one driver call for it instead of a public call and a CuPy subtraction.
    """
    bs = int(req_pool_indices.shape[0])
    if bs == 0:
        return
    block = common.block_size(SCATTER_BLOCK)
    col_tiles = common.grid_for(int(pool_out.shape[1]), block)  # >= 1: every request writes its length
    grid = common.persistent_grid(bs * col_tiles, 1, blocks_per_sm=common.THREADS_PER_SM // block)
    arr = common.kernel_array
    args = (arr(flat_in), arr(offsets), arr(req_pool_indices), arr(pool_out, persistent=True), col_tiles, arr(lens_out))
    common.launch(kernels.scatter_lens_kernel, _LENS_SIG, grid, block, args)
