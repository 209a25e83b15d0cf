"""Driver calls made from compiled code: several driver calls per Python call.

A driver call from Python pays, besides the driver's own work, the Python around
it: for a raw launch ``PreparedLaunch.launch``, the route's call and
cuda-bindings' argument conversion (about 0.45 us per launch on the development
VM, measured with ``benchmarks/host_step.py --driver fake``; ~2.5x that on the H200
host, where a monitor step makes ten launches); for the status readback CuPy's
runtime wrappers and cudart's layer over the driver (five calls per step).
Two Numba-compiled (CPU) functions make those calls from native code:

- :func:`compiled_launcher`: ``cuLaunchKernel`` for every row of a launch table
  (:class:`~.table.LaunchTable`): one Python call per phase however many launches;
- :func:`compiled_readback`: the step's readback calls (query the previous copy's
  event, record the step's end on the compute stream, let the side stream wait for
  it, copy the status block, record the copy) in one Python call
  (:class:`~kvcanary_numba.monitor.readback.CudaReadback`).

The C functions are called through addresses given at run time (an intrinsic
casts the integer to a function pointer), so nothing is baked into the compiled
code: it is cached on disk, and tests call ctypes callbacks in place of libcuda.
Pointer and ``size_t`` arguments travel as 64-bit integers, ``unsigned int`` as
32-bit ones (the same registers as the C types in the x86-64 and AArch64 ABIs).

Launch table: int64 ``[n, 5]``, one row per launch: the ``CUfunction`` handle,
grid (blocks), block (threads), and the addresses of ``kernelParams`` and ``extra``
(one of them 0): the :class:`~.prepared.PreparedLaunch`'s pointer array, or its
``extra`` array naming its one-buffer parameter block (``driver.PARAM_BUFFER``).
Both are stable for the launch's life: rebinding rewrites the parameter values
they lead to, never the arrays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .._jit import cpu_jit

__all__ = ["NOT_READY", "QUIET", "READBACK_FUNCTIONS", "compiled_launcher", "compiled_readback", "decode_status"]

logger = logging.getLogger("kvcanary_numba.launch")

#: libcuda functions of the readback step, in the order :func:`compiled_readback` takes their addresses.
READBACK_FUNCTIONS = ("cuEventQuery", "cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoHAsync_v2")

NOT_READY = 600  #: CUDA_ERROR_NOT_READY: a query's "not yet", not an error

#: :func:`compiled_readback`'s status when the queried copy is done and shows nothing new (its
#: write index is the expected one and every plan's ``enable`` is set): no CUresult is 1 without
#: ``call << 32`` in a failed call's status, so it cannot be mistaken for one.
QUIET = 1


def _c_call(bits: tuple, constants: dict | None = None):
    """Codegen of ``((int (*)(...)) fn)(args...)``: argument ``k`` is an integer of ``bits[k]``
    bits, taken from the call's arguments in order, or ``constants[k]`` when given."""
    constants = constants or {}

    def codegen(context, builder, signature, args):
        fn, values = args[0], list(args[1:])
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(b) for b in bits])
        call_args = []
        for k, b in enumerate(bits):
            if k in constants:
                call_args.append(ir.Constant(ir.IntType(b), constants[k]))
                continue
            v = values.pop(0)
            call_args.append(builder.trunc(v, ir.IntType(b)) if b < 64 else v)
        return builder.call(builder.inttoptr(fn, fnty.as_pointer()), call_args)

    return codegen


def _int64s(n: int):
    return types.int32(*([types.int64] * (n + 1)))


# CUresult cuLaunchKernel(CUfunction, unsigned grid x3, unsigned block x3, unsigned shared, CUstream,
#                         void **kernelParams, void **extra): grid y, z, block y, z = 1, no shared memory.
_LAUNCH = _c_call((64, 32, 32, 32, 32, 32, 32, 32, 64, 64, 64), {2: 1, 3: 1, 5: 1, 6: 1, 7: 0})


@intrinsic
def _cu_launch_kernel(typingctx, fn, func, grid, block, stream, params, extra):
    return _int64s(6), _LAUNCH


@intrinsic
def _load_word(typingctx, address):  # *(int64 *) address: a word of a pinned host buffer
    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return types.int64(types.int64), codegen


@intrinsic
def _call_1(typingctx, fn, a):  # cuEventQuery(CUevent)
    return _int64s(1), _c_call((64,))


@intrinsic
def _call_2(typingctx, fn, a, b):  # cuEventRecord(CUevent, CUstream)
    return _int64s(2), _c_call((64, 64))


@intrinsic
def _call_wait(typingctx, fn, a, b):  # cuStreamWaitEvent(CUstream, CUevent, unsigned flags = 0)
    return _int64s(2), _c_call((64, 64, 32), {2: 0})


@intrinsic
def _call_4(typingctx, fn, a, b, c, d):  # cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream)
    return _int64s(4), _c_call((64, 64, 64, 64))


