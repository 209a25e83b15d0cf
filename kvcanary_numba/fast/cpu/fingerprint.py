"""The optimised CPU fingerprint: :mod:`kvcanary_numba.reference.fingerprint` compiled for many cores.

For slot ``s`` and one source the fold reads, from the source viewed as bytes,
row ``s // page_size`` at column ``(s % page_size) * num_bytes_per_token``:
16 bytes in PARTIAL mode, ``read_bytes`` in ALL mode. The bytes are packed
into little-endian u64 words ``w`` and folded ``acc = splitmix64(acc ^ w)``
from 0; the per-source folds are combined the same way, in source order.
NONE mode, or no source at all, gives 0 without reading a byte.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import prange

from ..._jit import cpu_jit, run_parallel, twin
from ...constants import PARTIAL_READ_BYTES, RealKvHashMode
from ...context import RealKvSource
from ...hashing import splitmix64_u64

__all__ = ["compute_real_kv_hash", "fold_slots", "slots_covered"]


def slots_covered(real_kv_sources: Sequence[RealKvSource]) -> int:
    """Slots every source has bytes for: ``min(rows * page_size)`` (0 without sources)."""
    # RealKvSource.slots_covered, read without its two property calls (this runs on every launch).
    return min([src.tensor.shape[0] * src.page_size for src in real_kv_sources]) if real_kv_sources else 0


#: Valid ``real_kv_hash_mode`` values as ints (an int test is ~10x cheaper than ``RealKvHashMode(x)``).
_MODES = frozenset(int(m) for m in RealKvHashMode)
_NONE, _PARTIAL = int(RealKvHashMode.NONE), int(RealKvHashMode.PARTIAL)
_LE_U64 = np.dtype("<u8")


def _bytes_per_slot(src: RealKvSource, mode: int) -> int:
    return PARTIAL_READ_BYTES if mode == _PARTIAL else int(src.read_bytes)


def _word_span(src: RealKvSource) -> tuple[np.ndarray, int]:
    """The source's bytes as one 1-D little-endian u64 array, and its row stride in words.

    Rows may be strided (a layer of a larger pool); the span runs from the first
    byte of row 0 to the end of the last row. Row strides and slot offsets are
    multiples of 16 bytes (RealKvSource checks), so every slot starts on a word.
    """
    tensor = src.tensor
    if type(tensor) is np.ndarray and tensor.flags.c_contiguous and tensor.nbytes % 8 == 0:  # one plain view
        return tensor.ravel().view(_LE_U64), (int(tensor.strides[0]) // 8 if tensor.shape[0] > 1 else 0)
    table = src.bytes_view()
    rows, row_bytes = table.shape
    stride = int(table.strides[0]) if rows > 1 else 0
    total = (rows - 1) * stride + row_bytes
    flat = np.lib.stride_tricks.as_strided(table, shape=(total,), strides=(1,), writeable=False)
    return flat[: total // 8 * 8].view(_LE_U64), stride // 8


def _fold_source_loop(words, slots, limit, row_stride, page_size, words_per_token, count, acc):
    # acc[i] = S(acc[i] ^ fold(slot i)) for each covered slot, in one compiled pass:
    # NumPy's address arithmetic, per-word gathers and hash temporaries made this
    # the CPU verify's hot spot. Uncovered slots are skipped (their acc stays 0).
    for i in prange(slots.shape[0]):  # slots are independent: spread over the cores
        slot = slots[i]
        if slot < 0 or slot >= limit:
            continue
        if page_size == 1:
            first = slot * row_stride
        else:
            first = (slot // page_size) * row_stride + (slot % page_size) * words_per_token
        h = np.uint64(0)
        for k in range(count):
            h = splitmix64_u64(h ^ words[first + k])
        acc[i] = splitmix64_u64(acc[i] ^ h)


#: The same loop compiled twice: across the cores, and on one thread for few slots (starting
#: the parallel loop costs more than folding a few slots).
_fold_source_into = cpu_jit(nogil=True, parallel=True)(_fold_source_loop)
_fold_source_serial = cpu_jit(nogil=True)(twin(_fold_source_loop, "_serial"))
#: Slots below which a fold runs on one thread.
SERIAL_FOLD_SLOTS = 1024


def fold_slots(real_kv_sources: Sequence[RealKvSource], real_kv_hash_mode: int, slots: np.ndarray) -> np.ndarray:
    """Multi-source real-KV hash of each slot.

    Parameters
    ----------
    real_kv_sources : sequence of RealKvSource
        Sources with NumPy tensors, folded in this order.
    real_kv_hash_mode : RealKvHashMode or int
        NONE (result 0, nothing read), PARTIAL (16 bytes) or ALL (``read_bytes``).
    slots : int64 [n]
        Slot indices. A slot outside ``[0, slots_covered(real_kv_sources))``
        reads nothing and hashes to 0 (callers pass only covered slots; the
        canary kernels guarantee this through KVC-R007).

    Returns
    -------
    uint64 [n]
        ``real_kv_hash`` bits of each slot.
    """
    slots = np.asarray(slots, dtype=np.int64)
    out = np.zeros(slots.shape[0], dtype=np.uint64)
    mode = int(real_kv_hash_mode)
    if mode not in _MODES:
        RealKvHashMode(mode)  # raises ValueError, as for any value outside the enum
    limit = slots_covered(real_kv_sources)
    if mode == _NONE or limit <= 0 or slots.shape[0] == 0:
        return out  # also keeps empty sources from being viewed at all
    many = slots.shape[0] >= SERIAL_FOLD_SLOTS  # few slots: starting the parallel loop costs more
    for src in real_kv_sources:
        words, row_stride = _word_span(src)
        # Word offsets: slot s starts at (s // page) * row_stride + (s % page) * words_per_token;
        # only its first _bytes_per_slot bytes are read, never the holes.
        page, per_token, count = int(src.page_size), int(src.num_bytes_per_token) // 8, _bytes_per_slot(src, mode) // 8
        args = (words, slots, limit, row_stride, page, per_token, count, out)
        if many:
            run_parallel(_fold_source_into, _fold_source_serial, *args)
        else:
            _fold_source_serial(*args)
    return out


def compute_real_kv_hash(*, real_kv_sources, real_kv_hash_mode, slot_indices, out) -> None:
    """Write the real-KV hash of each slot into ``out`` (see :func:`fold_slots`).

    Parameters
    ----------
    real_kv_sources : tuple of RealKvSource
        At most 4 sources with NumPy tensors.
    real_kv_hash_mode : RealKvHashMode
        NONE, PARTIAL or ALL.
    slot_indices : int64 [n]
        Slots to fingerprint; uncovered or negative slots give 0.
    out : int64 [n]
        Receives the hashes (uint64 bits stored as int64).
    """
    out[...] = fold_slots(real_kv_sources, real_kv_hash_mode, slot_indices).view(np.int64)
