"""CUDA arrays that offer only DLPack, read without taking ownership of their memory.

``cupy.from_dlpack`` costs tens of microseconds per array and returns a new
object every call, so a public call over DLPack-only arrays missed every cache
(the validation memo, the launch glue's persistent views) and paid that twice
per array. Here the producer's capsule is only *read*: :func:`cuda_view` asks
``x.__dlpack__`` for a capsule, copies its ``DLTensor`` fields (pointer, shape,
strides, dtype, device, read-only flag) and lets the capsule go unconsumed, so
its destructor hands the memory back to the producer at once. What remains is
a :class:`DlpackView`: a ``__cuda_array_interface__`` description that owns
nothing. Views are interned by their description, so the same memory seen
again is the same object, and the caches keyed on objects hit.

The caller keeps the producer alive for the duration of the call (it passed
it), which is all the kernels need; a view outliving its producer describes
freed memory, exactly like a raw pointer, and is never launched on without
a fresh ``__dlpack__`` of a live producer having produced it again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .. import _interop
from .._runtime import CUDA_IMPORTS
from .._validate import c_strides
from ..errors import error

__all__ = ["DlpackView", "INTERNED", "capsule_fields", "cuda_view", "native_array", "native_views"]

#: Most interned views kept (oldest out); a view holds no memory, only numbers.
INTERNED = 512

_DLPACK_READ_ONLY = 1  # DLManagedTensorVersioned flags bit (DLPack >= 1.0)
_MAX_DIMS = 64  # NumPy's limit: a tensor claiming more is not one
#: DLDataType code -> NumPy kind letter (0 int, 1 uint, 2 float, 6 bool); others are not read here.
_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Versioned(ctypes.Structure):  # DLManagedTensorVersioned: the tensor comes after the header
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _Tensor),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]


def capsule_fields(capsule: Any) -> tuple | None:
    """(pointer, shape, byte strides, dtype, (device type, device id), read-only) of an
    unconsumed DLPack capsule, or None when its dtype is not one NumPy names the same way
    (vector lanes, bfloat16, complex, an odd bit width) or the capsule is not a tensor.

    Raises ValueError (from ctypes) for an object that is not a capsule, KVC-C001 for a tensor
    whose number of dimensions no array has."""
    name = _get_name(capsule)  # ValueError (from ctypes) for anything but a capsule
    if name == b"dltensor_versioned":
        managed = _Versioned.from_address(_get_pointer(capsule, name))
        tensor, read_only = managed.dl_tensor, bool(managed.flags & _DLPACK_READ_ONLY)
    elif name == b"dltensor":
        tensor, read_only = _Tensor.from_address(_get_pointer(capsule, name)), False
    else:
        return None
    kind = _KINDS.get(tensor.dtype.code)
    if kind is None or tensor.dtype.lanes != 1 or tensor.dtype.bits % 8 or (kind == "b" and tensor.dtype.bits != 8):
        return None
    dtype = np.dtype("?" if kind == "b" else f"{kind}{tensor.dtype.bits // 8}")
    ndim = int(tensor.ndim)
    if not 0 <= ndim <= _MAX_DIMS:  # its shape would be read from memory past the tensor's
        raise error(
            "KVC-C001", function="capsule_fields", argument="capsule", got=f"a DLPack tensor of {ndim} dimensions"
        )
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if tensor.strides:  # in elements; NULL means C-contiguous
        strides = tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(ndim))
    else:
        strides = c_strides(shape, dtype.itemsize)
    ptr = int(tensor.data or 0) + int(tensor.byte_offset)
    return ptr, shape, strides, dtype, (int(tensor.device.device_type), int(tensor.device.device_id)), read_only


class DlpackView:
    """A CUDA array description read from a DLPack capsule; owns no memory.

    Attributes
    ----------
    __cuda_array_interface__ : dict
        Version 3, byte strides always given, ``data = (pointer, read_only)``.
    shape : tuple of int
    strides : tuple of int
        Byte strides.
    dtype : numpy.dtype
    device_id : int
        The DLPack device id (the pointer's driver attribute is what validation trusts).
    device_type : int
        The capsule's DLPack device type (kDLCUDA, kDLCUDAManaged for memory a kernel can read).
    """

    __slots__ = (
        "__cuda_array_interface__",
        "shape",
        "strides",
        "dtype",
        "device_id",
        "device_type",
        "_kvcanary_layout",
        "__weakref__",
    )

    def __init__(self, ptr: int, shape: tuple, strides: tuple, dtype: np.dtype, device: tuple, read_only: bool):
        self.shape, self.strides, self.dtype = shape, strides, dtype
        self.device_type, self.device_id = device
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": strides,
            "typestr": dtype.str,
            "data": (ptr, read_only),
            "version": 3,
        }
        # What array_layout reads: no interface dict to parse per launch.
        self._kvcanary_layout = (ptr, shape, strides, dtype)

    def __repr__(self) -> str:
        ptr, read_only = self.__cuda_array_interface__["data"]
        return f"DlpackView(ptr={ptr:#x}, shape={self.shape}, dtype={self.dtype}{', read-only' if read_only else ''})"


_interned: OrderedDict[tuple, DlpackView] = OrderedDict()
_interning = threading.Lock()  # several host threads may read producers at once


def _capsule(x: Any, stream: int):
    try:  # DLPack >= 1.0 producers say whether the memory is read-only
        return x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # an older producer: no max_version keyword
        return x.__dlpack__(stream=stream)


def cuda_view(x: Any, stream: int) -> DlpackView | None:
    """The :class:`DlpackView` of CUDA DLPack producer ``x`` (None if its dtype is not read here).

    ``stream`` is the consumer's CUDA stream for the producer's ordering (DLPack: 1 is the
    legacy default stream); the producer makes its pending work visible to that stream.
    """
    fields = capsule_fields(_capsule(x, stream))  # the capsule dies here, unconsumed
    if fields is None:
        return None
    ptr, shape, strides, dtype, device, read_only = fields
    key = (ptr, shape, strides, dtype.str, device, read_only)
    with _interning:
        view = _interned.get(key)
        if view is None:
            view = _interned[key] = DlpackView(ptr, shape, strides, dtype, device, read_only)
            if len(_interned) > INTERNED:
                _interned.popitem(last=False)
        else:
            _interned.move_to_end(key)
    return view


def _consumer_stream(cupy) -> int:
    ptr = int(cupy.cuda.get_current_stream().ptr)
    return ptr if ptr else 1  # DLPack's name for the legacy default stream


def native_array(function: str, argument: str, x: Any):
    """A view of DLPack-only ``x``: NumPy for host memory; for CUDA memory a :class:`DlpackView`
    (dtypes it does not read, bfloat16 or vector lanes, go through ``cupy.from_dlpack``).

    KVC-C001 when the producer's ``__dlpack_device__`` or ``__dlpack__`` raises, answers with
    something that is not a DLPack capsule, or names CUDA for a capsule on another device."""
    device_type = _interop.dlpack_device_type(function, argument, x)
    if device_type in (_interop.KDL_CUDA, _interop.KDL_CUDA_MANAGED):
        try:
            with CUDA_IMPORTS:
                import cupy
        except ImportError:  # the core says why (KVC-C001)
            return _interop.native_array(function, argument, x)
        try:
            view = cuda_view(x, _consumer_stream(cupy))
        except Exception as exc:  # noqa: BLE001 - the producer's refusal, or a capsule that lies
            got = f"{type(x).__name__} whose __dlpack__() failed: {type(exc).__name__}: {str(exc)[:160]}"
            raise error("KVC-C001", function=function, argument=argument, got=got) from None
        if view is not None and view.device_type not in (_interop.KDL_CUDA, _interop.KDL_CUDA_MANAGED):
            got = f"{type(x).__name__} whose __dlpack_device__() says CUDA but whose capsule is on device type "
            raise error("KVC-C001", function=function, argument=argument, got=f"{got}{view.device_type}")
        if view is not None:
            return view
    return _interop.native_array(function, argument, x)


def native_views(value: Any, function: str = "", argument: str = "", views: dict | None = None):
    """``value`` with every DLPack-only array in it (dataclass fields, tuple items) replaced by its
    view (:func:`native_array`); the same object when there is none. ``views`` maps id(producer)
    to a view already read in this call (the validation memo's snapshot)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for field in dataclasses.fields(value):
            old = getattr(value, field.name)
            new = native_views(old, function, f"{argument}.{field.name}".lstrip("."), views)
            if new is not old:
                changes[field.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, (tuple, list)):
        items = [native_views(item, function, f"{argument}[{i}]", views) for i, item in enumerate(value)]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value
    if isinstance(value, np.ndarray) or not _interop.dlpack_only(value):
        return value
    seen = None if views is None else views.get(id(value))
    return native_array(function, argument, value) if seen is None else seen
