"""The driver calls of raw launches: ``cuLaunchKernel`` by one of two routes, and the ABI check.

Routes (one process-wide choice, made at the first raw launch prepared):

``"ctypes"``
    libcuda's ``cuLaunchKernel`` called through ctypes with pre-built pointer
    objects (kernel handle and ``kernelParams`` address built once per packed
    launch, one ``c_void_p`` per stream handle) and the launch shape as Python
    ints; the function has no ``argtypes``, so ctypes converts nothing per call
    (pointer arguments must be ``c_void_p`` objects: a Python int would be
    passed as a 32-bit C int).
``"bindings"``
    cuda-bindings' ``cuLaunchKernel`` (a handle object, a cached ``CUstream`` per stream).

:data:`LAUNCH_ROUTE` is the single switch (default from the environment variable
``KVCANARY_LAUNCH_ROUTE``, else ``"bindings"``): ``"auto"`` takes ctypes when
libcuda loads and the kernel handle converts to an int, else bindings;
``"ctypes"`` / ``"bindings"`` force one (a forced ctypes route that cannot load
falls back to bindings with a warning). It is read once, at the first raw launch
prepared. Why bindings by default: on the H200 host (session 6 run 1,
``benchmarks/results/session6/run1-launch-cost.json``) one cuda-bindings call
cost 3.90 us against 4.95 us for ctypes with ``argtypes`` and plain ints; the
ctypes route here drops that per-call conversion (about 1 us of the difference
on a CPU stub) but has not been measured there yet
(``benchmarks/results/probes/launch_route_cost.py`` measures both).
The driver is the same either way: cuda-bindings loads the same
``libcuda.so.1`` into the process, and both calls use the calling thread's
current context.

Launches issued together (a prepared phase, a replayed public call:
:class:`~.table.LaunchTable`) skip the route: :data:`DRIVER_CALLS` ``"compiled"``
(default) calls libcuda's ``cuLaunchKernel`` (:attr:`_Driver.native`, its address
through ctypes) from one compiled loop for all of them (:mod:`._native`); the
monitor's status readback makes its calls the same way (:func:`libcuda_functions`).
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any, Callable

__all__ = ["AbiMismatch", "DRIVER_CALLS", "LAUNCH_ROUTE", "PARAM_BUFFER", "choose_route", "compiled_calls", "driver",
           "libcuda_functions", "load_libcuda_launch", "native_address"]

#: Driver-call route of raw launches: "auto", "ctypes" or "bindings" (see the module docstring).
LAUNCH_ROUTE = os.environ.get("KVCANARY_LAUNCH_ROUTE", "bindings")

#: Launch tables pass each kernel's parameters as ONE buffer (``cuLaunchKernel``'s ``extra``:
#: ``CU_LAUNCH_PARAM_BUFFER_POINTER``) instead of an array of pointers to each of them (the
#: monitor's kernels take 90-166 parameters; the driver copies one block instead of following
#: one pointer per parameter). Only for kernels whose parameter offsets the driver reported and
#: the packing matches (``check_abi``). On by default: on the H200 (session 7 run 3,
#: ``probes/launch_table_cost.py`` on the decode phases) a tabled launch cost 4.3-5.6 us this way
#: against 6.1-6.6 us with kernelParams, and the monitor's GPU steps were byte-equal on both
#: (``test_gpu_fast_path_steps_equal_eager_steps_on_every_launch_loop``). Env
#: ``KVCANARY_PARAM_BUFFER=0`` turns it off; read when a table is built.
PARAM_BUFFER = os.environ.get("KVCANARY_PARAM_BUFFER", "1") == "1"

#: Who makes the driver calls issued together (a prepared phase's or a replayed public call's
#: launches, the monitor's readback calls of a step): "compiled" (a Numba-compiled function calls
#: libcuda's functions through their addresses, see ``_native``; needs libcuda through ctypes)
#: or "python" (each launch by the route above, the readback through CuPy's runtime). Read when
#: the first raw launch is prepared and when a readback is built (env ``KVCANARY_DRIVER_CALLS``).
DRIVER_CALLS = os.environ.get("KVCANARY_DRIVER_CALLS", "compiled")

logger = logging.getLogger("kvcanary_numba.launch")


class AbiMismatch(RuntimeError):
    """The packed parameters do not match the compiled kernel's (a raw launch would be wrong)."""


