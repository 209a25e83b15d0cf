"""Argument validation: arrays, scalars, the backend of a call and its ``stream=``.

Works on NumPy arrays, on any object exposing ``__cuda_array_interface__``
(CuPy, Numba device arrays, PyTorch tensors, JAX arrays: v2 and v3) and on
DLPack-only objects, without importing any of those libraries. The device of
a CUDA array comes from its pointer (:func:`._interop.pointer_device`); a
read-only interface (``data=(ptr, True)``) makes the array an input only.
Every check raises a registered :class:`~kvcanary_numba.errors.KvCanaryError`.

The backend of a call follows its arrays: NumPy arrays run the NumPy
reference, CUDA arrays the ``@cuda.jit`` kernels (which need numba-cuda:
:mod:`._runtime`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np

from . import _interop, _overlap
from ._runtime import kernels_unavailable, simulator_enabled
from .errors import error

__all__ = [
    "ArrayInfo",
    "BACKEND_NAMES",
    "as_native",
    "check_array",
    "check_bool",
    "check_bundle",
    "check_int",
    "check_type",
    "dtype_label",
    "entry_length",
    "inspect_array",
    "is_c_contiguous",
    "resolve_backend",
    "stream_handle",
]

Backend = Literal["numpy", "cuda"]
BACKEND_NAMES = ("auto", "numpy", "cuda")


class ArrayInfo:
    """What validation needs to know about one array, whatever its library.

    Attributes: ``kind`` ("numpy" | "cuda"), ``shape``, ``dtype``,
    ``c_contiguous``, ``strides`` (bytes), ``writeable``, ``device`` (CUDA
    device id or None), ``ptr`` (data address, read only when asked for:
    NumPy's ``ctypes.data`` alone costs several microseconds) and ``output``
    (the call writes it: :func:`check_array` with ``writeable=True``).
    """

    __slots__ = ("kind", "shape", "dtype", "c_contiguous", "strides", "writeable", "device", "output", "_ptr", "_array")

    def __init__(
        self,
        kind: Backend,
        shape: tuple[int, ...],
        dtype: np.dtype,
        c_contiguous: bool,
        strides: tuple[int, ...],
        ptr: int | None,
        writeable: bool,
        device: int | None,
        array: Any = None,
    ):
        self.kind, self.shape, self.dtype, self.c_contiguous = kind, shape, dtype, c_contiguous
        self.strides, self.writeable, self.device, self.output = strides, writeable, device, False
        self._ptr, self._array = ptr, array

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            self._ptr = int(self._array.__array_interface__["data"][0])
            self._array = None
        return self._ptr

    def span(self) -> tuple[int, int]:
        """Bytes ``[lo, hi)`` the elements cover, ``lo == hi`` when empty (:mod:`._overlap`)."""
        if self._array is not None:  # NumPy, address not read yet: a compiled read is cheaper
            return _overlap.host_span(self._array)
        return _overlap.bounds(self.ptr, self.shape, self.strides, self.dtype.itemsize)

    def __repr__(self) -> str:
        return (
            f"ArrayInfo(kind={self.kind!r}, shape={self.shape}, dtype={self.dtype}, "
            f"c_contiguous={self.c_contiguous}, device={self.device})"
        )


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def is_c_contiguous(shape, strides, itemsize) -> bool:
    """Whether an array of this layout is C-contiguous by NumPy's rule (any stride on an extent-1 axis)."""
    if any(extent == 0 for extent in shape):
        return True
    return all(
        extent == 1 or stride == want for extent, stride, want in zip(shape, strides, c_strides(shape, itemsize))
    )


#: Array types read through their attributes instead of ``__cuda_array_interface__``
#: (building that dict is the slow part): type -> True once recognised as CuPy.
_ATTRIBUTE_TYPES: dict[type, bool] = {}


def _is_cupy(array: Any) -> bool:
    kind = type(array)
    hit = _ATTRIBUTE_TYPES.get(kind)
    if hit is None:
        hit = _ATTRIBUTE_TYPES[kind] = kind.__module__.split(".")[0] == "cupy" and hasattr(array, "data")
    return hit


def inspect_array(function: str, argument: str, array: Any) -> ArrayInfo:
    """Describe ``array`` or raise KVC-C001 if it is neither NumPy, CUDA nor DLPack.

    A DLPack-only object is described by its NumPy / CuPy view
    (:func:`._interop.native_array`); the public wrappers hand that view on. A
    ``__cuda_array_interface__`` is read field by field and must agree with the object's
    ``shape`` (:func:`._interop.array_interface`). Masked arrays and matrices are refused.
    """
    if isinstance(array, np.ndarray):
        if type(array) is not np.ndarray:
            _refuse_subclass(function, argument, array)
        if array.dtype.kind not in "biufcO" and _interop.not_data(array.dtype):
            got = f"{type(array).__name__} of dtype {array.dtype} ({_interop.not_data(array.dtype)}, not data)"
            raise error("KVC-C001", function=function, argument=argument, got=got)
        flags = array.flags
        return ArrayInfo(
            "numpy", array.shape, array.dtype, flags.c_contiguous, array.strides, None, flags.writeable, None, array
        )
    if _is_cupy(array):  # same facts as its interface, without building the dict
        return ArrayInfo(
            "cuda",
            array.shape,
            array.dtype,
            array.flags.c_contiguous,
            array.strides,
            array.data.ptr,
            True,
            array.device.id,
        )
    facts = _interop.array_interface(function, argument, array)
    if facts is None:
        if _interop.dlpack_only(array):
            return inspect_array(function, argument, _interop.native_array(function, argument, array))
        raise error("KVC-C001", function=function, argument=argument, got=type(array).__name__)
    shape, dtype = facts.shape, facts.dtype
    if facts.strides is None:  # the interface's way of saying C-contiguous
        strides, contiguous = c_strides(shape, dtype.itemsize), True
    else:
        strides = facts.strides
        contiguous = is_c_contiguous(shape, strides, dtype.itemsize)
    return ArrayInfo("cuda", shape, dtype, contiguous, strides, facts.ptr, not facts.readonly, facts.device)


#: ndarray subclasses whose elements or indexing mean something else than their bytes say.
_REFUSED_SUBCLASSES = {np.ma.MaskedArray: "its mask would be ignored", np.matrix: "it indexes as 2-D"}


def _refuse_subclass(function: str, argument: str, array: np.ndarray) -> None:
    for cls, why in _REFUSED_SUBCLASSES.items():  # other subclasses (np.memmap) are read as arrays
        if isinstance(array, cls):
            got = f"{type(array).__name__} ({why}: pass np.asarray(...) of the data)"
            raise error("KVC-C001", function=function, argument=argument, got=got)


def check_array(
    function: str,
    argument: str,
    array: Any,
    *,
    dtype: np.dtype | type,
    ndim: int,
    shape: tuple[int | None, ...] | None = None,
    shape_of: str | None = None,
    min_len: int | None = None,
    writeable: bool = False,
    contiguous: bool = True,
) -> ArrayInfo:
    """Validate one array argument.

    Parameters
    ----------
    function, argument : str
        Names used in the error message (``<function>: <argument> ...``).
    array : array-like
        NumPy array or ``__cuda_array_interface__`` object.
    dtype : numpy dtype
        Required dtype (KVC-C002).
    ndim : int
        Required number of dimensions (KVC-C003).
    shape : tuple of int or None, optional
        Required extents; ``None`` entries are free (KVC-C004).
    shape_of : str, optional
        The argument ``shape`` was read from, named in the message (a length mismatch may be
        either array's fault).
    min_len : int, optional
        Minimum extent of axis 0 (KVC-C005).
    writeable : bool
        The call writes this array (KVC-C013).

    A CUDA array must also start at a multiple of its item size (KVC-C014).
    contiguous : bool
        Require C-contiguity (KVC-C006).
    """
    info = inspect_array(function, argument, array)
    if info.dtype != dtype:  # dtype == scalar type compares without building a dtype
        want = np.dtype(dtype)
        raise error("KVC-C002", function=function, argument=argument, expected=want.name, got=dtype_label(info.dtype))
    if len(info.shape) != ndim:
        raise error("KVC-C003", function=function, argument=argument, expected=ndim, got=info.shape)
    if shape is not None and any(w is not None and w != g for w, g in zip(shape, info.shape)):
        expected = tuple("*" if w is None else w for w in shape)
        if shape_of is not None:
            expected = f"{expected} (that of {shape_of})"
        raise error("KVC-C004", function=function, argument=argument, expected=expected, got=info.shape)
    if min_len is not None and info.shape[0] < min_len:
        raise error("KVC-C005", function=function, argument=argument, expected=min_len, got=info.shape[0])
    if contiguous and not info.c_contiguous:
        raise error("KVC-C006", function=function, argument=argument, got=info.strides, shape=info.shape)
    if writeable and not info.writeable:
        raise error("KVC-C013", function=function, argument=argument)
    if info.kind == "cuda" and info.ptr % info.dtype.itemsize:  # a kernel's element load would fault
        raise error("KVC-C014", function=function, argument=argument, expected=info.dtype.itemsize, got=info.ptr)
    info.output = writeable  # outputs may share memory with no other array of the call (KVC-C017)
    return info


def dtype_label(dtype: np.dtype) -> str:
    """``dtype``'s name, or its byte-order string when not native (">i8", not "int64")."""
    return dtype.name if dtype.isnative else dtype.str


def check_bool(function: str, argument: str, value: Any) -> bool:
    """Require a real ``bool`` (KVC-C010)."""
    if not isinstance(value, (bool, np.bool_)):
        raise error("KVC-C010", function=function, argument=argument, got=type(value).__name__)
    return bool(value)


def check_int(function: str, argument: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Require an int in ``[low, high]`` (either bound optional) (KVC-C011)."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if ok:
        value = int(value)
        ok = (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        if low is not None and high is not None:
            expected = f"an int in [{low}, {high}]"
        elif low is not None:
            expected = "a positive int" if low == 1 else f"an int >= {low}"
        else:
            expected = f"an int <= {high}" if high is not None else "an int"
        raise error("KVC-C011", function=function, argument=argument, expected=expected, got=value)
    return value


def check_type(function: str, argument: str, value: Any, cls: type) -> None:
    """Require ``value`` (a context, plan or other bundle argument) to be a ``cls`` (KVC-V001)."""
    if not isinstance(value, cls):
        raise error("KVC-V001", function=function, argument=argument, expected=cls.__name__, got=type(value).__name__)


def check_bundle(
    function: str, prefix: str, bundle: Any, specs: list[tuple[str, Any, tuple | None]]
) -> list[tuple[str, ArrayInfo]]:
    """Check the named 1-D arrays of a bundle: ``specs`` = [(field, dtype, shape)], all C-contiguous."""
    arrays = []
    for field, dtype, shape in specs:
        name = f"{prefix}.{field}"
        arrays.append((name, check_array(function, name, getattr(bundle, field), dtype=dtype, ndim=1, shape=shape)))
    return arrays


def entry_length(function: str, argument: str, lengths: dict[str, int], capacity: int | None = None) -> int:
    """The one length of a bundle's entry arrays (``lengths``: field -> length, in field order).

    Raises KVC-C004 naming the array that differs: from ``capacity`` where some array has that
    length, else from the most common length, so that one emptied array is the one named.
    """
    values = list(lengths.values())
    if len(set(values)) == 1:
        return values[0]
    want = capacity if capacity in values else max(values, key=values.count)
    odd = next(field for field, length in lengths.items() if length != want)
    raise error("KVC-C004", function=function, argument=f"{argument}.{odd}", expected=(want,), got=(lengths[odd],))


# --- the backend of a call -----------------------------------------------------------


def resolve_backend(function: str, backend: str, arrays: Iterable[tuple[str, ArrayInfo]]) -> Backend:
    """Pick the backend of one call from its arrays and the ``backend`` argument.

    All arrays must be of one kind (and, for CUDA, one device): KVC-C007.
    ``backend`` is ``"auto"`` (follow the arrays), ``"numpy"`` (NumPy
    references) or ``"cuda"`` (Numba-CUDA kernels; NumPy arrays only under the
    simulator): KVC-C009 / KVC-C008. The kernels need numba-cuda (KVC-C008).
    """
    if backend not in BACKEND_NAMES:
        raise error("KVC-C009", function=function, argument="backend", expected=BACKEND_NAMES, got=backend)
    first_name, first, device_name, device = None, None, None, None
    for name, info in arrays:
        if first is None:
            first_name, first = name, info
        elif info.kind != first.kind:
            raise error(
                "KVC-C007",
                function=function,
                argument=name,
                got=_where(info),
                reference=first_name,
                expected=_where(first),
            )
        if info.device is None:  # NumPy, or a CUDA array whose device is unknown (empty): fits any
            continue
        if device is None:
            device_name, device = name, info
        elif info.device != device.device:
            raise error(
                "KVC-C007",
                function=function,
                argument=name,
                got=_where(info),
                reference=device_name,
                expected=_where(device),
            )
    kind: Backend = "numpy" if first is None else first.kind
    if backend == "numpy" and kind == "cuda":
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason="the arrays are CUDA arrays")
    if backend == "cuda" and kind == "numpy" and not simulator_enabled():
        reason = "NumPy arrays run the kernels only under NUMBA_ENABLE_CUDASIM=1"
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason=reason)
    chosen: Backend = kind if backend == "auto" else backend  # type: ignore[assignment]
    reason = kernels_unavailable() if chosen == "cuda" else None
    if reason is not None:
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason=reason)
    return chosen


