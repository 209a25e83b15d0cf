"""CuPy arrays, on a stream of your own (concepts/array-libraries.md)."""

from array_step import EXPECTED, ring, skip_without_gpu, two_steps

skip_without_gpu()
# --8<-- [start:cupy]
import cupy

side = cupy.cuda.Stream(non_blocking=True)
ctx = two_steps(cupy.asarray, stream=side)  # every launch is queued on `side`
side.synchronize()
print(ring(ctx, cupy.asnumpy))
# --8<-- [end:cupy]
assert ring(ctx, cupy.asnumpy) == EXPECTED
