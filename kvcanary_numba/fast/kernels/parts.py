"""Grids split into equal parts, one per endpoint (``fast/kernels/endpoints.py``).

A launch for ``count`` endpoints has ``count * per`` blocks: blocks
``[e * per, (e + 1) * per)`` run endpoint ``e`` as if they were a launch of
``per`` blocks of their own. ``count`` is at most :data:`MAX_ENDPOINTS` (the K
and V halves of a monitor group's phase), so a block finds its endpoint with a
comparison, not a division. The arithmetic is 32-bit (a grid's block index and
size are), widened as ``cuda.grid(1)`` widens it: the endpoint verify's NONE
variant fits 32 registers only so. Device functions only.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from ...constants import MAX_ENDPOINTS

__all__ = ["MAX_ENDPOINTS", "part_block", "part_stride", "part_thread"]


@cuda.jit(device=True)
def part_block(per):
    """(endpoint, block index within its part) of this block; ``per``: blocks per part (int32 range)."""
    block = int32(cuda.blockIdx.x)
    blocks = int32(per)
    if block >= blocks:
        return int32(1), int32(block - blocks)
    return int32(0), block


@cuda.jit(device=True)
def part_thread(per):
    """This thread's index within its endpoint's part (``cuda.grid(1)`` of a launch of ``per`` blocks); int64."""
    _, block = part_block(per)
    return int64(block) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)


@cuda.jit(device=True)
def part_stride(per):
    """Threads of one part (``cuda.gridsize(1)`` of a launch of ``per`` blocks); int64."""
    return int64(int32(per)) * int64(cuda.blockDim.x)
