"""JAX arrays as inputs (read-only), CuPy for what the launches write (concepts/array-libraries.md)."""

import importlib.util
import os
import sys

from array_step import EXPECTED, ring, skip_without_gpu, two_steps

skip_without_gpu()
if importlib.util.find_spec("jax") is None:
    print("skipped: JAX is not installed")
    sys.exit(0)
os.environ.setdefault(
    "XLA_PYTHON_CLIENT_PREALLOCATE", "false"
)  # leave GPU memory to CuPy
# --8<-- [start:jax]
import cupy
import jax

jax.config.update("jax_enable_x64", True)  # int64 metadata stays int64
ctx = two_steps(cupy.asarray, inputs=jax.numpy.asarray)
cupy.cuda.runtime.deviceSynchronize()
print(ring(ctx, cupy.asnumpy))
# --8<-- [end:jax]
if jax.devices()[0].platform == "gpu":
    assert ring(ctx, cupy.asnumpy) == EXPECTED
