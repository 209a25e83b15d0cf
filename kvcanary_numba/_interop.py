"""Array-library interop: the device of a CUDA pointer, objects that offer only DLPack, streams.

Nothing here imports PyTorch or JAX: each is reached only through an object the caller
passed; CuPy is imported only to view a CUDA DLPack object.

- :func:`read_interface` reads a ``__cuda_array_interface__`` dict field by field, refusing
  (KVC-C001, naming the field) what is missing, mistyped or impossible: a pointer outside 64
  bits or null for a non-empty array, a mask, a version it does not know, more bytes than the
  driver's allocation at that pointer holds.
- :func:`pointer_device` asks the CUDA driver which device owns a pointer
  (``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)``), so a
  ``__cuda_array_interface__`` object of any library (Numba device arrays,
  PyTorch tensors, JAX arrays) gets its device from its memory, not from a
  library attribute; :func:`pointer_range` the allocation around it.
- :func:`native_array` turns an object that offers only DLPack into a view of the
  same memory: NumPy for host memory (``kDLCPU``), CuPy for CUDA memory. The fast
  wing reads CUDA capsules without CuPy (``fast/dlpack.py``). A producer whose
  ``__dlpack_device__`` or ``__dlpack__`` raises or answers nonsense is refused (KVC-C001).
- :func:`stream_object_handle` reads the raw handle of another library's stream object.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from .errors import error

__all__ = [
    "INTERFACE_VERSIONS",
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_MANAGED",
    "NOT_DEVICE_MEMORY",
    "Interface",
    "array_interface",
    "dlpack_device_type",
    "dlpack_only",
    "native_array",
    "not_data",
    "pointer_device",
    "pointer_range",
    "read_interface",
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


#: pointer -> (start, size) of the driver's allocation holding it, or None when the driver cannot tell.
_RANGE_OF: dict[int, tuple[int, int] | None] = {}


def _driver_range(ptr: int) -> tuple[int, int] | None:
    cu = _driver()
    if cu is None:
        return None
    attributes = cu.CUpointer_attribute
    err, start = cu.cuPointerGetAttribute(attributes.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr)
    if err != cu.CUresult.CUDA_SUCCESS:
        return None
    err, size = cu.cuPointerGetAttribute(attributes.CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr)
    return (int(start), int(size)) if err == cu.CUresult.CUDA_SUCCESS else None


def pointer_range(ptr: int, *, fresh: bool = False) -> tuple[int, int] | None:
    """(start, size) of the driver's allocation that holds ``ptr`` (cached per pointer; ``fresh``
    asks again: memory freed and allocated anew at that address may be another size), None when
    the driver cannot tell (no driver, memory it does not map)."""
    if not ptr:
        return None
    if fresh or ptr not in _RANGE_OF:
        if len(_RANGE_OF) >= _DEVICE_CACHE:
            _RANGE_OF.clear()
        _RANGE_OF[ptr] = _driver_range(ptr)
    return _RANGE_OF[ptr]


# --- __cuda_array_interface__ dicts -------------------------------------------------

#: Interface versions read here: 0 to 3 (2 added ``mask``, 3 ``stream``); a later version may
#: carry semantics this reader would ignore.
INTERFACE_VERSIONS = (0, 1, 2, 3)
#: Most bytes an interface may claim to span (larger claims are not memory; sizes then fit int64).
MAX_INTERFACE_BYTES = 2**62
#: Most dimensions (NumPy's limit).
MAX_DIMS = 64


class Interface(NamedTuple):
    """The checked facts of one ``__cuda_array_interface__``: ``strides`` None means C-contiguous."""

    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None
    ptr: int
    readonly: bool
    device: int | None


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _ints(value: Any, length: int | None = None) -> tuple[int, ...] | None:
    if not isinstance(value, (tuple, list)) or not all(_is_int(n) for n in value):
        return None
    return tuple(int(n) for n in value) if length is None or len(value) == length else None


#: typestr -> dtype, once read (a hot path for libraries without attributes the reader trusts).
_DTYPES: dict[str, np.dtype] = {}


def _dtype(typestr: Any) -> np.dtype | None:
    hit = _DTYPES.get(typestr) if isinstance(typestr, str) else None
    if hit is None and isinstance(typestr, str) and typestr:
        try:
            hit = np.dtype(typestr)
        except (TypeError, ValueError):
            return None
        if hit.hasobject or hit.itemsize == 0 or not_data(hit):  # host objects, no bytes, dates, text
            return None
        _DTYPES[typestr] = hit
    return hit


def not_data(dtype: np.dtype) -> str | None:
    """Why ``dtype``'s elements are not data the canary reads (dates, durations, text, records),
    else None. Numbers, booleans and opaque fixed-size types (bfloat16, float8) are data; object
    arrays are left to the checks that name them (a dtype mismatch, KVC-R010)."""
    kind = dtype.kind
    if kind in "biufcO":
        return None
    if kind in "Mm":
        return "dates and durations"
    if kind in "US":
        return "text"
    return "records" if dtype.fields is not None or dtype.subdtype is not None else None


def read_interface(function: str, argument: str, array: Any, cai: dict) -> Interface:
    """The facts of ``array``'s interface dict ``cai``, every field checked (KVC-C001 otherwise).

    Read: ``version`` (0 to 3), ``shape`` (ints >= 0), ``typestr`` (a NumPy type string of a
    fixed-size, object-free dtype), ``strides`` (None or one int per axis), ``data`` (pointer in
    ``[0, 2**64)``, read-only flag), ``mask`` (must be None: masked elements would be read as data),
    ``stream`` (None or a handle >= 1: 0 is not allowed). The bytes the elements span must fit
    in :data:`MAX_INTERFACE_BYTES`, start at a non-null pointer when there are any, lie in the
    driver's allocation at that pointer (where the driver can tell) and be device memory.
    """

    def refuse(why: str):
        got = f"{type(array).__name__} whose __cuda_array_interface__ {why}"
        raise error("KVC-C001", function=function, argument=argument, got=got)

    version = cai.get("version")
    if not _is_int(version) or version not in INTERFACE_VERSIONS:
        refuse(f"has version {version!r} (this reader knows 0 to 3)")
    shape = _ints(cai.get("shape"))
    if shape is None or len(shape) > MAX_DIMS or any(n < 0 for n in shape):
        refuse(f"has shape {cai.get('shape')!r}")
    dtype = _dtype(cai.get("typestr"))
    if dtype is None:
        refuse(f"has typestr {cai.get('typestr')!r} (a NumPy type string of plain data)")
    strides = cai.get("strides")
    if strides is not None:
        strides = _ints(strides, len(shape))
        if strides is None:
            refuse(f"has strides {cai.get('strides')!r} for shape {shape}")
    data = cai.get("data")
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        refuse(f"has data {data!r} (expected (pointer, read_only))")
    ptr, readonly = data
    ptr = 0 if ptr is None else ptr
    if not _is_int(ptr) or not 0 <= ptr < 2**64:
        refuse(f"has data pointer {ptr!r}")
    if not isinstance(readonly, (bool, np.bool_)) and not (_is_int(readonly) and readonly in (0, 1)):
        refuse(f"has read-only flag {readonly!r}")
    if cai.get("mask") is not None:
        refuse("has a mask (masked elements would be read as data)")
    stream = cai.get("stream")
    if stream is not None and not (_is_int(stream) and stream >= 1):
        refuse(f"has stream {stream!r} (None or a handle >= 1)")
    ptr = int(ptr)
    if strides is None:  # C-contiguous: the elements' bytes, none when empty
        lo, hi = ptr, ptr + math.prod(shape) * dtype.itemsize
    else:
        lo, hi = _overlap.bounds(ptr, shape, strides, dtype.itemsize)
    if hi - lo > MAX_INTERFACE_BYTES or lo < 0 or hi > 2**64:
        refuse(f"spans bytes [{lo:#x}, {hi:#x}), which no memory does")
    if hi > lo and not ptr:
        refuse("has a null data pointer for a non-empty array")
    device = pointer_device(ptr)
    if device == NOT_DEVICE_MEMORY:
        refuse(f"points at {ptr:#x}, which is not CUDA device memory")
    held = pointer_range(ptr) if hi > lo else None
    if held is not None and not held[0] <= lo < hi <= held[0] + held[1]:
        held = pointer_range(ptr, fresh=True)  # the cached answer may be of memory since freed
    if held is not None and not held[0] <= lo < hi <= held[0] + held[1]:
        start, end = held[0], held[0] + held[1]
        refuse(f"spans bytes [{lo:#x}, {hi:#x}) but the allocation at {ptr:#x} is [{start:#x}, {end:#x})")
    return Interface(shape, dtype, strides, ptr, bool(readonly), device)


def array_interface(function: str, argument: str, array: Any) -> Interface | None:
    """:func:`read_interface` of ``array.__cuda_array_interface__``; None when ``array`` has none.

    KVC-C001 when reading it raises (a PyTorch tensor that requires grad), when it is not a
    dict, or when the object's ``shape`` is not the interface's (the launch glue sizes its grids
    from ``shape``).
    """
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:  # none (a PyTorch CPU tensor has the property and says so this way)
        return None
    except Exception as exc:  # noqa: BLE001 - e.g. a PyTorch tensor that requires grad refuses to export
        raise _refused(function, argument, array, "__cuda_array_interface__", exc) from None
    if cai is None:
        return None
    if not isinstance(cai, dict):
        got = f"{type(array).__name__} whose __cuda_array_interface__ is a {type(cai).__name__}, not a dict"
        raise error("KVC-C001", function=function, argument=argument, got=got)
    facts = read_interface(function, argument, array, cai)
    try:
        shape = tuple(int(n) for n in array.shape)
    except Exception:  # noqa: BLE001 - no shape, or one that is not a sequence of ints
        shape = None
    if shape != facts.shape:
        got = f"{type(array).__name__} whose shape {shape} is not its interface's {facts.shape}"
        raise error("KVC-C001", function=function, argument=argument, got=got)
    return facts


# --- DLPack-only objects ---------------------------------------------------------


def dlpack_only(x: Any) -> bool:
    """True for an object with ``__dlpack__`` and ``__dlpack_device__`` but no CUDA array interface
    (NumPy arrays, which have both, are read directly). An interface that raises anything but
    AttributeError counts as present (reading it is then refused with its error)."""
    if isinstance(x, np.ndarray):
        return False
    try:
        return (
            hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__") and not hasattr(x, "__cuda_array_interface__")
        )
    except Exception:  # noqa: BLE001 - a property that raises (a PyTorch tensor requiring grad)
        return False


def _refused(function: str, argument: str, x: Any, what: str, exc: BaseException):
    got = f"{type(x).__name__} whose {what} raised {type(exc).__name__}: {str(exc)[:160]}"
    return error("KVC-C001", function=function, argument=argument, got=got)


def dlpack_device_type(function: str, argument: str, x: Any) -> int:
    """The DLPack device type ``x.__dlpack_device__()`` names (KVC-C001 when it raises or its
    answer is not a (device type, device id) pair of ints)."""
    try:
        answer = x.__dlpack_device__()
    except Exception as exc:  # noqa: BLE001 - any failure of the producer is its refusal
        raise _refused(function, argument, x, "__dlpack_device__()", exc) from None
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(_is_int(v) for v in answer):
        got = f"{type(x).__name__} whose __dlpack_device__() answered {answer!r}"
        raise error("KVC-C001", function=function, argument=argument, got=got)
    return int(answer[0])


def native_array(function: str, argument: str, x: Any):
    """A view of DLPack-only ``x`` (same memory): NumPy for host memory, CuPy for CUDA memory.

    The view holds its producer's memory (through the capsule) for as long as it lives. A
    producer whose export raises (a PyTorch tensor that requires grad), answers with something
    that is not a DLPack capsule, or names another device than its capsule is refused (KVC-C001).
    """
    device_type = dlpack_device_type(function, argument, x)
    if device_type == KDL_CPU:
        try:
            return np.from_dlpack(x)
        except Exception as exc:  # noqa: BLE001 - NumPy's own refusal of the capsule, or the producer's
            raise _refused(function, argument, x, "__dlpack__()", exc) from None
    if device_type in (KDL_CUDA, KDL_CUDA_MANAGED):
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
        try:
            return cupy.from_dlpack(x)
        except Exception as exc:  # noqa: BLE001 - CuPy's own refusal of the capsule, or the producer's
            raise _refused(function, argument, x, "__dlpack__()", exc) from None
    raise error(
        "KVC-C001",
        function=function,
        argument=argument,
        got=f"{type(x).__name__} on DLPack device type {device_type}",
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
