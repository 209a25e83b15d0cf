"""Probe (session 6, launchdesc): host µs of one raw launch per ``launch/_driver.py`` route.

Same compiled kernel and packed parameters; each route through its own ``_Driver``:
``bindings`` (cuda-bindings ``cuLaunchKernel``), ``ctypes`` (libcuda through ctypes, pre-built
``c_void_p`` arguments, no argtypes), and for reference the ctypes call with argtypes and plain
ints that ``launch_call_cost.py`` measured. Also ``PreparedLaunch.launch(stream)`` under each
route. Prints one JSON object; pick ``_driver.LAUNCH_ROUTE`` (or env ``KVCANARY_LAUNCH_ROUTE``)
from it. Run on a GPU from the repository root: ``python3 benchmarks/results/probes/launch_route_cost.py``.
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
from kvcanary_numba.launch import _common, _driver, prepared  # noqa: E402


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


views = [_common.kernel_array(cupy.zeros(4, dtype=np.int64)) for _ in range(4)]
stream = int(cupy.cuda.get_current_stream().ptr)
out = {}
packed = {}
for route in ("bindings", "ctypes"):
    drv = _driver._Driver()
    drv.select(_common.function_handle(touch, SIG), route)
    prepared._driver = drv  # packed launches built (and launched) now take this route
    p = prepared.PreparedLaunch(touch, SIG, 1, 32, views)
    assert p.raw and drv.route == route, (p.fallback_reason, drv.route)
    packed[route] = p
    out[f"{route}_driver_launch"] = per_call(lambda: drv.launch(p._func, 1, 32, stream, p._params))
    out[f"{route}_prepared_launch_stream"] = per_call(lambda: p.launch(stream))
typed = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
uint = ctypes.c_uint
typed.argtypes = [ctypes.c_void_p] + [uint] * 7 + [ctypes.c_void_p] * 3
typed.restype = ctypes.c_int
func, params = int(packed["bindings"].handle), packed["bindings"]._params
out["ctypes_argtypes_ints"] = per_call(lambda: typed(func, 1, 1, 1, 32, 1, 1, 0, stream, params, None))
# The handle is a CUkernel (library-managed): the driver resolves this context's function on
# every launch. Launching the CUfunction itself (cuKernelGetFunction, once) may be cheaper.
cu = drv.cu
err, function = cu.cuKernelGetFunction(packed["bindings"].handle)
if err == cu.CUresult.CUDA_SUCCESS:
    cu_stream = cu.CUstream(stream)
    out["bindings_cufunction_launch"] = per_call(
        lambda: cu.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, cu_stream, params, 0))
    out["ctypes_argtypes_cufunction"] = per_call(
        lambda: typed(int(function), 1, 1, 1, 32, 1, 1, 0, stream, params, None))
out["default_route"] = _driver.LAUNCH_ROUTE
print(json.dumps(out))
