"""Kernel-argument views of NumPy and CUDA arrays (API: :mod:`._common`).

A CUDA array becomes a Numba device-array view over the same memory (no copy,
no stream sync); a NumPy array (simulator) is passed as is or re-viewed with
NumPy. Views of long-lived arrays are cached (``persistent=True``).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from .._arrays import _c_strides

__all__ = ["CACHE_SIZE", "array_layout", "byte_span", "kernel_array", "reinterpret"]

#: Persistent device-array views kept (see ``persistent=True``).
CACHE_SIZE = 256

#: (id(x), layout, builder) -> (weak reference to x, view). A cached view does not own
#: x (built with ``owner=None``) and the entry goes when x dies: the cache never keeps a
#: user's array (or its memory) alive.
_views: OrderedDict[tuple, tuple[weakref.ref, Any]] = OrderedDict()


#: Attribute holding the layout of the Numba views built here: launches read it back
#: every call, and the view's own ``__cuda_array_interface__`` costs ~3 us to build.
_LAYOUT = "_kvcanary_layout"


#: Per host thread: ``note(view, source, builder, params, persistent)`` while a recording is
#: active (:func:`.recording.recording` sets it); every builder reports what it built from what.
observing = threading.local()


def _observed(view, x, builder: str, params: tuple, persistent: bool):
    note = getattr(observing, "note", None)
    if note is not None:
        note(view, x, builder, params, persistent)
    return view


def _cai_view(x: Any, ptr: int, dtype: np.dtype, shape: tuple, strides: tuple | None, owner: Any = None):
    from numba import cuda

    desc = {"shape": shape, "strides": strides, "typestr": dtype.str, "data": (ptr, False), "version": 3}
    # sync=False: the producer's stream order is the caller's business, and a
    # synchronize would be illegal inside CUDA-graph capture.
    view = cuda.from_cuda_array_interface(desc, owner=owner, sync=False)
    shape = tuple(int(n) for n in shape)
    setattr(view, _LAYOUT, (int(ptr), shape, _c_strides(shape, dtype.itemsize) if strides is None else tuple(strides),
                            dtype))  # fmt: skip
    return view


def array_layout(x: Any) -> tuple[int, tuple, tuple, np.dtype]:
    """(data pointer, shape, strides in bytes, dtype) of a NumPy or CUDA array.

    CuPy arrays are read through attributes (far cheaper than building their
    ``__cuda_array_interface__`` dict); other CUDA arrays through that dict.
    """
    ptr = getattr(getattr(x, "data", None), "ptr", None)  # CuPy: MemoryPointer.ptr
    if ptr is not None:
        return int(ptr), tuple(x.shape), tuple(x.strides), x.dtype
    layout = getattr(x, _LAYOUT, None)  # a view built by this module
    if layout is not None:
        return layout
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data), x.shape, x.strides, x.dtype
    cai = x.__cuda_array_interface__
    shape, dtype = tuple(int(n) for n in cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    strides = _c_strides(shape, dtype.itemsize) if strides is None else tuple(int(n) for n in strides)
    return int(cai["data"][0] or 0), shape, strides, dtype


def _cached(x: Any, key: tuple, persistent: bool, build):
    if not persistent:
        return build(x)  # a per-call view owns x while it lives
    # The weak reference tells a live x from a new array at a recycled id, and the
    # layout catches views rebuilt in place with other memory.
    full = (id(x), *array_layout(x), *key)
    hit = _views.get(full)
    if hit is not None and hit[0]() is x:
        _views.move_to_end(full)
        return hit[1]
    view = build(None)
    try:
        ref = weakref.ref(x, lambda _, full=full: _views.pop(full, None))
    except TypeError:  # not weak-referenceable: not cached
        return build(x)
    _views[full] = (ref, view)
    if len(_views) > CACHE_SIZE:
        _views.popitem(last=False)
    return view


def kernel_array(x: Any, *, persistent: bool = False):
    """``x`` as a kernel argument (NumPy as is, CUDA arrays as Numba views)."""
    if isinstance(x, np.ndarray):
        return _observed(x, x, "kernel_array", (), persistent)

    def build(owner):
        ptr, shape, strides, dtype = array_layout(x)
        return _cai_view(x, ptr, dtype, shape, strides, owner)

    return _observed(_cached(x, ("same",), persistent, build), x, "kernel_array", (), persistent)


def reinterpret(x: Any, dtype, shape: Sequence[int] | None = None, *, persistent: bool = False):
    """The bytes of C-contiguous ``x`` viewed as ``dtype`` with ``shape`` (default: 1-D)."""
    dtype = np.dtype(dtype)
    params = (dtype,) if shape is None else (dtype, tuple(int(n) for n in shape))
    if isinstance(x, np.ndarray):
        flat = x.reshape(-1).view(np.uint8).view(dtype)
        return _observed(flat if shape is None else flat.reshape(tuple(shape)), x, "reinterpret", params, persistent)

    def build(owner):
        ptr, in_shape, _, in_dtype = array_layout(x)
        nbytes = int(np.prod(in_shape, dtype=np.int64)) * in_dtype.itemsize
        out_shape = (nbytes // dtype.itemsize,) if shape is None else tuple(int(n) for n in shape)
        return _cai_view(x, ptr, dtype, out_shape, None, owner)

    view = _cached(x, ("reinterpret", dtype.str, None if shape is None else tuple(shape)), persistent, build)
    return _observed(view, x, "reinterpret", params, persistent)


def _span_items(shape: tuple, strides: tuple, itemsize_in: int, itemsize_out: int) -> int:
    rows, cols = shape
    if rows == 0 or cols == 0:
        return 0
    return ((rows - 1) * strides[0] + cols * itemsize_in) // itemsize_out


def byte_span(x: Any, dtype, *, persistent: bool = False):
    """1-D ``dtype`` view over all rows of 2-D ``x`` (rows contiguous, any row stride)."""
    dtype = np.dtype(dtype)
    if isinstance(x, np.ndarray):
        n = _span_items(x.shape, x.strides, x.itemsize, dtype.itemsize)
        if n == 0:
            return _observed(np.zeros(0, dtype=dtype), x, "byte_span", (dtype,), persistent)
        raw = np.lib.stride_tricks.as_strided(x, shape=(1,), strides=(1,))  # first element, same base
        u8 = np.lib.stride_tricks.as_strided(raw.view(np.uint8), shape=(n * dtype.itemsize,), strides=(1,))
        return _observed(u8.view(dtype), x, "byte_span", (dtype,), persistent)

    def build(owner):
        ptr, shape, strides, in_dtype = array_layout(x)
        return _cai_view(x, ptr, dtype, (_span_items(shape, strides, in_dtype.itemsize, dtype.itemsize),), None,
                         owner)  # fmt: skip

    return _observed(_cached(x, ("span", dtype.str), persistent, build), x, "byte_span", (dtype,), persistent)
