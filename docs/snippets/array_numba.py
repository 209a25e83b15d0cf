"""Numba device arrays (concepts/array-libraries.md)."""

from array_step import EXPECTED, ring, skip_without_gpu, two_steps

skip_without_gpu()
# --8<-- [start:numba]
from numba import cuda

ctx = two_steps(cuda.to_device)  # the device comes from the pointer, not from CuPy
cuda.synchronize()
print(ring(ctx, lambda a: a.copy_to_host()))
# --8<-- [end:numba]
assert ring(ctx, lambda a: a.copy_to_host()) == EXPECTED
