"""Hostile stand-ins for arrays, by class, for the array-like tests (issue 33).

Every case is a factory: given the valid NumPy array an argument holds, it returns an object to
pass in its place. Classes:

- ``interface``: ``__cuda_array_interface__`` dicts with fields missing, of the wrong type, lying
  (typestr, strides, pointers, the read-only flag, version, mask, stream), or a property that raises;
- ``dlpack``: ``__dlpack__`` / ``__dlpack_device__`` that raise, return non-capsules or lie about
  the device;
- ``torch``: stand-ins for PyTorch tensors that require grad (both exports refuse, as PyTorch's do);
- ``numpy``: masked arrays, matrices, datetime64 / timedelta64 / object / structured / string dtypes.

:func:`random_interface` draws a hostile interface dict from a seed (the property tests).
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import warnings
from collections.abc import Callable, Iterator

import numpy as np

#: Marks a field :func:`interface` leaves out.
MISSING = object()


class Interface:
    """An object whose ``__cuda_array_interface__`` is ``cai`` (raised instead when an exception) and
    whose ``shape`` is ``shape``; ``keep`` holds the memory the pointer names."""

    def __init__(self, cai, keep=None, shape=None):
        self._cai, self._keep, self.shape = cai, keep, shape

    @property
    def __cuda_array_interface__(self):
        if isinstance(self._cai, BaseException):
            raise self._cai
        return self._cai


def interface(base, *, shape_attribute=MISSING, **changes) -> Interface:
    """A version-3 interface over the memory of ``base`` (NumPy or CuPy, C-contiguous) with
    ``changes`` (``MISSING``: field left out); its ``shape`` attribute is ``base``'s unless given."""
    cai = {"shape": base.shape, "typestr": base.dtype.str, "data": (_ptr(base), False), "strides": None, "version": 3}
    for key, value in changes.items():
        if value is MISSING:
            cai.pop(key, None)
        else:
            cai[key] = value
    return Interface(cai, keep=base, shape=base.shape if shape_attribute is MISSING else shape_attribute)


def _ptr(base) -> int:
    cai = getattr(base, "__cuda_array_interface__", None)
    return cai["data"][0] if cai is not None else base.__array_interface__["data"][0]


def _host(base) -> np.ndarray:
    return base.get() if hasattr(base, "get") else np.asarray(base)