def _where(info: ArrayInfo) -> str:
    return info.kind if info.device is None else f"{info.kind}:{info.device}"


# --- streams and DLPack-only arrays --------------------------------------------------


def stream_handle(function: str, stream: Any) -> int | None:
    """CUDA stream handle of a public ``stream=`` argument (KVC-C016).

    ``None`` (CuPy's current stream; the legacy default stream without CuPy) stays None.
    Accepted otherwise: an int handle >= 0 (0: the legacy default stream), an object with
    ``__cuda_stream__`` returning ``(version, handle)``, a CuPy / Numba / PyTorch stream.
    """
    if stream is None:
        return None
    handle = _interop.stream_object_handle(stream)
    if handle is None or handle < 0:
        raise error("KVC-C016", function=function, argument="stream", got=f"{type(stream).__name__} {stream!r}")
    return handle


def as_native(function: str, kwargs: dict) -> dict:
    """``kwargs`` with every DLPack-only array in them (dataclass fields, tuple items) replaced by a
    NumPy or CuPy view of the same memory (:func:`._interop.native_array`); the same dict when there
    is none, so the NumPy path pays one type test per argument."""
    changed = {name: _native(value, function, name) for name, value in kwargs.items()}
    return kwargs if all(changed[name] is kwargs[name] for name in kwargs) else changed


def _native(value: Any, function: str, argument: str):
    if isinstance(value, np.ndarray) or value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for field in dataclasses.fields(value):
            old = getattr(value, field.name)
            new = _native(old, function, f"{argument}.{field.name}")
            if new is not old:
                changes[field.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, (tuple, list)):
        items = [_native(item, function, f"{argument}[{i}]") for i, item in enumerate(value)]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value
    return _interop.native_array(function, argument, value) if _interop.dlpack_only(value) else value
