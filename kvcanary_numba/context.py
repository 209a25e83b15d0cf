"""RealKvSource and CanaryContext: what a verify or write launch reads and records into, and their launch-time checks."""

from __future__ import annotations

from dataclasses import dataclass, replace as _replace
from typing import Any

import numpy as np

from . import _interop
from ._runtime import INT32_MAX, MAX_SLOT_STRIDE_BYTES, array_module, coded_allocation
from ._validate import ArrayInfo, check_array, check_int, check_type, inspect_array
from .constants import (
    CANARY_SLOT_BYTES,
    DEFAULT_RING_CAPACITY,
    MAX_REAL_KV_SOURCES,
    NUM_LAUNCH_TAGS,
    REAL_KV_ALIGN_BYTES,
    VIOLATION_FIELDS,
    CanaryLaunchTag,
    RealKvHashMode,
)
from .errors import REGISTRY, KvCanaryError, error

__all__ = ["CanaryContext", "RealKvSource", "check_context", "check_real_kv_sources"]

Arrays = list[tuple[str, ArrayInfo]]
#: Canary fields are 8-byte words; the GPU loads them as such.
_FIELD_ALIGN = 8

_SOURCE = "RealKvSource"


def _geometry_int(value: Any) -> int | None:
    """``value`` as a Python int if it is an int or NumPy integer (bools excluded), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class RealKvSource:
    """One strip of real KV bytes folded into each slot's ``real_kv_hash``.

    For slot ``s`` the fingerprint reads, from ``tensor`` viewed as bytes,
    row ``s // page_size``, columns
    ``(s % page_size) * num_bytes_per_token`` onwards: 16 bytes in PARTIAL
    mode, ``read_bytes`` in ALL mode. Bytes of a row past
    ``page_size * num_bytes_per_token`` ("holes") are never read.

    Attributes
    ----------
    tensor : array, any plain dtype (not object), 2-D [rows, row_elements]
        Live KV memory (a view, never a copy). The last axis must be contiguous;
        rows are strided by a non-negative multiple of 16 bytes (0: broadcast rows).
    page_size : int
        Slots per row, >= 1. NumPy integers are accepted and stored as ``int``;
        bools and floats are not. ``page_size * num_bytes_per_token`` must fit
        the row (exact integer arithmetic, no wrap-around).
    num_bytes_per_token : int
        Bytes of a row per slot; a positive multiple of 16.
    read_bytes : int
        Leading bytes per slot folded in ALL mode; a multiple of 16 in
        ``(0, num_bytes_per_token]``.

    Raises
    ------
    KvCanaryError
        KVC-R001 … KVC-R006, KVC-R010, KVC-C001, KVC-C014.
    """

    tensor: Any
    page_size: int
    num_bytes_per_token: int
    read_bytes: int

    def __post_init__(self) -> None:
        # Geometry as Python ints first: NumPy integer products wrap silently and let reads run past the tensor.
        problem = _field_problem(self)
        if problem is not None:
            raise problem
        for name in ("page_size", "num_bytes_per_token", "read_bytes"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if _interop.dlpack_only(self.tensor):  # kept as its NumPy / CuPy view (same memory)
            object.__setattr__(self, "tensor", _interop.native_array(_SOURCE, "tensor", self.tensor))
        problem = _tensor_problem(self, inspect_array(_SOURCE, "tensor", self.tensor))
        if problem is not None:
            raise problem

    @property
    def rows(self) -> int:
        return int(inspect_array(_SOURCE, "tensor", self.tensor).shape[0])  # any array kind, interface-only too

    @property
    def slots_covered(self) -> int:
        """Number of slots this source has bytes for (``rows * page_size``)."""
        return self.rows * int(self.page_size)

    def bytes_view(self):
        """The tensor as a 2-D uint8 array [rows, row_bytes] sharing memory (NumPy or CuPy)."""
        return self.tensor.view(np.uint8)


Problem = KvCanaryError | None


def _field_problem(source: RealKvSource) -> Problem:
    """The error (not raised) of the first integer field ``source`` gets wrong now, or None."""
    page_size = _geometry_int(source.page_size)
    if page_size is None or page_size < 1:
        return error("KVC-R001", function=_SOURCE, got=source.page_size)
    nbt = _geometry_int(source.num_bytes_per_token)
    if nbt is None or nbt <= 0 or nbt % REAL_KV_ALIGN_BYTES:
        return error("KVC-R002", function=_SOURCE, got=source.num_bytes_per_token)
    rb = _geometry_int(source.read_bytes)
    if rb is None or not 0 < rb <= nbt or rb % REAL_KV_ALIGN_BYTES:
        return error("KVC-R003", function=_SOURCE, num_bytes_per_token=nbt, got=source.read_bytes)
    return None


def _tensor_problem(source: RealKvSource, info: ArrayInfo) -> Problem:
    """What of ``source``'s tensor (described by ``info``) breaks the rules, or None (fields: good ints)."""
    if len(info.shape) != 2:
        return error("KVC-R004", function=_SOURCE, got=info.shape)
    if info.dtype.hasobject:
        return error("KVC-R010", function=_SOURCE, got=info.dtype.name)
    page_size, nbt = int(source.page_size), int(source.num_bytes_per_token)
    rows, itemsize, row_bytes = info.shape[0], info.dtype.itemsize, info.shape[1] * info.dtype.itemsize
    if rows and row_bytes:  # an empty tensor is never read: its strides do not matter
        column_ok = info.shape[1] == 1 or info.strides[1] == itemsize
        # Rows may repeat (stride 0, a broadcast view) but never run backwards or off the 16-byte grid.
        row_ok = rows == 1 or (info.strides[0] >= 0 and info.strides[0] % REAL_KV_ALIGN_BYTES == 0)
        if not (column_ok and row_ok):
            return error("KVC-R005", function=_SOURCE, got=info.strides, shape=info.shape, dtype=info.dtype.name)
    if row_bytes < (needed := page_size * nbt):
        return error(
            "KVC-R006", function=_SOURCE, got=row_bytes, page_size=page_size, num_bytes_per_token=nbt, needed=needed
        )
    if rows and row_bytes and info.ptr % REAL_KV_ALIGN_BYTES != 0:
        return error("KVC-C014", function=_SOURCE, argument="tensor", expected=REAL_KV_ALIGN_BYTES, got=info.ptr)
    return None


