"""Specification of the real-KV fingerprint (``kernels/fingerprint.py``).

The chain proves a slot's record is right; the fingerprint, field 3 of the
record, ties the record to the slot's live KV bytes (see
``docs/concepts/fingerprints.md``).

One source
    A :class:`~kvcanary_numba.RealKvSource` viewed as bytes is a table of
    ``rows`` rows. Slot ``s`` lives in row ``s // page_size``, from byte column
    ``(s % page_size) * num_bytes_per_token``. The fold reads the first
    16 bytes there in PARTIAL mode, the first ``read_bytes`` in ALL mode, as
    little-endian u64 words ``w0, w1, ...``, and folds them from 0:
    ``h = splitmix64(h ^ w)``, word after word.
Several sources
    Their folds combine the same way, in source order:
    ``acc = splitmix64(acc ^ fold_source)``, from ``acc = 0``.
No bytes
    NONE mode, or no sources at all: every slot hashes to 0 and nothing is
    read. A slot outside ``[0, slots_covered)``, where ``slots_covered`` is the
    least ``rows * page_size`` of the sources, also hashes to 0 without a read
    (negative slots, padding beyond the pool). The public launches check that
    the sources cover every canary slot (KVC-R007), so verify and write only
    ever fold covered slots.

Exact semantics: ``docs/concepts/semantics.md`` ("Real-KV fingerprint").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..constants import PARTIAL_READ_BYTES, RealKvHashMode
from ._hash import splitmix64_words

__all__ = ["compute_real_kv_hash", "fold_slots", "fold_source", "slots_covered"]


def slots_covered(real_kv_sources: Sequence) -> int:
    """Slots every source has bytes for: the least ``rows * page_size`` (0 without sources)."""
    return min((src.rows * src.page_size for src in real_kv_sources), default=0)


def fold_source(src, read_bytes: int, slots: np.ndarray) -> np.ndarray:
    """The fold of one source's first ``read_bytes`` bytes of each slot.

    Parameters
    ----------
    src : RealKvSource
        A source with a NumPy tensor.
    read_bytes : int
        Bytes read per slot, a positive multiple of 16.
    slots : int64 [n]
        Covered slots only: each in ``[0, src.rows * src.page_size)``.

    Returns
    -------
    uint64 [n]
    """
    table = src.bytes_view()  # uint8 [rows, row_bytes]: any row stride, bytes contiguous
    row = slots // src.page_size
    column = (slots % src.page_size) * src.num_bytes_per_token
    # One row of ``read_bytes`` bytes per slot, then each row as little-endian u64 words.
    slot_bytes = table[row[:, None], column[:, None] + np.arange(read_bytes)]
    words = np.ascontiguousarray(slot_bytes).view("<u8")  # [n, read_bytes // 8]
    h = np.zeros(slots.shape[0], dtype=np.uint64)
    for k in range(words.shape[1]):  # word order: 16-byte vectors, lo word then hi word
        h = splitmix64_words(h ^ words[:, k])
    return h


def fold_slots(real_kv_sources: Sequence, real_kv_hash_mode, slots) -> np.ndarray:
    """Multi-source real-KV hash of each slot.

    Parameters
    ----------
    real_kv_sources : sequence of RealKvSource
        Sources with NumPy tensors, folded in this order.
    real_kv_hash_mode : RealKvHashMode or int
        NONE, PARTIAL or ALL; any other value raises ``ValueError``.
    slots : int64 [n]
        Slot indices; those outside ``[0, slots_covered(real_kv_sources))``
        hash to 0.

    Returns
    -------
    uint64 [n]
        The ``real_kv_hash`` bits of each slot (a new array).
    """
    mode = RealKvHashMode(int(real_kv_hash_mode))
    slots = np.asarray(slots, dtype=np.int64)
    out = np.zeros(slots.shape[0], dtype=np.uint64)
    if mode == RealKvHashMode.NONE or not real_kv_sources:
        return out
    covered = (slots >= 0) & (slots < slots_covered(real_kv_sources))
    if not covered.any():
        return out
    acc = np.zeros(int(covered.sum()), dtype=np.uint64)
    for src in real_kv_sources:
        read_bytes = PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else src.read_bytes
        acc = splitmix64_words(acc ^ fold_source(src, read_bytes, slots[covered]))
    out[covered] = acc
    return out


def compute_real_kv_hash(*, real_kv_sources, real_kv_hash_mode, slot_indices, out) -> None:
    """Write the real-KV hash of each slot into ``out`` (``fingerprint_src<n>`` kernels).

    Parameters
    ----------
    real_kv_sources : tuple of RealKvSource
        At most 4 sources with NumPy tensors.
    real_kv_hash_mode : RealKvHashMode
        NONE, PARTIAL or ALL.
    slot_indices : int64 [n]
        Slots to fingerprint; negative or uncovered slots give 0.
    out : int64 [n]
        Receives the hashes (their uint64 bits stored as int64).
    """
    out[...] = fold_slots(real_kv_sources, real_kv_hash_mode, slot_indices).view(np.int64)
