"""Widening kernel: an int32 index array copied into int64, the dtype every other kernel reads.

SGLang's launcher accepts the write's ``input_ids``, ``positions`` and ``out_cache_loc``
as int32 or int64 and hands int64 to its kernels; ``launch/write.py`` does the same with
one launch of this kernel per int32 array, into launch scratch the caller never sees.
Sign extension keeps every value, negative slots (skipped entries) included, so the
write that follows stores and reports exactly what it would for the int64 arrays.
"""

from __future__ import annotations

from numba import cuda, int64

__all__ = ["KERNELS", "SIGNATURES", "widen_int32"]

#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {"widen_int32": ("void(int32[::1], int64[::1])",)}


@cuda.jit
def widen_int32(source, out):
    """Grid-stride over ``source``: ``out[i] = source[i]`` (``out`` has at least its length)."""
    for i in range(int64(cuda.grid(1)), int64(source.shape[0]), int64(cuda.gridsize(1))):
        out[i] = int64(source[i])


KERNELS = {"widen_int32": widen_int32}
