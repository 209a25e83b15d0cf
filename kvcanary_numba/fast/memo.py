"""Validation results remembered per argument snapshot, so a repeated public call skips its checks.

A *snapshot* of a call's arguments is a hashable tuple holding everything the validation of that call reads
and nothing that keeps a user object alive:

- an array's layout: shape, byte strides, dtype, a CUDA array's pointer (its device follows), writeability;
- for an array held by a context, plan or source (long-lived by design) also a per-object *token*: a number
  given to a live object on first sight and forgotten (weak-reference callback) when it is freed, so an array
  freed and replaced at the same address gets a new token. NumPy pointers are not read (``ctypes.data`` costs
  microseconds); the token stands for them, since a live NumPy array's memory does not move;
- a dataclass (CanaryContext, VerifyPlan, WritePlan, RealKvSource): its type and its fields' snapshots; tuples
  and lists element-wise; scalars as (type, value).

Two calls with equal snapshots pass or fail validation alike, so :class:`Memo` stores the snapshots (and a
small result) of calls that passed; the one exception is whether top-level NumPy arrays share memory (their
addresses are not in the snapshot), which :mod:`.overlap` re-tests on every hit. Anything the walk does not
know raises :class:`Uncacheable`: the call is validated in full. Array-like objects that cannot be weakly
referenced are never cached at depth.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._runtime import imported
from .dlpack import native_array, native_views
from .overlap import recheck_for
from .tokens import TOKENS, Uncacheable, token

__all__ = ["Entry", "Memo", "Uncacheable", "checked", "snapshot", "token"]


# --- per-type walkers: (value, depth, state) -> hashable ---------------------------
# ``state`` is a one-item list holding a dict: id(DLPack-only producer) -> the view the
# snapshot read it through (the wrapper hands those views on, without exporting again).


def _numpy(x, depth, state):
    if depth == 0:
        return (x.shape, x.strides, x.dtype, x.flags.writeable)
    hit = TOKENS.get(id(x))  # token(x), inlined: this is the hot path
    return (hit[1] if hit is not None and hit[0]() is x else token(x), x.shape, x.strides, x.dtype, x.flags.writeable)


def _numpy_subclass(x, depth, state):
    # The type is part of it: validation refuses some subclasses (masked arrays) that a plain
    # array of the same layout passes.
    return (type(x), *_numpy(x, depth, state))


def _cupy(x, depth, state):
    return (x.data.ptr, x.shape, x.strides, x.dtype)


_ABSENT = type("_Absent", (), {})  # stands for cupy.ndarray before CuPy is imported: no value has this type
_inlined_cupy: type = _ABSENT  # what snapshot() inlines like NumPy's: cupy.ndarray once one was registered


def _cupy_array_type() -> type:
    return getattr(imported("cupy"), "ndarray", _ABSENT)


def _torch(x, depth, state):
    if not x.is_cuda:  # a CPU tensor is read through DLPack, as a NumPy view
        return _dlpack(x, depth, state)
    return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.requires_grad)


def _numba(x, depth, state):
    # A Numba device array's interface dict is rebuilt (and its contiguity re-derived) on
    # every read; its attributes give the same facts for a fraction of the cost.
    data = x.gpu_data
    layout = (int(data.device_pointer) if data is not None else 0, x.shape, x.strides, x.dtype)
    return layout if depth == 0 else (token(x), *layout)


def _cai(x, depth, state):
    # Every field validation reads (version, mask, stream too); a dict it cannot read is validated in full.
    try:
        cai = x.__cuda_array_interface__
        strides = cai.get("strides")
        layout = (
            tuple(cai["data"]),
            tuple(cai["shape"]),
            None if strides is None else tuple(strides),
            cai["typestr"],
            cai.get("version"),
            cai.get("mask") is None,
            cai.get("stream"),
            tuple(x.shape),
        )
        hash(layout)
    except Exception:  # noqa: BLE001 - missing fields, unhashable values, an interface that raises
        raise Uncacheable(type(x).__name__) from None
    return layout if depth == 0 else (token(x), *layout)


def _dlpack(x, depth, state):
    view = state[0][id(x)] = native_array("snapshot", "array", x)
    # The producer's token stands for its identity (NumPy / CuPy views are new objects every call).
    return (token(x) if depth else None, _walk(view, 0, state))


def _scalar(x, depth, state):
    return (type(x), x)


def _none(x, depth, state):
    return None


def _sequence(x, depth, state):
    return (type(x), *[_walk(item, depth + 1, state) for item in x])


_WALKERS: dict[type, Callable] = {np.ndarray: _numpy, type(None): _none, tuple: _sequence, list: _sequence}
#: Types whose snapshot is ``(type, value)`` (walkers inline it: scalars are a call's other half).
_SCALARS: set[type] = {bool, int, float, str, np.bool_, np.int32, np.int64}
for _t in _SCALARS:
    _WALKERS[_t] = _scalar


#: Straight-line snapshot of a NumPy array held at depth > 0 (what :func:`_numpy` returns there),
#: inlined into generated walkers: NumPy arrays are most of what a call holds.
_NUMPY_AT_DEPTH = (
    "(h[1] if (h := _tget(id(v))) is not None and h[0]() is v else _token(v), "
    "v.shape, v.strides, v.dtype, v.flags.writeable)"
)
_CUPY_INLINE = "(v.data.ptr, v.shape, v.strides, v.dtype)"  #: _cupy's snapshot, inlined in the same way


def _dataclass_walker(cls: type) -> Callable:
    # Generated straight-line code (one attribute read, and for a NumPy array no call, per field):
    # a loop over the fields costs twice as much, and contexts are walked on every call.
    lines = ["def walk(x, depth, state):", "    d = depth + 1"]
    names = [f.name for f in dataclasses.fields(cls)]
    for i, name in enumerate(names):
        lines += [
            f"    v = x.{name}",
            "    t = type(v)",
            f"    s{i} = {_NUMPY_AT_DEPTH} if t is _ndarray else {_CUPY_INLINE} if t is _cupy_t else (t, v) "
            f"if t in _scalars else None if v is None else (_get(t) or _walker(v))(v, d, state)",
        ]
    lines.append(f"    return (cls, {''.join(f's{i}, ' for i in range(len(names)))})")
    scope = {
        "cls": cls,
        "_get": _WALKERS.get,
        "_walker": _register,
        "_ndarray": np.ndarray,
        "_tget": TOKENS.get,
        "_token": token,
        "_scalars": _SCALARS,
        "_cupy_t": _cupy_array_type(),
    }
    exec("\n".join(lines) + "\n", scope)  # noqa: S102 - field names come from the dataclass definition
    return scope["walk"]


def _is_numba_device_array(cls: type) -> bool:
    # ``gpu_data`` is an instance attribute; the class marks itself with ``__cuda_ndarray__``.
    # The simulator's arrays carry the mark too but hold a NumPy array, not a device pointer.
    module = cls.__module__
    return (
        module.split(".")[0] in ("numba", "numba_cuda")
        and "simulator" not in module
        and getattr(cls, "__cuda_ndarray__", False) is True
        and hasattr(cls, "__cuda_array_interface__")
    )


def _walker_for(cls: type) -> Callable:
    if cls is np.ndarray:
        return _numpy
    if issubclass(cls, np.ndarray):
        return _numpy_subclass
    root = cls.__module__.split(".")[0]
    if root == "cupy" and hasattr(cls, "data"):
        return _cupy
    if root == "torch" and hasattr(cls, "data_ptr"):
        return _torch
    if _is_numba_device_array(cls):
        return _numba
    if dataclasses.is_dataclass(cls):
        return _dataclass_walker(cls)
    if issubclass(cls, (int, np.integer)):  # IntEnum members (tags, modes), other ints
        return _scalar
    if hasattr(cls, "__cuda_array_interface__"):
        return _cai
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        return _dlpack
    raise Uncacheable(cls.__name__)


def _register(x) -> Callable:
    global _inlined_cupy
    walker = _WALKERS[type(x)] = _walker_for(type(x))
    if walker is _scalar:
        _SCALARS.add(type(x))
    elif walker is _cupy and type(x) is _cupy_array_type():  # snapshot() inlines it from now on
        _inlined_cupy = type(x)
    return walker


def _walk(x, depth, state):
    return (_WALKERS.get(type(x)) or _register(x))(x, depth, state)


def snapshot(values: tuple) -> tuple[tuple, dict]:
    """(snapshot of ``values``, {id(DLPack-only producer): its view}, empty if none); may raise Uncacheable."""
    state, out, cupy_t = [{}], [], _inlined_cupy
    for v in values:  # a loop, with top-level NumPy arrays and None inlined: this runs on every call
        kind = type(v)
        if kind is np.ndarray:
            out.append((v.shape, v.strides, v.dtype, v.flags.writeable))  # _numpy at depth 0
        elif kind is cupy_t:
            out.append((v.data.ptr, v.shape, v.strides, v.dtype))  # _cupy
        elif kind in _SCALARS:
            out.append((kind, v))
        elif v is None:
            out.append(None)
        else:
            out.append((_WALKERS.get(kind) or _register(v))(v, 0, state))
    return tuple(out), state[0]


class Entry:
    """What a memo remembers of a call that passed: its backend, how often the snapshot came back,
    the shared-memory test a hit still owes (``overlap``: a :class:`.overlap.Recheck` or None) and,
    on a GPU, the call's launches packed for replay (a LaunchTable) with ``where`` they are valid:
    (stream, device, glue launch state); see :func:`.replay.run_launches`."""

    __slots__ = ("kind", "hits", "launches", "where", "overlap")

    def __init__(self, kind: str, overlap: Callable[[dict], None] | None = None):
        self.kind, self.hits, self.launches, self.where, self.overlap = kind, 0, None, None, overlap


class Memo:
    """Snapshots of calls that passed validation, with an :class:`Entry` each (bounded, oldest out).

    The last snapshot found is compared first: a serving loop repeats one call, and comparing two
    equal snapshots is cheaper than hashing one (a snapshot's hash is not cached). Several host
    threads may share a memo: the last hit is one (snapshot, entry) pair, replaced whole, and
    entries are added and evicted under a lock.
    """

    __slots__ = ("_hits", "size", "_last", "_adding")

    def __init__(self, size: int = 1024):
        self._hits: dict[tuple, Any] = {}
        self.size = size
        self._last: tuple[tuple | None, Any] = (None, None)
        self._adding = threading.Lock()

    def get(self, key: tuple | None):
        if key is None:
            return None
        last = self._last
        if key == last[0]:
            return last[1]
        hit = self._hits.get(key)
        if hit is not None:
            self._last = (key, hit)
        return hit

    def put(self, key: tuple | None, result: Any) -> None:
        if key is None:
            return
        with self._adding:
            if len(self._hits) >= self.size:
                oldest = next(iter(self._hits))
                if oldest == self._last[0]:
                    self._last = (None, None)
                del self._hits[oldest]
            self._hits[key] = result

    def clear(self) -> None:
        with self._adding:
            self._hits.clear()
            self._last = (None, None)


def checked(
    function: str,
    memo: Memo,
    validate: Callable[..., tuple],
    kwargs: dict,
    backend: str,
    value_checks: Callable[[dict], None] | None = None,
) -> tuple[Entry, dict]:
    """Validate ``kwargs`` unless their snapshot passed before; returns the snapshot's :class:`Entry`
    and the arguments to run with (DLPack-only arrays as NumPy views or :class:`.dlpack.DlpackView`).

    ``validate(backend=..., **kwargs)`` is the core operation's: it raises the call's coded
    errors or returns the backend and every array of the call. On a memo hit two checks still
    run: ``value_checks(kwargs)``, the checks of ``validate`` that read array contents (a
    snapshot knows layouts, not contents), and the shared-memory test of the arrays whose
    addresses the snapshot does not hold (:mod:`.overlap`).
    """
    try:
        key, views = snapshot((*kwargs.values(), backend))
        dlpack = bool(views)
    except Exception:  # noqa: BLE001 - Uncacheable, or an object that fails to describe itself: validated in full
        key, views, dlpack = None, None, True
    if dlpack:
        kwargs = {name: native_views(value, function, name, views) for name, value in kwargs.items()}
    entry = memo.get(key)
    if entry is None:
        kind, arrays = validate(backend=backend, **kwargs)
        entry = Entry(kind, recheck_for(function, arrays))
        memo.put(key, entry)
        return entry, kwargs
    entry.hits += 1
    if value_checks is not None:
        value_checks(kwargs)
    if entry.overlap is not None:
        entry.overlap(kwargs)
    return entry, kwargs