def _source_problem(function: str, argument: str, source: RealKvSource) -> tuple[Problem, ArrayInfo | None]:
    """The rules ``source`` was built under, on its fields and tensor as they are now (a frozen dataclass
    over an array that is not: ``tensor.shape = ...``, ``object.__setattr__``, memory a library moved).

    Returns (the first rule broken or None, the tensor's description or None). KVC-C001: no array.
    """
    problem = _field_problem(source)
    if problem is not None:
        return problem, None
    if _interop.dlpack_only(source.tensor):  # construction keeps a NumPy / CuPy view; launches read no other
        got = f"{type(source.tensor).__name__} (DLPack only)"
        return error("KVC-C001", function=_SOURCE, argument="tensor", got=got), None
    info = inspect_array(function, f"{argument}.tensor", source.tensor)
    return _tensor_problem(source, info), info


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryContext:
    """Shared launch context of the verify and write kernels.

    Attributes
    ----------
    canary_buf : uint8 [num_slots, stride >= 32]
        One 32-byte record per KV slot (token, position, prev_hash, real_kv_hash).
    kernel_kind : CanaryLaunchTag
        Stamped into field 0 of every violation row this launch records.
    violation_ring : int64 [ring_capacity, 8]
        Fill-once violation rows.
    violation_write_index : int32 [1]
        Rows ever recorded (keeps counting past the capacity).
    slot_run_counter : int64 [1]
        Entries processed (health counter).
    kernel_run_counter : int64 [1]
        Launches run (health counter).
    real_kv_sources : tuple of RealKvSource
        Up to 4 strips of live KV folded into ``real_kv_hash``.
    real_kv_hash_mode : RealKvHashMode
        NONE (no bytes read), PARTIAL (16 bytes) or ALL (``read_bytes``).
    enable_chain_position_assert : int32 [1]
        Device flag gating the write kernel's chain-step position assert.
    """

    canary_buf: Any
    kernel_kind: CanaryLaunchTag
    violation_ring: Any
    violation_write_index: Any
    slot_run_counter: Any
    kernel_run_counter: Any
    real_kv_sources: tuple[RealKvSource, ...] = ()
    real_kv_hash_mode: RealKvHashMode = RealKvHashMode.NONE
    enable_chain_position_assert: Any = None

    @property
    def num_slots(self) -> int:
        return int(self.canary_buf.shape[0])

    @property
    def ring_capacity(self) -> int:
        return int(self.violation_ring.shape[0])

    @classmethod
    def allocate(
        cls,
        *,
        num_slots: int,
        slot_stride_bytes: int = CANARY_SLOT_BYTES,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        kernel_kind: CanaryLaunchTag = CanaryLaunchTag.HEAD_K_FULL,
        real_kv_sources: tuple[RealKvSource, ...] = (),
        real_kv_hash_mode: RealKvHashMode = RealKvHashMode.NONE,
        device: str = "cpu",
    ) -> CanaryContext:
        """Allocate a zeroed canary buffer, ring, write index and counters.

        One canary record per KV slot ``0 .. num_slots - 1`` (the KV pool's rows). Slot 0 is
        SGLang's padding slot: padded tokens write there and verify never checks it, so an
        engine hands out KV slots from 1 (a write that stores a real token in slot 0 warns
        once: ``CanarySlotZeroWarning``). The chain-position assert flag starts at 1 (on), as
        in SGLang.

        Raises
        ------
        KvCanaryError
            KVC-C011 for sizes outside ``[1, 2**31 - 1]`` (stride: ``[32, 4096]``) or a tag / mode
            outside its enum, KVC-C012 for a bad stride, KVC-C015 when the buffers do not fit in
            memory, KVC-R007 … KVC-R009 for sources that are not RealKvSource objects, more than 4
            or too few rows for ``num_slots``; KVC-C009, KVC-C008.
        """
        function = "CanaryContext.allocate"
        num_slots = check_int(function, "num_slots", num_slots, low=1, high=INT32_MAX)
        stride = check_int(function, "slot_stride_bytes", slot_stride_bytes, high=MAX_SLOT_STRIDE_BYTES)
        if stride < CANARY_SLOT_BYTES or stride % 8:
            raise error("KVC-C012", function=function, argument="canary_buf (slot_stride_bytes)", got=stride)
        ring_capacity = check_int(function, "ring_capacity", ring_capacity, low=1, high=INT32_MAX)
        kind = check_int(function, "kernel_kind", kernel_kind, low=0, high=len(CanaryLaunchTag) - 1)
        # Sources must cover every slot (KVC-R007) here already, not at the first launch.
        mode, _ = check_real_kv_sources(function, real_kv_sources, real_kv_hash_mode, num_slots=num_slots)
        xp = array_module(function, device)
        nbytes = num_slots * stride + ring_capacity * VIOLATION_FIELDS * 8
        with coded_allocation(function, "num_slots", num_slots, what="canary buffer and ring", nbytes=nbytes):
            return cls(
                canary_buf=xp.zeros((num_slots, stride), dtype=np.uint8),
                kernel_kind=CanaryLaunchTag(kind),
                violation_ring=xp.zeros((ring_capacity, VIOLATION_FIELDS), dtype=np.int64),
                violation_write_index=xp.zeros(1, dtype=np.int32),
                slot_run_counter=xp.zeros(1, dtype=np.int64),
                kernel_run_counter=xp.zeros(1, dtype=np.int64),
                real_kv_sources=tuple(real_kv_sources),
                real_kv_hash_mode=RealKvHashMode(mode),
                enable_chain_position_assert=xp.ones(1, dtype=np.int32),
            )

    def replace(self, **changes: Any) -> CanaryContext:
        """A copy with some fields changed (e.g. another tag or buffer sharing this ring)."""
        return _replace(self, **changes)


