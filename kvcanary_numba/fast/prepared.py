"""Packed launches: a :class:`~kvcanary_numba.launch._launch.LaunchSpec` reduced to one ``cuLaunchKernel`` call.

A Numba launch re-derives the kernel ABI from the Python arguments on every
call (type checks, device-array wrapping, ctypes conversion): 25-170 us of host
time per launch on an H200 host. :class:`PreparedLaunch` does that work once: it
packs the parameter buffer (Numba's kernel ABI, below) from a launch
description and then launches with a single driver call (:mod:`.driver`). It
remembers what it packed for each argument (an array's layout: pointer, shape,
strides, dtype; a scalar's value), so a consumer can re-point one argument
(:meth:`PreparedLaunch.rebind`: only the slots of an array whose layout changed
are rewritten), re-pack a whole new description (:meth:`PreparedLaunch.refill`)
or check that a description still packs to the same bytes
(:meth:`PreparedLaunch.stale_arguments`).

Numba's kernel ABI, one entry per flattened parameter, in signature order:

- array of ``ndim`` n: ``meminfo`` (void*, 0), ``parent`` (void*, 0), ``nitems``
  (intp), ``itemsize`` (intp), ``data`` (void*), ``shape[n]`` (intp),
  ``strides[n]`` (intp, bytes);
- integer scalar: its ctypes type; ``bool``: one byte; float: c_float / c_double;
- tuple: its members, flattened in order.

Under Numba's CUDA simulator there is no driver: a prepared launch keeps its
arguments and runs the core's launch (:func:`kvcanary_numba.launch._launch.run`), so the
rebinding logic is tested on a CPU with the same results as the normal path.
Who consumes packed launches, and the rule that keeps their pointers current:
:mod:`.replay`.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from numba.core import types  # once here: the packers below run per argument of every eager launch

from ..launch._launch import LaunchSpec, View, array_layout, current_stream, kernel_array, run
from . import driver as _numba
from .driver import AbiMismatch

__all__ = ["PreparedLaunch", "pack_buffer"]

_INTP = ctypes.c_ssize_t
_VOIDP = ctypes.c_void_p
logger = logging.getLogger("kvcanary_numba.fast")


# --- packing --------------------------------------------------------------------
# An array's layout is ``array_layout(x)``: (data pointer, shape, strides in bytes, dtype).


def _array_values(layout: tuple) -> list[int]:
    ptr, shape, strides, dtype = layout
    nitems = 1
    for extent in shape:
        nitems *= extent
    return [0, 0, nitems, dtype.itemsize, ptr, *shape, *strides]


def _slot_types(ty) -> list:
    """ctypes types of the flattened parameters of one Numba argument type."""
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
    if isinstance(ty, types.Array):
        return _array_values(array_layout(value))
    if isinstance(ty, types.BaseTuple):
        return [v for member, item in zip(ty, value) for v in _slot_values(member, item)]
    return [value]


def pack_buffer(argument_types: Sequence, args: Sequence) -> tuple:
    """Numba's kernel ABI for ``args``: every flattened parameter in one buffer laid out as the
    kernel's parameter block (each at the next multiple of its alignment, as the CUDA ABI does).

    Returns
    -------
    buffer : ctypes array
        The parameter block (8-byte aligned storage).
    size : int
        Bytes of the block (the end of the last parameter).
    offsets : list of int
        Offset of each flattened parameter in the block.
    slots : list of ctypes objects
        One per flattened parameter, in order, each a view of its bytes in ``buffer`` (their
        addresses form ``kernelParams``; writing a slot's value rewrites the block).
    starts : list of int
        Index in ``slots`` of the first parameter of each argument.
    """
    flat, starts = [], []
    for ty, value in zip(argument_types, args):
        starts.append(len(flat))
        flat += zip(_slot_types(ty), _slot_values(ty, value))
    offsets, end = [], 0
    for ctype, _ in flat:
        align = ctypes.alignment(ctype)
        end = -(-end // align) * align
        offsets.append(end)
        end += ctypes.sizeof(ctype)
    buffer = (ctypes.c_uint64 * max(-(-end // 8), 1))()
    slots = []
    for (ctype, value), offset in zip(flat, offsets):
        slot = ctype.from_buffer(buffer, offset)
        slot.value = value
        slots.append(slot)
    return buffer, end, offsets, slots, starts


def _packed(ty, value):
    """What is packed for one argument of Numba type ``ty``: an array's layout, a scalar's value,
    a tuple's items packed alike (so that nothing packed holds an array)."""
    if isinstance(ty, types.Array):
        return array_layout(value)
    if isinstance(ty, types.BaseTuple):
        return tuple(_packed(member, item) for member, item in zip(ty, value))
    return value


def _swapped(arg, old, new):
    """``arg`` with each view of (or reference to) ``old`` aimed at ``new``; None when it holds none."""
    if isinstance(arg, View):
        return arg.on(new) if arg.source is old else None
    if isinstance(arg, tuple):
        items = [_swapped(item, old, new) for item in arg]
        if all(item is None for item in items):
            return None
        return tuple(item if swap is None else swap for item, swap in zip(arg, items))
    return new if arg is old else None


# --- the prepared launch --------------------------------------------------------


class PreparedLaunch:
    """One kernel launch with its parameter buffer packed once.

    Parameters
    ----------
    kernel, signature, grid, block, args
        The fields of a :class:`~kvcanary_numba.launch._launch.LaunchSpec` (:meth:`from_spec` takes one).
        Array memory must outlive the launch object or be rebound before it is freed.

    Attributes
    ----------
    raw : bool
        True when launches go straight to ``cuLaunchKernel``; False under the
        simulator, or when preparing failed (``fallback_reason`` says why, a
        warning is logged): then the core's launch runs.
    packed : list
        Per argument, what the parameter buffer holds: an array's layout
        (pointer, shape, strides, dtype), a scalar's value, a tuple's items as such.
    handle : object or None
        The kernel's driver handle (``CUfunction``, else ``CUkernel``; :func:`.driver.function_handle`).
        ``_func`` and ``_params`` are what the driver takes for it and for the parameter array.
    """

    __slots__ = (
        "kernel",
        "signature",
        "grid",
        "block",
        "args",
        "raw",
        "fallback_reason",
        "packed",
        "handle",
        "_func",
        "_slots",
        "_starts",
        "_pointers",
        "_params",
        "_types",
        "_arrays",
        "_tabled",
        "_buffer",
        "_size",
        "_extra",
    )

    def __init__(self, kernel, signature: str, grid: int, block: int, args: Sequence[Any]):
        self.kernel, self.signature = kernel, signature
        self.grid, self.block = int(grid), int(block)
        self.args = list(args)
        self.raw, self.fallback_reason, self.packed, self.handle = False, None, [], None
        self._tabled = False  # a LaunchTable copied its handle, grid, block and parameter array
        self._extra = None  # cuLaunchKernel's ``extra`` for the one-buffer form, when the driver's layout is ours
        driver = _numba.driver
        if not driver.raw:  # the simulator
            return
        driver.check_types(kernel, signature, self.args)  # the glue's types, once
        self.handle = driver.function_handle(kernel, signature)
        if self.handle is None:  # logged once by function_handle
            self.fallback_reason = "no driver handle for the compiled kernel"
            return
        self._types = driver.argument_types(kernel, signature)
        self._arrays = [hasattr(ty, "ndim") for ty in self._types]
        try:
            self._buffer, size, offsets, self._slots, self._starts = pack_buffer(self._types, self.args)
            reported = driver.check_abi(self.handle, [ctypes.sizeof(s) for s in self._slots])
        except (NotImplementedError, AbiMismatch) as exc:  # never worse than Numba's launch
            self.fallback_reason = f"{type(exc).__name__}: {exc}"
            logger.warning("prepared launch of %s falls back to the core's launch: %s", signature, exc)
            return
        self.packed = [_packed(ty, v) for ty, v in zip(self._types, self.args)]
        self._pointers = (_VOIDP * max(len(self._slots), 1))(*(ctypes.addressof(s) for s in self._slots))
        if reported == offsets:  # the driver lays the parameters out as pack_buffer did
            self._size = ctypes.c_size_t(size)
            # CU_LAUNCH_PARAM_BUFFER_POINTER (1), the block, CU_LAUNCH_PARAM_BUFFER_SIZE (2), its size, END (0)
            self._extra = (_VOIDP * 5)(1, ctypes.addressof(self._buffer), 2, ctypes.addressof(self._size), 0)
        driver.select(self.handle)
        self._func = driver.func_arg(self.handle)
        self._params = driver.params_arg(ctypes.addressof(self._pointers))
        self.raw = True

    @classmethod
    def from_spec(cls, spec: LaunchSpec) -> PreparedLaunch:
        """The packed launch of ``spec`` (its arguments' types checked against its signature)."""
        return cls(spec.kernel, spec.signature, spec.grid, spec.block, spec.args)

    def rebind(self, index: int, source: Any, origin: View | None = None, layout: tuple | None = None) -> None:
        """Point array argument ``index`` at ``source`` (same dtype and ndim as before).

        ``origin`` is the :class:`View` the glue built the argument as (None: the array
        itself); ``layout`` is ``array_layout(source)`` when the caller has it (used for
        views of the whole array). On a GPU only the slots of this argument are re-packed,
        and only when the pointer or shape changed.
        """
        view = kernel_array(source) if origin is None else origin.on(source)
        if not self.raw:
            self.args[index] = view
            return
        if layout is not None and view.builder == "array":
            view_layout = layout
        else:
            view_layout = view.layout()
        self.args[index] = source  # keeps the memory alive while the launch may use it
        self._pack_array(index, view_layout)

    def viewing(self, array: Any) -> list[int]:
        """Indices of the arguments that view ``array`` (inside tuples too): where :meth:`repoint` acts."""
        return [index for index, arg in enumerate(self.args) if _swapped(arg, array, array) is not None]

    def repoint(self, old: Any, new: Any, indices: Sequence[int] | None = None) -> bool:
        """Aim every view of array ``old`` among the arguments (inside tuples too; only ``indices`` when
        given) at ``new``, which has the geometry ``old`` was packed with (shape, strides, dtype: nothing
        else of the launch depends on it); only the slots of the arguments holding one are rewritten.
        Returns whether any did. ``new`` may be ``old`` itself: memory that moved in place is packed again.
        """
        changed = False
        for index in range(len(self.args)) if indices is None else indices:
            arg = self.args[index]
            swapped = _swapped(arg, old, new)
            if swapped is None:
                continue
            changed, self.args[index] = True, swapped  # the launch keeps ``new`` alive, no longer ``old``
            if self.raw:
                ty, start = self._types[index], self._starts[index]
                for k, value in enumerate(_slot_values(ty, swapped)):
                    self._slots[start + k].value = value
                self.packed[index] = _packed(ty, swapped)
        return changed

    def _pack_array(self, index: int, layout: tuple) -> None:
        if self.packed[index] == layout:
            return
        self.packed[index] = layout
        start, slots = self._starts[index], self._slots
        for k, v in enumerate(_array_values(layout)):
            slots[start + k].value = v

    def refill(self, spec: LaunchSpec) -> None:
        """Aim a raw launch at ``spec`` (same kernel and signature): every argument is re-packed
        (arrays only where their layout changed), so nothing of the previous launch stays.

        Raises
        ------
        RuntimeError
            When a :class:`~.table.LaunchTable` holds this launch (it copied the grid and block).
        """
        if self._tabled:
            raise RuntimeError(f"refill of {self.signature}: a launch table holds it and would launch the old shape")
        self.grid, self.block = spec.grid, spec.block
        self.args = list(spec.args)
        for index, (is_array, value) in enumerate(zip(self._arrays, spec.args)):
            if is_array:
                self._pack_array(index, array_layout(value))
            else:
                self.packed[index] = _packed(self._types[index], value)
                start = self._starts[index]
                for k, v in enumerate(_slot_values(self._types[index], value)):
                    self._slots[start + k].value = v

    def stale_arguments(self, spec: LaunchSpec) -> list[str]:
        """What of ``spec`` this raw launch would not launch as asked: [] when it packs the same.

        A launch that is not raw keeps its arguments and packs nothing: [].
        """
        if not self.raw:
            return []
        if (spec.kernel, spec.signature) != (self.kernel, self.signature):
            return [f"kernel {spec.signature} instead of {self.signature}"]
        out = [
            f"{name} {new} instead of {old}"
            for name, new, old in (("grid", spec.grid, self.grid), ("block", spec.block, self.block))
            if new != old
        ]
        for index, (ty, value) in enumerate(zip(self._types, spec.args)):
            now = _packed(ty, value)
            if now != self.packed[index]:
                out.append(f"argument {index}: {now} instead of {self.packed[index]}")
        return out

    def release(self) -> None:
        """Drop the arguments (the packed pointers stay): a launch kept for replay keeps no array alive."""
        self.args = []

    def launch(self, stream: int | None = None) -> None:
        """Launch on ``stream`` (a CUDA stream handle; default: CuPy's current stream)."""
        handle = current_stream() if stream is None else int(stream)
        if not self.raw:
            run(LaunchSpec(self.kernel, self.signature, self.grid, self.block, tuple(self.args), handle))
            return
        _numba.driver.launch(self._func, self.grid, self.block, handle, self._params)