def libcuda_function(name: str):
    """libcuda's function ``name`` as a ctypes function, or None where libcuda does not load
    through ctypes or lacks it."""
    try:
        return getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError):
        return None


def load_libcuda_launch() -> Callable | None:
    """libcuda's ``cuLaunchKernel`` as a ctypes function (int result, no ``argtypes``), or None
    when it does not load."""
    fn = libcuda_function("cuLaunchKernel")
    if fn is not None:
        fn.restype = ctypes.c_int
    return fn


def choose_route(preference: str, load: Callable[[], Callable | None], handle: Any) -> tuple[str, Callable | None]:
    """(route, ctypes function or None) for ``preference`` given a sample kernel ``handle``."""
    if preference not in ("auto", "ctypes", "bindings"):
        raise RuntimeError(f"LAUNCH_ROUTE must be 'auto', 'ctypes' or 'bindings', not {preference!r}")
    if preference == "bindings":
        return "bindings", None
    fn = load()
    convertible = True
    try:
        int(handle)
    except (TypeError, ValueError):
        convertible = False
    if fn is not None and convertible:
        return "ctypes", fn
    if preference == "ctypes":
        logger.warning("raw launches use cuda-bindings: %s", "libcuda did not load" if fn is None else
                       f"a {type(handle).__name__} kernel handle is not an int")  # fmt: skip
    return "bindings", None


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


class _Driver:
    """Raw launches and the ABI check; ``launch`` is the chosen route's call."""

    def __init__(self):
        self._cu = None
        self._fn: Callable | None = None
        self._cu_launch: Callable | None = None  # cuda-bindings' cuLaunchKernel (bindings route)
        self._success: Any = None
        self._streams: dict[int, Any] = {}
        self.route: str | None = None  # chosen at the first select()
        #: Address of a C ``cuLaunchKernel`` for compiled launch loops (set by select(); None: loop in Python).
        self.native: int | None = None

    @property
    def cu(self):
        if self._cu is None:
            from cuda.bindings import driver

            self._cu = driver
        return self._cu

    def select(self, handle: Any, preference: str | None = None, load: Callable = load_libcuda_launch) -> str:
        """Choose the route (once; ``handle`` is a sample kernel handle). Returns it."""
        if self.route is None:
            self.route, self._fn = choose_route(LAUNCH_ROUTE if preference is None else preference, load, handle)
            self.launch = self._launch_ctypes if self.route == "ctypes" else self._launch_bindings
            if self.route == "bindings":  # looked up once: attribute reads are a launch's hot path
                self._cu_launch, self._success = self.cu.cuLaunchKernel, self.cu.CUresult.CUDA_SUCCESS
            if compiled_calls():
                self.native = native_address(self._fn if self._fn is not None else load())
        return self.route

    def func_arg(self, handle: Any):
        """What :meth:`launch` takes for kernel ``handle`` on the chosen route."""
        return ctypes.c_void_p(int(handle)) if self.route == "ctypes" else handle

    def params_arg(self, address: int):
        """What :meth:`launch` takes for the ``kernelParams`` array at ``address``."""
        return ctypes.c_void_p(address) if self.route == "ctypes" else address

    def launch(self, func, grid: int, block: int, stream: int, params) -> None:
        """Launch ``func`` (:meth:`func_arg`) with ``params`` (:meth:`params_arg`) on stream handle
        ``stream`` (an int)."""
        raise RuntimeError("no launch route chosen: prepare a launch first")  # replaced by select()

    def _launch_ctypes(self, func, grid: int, block: int, stream: int, params) -> None:
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = ctypes.c_void_p(stream)
        # grid and block go as C ints (no argtypes): the driver reads unsigned ints, same registers.
        err = self._fn(func, grid, 1, 1, block, 1, 1, 0, handle, params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed: {self._name(err)} (grid {grid}, block {block})")

    def _launch_bindings(self, func, grid: int, block: int, stream: int, params: int) -> None:
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = self.cu.CUstream(stream)
        err = self._cu_launch(func, grid, 1, 1, block, 1, 1, 0, handle, params, 0)[0]
        if err != self._success:
            raise RuntimeError(f"cuLaunchKernel failed: {err.name} (grid {grid}, block {block})")

    def _name(self, err: int) -> str:
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


#: The process's driver calls (one route for every raw launch).
driver = _Driver()
