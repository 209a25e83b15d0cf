"""Prepared launches: a kernel launch reduced to one ``cuLaunchKernel`` call.

A Numba launch re-derives the kernel ABI from the Python arguments on every
call (type checks, device-array wrapping, ctypes conversion): 25-170 us of host
time per launch on an H200 host. The canary launches the same kernels with the
same long-lived arrays every forward step, so :class:`PreparedLaunch` does that
work once: it packs the parameter buffer (Numba's kernel ABI, below) when it is
built and then launches with a single driver call. Arguments that may change
between steps (an engine's token arrays) are re-packed only when their data
pointer or shape changed (:meth:`PreparedLaunch.rebind`).

Numba's kernel ABI, one entry per flattened parameter, in signature order:

- array of ``ndim`` n: ``meminfo`` (void*, 0), ``parent`` (void*, 0), ``nitems``
  (intp), ``itemsize`` (intp), ``data`` (void*), ``shape[n]`` (intp),
  ``strides[n]`` (intp, bytes);
- integer scalar: its ctypes type; ``bool``: one byte; float: c_float / c_double;
- tuple: its members, flattened in order.

Under Numba's CUDA simulator there is no driver: a prepared launch keeps its
arguments and runs the ordinary launch (:func:`._common.launch`), so the
rebinding logic is tested on a CPU with the same results as the normal path.

The ordinary launch glue uses the same machinery: :func:`._common.launch` keeps
one prepared launch per kernel (and device and host thread) and refills it with each
call's arguments (:meth:`PreparedLaunch.refill`).

:func:`.recording.recording` collects the launches an ordinary launch-glue
call *would* make, and where every array argument came from, so callers can
prepare whole phases (the monitor does: :mod:`kvcanary_numba.monitor.fastpath`).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Sequence

from . import _common
from .recording import Origin, RecordedLaunch

__all__ = ["PreparedLaunch", "pack_arguments"]

_INTP = ctypes.c_ssize_t
_VOIDP = ctypes.c_void_p
logger = logging.getLogger("kvcanary_numba.launch")


# --- array layouts --------------------------------------------------------------
# A layout is ``_common.array_layout(x)``: (data pointer, shape, strides in bytes, dtype).

def _array_values(layout: tuple) -> list[int]:
    ptr, shape, strides, dtype = layout
    nitems = 1
    for extent in shape:
        nitems *= extent
    return [0, 0, nitems, dtype.itemsize, ptr, *shape, *strides]


# --- packing --------------------------------------------------------------------

def _slot_types(ty) -> list:
    """ctypes types of the flattened parameters of one Numba argument type."""
    from numba.core import types

    if isinstance(ty, types.Array):
        return [_VOIDP, _VOIDP, _INTP, _INTP, _VOIDP] + [_INTP] * (2 * ty.ndim)
    if isinstance(ty, types.BaseTuple):
        return [c for member in ty for c in _slot_types(member)]
    if ty == types.boolean:
        return [ctypes.c_bool]
    if isinstance(ty, types.Integer):
        return [getattr(ctypes, f"c_{ty}")]
    if ty in (types.float32, types.float64):
        return [ctypes.c_float if ty == types.float32 else ctypes.c_double]
    raise NotImplementedError(f"prepared launches do not pack arguments of type {ty}")


def _slot_values(ty, value) -> list:
    from numba.core import types

    if isinstance(ty, types.Array):
        return _array_values(_common.array_layout(value))
    if isinstance(ty, types.BaseTuple):
        return [v for member, item in zip(ty, value) for v in _slot_values(member, item)]
    return [value]


def pack_arguments(argument_types: Sequence, args: Sequence) -> tuple[list, list[int]]:
    """The ctypes objects of Numba's kernel ABI for ``args``, and where each argument starts.

    Returns
    -------
    slots : list of ctypes objects
        One per flattened parameter, in order (their addresses form ``kernelParams``).
    starts : list of int
        Index in ``slots`` of the first parameter of each argument.
    """
    slots, starts = [], []
    for ty, value in zip(argument_types, args):
        starts.append(len(slots))
        for ctype, v in zip(_slot_types(ty), _slot_values(ty, value)):
            slots.append(ctype(v))
    return slots, starts


# --- the prepared launch --------------------------------------------------------

class PreparedLaunch:
    """One kernel launch with its parameter buffer packed once.

    Parameters
    ----------
    kernel : numba.cuda dispatcher
        A module-level ``@cuda.jit`` kernel (see :mod:`kvcanary_numba.kernels`).
    signature : str
        The declared signature it is compiled for (eagerly, here).
    grid, block : int
        1-D launch shape.
    args : sequence
        Kernel arguments as the launch glue passes them (Numba device arrays
        or any ``__cuda_array_interface__`` array; NumPy under the simulator;
        Python scalars and tuples). Array memory must outlive the launch object
        or be rebound before it is freed.

    Attributes
    ----------
    raw : bool
        True when launches go straight to ``cuLaunchKernel``; False under the
        simulator, or when preparing failed (``fallback_reason`` says why, a
        warning is logged): then the ordinary launch path runs.
    """

    __slots__ = ("kernel", "signature", "grid", "block", "args", "raw", "fallback_reason", "_func", "_slots",
                 "_starts", "_pointers", "_params", "_layouts", "_types")

    def __init__(self, kernel, signature: str, grid: int, block: int, args: Sequence[Any]):
        self.kernel, self.signature = kernel, signature
        self.grid, self.block = int(grid), int(block)
        self.args = list(args)
        self._layouts: dict[int, tuple] = {}
        self.raw, self.fallback_reason = False, None
        if _common.ON_SIMULATOR:
            return
        _common.check_signature(signature, self.args, kernel)  # the glue's types, once
        try:
            compiled = _common.compile_kernel(kernel, signature)  # compiled and loaded
            self._func = compiled._codelibrary.get_cufunc().handle
            self._types = compiled.argument_types
            self._slots, self._starts = pack_arguments(self._types, self.args)
            self._pointers = (_VOIDP * max(len(self._slots), 1))(*(ctypes.addressof(s) for s in self._slots))
            self._params = ctypes.addressof(self._pointers)
            _driver.check_abi(self._func, [ctypes.sizeof(s) for s in self._slots])
        except Exception as exc:  # noqa: BLE001 - never worse than the ordinary launch
            self.fallback_reason = f"{type(exc).__name__}: {exc}"
            logger.warning("prepared launch of %s falls back to the ordinary launch: %s", signature, exc)
            return
        self.raw = True

    @classmethod
    def from_record(cls, record: RecordedLaunch) -> "PreparedLaunch":
        return cls(record.kernel, record.signature, record.grid, record.block, record.args)

    def rebind(self, index: int, source: Any, origin: Origin | None = None, layout: tuple | None = None) -> None:
        """Point array argument ``index`` at ``source`` (same dtype and ndim as before).

        ``origin`` says how the glue derived the argument from its source (None:
        the array itself); ``layout`` is ``_common.array_layout(source)`` when the
        caller has it. On a GPU only the slots of this argument are re-packed, and only
        when the pointer or shape changed.
        """
        if not self.raw:
            self.args[index] = origin.rebuild(source) if origin is not None else _common.kernel_array(source)
            return
        source_layout = _common.array_layout(source) if layout is None else layout
        view_layout = source_layout if origin is None else origin.layout(source_layout)
        if view_layout is None:  # rare: shaped views; build one to read its layout
            view_layout = _common.array_layout(origin.rebuild(source))
        self.args[index] = source  # keeps the memory alive while the launch may use it
        if self._layouts.get(index) == view_layout:
            return
        self._layouts[index] = view_layout
        start = self._starts[index]
        for k, v in enumerate(_array_values(view_layout)):
            self._slots[start + k].value = v

    def refill(self, grid: int, block: int, args: Sequence[Any]) -> None:
        """Aim a raw launch at new ``args`` of the same types (arrays as :meth:`rebind`, scalars re-packed)."""
        self.grid, self.block = int(grid), int(block)
        self.args = list(args)
        for index, (ty, value) in enumerate(zip(self._types, args)):
            if hasattr(ty, "ndim"):
                self.rebind(index, value)
            else:
                start = self._starts[index]
                for k, v in enumerate(_slot_values(ty, value)):
                    self._slots[start + k].value = v

    def launch(self, stream: int | None = None) -> None:
        """Launch on ``stream`` (a CUDA stream handle; default CuPy's current stream)."""
        if not self.raw:
            _common.launch(self.kernel, self.signature, self.grid, self.block, self.args)
            return
        handle = _common._current_stream_ptr() if stream is None else int(stream)
        _driver.launch(self._func, self.grid, self.block, handle, self._params)


class _Driver:
    """The two driver calls prepared launches make (cuda-bindings, imported lazily)."""

    def __init__(self):
        self._cu = None
        self._streams: dict[int, Any] = {}

    @property
    def cu(self):
        if self._cu is None:
            from cuda.bindings import driver

            self._cu = driver
        return self._cu

    def launch(self, func, grid: int, block: int, stream: int, params: int) -> None:
        cu = self.cu
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = cu.CUstream(stream)
        err = cu.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 0, handle, params, 0)[0]
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel failed: {err.name} (grid {grid}, block {block})")

    def check_abi(self, func, sizes: list[int]) -> None:
        """Compare the packed parameter sizes with the compiled kernel's (when the driver can tell)."""
        cu = self.cu
        query = cu.cuKernelGetParamInfo if isinstance(func, cu.CUkernel) else getattr(cu, "cuFuncGetParamInfo", None)
        if query is None:
            return
        for i, size in enumerate(sizes):
            err, _, actual = query(func, i)
            if err != cu.CUresult.CUDA_SUCCESS:
                if i == 0 and err == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED:
                    return  # older driver: nothing to compare against
                raise RuntimeError(f"prepared launch: kernel has {i} parameters, {len(sizes)} were packed")
            if actual != size:
                raise RuntimeError(f"prepared launch: parameter {i} is {actual} bytes, packed {size}")
        if query(func, len(sizes))[0] == cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"prepared launch: kernel has more than the {len(sizes)} packed parameters")


_driver = _Driver()
