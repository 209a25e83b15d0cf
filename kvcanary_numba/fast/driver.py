"""Every use of numba-cuda's and the CUDA driver's internals the fast wing makes, in one module.

The core launches through numba-cuda's public API (``kernel[grid, block, stream](*args)``,
``kvcanary_numba/launch/_launch.py``). The fast wing skips that path's per-launch work
(argument typing, view building, ctypes conversion: 25-170 us of host time per launch) by
packing Numba's kernel ABI itself and calling ``cuLaunchKernel`` directly. For that it needs
what numba-cuda does not document: a compiled kernel's driver handle, its argument types, and
the ABI those types lower to. This module reads them, and every reader fails soft:

- :func:`function_handle` returns None when numba-cuda's objects do not look as expected
  (logged once); packed launches then fall back to the core's public launch
  (``PreparedLaunch.raw`` is False), which tests cover with the handle faked away;
- :meth:`_Driver.check_abi` compares the packed parameter sizes with the driver's report
  (``cuKernelGetParamInfo``) and raises :class:`AbiMismatch` (the same fallback) on a difference;
- :func:`libcuda_functions` gives the addresses of libcuda's functions for the compiled
  launch loop (``fast/native.py``), or None: then each launch is a cuda-bindings call.

Switches (module attributes, for tests and measurements; never read from the environment):
:data:`DRIVER_CALLS` ("compiled" or "python") and :data:`PARAM_BUFFER` (kernel parameters as
one block, ``cuLaunchKernel``'s ``extra``, where the driver's layout is the packer's).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

from ..launch._device import current_device

__all__ = [
    "AbiMismatch",
    "DRIVER_CALLS",
    "Driver",
    "PARAM_BUFFER",
    "argument_types",
    "bound_kernel",
    "check_types",
    "compiled_calls",
    "driver",
    "function_handle",
    "libcuda_function",
    "libcuda_functions",
    "native_address",
    "type_of",
]

#: Launch tables pass each kernel's parameters as ONE buffer (``cuLaunchKernel``'s ``extra``:
#: ``CU_LAUNCH_PARAM_BUFFER_POINTER``) instead of an array of pointers to each of them (the
#: monitor's kernels take 90-166 parameters; the driver copies one block instead of following
#: one pointer per parameter). Only for kernels whose parameter offsets the driver reported and
#: the packing matches (``check_abi``). On: measured on an H200 (2026-12-04,
#: ``benchmarks/NOTES.md``), a tabled launch cost 4.3-5.6 us this way against 6.1-6.6 us with
#: kernelParams, and the monitor's GPU steps were byte-equal both ways.
PARAM_BUFFER = True

#: Who makes the driver calls issued together (a prepared phase's or a replayed public call's
#: launches, the monitor's readback calls of a step): "compiled" (a Numba-compiled function calls
#: libcuda's functions through their addresses, ``fast/native.py``) or "python" (one cuda-bindings
#: call per launch, the readback through CuPy's runtime).
DRIVER_CALLS = "compiled"

logger = logging.getLogger("kvcanary_numba.fast")


class AbiMismatch(RuntimeError):
    """The packed parameters do not match the compiled kernel's (a raw launch would be wrong)."""


def libcuda_function(name: str):
    """libcuda's function ``name`` as a ctypes function, or None where libcuda does not load
    through ctypes or lacks it."""
    try:
        return getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError):
        return None


def compiled_calls() -> bool:
    """Whether :data:`DRIVER_CALLS` asks for compiled driver calls (RuntimeError on another value)."""
    if DRIVER_CALLS not in ("compiled", "python"):
        raise RuntimeError(f"DRIVER_CALLS must be 'compiled' or 'python', not {DRIVER_CALLS!r}")
    return DRIVER_CALLS == "compiled"


def libcuda_functions(names, load: Callable = lambda: ctypes.CDLL("libcuda.so.1")) -> list[int] | None:
    """Addresses of libcuda's functions ``names`` for compiled calls, or None (``DRIVER_CALLS`` is
    "python", libcuda does not load through ctypes, or one of them is missing)."""
    if not compiled_calls():
        return None
    try:
        lib = load()
        return [native_address(getattr(lib, name)) for name in names]
    except (OSError, AttributeError):
        return None


def native_address(fn) -> int | None:
    """The address of a ctypes foreign function (libcuda's ``cuLaunchKernel``), else None."""
    if not isinstance(fn, ctypes._CFuncPtr):  # None, or a stand-in that is not a C function
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