INTERFACE: dict[str, Callable[[np.ndarray], object]] = {
    "no shape": lambda a: interface(a, shape=MISSING),
    "no typestr": lambda a: interface(a, typestr=MISSING),
    "no data": lambda a: interface(a, data=MISSING),
    "no version": lambda a: interface(a, version=MISSING),
    "empty dict": lambda a: Interface({}, shape=a.shape),
    "shape None": lambda a: interface(a, shape=None),
    "shape a string": lambda a: interface(a, shape="abc"),
    "shape an int": lambda a: interface(a, shape=a.shape[0]),
    "shape of floats": lambda a: interface(a, shape=tuple(float(n) + 0.5 for n in a.shape)),
    "shape negative": lambda a: interface(a, shape=(-1,) + a.shape[1:]),
    "shape huge": lambda a: interface(a, shape=(2**62,) + a.shape[1:]),
    "shape past int64": lambda a: interface(a, shape=(2**70,) + a.shape[1:]),
    "shape of strings": lambda a: interface(a, shape=tuple(str(n) for n in a.shape)),
    "shape nested": lambda a: interface(a, shape=(a.shape,)),
    "typestr None": lambda a: interface(a, typestr=None),
    "typestr an int": lambda a: interface(a, typestr=8),
    "typestr empty": lambda a: interface(a, typestr=""),
    "typestr unknown": lambda a: interface(a, typestr="<q9"),
    "typestr object": lambda a: interface(a, typestr="|O"),
    "typestr datetime64": lambda a: interface(a, typestr="<M8[ns]"),
    "typestr timedelta64": lambda a: interface(a, typestr="<m8[ns]"),
    "typestr void": lambda a: interface(a, typestr=f"|V{a.dtype.itemsize}"),
    "typestr structured": lambda a: interface(a, typestr=f"|V{a.dtype.itemsize}", descr=[("x", a.dtype.str)]),
    "typestr unicode": lambda a: interface(a, typestr="<U2"),
    "typestr big-endian": lambda a: interface(a, typestr=a.dtype.newbyteorder(">").str),
    "strides a string": lambda a: interface(a, strides="x"),
    "strides too short": lambda a: interface(a, strides=a.strides[1:]),
    "strides too long": lambda a: interface(a, strides=a.strides + (8,)),
    "strides negative": lambda a: interface(a, strides=tuple(-s for s in a.strides)),
    "strides zero": lambda a: interface(a, strides=(0,) * a.ndim),
    "strides of floats": lambda a: interface(a, strides=tuple(s + 0.5 for s in a.strides)),
    "strides huge": lambda a: interface(a, strides=tuple(2**70 for _ in a.strides)),
    "strides misaligned": lambda a: interface(a, strides=tuple(s + 1 for s in a.strides)),
    "data None": lambda a: interface(a, data=None),
    "data an int": lambda a: interface(a, data=_ptr(a)),
    "data too short": lambda a: interface(a, data=(_ptr(a),)),
    "data too long": lambda a: interface(a, data=(_ptr(a), False, 1)),
    "pointer a string": lambda a: interface(a, data=("0x1000", False)),
    "pointer a float": lambda a: interface(a, data=(float(_ptr(a)), False)),
    "pointer negative": lambda a: interface(a, data=(-4096, False)),
    "pointer past 64 bits": lambda a: interface(a, data=(2**64 + 4096, False)),
    "pointer huge": lambda a: interface(a, data=(2**200, False)),
    "pointer null": lambda a: interface(a, data=(0, False)),
    "pointer None": lambda a: interface(a, data=(None, False)),
    "read-only flag a string": lambda a: interface(a, data=(_ptr(a), "no")),
    "version a string": lambda a: interface(a, version="3"),
    "version negative": lambda a: interface(a, version=-1),
    "version from the future": lambda a: interface(a, version=99),
    "mask given": lambda a: interface(a, mask=interface(np.zeros(a.shape, np.bool_))),
    "stream zero": lambda a: interface(a, stream=0),
    "stream a string": lambda a: interface(a, stream="default"),
    "stream negative": lambda a: interface(a, stream=-2),
    "interface a list": lambda a: Interface([a.shape, a.dtype.str], shape=a.shape),
    "interface None": lambda a: Interface(None, shape=a.shape),
    "interface raises": lambda a: Interface(RuntimeError("no interface today"), shape=a.shape),
    "interface raises KeyError": lambda a: Interface(KeyError("shape"), shape=a.shape),
    "shape attribute lies": lambda a: interface(a, shape_attribute=(2 * a.shape[0],) + a.shape[1:]),
    "no shape attribute": lambda a: interface(a, shape_attribute=None),
}


class DlpackObject:
    """An object that offers only DLPack: ``device()`` answers ``__dlpack_device__``, ``capsule(**kw)``
    answers ``__dlpack__``; either may raise."""

    def __init__(self, device: Callable, capsule: Callable, keep=None):
        self._device, self._capsule, self._keep = device, capsule, keep

    def __dlpack_device__(self):
        return self._device()

    def __dlpack__(self, **kwargs):
        return self._capsule(**kwargs)


def _raise(exc: BaseException) -> Callable:
    def fail(**_):
        raise exc

    return fail


