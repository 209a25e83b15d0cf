"""Array-library interop: the device of a CUDA pointer, objects that offer only DLPack, streams.

Nothing here imports PyTorch or JAX: each is reached only through an object the caller
passed; CuPy is imported only to view a CUDA DLPack object.

- :func:`pointer_device` asks the CUDA driver which device owns a pointer
  (``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)``), so a
  ``__cuda_array_interface__`` object of any library (Numba device arrays,
  PyTorch tensors, JAX arrays) gets its device from its memory, not from a
  library attribute.
- :func:`native_array` turns an object that offers only DLPack into a view of the
  same memory: NumPy for host memory (``kDLCPU``), CuPy for CUDA memory. The fast
  wing reads CUDA capsules without CuPy (``fast/dlpack.py``).
- :func:`stream_object_handle` reads the raw handle of another library's stream object.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._runtime import CUDA_IMPORTS
from .errors import error

__all__ = [
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_MANAGED",
    "NOT_DEVICE_MEMORY",
    "dlpack_only",
    "native_array",
    "pointer_device",
    "stream_object_handle",
]

#: DLPack device types (dlpack.h ``DLDeviceType``).
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13

# --- device of a pointer ----------------------------------------------------------

#: pointer -> device ordinal. A pointer's device never changes while the memory is
#: allocated; the cache is cleared when it fills (a freed and re-mapped address is
#: asked again then). Size-0 arrays have pointer 0 and no device.
_DEVICE_OF: dict[int, int | None] = {}
_DEVICE_CACHE = 4096
_driver_state: list = []  # [cuda.bindings.driver module] once it answered, [None] when unusable


def _driver():
    if not _driver_state:
        try:
            with CUDA_IMPORTS:
                from cuda.bindings import driver as cu

            ok = cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS
        except Exception:  # noqa: BLE001 - no bindings / no driver: devices stay unknown
            cu, ok = None, False
        _driver_state.append(cu if ok else None)
    return _driver_state[0]


#: :func:`pointer_device` of a pointer the driver does not know (pageable host memory, junk).
NOT_DEVICE_MEMORY = -2


def _driver_ordinal(ptr: int) -> int | None:
    """The driver's device ordinal of ``ptr``: ``NOT_DEVICE_MEMORY`` when the driver says it is no
    memory it maps (a host array posing as a CUDA array: a kernel would fault on it), None when
    it cannot tell (no driver, other errors)."""
    cu = _driver()
    if cu is None:
        return None
    attribute = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, ordinal = cu.cuPointerGetAttribute(attribute, ptr)
    if err == cu.CUresult.CUDA_SUCCESS:
        return int(ordinal)
    return NOT_DEVICE_MEMORY if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE else None


def pointer_device(ptr: int) -> int | None:
    """Device ordinal owning CUDA pointer ``ptr`` (cached per pointer); None when unknown,
    ``NOT_DEVICE_MEMORY`` when the driver maps no memory there."""
    if not ptr:
        return None
    hit = _DEVICE_OF.get(ptr, -1)
    if hit == -1:
        if len(_DEVICE_OF) >= _DEVICE_CACHE:
            _DEVICE_OF.clear()
        hit = _DEVICE_OF[ptr] = _driver_ordinal(ptr)
    return hit


# --- DLPack-only objects ---------------------------------------------------------


def dlpack_only(x: Any) -> bool:
    """True for an object with ``__dlpack__`` and ``__dlpack_device__`` but no CUDA array interface
    (NumPy arrays, which have both, are read directly)."""
    return (
        not isinstance(x, np.ndarray)
        and hasattr(x, "__dlpack_device__")
        and hasattr(x, "__dlpack__")
        and not hasattr(x, "__cuda_array_interface__")
    )


def native_array(function: str, argument: str, x: Any):
    """A view of DLPack-only ``x`` (same memory): NumPy for host memory, CuPy for CUDA memory.

    The view holds its producer's memory (through the capsule) for as long as it lives.
    """
    device_type, _ = x.__dlpack_device__()
    if int(device_type) == KDL_CPU:
        return np.from_dlpack(x)
    if int(device_type) in (KDL_CUDA, KDL_CUDA_MANAGED):
        try:
            with CUDA_IMPORTS:
                import cupy
        except ImportError:
            raise error(
                "KVC-C001",
                function=function,
                argument=argument,
                got=f"{type(x).__name__} (a CUDA DLPack object needs CuPy to be viewed)",
            ) from None
        return cupy.from_dlpack(x)
    raise error(
        "KVC-C001",
        function=function,
        argument=argument,
        got=f"{type(x).__name__} on DLPack device type {int(device_type)}",
    )


# --- streams -------------------------------------------------------------------------


def _int_handle(value: Any) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    raw = getattr(value, "value", None)  # ctypes.c_void_p (None for the NULL stream)
    if raw is not None or type(value).__name__ == "c_void_p":
        return int(raw or 0)
    try:
        return int(value)  # cuda.bindings CUstream
    except (TypeError, ValueError):
        return None


def stream_object_handle(stream: Any) -> int | None:
    """The handle of a stream: an int, an object speaking the CUDA stream protocol, or a CuPy /
    Numba / PyTorch stream; None when ``stream`` is none of these."""
    if isinstance(stream, (int, np.integer)):
        return _int_handle(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        pair = proto() if callable(proto) else proto  # a method in the protocol; early versions: a property
        if isinstance(pair, tuple) and len(pair) == 2:
            return _int_handle(pair[1])
        return None
    for attribute in ("ptr", "cuda_stream", "handle"):  # CuPy, PyTorch, Numba
        if hasattr(stream, attribute):
            return _int_handle(getattr(stream, attribute))
    return None
