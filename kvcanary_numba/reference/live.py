"""Live real-KV fingerprints of many slots at once, read as 8-byte words (the moved-records specification).

The fingerprint is the one :mod:`.fingerprint` specifies (and the write kernel stores in a
record's field 3): per source, the slot's first 16 bytes (PARTIAL) or ``read_bytes`` (ALL) as
little-endian u64 words ``w``, folded ``h = splitmix64(h ^ w)`` from 0, and the sources folded
the same way in order. :func:`fold_slots` of that module gathers bytes, which costs an index
per byte; the moved-records operations check up to millions of slots on the host tier, so here
each source is viewed as one run of u64 words and each slot's words are gathered directly.
Every slot starts on a word: row strides and ``num_bytes_per_token`` are multiples of 16 bytes
(checked by :class:`~kvcanary_numba.RealKvSource`). Tests compare the two folds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..constants import PARTIAL_READ_BYTES, SPLITMIX64_MUL1, SPLITMIX64_MUL2, RealKvHashMode

__all__ = ["live_fingerprints", "mix_into", "word_span"]

_WORD = 8
_MUL1, _MUL2 = np.uint64(SPLITMIX64_MUL1), np.uint64(SPLITMIX64_MUL2)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def mix_into(h: np.ndarray, word: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """``h = splitmix64(h ^ word)`` in place on uint64 arrays of one shape (``scratch``: same shape).

    The finalizer of :mod:`._hash` (no golden-ratio increment), written with ``out=`` so that
    millions of slots make no temporary arrays.
    """
    np.bitwise_xor(h, word, out=h)
    with np.errstate(over="ignore"):  # the multiplications wrap on purpose
        np.right_shift(h, _S30, out=scratch)
        h ^= scratch
        h *= _MUL1
        np.right_shift(h, _S27, out=scratch)
        h ^= scratch
        h *= _MUL2
        np.right_shift(h, _S31, out=scratch)
        h ^= scratch
    return h


def word_span(src) -> tuple[np.ndarray, int]:
    """A NumPy source's bytes as 1-D little-endian uint64 words, and its row stride in words.

    The span runs from the first byte of row 0 to the last whole word of the last row
    (rows may be strided: a layer of a larger pool); row ``r`` starts at word
    ``r * row_stride``.
    """
    tensor = src.tensor
    if tensor.flags.c_contiguous and tensor.nbytes % _WORD == 0:  # one plain view: no strided span to build
        return tensor.reshape(-1).view("<u8"), (int(tensor.strides[0]) // _WORD if tensor.shape[0] > 1 else 0)
    table = src.bytes_view()  # uint8 [rows, row_bytes], bytes of a row contiguous
    rows, row_bytes = table.shape
    stride = int(table.strides[0]) if rows > 1 else 0
    total = (rows - 1) * stride + row_bytes if rows and row_bytes else 0
    flat = np.lib.stride_tricks.as_strided(table, shape=(total,), strides=(1,), writeable=False)
    return flat[: total // _WORD * _WORD].view("<u8"), stride // _WORD


def live_fingerprints(real_kv_sources: Sequence, real_kv_hash_mode, slots: np.ndarray) -> np.ndarray:
    """The live fingerprint of each slot, as the write kernel would store it.

    Parameters
    ----------
    real_kv_sources : sequence of RealKvSource
        NumPy sources, folded in this order; each covers every slot of ``slots``.
    real_kv_hash_mode : RealKvHashMode
        NONE (or no source) gives 0 for every slot and reads nothing.
    slots : int64 [n]
        Covered slots only (``0 <= slot < rows * page_size`` of every source).

    Returns
    -------
    uint64 [n]
    """
    slots = np.asarray(slots, dtype=np.int64)
    acc = np.zeros(slots.shape[0], dtype=np.uint64)
    mode = RealKvHashMode(int(real_kv_hash_mode))
    if mode == RealKvHashMode.NONE or not real_kv_sources or slots.shape[0] == 0:
        return acc
    h, scratch = np.empty(slots.shape[0], dtype=np.uint64), np.empty(slots.shape[0], dtype=np.uint64)
    for src in real_kv_sources:
        words, row_stride = word_span(src)
        read_words = (PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(src.read_bytes)) // _WORD
        page_size = int(src.page_size)
        if page_size == 1:
            base = slots * row_stride
        else:
            row, column = np.divmod(slots, page_size)
            base = row * row_stride + column * (int(src.num_bytes_per_token) // _WORD)
        h[...] = 0
        pairs = words[: words.shape[0] // 2 * 2].reshape(-1, 2)  # 16-byte vectors: every slot starts on one
        base //= 2
        for _ in range(read_words // 2):  # lo word, then hi word of each vector: plain word order
            vector = np.take(pairs, base, axis=0)  # one gather brings both words of each slot
            mix_into(h, vector[:, 0], scratch)
            mix_into(h, vector[:, 1], scratch)
            base += 1
        mix_into(acc, h, scratch)
    return acc