def _foreign_capsule() -> object:
    """A PyCapsule that is not a DLPack tensor (another name)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(id(_foreign_capsule), b"not_a_tensor", None)


def _numpy_capsule(a) -> Callable:
    host = _host(a).copy()  # a host capsule, whatever ``a`` is
    return lambda **kw: host.__dlpack__()


DLPACK: dict[str, Callable[[np.ndarray], object]] = {
    "device raises": lambda a: DlpackObject(_raise(RuntimeError("no device")), _numpy_capsule(a), a),
    "device raises BufferError": lambda a: DlpackObject(_raise(BufferError("gone")), _numpy_capsule(a), a),
    "device not a tuple": lambda a: DlpackObject(lambda: "cpu", _numpy_capsule(a), a),
    "device too short": lambda a: DlpackObject(lambda: (1,), _numpy_capsule(a), a),
    "device of strings": lambda a: DlpackObject(lambda: ("kDLCPU", "0"), _numpy_capsule(a), a),
    "device unknown type": lambda a: DlpackObject(lambda: (99, 0), _numpy_capsule(a), a),
    "device type None": lambda a: DlpackObject(lambda: (None, 0), _numpy_capsule(a), a),
    "device says CUDA, capsule on the host": lambda a: DlpackObject(lambda: (2, 0), _numpy_capsule(a), a),
    "device says managed, capsule on the host": lambda a: DlpackObject(lambda: (13, 0), _numpy_capsule(a), a),
    "capsule raises": lambda a: DlpackObject(lambda: (1, 0), _raise(RuntimeError("export refused")), a),
    "capsule raises BufferError": lambda a: DlpackObject(lambda: (1, 0), _raise(BufferError("read-only")), a),
    "capsule raises TypeError": lambda a: DlpackObject(lambda: (1, 0), _raise(TypeError("bad keyword")), a),
    "capsule an int": lambda a: DlpackObject(lambda: (1, 0), lambda **kw: 12345, a),
    "capsule None": lambda a: DlpackObject(lambda: (1, 0), lambda **kw: None, a),
    "capsule bytes": lambda a: DlpackObject(lambda: (1, 0), lambda **kw: b"dltensor", a),
    "capsule of another kind": lambda a: DlpackObject(lambda: (1, 0), lambda **kw: _foreign_capsule(), a),
    "CUDA capsule raises": lambda a: DlpackObject(lambda: (2, 0), _raise(RuntimeError("export refused")), a),
    "CUDA capsule an int": lambda a: DlpackObject(lambda: (2, 0), lambda **kw: 7, a),
    "CUDA capsule of another kind": lambda a: DlpackObject(lambda: (2, 0), lambda **kw: _foreign_capsule(), a),
}


class _TorchDtype:
    def __repr__(self) -> str:
        return "torch.int64"


def _torch_tensor(a, *, cuda: bool):
    """A stand-in for a PyTorch tensor with ``requires_grad=True`` over ``a``'s memory: as in PyTorch,
    its ``__cuda_array_interface__`` (CUDA) and ``__dlpack__`` refuse while it requires grad."""

    def refuse_interface(self):
        raise RuntimeError(
            "Can't get __cuda_array_interface__ on Variable that requires grad. If gradients aren't "
            "required, use var.detach() to get Variable that doesn't require grad."
        )

    def refuse_dlpack(self, *args, **kwargs):
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")

    members = {
        "__module__": "torch",
        "requires_grad": True,
        "is_cuda": cuda,
        "shape": a.shape,
        "dtype": _TorchDtype(),
        "data_ptr": lambda self: _ptr(a),
        "stride": lambda self: tuple(s // a.itemsize for s in a.strides),
        "__dlpack__": refuse_dlpack,
        "__dlpack_device__": lambda self: (2 if cuda else 1, 0),
    }
    if cuda:
        members["__cuda_array_interface__"] = property(refuse_interface)
    return type("Tensor", (), members)()


TORCH: dict[str, Callable[[np.ndarray], object]] = {
    "CUDA tensor requiring grad": lambda a: _torch_tensor(a, cuda=True),
    "CPU tensor requiring grad": lambda a: _torch_tensor(a, cuda=False),
}


def _same_size(a, kind: str) -> np.ndarray:
    """A host array of ``a``'s shape whose dtype is of ``kind`` (same item size where one exists)."""
    a, size = _host(a), a.dtype.itemsize
    if kind in "Mm":
        return np.zeros(a.shape, f"{kind}8[ns]")
    if kind == "structured":
        return np.zeros(a.shape, [("x", a.dtype)])
    if kind == "O":
        return a.astype(object)
    if kind == "U":
        return np.zeros(a.shape, f"U{max(size // 4, 1)}")
    return np.zeros(a.shape, f"S{size}")