def check_real_kv_sources(
    function: str,
    real_kv_sources: Any,
    real_kv_hash_mode: Any,
    *,
    num_slots: int | None = None,
    slots_of: str = "num_slots",
) -> tuple[RealKvHashMode, Arrays]:
    """Launch-time checks of a source tuple and its mode (shared by verify, write and fingerprint).

    Each source's geometry is checked again (its tensor's shape, strides, dtype and
    pointer, and its fields, as they are now: they may have changed in place since the
    :class:`RealKvSource` was built), then what depends on the launch.

    Parameters
    ----------
    function : str
        Public function named in error messages.
    real_kv_sources : tuple or list of RealKvSource
        At most ``MAX_REAL_KV_SOURCES`` (KVC-R008) RealKvSource objects (KVC-R009).
    real_kv_hash_mode : RealKvHashMode or int
        A member of RealKvHashMode (KVC-C011).
    num_slots : int, optional
        Canary slots the launch may fingerprint; every source must cover them
        (``rows * page_size >= num_slots``, KVC-R007).
    slots_of : str
        What ``num_slots`` was read from, as the KVC-R007 message names it.

    Returns
    -------
    mode : RealKvHashMode
    arrays : list of (name, ArrayInfo)
        The source tensors, to add to the call's backend/device resolution
        (so a source on another device raises KVC-C007).

    Raises
    ------
    KvCanaryError
        KVC-R007, KVC-R008, KVC-R009, KVC-R011 (a source that changed since it was built), KVC-C011,
        KVC-C001.
    """
    if not isinstance(real_kv_sources, (tuple, list)):
        raise error("KVC-R009", function=function, argument="real_kv_sources", got=type(real_kv_sources).__name__)
    if len(real_kv_sources) > MAX_REAL_KV_SOURCES:
        raise error("KVC-R008", function=function, expected=MAX_REAL_KV_SOURCES, got=len(real_kv_sources))
    arrays = []
    for index, source in enumerate(real_kv_sources):
        name = f"real_kv_sources[{index}]"
        if not isinstance(source, RealKvSource):
            raise error("KVC-R009", function=function, argument=name, got=type(source).__name__)
        # Built valid, but its tensor or fields may have changed since (issue "memory that moves").
        problem, info = _source_problem(function, name, source)
        if problem is not None:
            reason = REGISTRY[problem.code].message.format(**problem.fields)
            raise error("KVC-R011", function=function, argument=name, reason=reason, cause=problem.code)
        if num_slots is not None and info.shape[0] * source.page_size < num_slots:
            raise error(
                "KVC-R007",
                function=function,
                index=index,
                rows=info.shape[0],
                page_size=source.page_size,
                got=info.shape[0] * source.page_size,
                needed=num_slots,
                slots_of=slots_of,
            )
        arrays.append((f"{name}.tensor", info))
    mode = check_int(function, "real_kv_hash_mode", real_kv_hash_mode, low=0, high=len(RealKvHashMode) - 1)
    return RealKvHashMode(mode), arrays


