"""RealKvSource and CanaryContext: what a verify or write launch reads and records into."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _interop
from ._arrays import check_int, inspect_array
from ._backend import array_module
from ._limits import INT32_MAX, MAX_SLOT_STRIDE_BYTES, coded_allocation
from .constants import (
    CANARY_SLOT_BYTES,
    DEFAULT_RING_CAPACITY,
    REAL_KV_ALIGN_BYTES,
    VIOLATION_FIELDS,
    CanaryLaunchTag,
    RealKvHashMode,
)
from .errors import error

__all__ = ["RealKvSource", "CanaryContext"]

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
        page_size = _geometry_int(self.page_size)
        if page_size is None or page_size < 1:
            raise error("KVC-R001", function=_SOURCE, got=self.page_size)
        nbt = _geometry_int(self.num_bytes_per_token)
        if nbt is None or nbt <= 0 or nbt % REAL_KV_ALIGN_BYTES:
            raise error("KVC-R002", function=_SOURCE, got=self.num_bytes_per_token)
        rb = _geometry_int(self.read_bytes)
        if rb is None or not 0 < rb <= nbt or rb % REAL_KV_ALIGN_BYTES:
            raise error("KVC-R003", function=_SOURCE, num_bytes_per_token=nbt, got=self.read_bytes)
        for name, value in (("page_size", page_size), ("num_bytes_per_token", nbt), ("read_bytes", rb)):
            object.__setattr__(self, name, value)
        if _interop.dlpack_only(self.tensor):  # kept as its NumPy / CuPy view (same memory)
            object.__setattr__(self, "tensor", _interop.native_array(_SOURCE, "tensor", self.tensor, own=True))
        info = inspect_array(_SOURCE, "tensor", self.tensor)
        if len(info.shape) != 2:
            raise error("KVC-R004", function=_SOURCE, got=info.shape)
        if info.dtype.hasobject:
            raise error("KVC-R010", function=_SOURCE, got=info.dtype.name)
        rows, itemsize = info.shape[0], info.dtype.itemsize
        row_bytes = info.shape[1] * itemsize
        if rows and row_bytes:  # an empty tensor is never read: its strides do not matter
            column_ok = info.shape[1] == 1 or info.strides[1] == itemsize
            # Rows may repeat (stride 0, a broadcast view) but never run backwards or off the 16-byte grid.
            row_ok = rows == 1 or (info.strides[0] >= 0 and info.strides[0] % REAL_KV_ALIGN_BYTES == 0)
            if not (column_ok and row_ok):
                raise error("KVC-R005", function=_SOURCE, got=info.strides, shape=info.shape, dtype=info.dtype.name)
        if row_bytes < page_size * nbt:
            raise error(
                "KVC-R006", function=_SOURCE, got=row_bytes, page_size=page_size, num_bytes_per_token=nbt,
                needed=page_size * nbt,
            )  # fmt: skip
        if rows and row_bytes and info.ptr % REAL_KV_ALIGN_BYTES != 0:
            raise error("KVC-C014", function=_SOURCE, argument="tensor", expected=REAL_KV_ALIGN_BYTES, got=info.ptr)

    @property
    def rows(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def slots_covered(self) -> int:
        """Number of slots this source has bytes for (``rows * page_size``)."""
        return self.rows * int(self.page_size)

    def bytes_view(self):
        """The tensor as a 2-D uint8 array [rows, row_bytes] sharing memory (NumPy or CuPy)."""
        return self.tensor.view(np.uint8)


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

        The chain-position assert flag starts at 1 (on), as in SGLang.

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
        from .fingerprint import check_real_kv_sources  # imports this module

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
        return dataclasses.replace(self, **changes)