# nogil: the GIL is released once for the whole table (cuda-bindings released it per launch),
# so another Python thread is not held up by the driver calls (a launch may wait for queue room).
@cpu_jit(nogil=True)
def _launch_table(fn, table, stream):
    if table.shape[1] != 5:
        raise RuntimeError("a launch table has 5 columns: function, grid, block, kernelParams, extra")
    for i in range(table.shape[0]):
        err = _cu_launch_kernel(fn, table[i, 0], table[i, 1], table[i, 2], stream, table[i, 3], table[i, 4])
        if err != 0:
            return (i << 32) | (err & 0xFFFFFFFF)
    return 0


@cpu_jit()
def _quiet(words, expect, first_plan_word, nwords):
    """Whether the status words at address ``words`` show write index ``expect`` and every plan's
    ``enable`` set (the low int32 lanes of word 0 and of every second word from ``first_plan_word``)."""
    if expect < 0 or _load_word(words) & 0xFFFFFFFF != expect:
        return False
    for w in range(first_plan_word, nwords, 2):
        if _load_word(words + 8 * w) & 0xFFFFFFFF == 0:
            return False
    return True


@cpu_jit()
def _readback_step(fns, query, queried, first_plan_word, launched, copied, side, host, device, nbytes, compute, expect):
    status = 0
    if query != 0:
        status = _call_1(fns[0], query)
        if status != 0 and status != NOT_READY:
            return (1 << 32) | (status & 0xFFFFFFFF)
    err = _call_2(fns[1], launched, compute)
    if err != 0:
        return (2 << 32) | (err & 0xFFFFFFFF)
    err = _call_wait(fns[2], side, launched)
    if err != 0:
        return (3 << 32) | (err & 0xFFFFFFFF)
    err = _call_4(fns[3], host, device, nbytes, side)
    if err != 0:
        return (4 << 32) | (err & 0xFFFFFFFF)
    err = _call_2(fns[1], copied, side)
    if err != 0:
        return (5 << 32) | (err & 0xFFFFFFFF)
    if query != 0 and status == 0 and _quiet(queried, expect, first_plan_word, nbytes // 8):
        return QUIET
    return status


_lock = threading.Lock()
_compiled: dict[str, Callable | None] = {}  # name -> function once compiled, None once compiling failed


def _compile(name: str, function, signature: str) -> Callable | None:
    if name not in _compiled:
        with _lock:
            if name not in _compiled:
                try:
                    function.compile(signature)  # now (or from the cache), not inside a step
                    function.disable_compile()  # another argument type is a bug: TypeError
                    _compiled[name] = function
                except Exception as exc:  # noqa: BLE001 - any failure: the Python calls, never worse
                    logger.warning("compiled %s unavailable, its driver calls go through Python: %s", name, exc)
                    _compiled[name] = None
    return _compiled[name]


def compiled_launcher() -> Callable | None:
    """``launch_table(fn, table, stream) -> status`` (compiled on first use), or None when Numba
    cannot compile it here (logged once: callers then loop in Python).

    ``fn`` is the address of a function with ``cuLaunchKernel``'s C signature, ``table`` the
    launch table (module docstring), ``stream`` a stream handle. The launches run in row order
    and stop at the first error: ``status`` is 0, else ``row << 32 | CUresult``
    (:func:`decode_status`); the rows before it were launched. A table without the five
    columns raises RuntimeError before any launch.
    """
    return _compile("launch loop", _launch_table, "int64(int64, int64[:, ::1], int64)")


def compiled_readback() -> Callable | None:
    """``readback_step(fns, query, queried, first_plan_word, launched, copied, side, host, device,
    nbytes, compute, expect) -> status`` (compiled on first use), or None (logged once).

    ``fns``: int64 addresses of :data:`READBACK_FUNCTIONS`. In order: ``cuEventQuery(query)``
    unless ``query`` is 0, ``cuEventRecord(launched, compute)``,
    ``cuStreamWaitEvent(side, launched, 0)``, ``cuMemcpyDtoHAsync_v2(host, device, nbytes,
    side)``, ``cuEventRecord(copied, side)``; it stops at the first error. ``status``: the
    query's CUresult (0 done, 600 not ready; 0 without a query) when every call succeeded,
    else ``call << 32 | CUresult`` with ``call`` 1-5 in that order (:func:`decode_status`);
    :data:`QUIET` in place of 0 when the queried copy (the status block at host address
    ``queried``, ``nbytes`` long) has write index ``expect`` (-1: never quiet) and a nonzero
    ``enable`` lane in every second word from ``first_plan_word`` on: nothing to process.
    """
    return _compile("readback step", _readback_step, "int64(int64[::1], " + ", ".join(["int64"] * 11) + ")")


def decode_status(status: int) -> tuple[int, int]:
    """(row or call, CUresult) of a :func:`compiled_launcher` / :func:`compiled_readback` status."""
    return status >> 32, status & 0xFFFFFFFF