def _matrix(a):
    a = _host(a).copy()
    if a.ndim != 2:
        return np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
    with warnings.catch_warnings():  # NumPy discourages matrices (PendingDeprecationWarning): that is the point
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.asmatrix(a)


NUMPY: dict[str, Callable[[np.ndarray], object]] = {
    "masked array": lambda a: np.ma.masked_array(_host(a).copy(), mask=np.zeros(a.shape, bool)),
    "masked array with a mask": lambda a: np.ma.masked_array(_host(a).copy(), mask=np.ones(a.shape, bool)),
    "matrix (2-D) or masked": _matrix,
    "datetime64": lambda a: _same_size(a, "M"),
    "timedelta64": lambda a: _same_size(a, "m"),
    "object": lambda a: _same_size(a, "O"),
    "structured": lambda a: _same_size(a, "structured"),
    "unicode": lambda a: _same_size(a, "U"),
    "bytes": lambda a: _same_size(a, "S"),
}

#: Class name -> its cases.
CLASSES: dict[str, dict[str, Callable[[np.ndarray], object]]] = {
    "interface": INTERFACE,
    "dlpack": DLPACK,
    "torch": TORCH,
    "numpy": NUMPY,
}

#: Values an interface field may take in :func:`random_interface` (besides the valid one).
_GARBAGE = (None, "", "x", -1, 0, 1, 2**64, 2**200, 1.5, (), (None,), ("1",), (-1,), (2**63,), [], {}, b"\x00")


def random_interface(base: np.ndarray, rng: np.random.Generator) -> Interface:
    """A hostile interface over ``base``: one to three fields left out or replaced by garbage, at
    least one of them a field a reader needs (shape, typestr, data)."""
    keys = ["shape", "typestr", "data", "strides", "version", "mask", "stream"]
    changes = {str(rng.choice(["shape", "typestr", "data"])): None}
    for key in rng.choice(keys, size=int(rng.integers(0, 3)), replace=False):
        changes[str(key)] = None
    for key in changes:
        pick = int(rng.integers(0, len(_GARBAGE) + 1))
        changes[key] = MISSING if pick == len(_GARBAGE) else _GARBAGE[pick]
    return interface(base, **changes)


# --- putting a hostile object in a call's arguments -------------------------------------------------


def array_paths(value, prefix: str = "") -> Iterator[str]:
    """Paths (``context.real_kv_sources[0].tensor``) of every NumPy or CuPy array in ``value``: a
    dict of keyword arguments, dataclass fields, tuple items."""
    if isinstance(value, np.ndarray) or type(value).__module__.split(".")[0] == "cupy":
        yield prefix
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from array_paths(item, key)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from array_paths(getattr(value, field.name), f"{prefix}.{field.name}")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from array_paths(item, f"{prefix}[{i}]")


def _parts(path: str) -> list[str]:
    return re.findall(r"[^.\[\]]+", path)


def at(value, path: str):
    """What ``path`` names in ``value``."""
    for part in _parts(path):
        if isinstance(value, dict):
            value = value[part]
        elif isinstance(value, tuple):
            value = value[int(part)]
        else:
            value = getattr(value, part)
    return value


def replaced(value, path: str, new):
    """``value`` with what ``path`` names replaced by ``new`` (dataclasses rebuilt: a source whose
    tensor is replaced is a new RealKvSource, checked when built)."""
    parts = _parts(path)
    if not parts:
        return new
    head, rest = parts[0], ".".join(parts[1:])
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    if isinstance(value, tuple):
        return tuple(replaced(item, rest, new) if i == int(head) else item for i, item in enumerate(value))
    return dataclasses.replace(value, **{head: replaced(getattr(value, head), rest, new)})


def memory_of(value) -> dict[str, bytes]:
    """Path -> bytes of every array in ``value`` (what a rejected call must leave as it was)."""
    return {path: _host(at(value, path)).tobytes() for path in array_paths(value)}
