"""Launch glue of the monitor's per-step input work on the device (the HEAD phase's first launches).

- :func:`translate_slots`: an SWA group's slots of the step's new tokens, one launch
  (kernel: ``fast/kernels/translate.py``) instead of
  :func:`~kvcanary_numba.monitor.groups.translate_slots`'s six CuPy operations;
- :func:`scatter_tokens_and_lens`: the expected-token scatter and the valid lengths, one
  launch (kernel: ``fast/kernels/scatter_lens.py``) instead of a public scatter call and a
  CuPy subtraction.

Called with arrays the monitor's batch checks validated; recorded into the prepared HEAD
phase, whose per-step roles rebind them. Nothing is launched for empty inputs.
"""

from __future__ import annotations

from ..launch import _launch as common
from ..launch.scatter import SCATTER_BLOCK

__all__ = ["TRANSLATE_BLOCK", "scatter_tokens_and_lens", "translate_slots"]

#: Threads per block on a GPU.
TRANSLATE_BLOCK = 256


def translate_slots(*, lut, index, out, stream: int | None = None) -> None:
    """``out[i]`` = ``index[i]`` translated through ``lut`` (the kernel module's rules); int64 arrays,
    ``out`` as long as ``index``. Nothing is launched for an empty ``index``."""
    from .kernels import translate as kernels

    n = int(index.shape[0])
    if n == 0:
        return
    block = common.block_size(TRANSLATE_BLOCK)
    grid = common.persistent_grid(n, block)
    common.launch(
        kernels.translate_kernel,
        kernels.SIGNATURES["translate"][0],
        grid,
        block,
        (common.kernel_array(lut, persistent=True), common.kernel_array(index), common.kernel_array(out)),
        stream,
    )


def scatter_tokens_and_lens(
    *, flat_in, offsets, req_pool_indices, pool_out, lens_out, stream: int | None = None
) -> None:
    """The monitor's per-step token work in one launch: :func:`scatter_req_token_ids`, and
    ``lens_out[:bs] = offsets[1:] - offsets[:-1]`` (what the plans read as valid lengths).

    Arguments as :func:`scatter_req_token_ids` (checked by the monitor's batch checks: int64
    token arrays, ``offsets`` of ``bs + 1``), ``lens_out`` int64 ``[bs]`` (a per-step view of
    the monitor's buffer). Launched whenever ``bs > 0``, even with nothing to scatter: the
    lengths are written anyway.
    """
    from .kernels import scatter_lens as kernels

    bs = int(req_pool_indices.shape[0])
    if bs == 0:
        return
    block = common.block_size(SCATTER_BLOCK)
    col_tiles = common.grid_for(int(pool_out.shape[1]), block)  # >= 1: every request writes its length
    grid = common.persistent_grid(bs * col_tiles, 1, blocks_per_sm=common.THREADS_PER_SM // block)
    arr = common.kernel_array
    args = (arr(flat_in), arr(offsets), arr(req_pool_indices), arr(pool_out, persistent=True), col_tiles, arr(lens_out))
    common.launch(kernels.scatter_lens_kernel, kernels.SIGNATURES["scatter_lens"][0], grid, block, args, stream)
