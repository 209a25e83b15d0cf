"""A do-nothing ``libcuda.so.1`` for host-time measurements on a machine without a GPU.

:func:`load` compiles a tiny C library (with the system C compiler) that exports
the driver functions the monitor's host path calls -- ``cuLaunchKernel``, the
status readback's ``cuEventQuery`` / ``cuEventRecord`` / ``cuStreamWaitEvent`` /
``cuMemcpyDtoHAsync_v2`` (which copies nothing), and ``cuGetProcAddress_v2`` /
``cuDriverGetVersion`` (what cuda-bindings resolves its functions through) -- each
returning ``CUDA_SUCCESS`` and counting its calls, and loads it process-wide under the soname ``libcuda.so.1``. cuda-bindings'
``cuLaunchKernel`` and ``ctypes.CDLL("libcuda.so.1")`` then both reach it, so the
Python around every driver call runs as on a GPU host while the driver itself
costs nothing (``benchmarks/host_step.py --driver fake``). Never load it in a
process that uses a real GPU.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile

__all__ = ["SOURCE", "FakeDriver", "load"]

SOURCE = r"""
#include <stdint.h>
#include <string.h>
typedef int CUresult;
static long long counts[8];
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) { counts[0]++; return 0; }
CUresult cuEventQuery(void *event) { counts[1]++; return 0; }
CUresult cuEventRecord(void *event, void *stream) { counts[2]++; return 0; }
CUresult cuStreamWaitEvent(void *stream, void *event, unsigned flags) { counts[3]++; return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t size, void *stream) { counts[4]++; return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    void *p = 0;
    if (!strcmp(symbol, "cuLaunchKernel")) p = (void *)cuLaunchKernel;
    else if (!strcmp(symbol, "cuDriverGetVersion")) p = (void *)cuDriverGetVersion;
    else if (!strcmp(symbol, "cuInit")) p = (void *)cuInit;
    *pfn = p;
    if (status) *status = p ? 0 : 1;  /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return p ? 0 : 500;               /* CUDA_ERROR_NOT_FOUND */
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, 0);
}
long long fake_count(int which) { return counts[which]; }
"""


class FakeDriver:
    """The loaded fake library: :meth:`launches` counts the ``cuLaunchKernel`` calls so far,
    :meth:`readback_calls` the readback's driver calls."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib, self.path = lib, path
        lib.fake_count.restype = ctypes.c_longlong

    def launches(self) -> int:
        return int(self.lib.fake_count(0))

    def readback_calls(self) -> int:
        return sum(int(self.lib.fake_count(k)) for k in range(1, 5))


_loaded: list[FakeDriver] = []


def load() -> FakeDriver:
    """Build and load the fake ``libcuda.so.1`` (once per process).

    Raises
    ------
    RuntimeError
        No C compiler, or the build failed.
    """
    if _loaded:
        return _loaded[0]
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("--driver fake needs a C compiler (cc or gcc) to build the fake libcuda")
    folder = tempfile.mkdtemp(prefix="kvcanary-fake-libcuda-")
    source, path = os.path.join(folder, "fake.c"), os.path.join(folder, "libcuda.so.1")
    with open(source, "w") as f:
        f.write(SOURCE)
    done = subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", path, source], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the fake libcuda failed: {done.stderr[-2000:]}")
    # RTLD_GLOBAL and the soname: a later dlopen("libcuda.so.1") (cuda-bindings, ctypes) gets this one.
    _loaded.append(FakeDriver(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path))
    return _loaded[0]