# --- compiled kernels ---------------------------------------------------------------


def bound_kernel(kernel, signature: str):
    """``kernel`` compiled for ``signature`` and loaded into the current device's context now (a
    module load is not allowed later, inside CUDA-graph capture); once per device: a kernel
    loaded on one GPU is not loaded on another (the process's :data:`driver` says which is current)."""
    return _bound_on(kernel, signature, driver.current_device())


@cache
def _bound_on(kernel, signature: str, device: int):
    compiled = kernel.compile(signature)  # numba-cuda compiles for the current device's architecture
    compiled.bind()  # loads the module into the current context: ``device``'s
    return compiled


def argument_types(kernel, signature: str) -> tuple:
    """The Numba types of the compiled kernel's arguments (what its ABI lowers)."""
    return tuple(bound_kernel(kernel, signature).argument_types)


#: Why :func:`function_handle` found no handle, once logged (None: it never failed).
_handle_failure: list[str] = []


def function_handle(kernel, signature: str):
    """The driver handle of ``kernel`` compiled for ``signature`` (a ``CUfunction`` of the
    current context, else the library's ``CUkernel``), or None.

    numba-cuda has no documented call for it. The path taken: the compiled kernel's
    ``library`` property, its ``get_cufunc()`` (the per-device function, loaded by
    :func:`bound_kernel`), that function's cuda.core ``Kernel`` and its public ``handle``.
    A numba-cuda release that renames one of them raises AttributeError here: the warning
    is logged once and callers take the core's launch.
    """
    compiled = bound_kernel(kernel, signature)
    try:
        handle = compiled.library.get_cufunc().kernel.handle
    except AttributeError as exc:
        if not _handle_failure:
            _handle_failure.append(f"{type(exc).__name__}: {exc}")
            logger.warning("no driver handle for compiled kernels (%s): launches take the core's launch", exc)
        return None
    return _context_function(handle)


def _context_function(handle):
    """The current context's ``CUfunction`` of library kernel ``handle`` (a ``CUkernel``), or
    ``handle`` itself when the driver cannot give one: a ``CUkernel`` is resolved to the
    context's function on every launch, which costs ~1.5 us a call."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return handle
    if not isinstance(handle, cu.CUkernel):
        return handle
    err, function = cu.cuKernelGetFunction(handle)
    return function if err == cu.CUresult.CUDA_SUCCESS else handle


def type_of(arg: Any):
    """The Numba type of one launch argument as the compiled kernel sees it: a :class:`View` or
    other array (C layout when C-contiguous), a tuple of them, or a scalar."""
    from numba import typeof, types
    from numba.np.numpy_support import from_dtype

    from .._validate import is_c_contiguous
    from ..launch._launch import View, array_layout

    if isinstance(arg, tuple):
        return types.BaseTuple.from_types([type_of(item) for item in arg])
    if isinstance(arg, View) or hasattr(arg, "__cuda_array_interface__"):
        _, shape, strides, dtype = array_layout(arg)
        contiguous = is_c_contiguous(tuple(shape), tuple(strides), dtype.itemsize)  # NumPy's rule
        return types.Array(from_dtype(dtype), len(shape), "C" if contiguous else "A")
    return typeof(arg)


def check_types(kernel, signature: str, args) -> None:
    """Raise ``RuntimeError`` if ``args`` do not have the compiled kernel's argument types."""
    from ..launch._launch import same_type

    declared = argument_types(kernel, signature)
    if len(declared) != len(args):
        raise RuntimeError(f"kernel launch: {len(args)} arguments for signature {signature}")
    for i, (want, arg) in enumerate(zip(declared, args)):
        got = type_of(arg)
        if not same_type(want, got):
            raise RuntimeError(f"kernel launch: argument {i} is {got}, signature {signature} declares {want}")


