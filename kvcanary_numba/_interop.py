"""Array-library interop: the device of a CUDA pointer, DLPack-only objects, CUDA streams.

Nothing here imports CuPy, PyTorch or JAX: each is reached only through an object
the caller passed (or ``sys.modules`` when the caller already imported it).

- :func:`pointer_device` asks the CUDA driver which device owns a pointer
  (``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)``), so a
  ``__cuda_array_interface__`` object of any library (Numba device arrays,
  PyTorch tensors, JAX arrays) gets its device from its memory, not from a
  library attribute.
- :func:`native_array` turns an object that offers only DLPack into a description
  of the same memory: a :class:`._dlpack.DlpackView` (``kDLCUDA``, read from the
  capsule, owning nothing) or a NumPy view (``kDLCPU``).
- :func:`stream_handle` reads the CUDA stream handle of a ``stream=`` argument.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

import numpy as np

from . import _dlpack
from .errors import KvCanaryError, error

__all__ = ["NOT_DEVICE_MEMORY", "dispatch", "dlpack_only", "native_array", "native_views", "pointer_device", "stream_handle"]

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
    return (not isinstance(x, np.ndarray) and hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__")
            and not hasattr(x, "__cuda_array_interface__"))  # fmt: skip


def _convert(function: str, argument: str, x: Any, own: bool):
    device_type, _ = x.__dlpack_device__()
    if int(device_type) == KDL_CPU:
        return np.from_dlpack(x)
    if int(device_type) in (KDL_CUDA, KDL_CUDA_MANAGED):
        try:
            import cupy
        except ImportError:
            raise error("KVC-C001", function=function, argument=argument,
                        got=f"{type(x).__name__} (a CUDA DLPack object needs CuPy to be viewed)") from None  # fmt: skip
        # Read without a CuPy view (which costs tens of microseconds and is new every call);
        # dtypes the reader does not name (bfloat16, vector lanes) still go through CuPy.
        view = None if own else _dlpack.cuda_view(x, _consumer_stream(cupy))
        return cupy.from_dlpack(x) if view is None else view
    raise error("KVC-C001", function=function, argument=argument,
                got=f"{type(x).__name__} on DLPack device type {int(device_type)}")  # fmt: skip


def _consumer_stream(cupy) -> int:
    ptr = int(cupy.cuda.get_current_stream().ptr)
    return ptr if ptr else 1  # DLPack's name for the legacy default stream


def native_array(function: str, argument: str, x: Any, *, own: bool = False):
    """A view of DLPack-only ``x`` (same memory): NumPy for host memory, a
    :class:`._dlpack.DlpackView` (or, for dtypes it does not read, a CuPy array) for CUDA memory.

    A NumPy or CuPy view holds its producer's memory (often the producer itself, through the
    capsule), so those are never cached; a ``DlpackView`` holds nothing and is interned: it
    serves one call, whose caller keeps the producer alive. ``own=True`` (an object that keeps
    the array, such as a ``RealKvSource``) always gets a view that holds the memory.
    """
    return _convert(function, argument, x, own)


# --- streams ------------------------------------------------------------------------


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


def _protocol_handle(stream: Any) -> int | None:
    """The handle of an object speaking the CUDA stream protocol (or a CuPy / Numba / PyTorch stream)."""
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


def stream_handle(function: str, stream: Any) -> int | None:
    """CUDA stream handle of a public ``stream=`` argument (KVC-C016).

    ``None`` means CuPy's current stream (the legacy default stream without CuPy)
    and is returned as None. Accepted otherwise: an int handle >= 0 (0 = legacy
    default stream), an object with ``__cuda_stream__`` returning ``(version,
    handle)``, a CuPy / Numba / PyTorch stream.
    """
    if stream is None:
        return None
    handle = _int_handle(stream) if isinstance(stream, (int, np.integer)) else _protocol_handle(stream)
    if handle is None or handle < 0:
        raise error("KVC-C016", function=function, argument="stream", got=f"{type(stream).__name__} {stream!r}")
    return handle


def native_views(value: Any, function: str = "", argument: str = "", views: dict | None = None):
    """``value`` with every DLPack-only array in it (dataclass fields, tuple items) replaced
    by its view (:func:`native_array`); the same object when there is none. ``views`` maps
    id(producer) to a view already read in this call (the validation memo's snapshot)."""
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
    if isinstance(value, np.ndarray) or not dlpack_only(value):
        return value
    seen = None if views is None else views.get(id(value))
    return native_array(function, argument, value) if seen is None else seen


_MODULES = {"numpy": "kvcanary_numba.reference.", "cuda": "kvcanary_numba.launch."}


def dispatch(function: str, entry, op: str, stream: Any, kwargs: dict) -> None:
    """Run ``function`` of ``reference.<op>`` (NumPy) or ``launch.<op>`` (CUDA) with ``kwargs``.

    ``entry`` is the call's :class:`._memo.Entry` (its backend, and launches packed for replay).
    The module is looked up at call time (tests swap it). ``stream`` is the public ``stream=``
    argument (KVC-C016): None runs on CuPy's current stream; otherwise the CUDA launches of the
    call are queued on that handle. The NumPy path checks it and runs synchronously on the host.
    """
    handle = stream_handle(function, stream)
    name = _MODULES[entry.kind] + op
    module = sys.modules.get(name)
    if module is None:  # imported lazily: the launch glue pulls in numba.cuda, the CPU path must not
        module = importlib.import_module(name)
    run = getattr(module, function)
    if entry.kind == "numpy":
        run(**kwargs)
        return
    from .launch._kernel_launch import run_launches

    try:
        run_launches(entry, run, kwargs, handle)
    except KvCanaryError as exc:  # launch scratch refused during graph capture: name the public call
        from .launch.scratch import CAPTURE_FUNCTION

        if exc.fields.get("function") != CAPTURE_FUNCTION:
            raise
        raise error("KVC-C015", **{**exc.fields, "function": function}) from None