def check_context(function: str, context: Any, *, writes_buffer: bool, needs_chain_flag: bool) -> Arrays:
    """Validate a :class:`CanaryContext` for one verify or write launch.

    Parameters
    ----------
    function : str
        Public function named in error messages.
    context : CanaryContext
        ``canary_buf`` uint8 [num_slots >= 1, stride] with stride a multiple of
        8 and >= 32, 8-byte aligned; ``violation_ring`` int64 [N >= 1, 8];
        ``violation_write_index`` int32 [1]; ``slot_run_counter`` and
        ``kernel_run_counter`` int64 [1]; ``enable_chain_position_assert``
        int32 [1] (may be None when ``needs_chain_flag`` is False);
        ``kernel_kind`` a CanaryLaunchTag value; sources and mode as
        :func:`check_real_kv_sources` with coverage of every canary slot.
        All C-contiguous; everything the launch writes must be writeable.
    writes_buffer : bool
        The launch writes ``canary_buf`` (write does, verify does not).
    needs_chain_flag : bool
        The launch reads ``enable_chain_position_assert``.

    Returns
    -------
    list of (name, ArrayInfo)
        Every array of the context, for the backend choice and the shared-memory check.

    Raises
    ------
    KvCanaryError
        KVC-V001, KVC-C001 … KVC-C006, KVC-C011 … KVC-C014, KVC-R007 … KVC-R009.
    """
    check_type(function, "context", context, CanaryContext)
    name = "context.canary_buf"
    buf = check_array(function, name, context.canary_buf, dtype=np.uint8, ndim=2, min_len=1, writeable=writes_buffer)
    stride = buf.shape[1]
    if stride < CANARY_SLOT_BYTES or stride % _FIELD_ALIGN:
        raise error("KVC-C012", function=function, argument=name, got=stride)
    if buf.ptr % _FIELD_ALIGN:
        raise error("KVC-C014", function=function, argument=name, expected=_FIELD_ALIGN, got=buf.ptr)
    check_int(function, "context.kernel_kind", context.kernel_kind, low=0, high=NUM_LAUNCH_TAGS - 1)
    arrays: Arrays = [(name, buf)]
    specs = [
        ("violation_ring", np.int64, (None, VIOLATION_FIELDS)),
        ("violation_write_index", np.int32, (1,)),
        ("slot_run_counter", np.int64, (1,)),
        ("kernel_run_counter", np.int64, (1,)),
    ]
    if needs_chain_flag or context.enable_chain_position_assert is not None:
        specs.append(("enable_chain_position_assert", np.int32, (1,)))
    for field, dtype, shape in specs:
        rules = dict(
            dtype=dtype, ndim=len(shape), shape=shape, min_len=1, writeable=field != "enable_chain_position_assert"
        )
        info = check_array(function, f"context.{field}", getattr(context, field), **rules)
        arrays.append((f"context.{field}", info))
    _, source_arrays = check_real_kv_sources(
        function,
        context.real_kv_sources,
        context.real_kv_hash_mode,
        num_slots=buf.shape[0],
        slots_of="context.canary_buf.shape[0]",
    )
    return arrays + source_arrays