class Driver:
    """What the fast wing asks of numba-cuda's internals and of the CUDA driver, in one object.

    Packed launches (:mod:`.prepared`), their replay (:mod:`.replay`) and launch tables
    (:mod:`.table`) reach the GPU only through the process's instance, :data:`driver`:
    ``raw`` (whether raw launches are possible: False under Numba's CUDA simulator), the
    compiled kernels' handles and argument types, the current device, the per-thread cache
    of eager packed launches and the driver calls. Tests swap that one instance for a
    stand-in that decodes each launch's parameters on the CPU (``tests/launch_fakes.py``).
    """

    def __init__(self, raw: bool | None = None):
        from ..launch._launch import ON_SIMULATOR

        self.raw = not ON_SIMULATOR if raw is None else raw
        #: Per host thread: (kernel, signature, device) -> the packed launch every eager launch refills.
        self.eager = threading.local()
        self._cu = None
        self._cu_launch: Callable | None = None
        self._success: Any = None
        self._streams: dict[int, Any] = {}
        self.ready = False
        #: Address of a C ``cuLaunchKernel`` for compiled launch loops (set by select(); None: loop in Python).
        self.native: int | None = None

    def function_handle(self, kernel, signature: str):
        """:func:`function_handle`: the compiled kernel's driver handle, or None."""
        return function_handle(kernel, signature)

    def argument_types(self, kernel, signature: str) -> tuple:
        """:func:`argument_types`: the compiled kernel's Numba argument types."""
        return argument_types(kernel, signature)

    def check_types(self, kernel, signature: str, args) -> None:
        """:func:`check_types`: RuntimeError unless ``args`` have the compiled kernel's types."""
        check_types(kernel, signature, args)

    def current_device(self) -> int:
        """The current CUDA device (CuPy's, where the caller uses CuPy): part of every key of a
        driver handle, a packed launch, a replay and launch scratch (a handle, a loaded module
        and scratch memory belong to one device's context)."""
        return current_device()

    @property
    def cu(self):
        if self._cu is None:
            from cuda.bindings import driver

            self._cu = driver
        return self._cu

    def select(self, handle: Any = None, load: Callable | None = None) -> None:
        """Get ready for raw launches (once): cuda-bindings' ``cuLaunchKernel`` for single launches,
        the address of libcuda's for compiled launch loops (``load``: a stand-in for libcuda)."""
        if self.ready:
            return
        self._cu_launch, self._success = self.cu.cuLaunchKernel, self.cu.CUresult.CUDA_SUCCESS
        if compiled_calls():
            fn = libcuda_function("cuLaunchKernel") if load is None else load()
            self.native = native_address(fn)
        self.ready = True

    def func_arg(self, handle: Any):
        """What :meth:`launch` takes for kernel ``handle``."""
        return handle

    def params_arg(self, address: int):
        """What :meth:`launch` takes for the ``kernelParams`` array at ``address``."""
        return address

    def launch(self, func, grid: int, block: int, stream: int, params) -> None:
        """Launch ``func`` with ``kernelParams`` at ``params`` on stream handle ``stream`` (an int)."""
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = self.cu.CUstream(stream)
        err = self._cu_launch(func, grid, 1, 1, block, 1, 1, 0, handle, params, 0)[0]
        if err != self._success:
            raise RuntimeError(f"cuLaunchKernel failed: {err.name} (grid {grid}, block {block})")

    def error_name(self, err: int) -> str:
        """The name of CUresult ``err`` (``CUDA_ERROR_...``), else its number."""
        try:
            return self.cu.CUresult(err).name
        except (ImportError, ValueError):
            return f"CUresult {err}"

    def check_abi(self, handle, sizes: list[int]) -> list[int] | None:
        """Raise :class:`AbiMismatch` unless the packed parameter sizes are the compiled kernel's
        (when the driver can tell); returns the parameters' offsets in the kernel's parameter
        block as the driver reports them, or None when it cannot tell."""
        cu = self.cu
        query = cu.cuKernelGetParamInfo if isinstance(handle, cu.CUkernel) else getattr(cu, "cuFuncGetParamInfo", None)
        if query is None:
            return None
        offsets = []
        for i, size in enumerate(sizes):
            err, offset, actual = query(handle, i)
            if err != cu.CUresult.CUDA_SUCCESS:
                if i == 0 and err == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED:
                    return None  # older driver: nothing to compare against
                raise AbiMismatch(f"kernel has {i} parameters, {len(sizes)} were packed")
            if actual != size:
                raise AbiMismatch(f"parameter {i} is {actual} bytes, packed {size}")
            offsets.append(int(offset))
        if query(handle, len(sizes))[0] == cu.CUresult.CUDA_SUCCESS:
            raise AbiMismatch(f"kernel has more than the {len(sizes)} packed parameters")
        return offsets


#: The process's driver (tests swap it for a stand-in).
driver = Driver()
