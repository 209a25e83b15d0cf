"""Probe (session 6): host µs of one kernel launch through each driver-call route.

Routes, same compiled kernel and packed parameters: cuda-bindings ``cuLaunchKernel``
(what ``PreparedLaunch`` uses), a ctypes call straight into ``libcuda``'s
``cuLaunchKernel``, ``PreparedLaunch.launch()``, the eager ``_common.launch`` refill, and
Numba's own launch. Prints one JSON object. Run on a GPU: ``python3 launch_call_cost.py``.
"""

import ctypes
import json
import sys
import time

import numpy as np

np.row_stack = getattr(np, "row_stack", np.vstack)

import cupy  # noqa: E402
from numba import cuda  # noqa: E402

sys.path.insert(0, ".")
from kvcanary_numba.launch import _common  # noqa: E402
from kvcanary_numba.fast.prepared import PreparedLaunch, _driver  # noqa: E402


@cuda.jit
def touch(a, b, c, d):
    if cuda.grid(1) == 0:
        a[0] += b[0] + c[0] + d[0]


SIG = "void(int64[::1], int64[::1], int64[::1], int64[::1])"


def per_call(fn, n=20000):
    fn()
    cupy.cuda.runtime.deviceSynchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
        cupy.cuda.runtime.deviceSynchronize()
    return round(sorted(best)[2], 3)


arrays = [cupy.zeros(4, dtype=np.int64) for _ in range(4)]
views = [_common.kernel_array(a) for a in arrays]
p = PreparedLaunch(touch, SIG, 1, 32, views)
assert p.raw, p.fallback_reason
stream = int(cupy.cuda.get_current_stream().ptr)
lib = ctypes.CDLL("libcuda.so.1")
fn = lib.cuLaunchKernel
fn.restype = ctypes.c_int
fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                                         ctypes.c_void_p]
func = int(p._func)
params = p._params
cu = _driver.cu
cu_stream = cu.CUstream(stream)
out = {
    "cuda_bindings_cuLaunchKernel": per_call(lambda: cu.cuLaunchKernel(p._func, 1, 1, 1, 32, 1, 1, 0, cu_stream,
                                                                        params, 0)),
    "ctypes_libcuda_cuLaunchKernel": per_call(lambda: fn(func, 1, 1, 1, 32, 1, 1, 0, stream, params, None)),
    "driver_launch_wrapper": per_call(lambda: _driver.launch(p._func, 1, 32, stream, params)),
    "prepared_launch": per_call(lambda: p.launch()),
    "eager_common_launch": per_call(lambda: _common.launch(touch, SIG, 1, 32, views), n=5000),
    "numba_launch_cupy_args": per_call(lambda: touch[1, 32](*arrays), n=2000),
    "func_handle_type": type(p._func).__name__,
}
print(json.dumps(out))
