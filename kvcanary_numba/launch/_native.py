"""Driver calls made from compiled code: a whole list of launches per Python call.

A raw launch from Python pays, besides the driver's own work, the Python around
it (``PreparedLaunch.launch``, the route's call, cuda-bindings' argument
conversion, a GIL release per call): about 0.65 us per launch on the
development VM, ~1.5-2 us on the H200 host, where one monitor step makes ten
launches. :func:`launch_table` is a Numba-compiled (CPU) loop that calls
libcuda's ``cuLaunchKernel`` through its address for every row of a launch table,
so a phase costs one Python call however many launches it has
(``benchmarks/host_step.py --driver fake`` measures both).

The C function is called through a pointer given at run time (an intrinsic
casts the integer to a function pointer), so nothing is baked into the compiled
code: it is cached on disk, and tests call it with a ctypes callback in place of
libcuda. Pointer arguments travel as 64-bit integers (the same registers as
pointers in the x86-64 and AArch64 C ABIs).

Launch table: int64 ``[n, 4]``, one row per launch: the ``CUfunction`` handle,
grid (blocks), block (threads) and the address of the ``kernelParams`` array
(the :class:`~.prepared.PreparedLaunch`'s pointer array, stable for its life:
rebinding rewrites the parameter values it points at, never the array).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["compiled_launcher", "decode_status"]

logger = logging.getLogger("kvcanary_numba.launch")


@intrinsic
def _cu_launch_kernel(typingctx, fn, func, grid, block, stream, params):
    """``((CUresult (*)(...)) fn)(func, grid, 1, 1, block, 1, 1, 0, stream, params, NULL)``."""
    sig = types.int32(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        fn, func, grid, block, stream, params = args
        i32, i64 = ir.IntType(32), ir.IntType(64)
        # CUresult cuLaunchKernel(CUfunction, unsigned grid x3, unsigned block x3, unsigned shared,
        #                         CUstream, void **kernelParams, void **extra)
        fnty = ir.FunctionType(i32, [i64] + [i32] * 7 + [i64, i64, i64])
        target = builder.inttoptr(fn, fnty.as_pointer())
        one, zero = ir.Constant(i32, 1), ir.Constant(i32, 0)
        grid32, block32 = builder.trunc(grid, i32), builder.trunc(block, i32)
        return builder.call(target, [func, grid32, one, one, block32, one, one, zero, stream, params,
                                     ir.Constant(i64, 0)])  # fmt: skip

    return sig, codegen


# nogil: the GIL is released once for the whole table (cuda-bindings released it per launch),
# so another Python thread is not held up by the driver calls.
@njit(cache=True, nogil=True)
def _launch_table(fn, table, stream):
    for i in range(table.shape[0]):
        err = _cu_launch_kernel(fn, table[i, 0], table[i, 1], table[i, 2], stream, table[i, 3])
        if err != 0:
            return (i << 32) | (err & 0xFFFFFFFF)
    return 0


_lock = threading.Lock()
_compiled: list = []  # [function] once compiled, [None] once compiling failed (logged)


def compiled_launcher() -> Callable | None:
    """``launch_table(fn, table, stream) -> status`` (compiled on first use), or None when Numba
    cannot compile it here (logged once: callers then loop in Python).

    ``fn`` is the address of a function with ``cuLaunchKernel``'s C signature, ``table`` the
    launch table (module docstring), ``stream`` a stream handle. The launches run in row order
    and stop at the first error: ``status`` is 0, else ``row << 32 | CUresult``
    (:func:`decode_status`); the rows before it were launched.
    """
    if not _compiled:
        with _lock:
            if not _compiled:
                try:
                    # The one signature, compiled now (or loaded from the cache), not inside a step.
                    _launch_table.compile("int64(int64, int64[:, ::1], int64)")
                    _launch_table.disable_compile()  # another argument type is a bug: TypeError
                    fn = _launch_table
                except Exception as exc:  # noqa: BLE001 - any failure: the Python loop, never worse
                    logger.warning("compiled launch loop unavailable, launches loop in Python: %s", exc)
                    fn = None
                _compiled.append(fn)
    return _compiled[0]


def decode_status(status: int) -> tuple[int, int]:
    """(row, CUresult) of a non-zero :func:`compiled_launcher` status."""
    return status >> 32, status & 0xFFFFFFFF
