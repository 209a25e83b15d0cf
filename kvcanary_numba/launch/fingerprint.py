"""Launch glue for real-KV fingerprints: source arguments shared by verify and
write, and the standalone :func:`compute_real_kv_hash` kernel launch."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..constants import MAX_REAL_KV_SOURCES, PARTIAL_READ_BYTES, RealKvHashMode
from ..kernels import fingerprint as _kernels
from . import _common

__all__ = ["compute_real_kv_hash", "source_args"]

_WORD = 8
_GPU_BLOCK = 256


def _row_stride_words(source) -> int:
    _, shape, strides, _ = _common.array_layout(source.tensor)
    # A single row is never strided over (its row index is always 0).
    return strides[0] // _WORD if shape[0] > 1 else 0


def source_args(sources: Sequence[Any], mode: RealKvHashMode, fallback) -> tuple[int, tuple, tuple, int]:
    """Kernel arguments describing the real-KV sources of one launch.

    Parameters
    ----------
    sources : sequence of RealKvSource
        Validated sources (at most 4), in fold order.
    mode : RealKvHashMode
        NONE folds nothing (no bytes read), PARTIAL 16 bytes, ALL ``read_bytes``.
    fallback : kernel array, uint64 1-D C-contiguous
        Passed for unused source slots (never read). Take a view of an array
        the kernel only reads: the simulator copies each argument in and out,
        so an alias of an output would overwrite it.

    Returns
    -------
    nsrc : int
        Sources to fold (0 in NONE mode): selects the kernel variant.
    spans : tuple of 4 kernel arrays
        ``uint64`` word spans of the sources.
    params : tuple of 16 int
        ``(row_stride, page_size, words_per_token, read_words)`` per source, in words.
    limit : int
        Slots every folded source covers (``min(rows * page_size)``), 0 if none.
    """
    used = tuple(sources) if RealKvHashMode(mode) != RealKvHashMode.NONE else ()
    spans, params, limit = [], [], None
    for source in used[:MAX_REAL_KV_SOURCES]:
        read = PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(source.read_bytes)
        spans.append(_common.byte_span(source.tensor, np.uint64, persistent=True))
        params += [
            _row_stride_words(source),
            int(source.page_size),
            int(source.num_bytes_per_token) // _WORD,
            read // _WORD,
        ]
        covered = int(source.tensor.shape[0]) * int(source.page_size)
        limit = covered if limit is None else min(limit, covered)
    nsrc = len(spans)
    spans += [fallback] * (MAX_REAL_KV_SOURCES - nsrc)
    params += [0] * (4 * (MAX_REAL_KV_SOURCES - nsrc))
    return nsrc, tuple(spans), tuple(params), limit or 0


def compute_real_kv_hash(*, real_kv_sources, real_kv_hash_mode, slot_indices, out) -> None:
    """Fingerprint ``slot_indices`` into ``out`` on the GPU (or the simulator).

    Parameters
    ----------
    real_kv_sources : tuple of RealKvSource
        Up to 4 validated sources, in fold order.
    real_kv_hash_mode : RealKvHashMode
        NONE writes 0 everywhere without reading any source.
    slot_indices : int64 [n]
        Slots to fingerprint; a slot outside ``[0, min(rows * page_size))``
        gets 0 (nothing is read for it).
    out : int64 [n]
        Receives the ``real_kv_hash`` of each slot (uint64 bits as int64).
    """
    slots = _common.kernel_array(slot_indices)
    dest = _common.kernel_array(out)
    fallback = _common.reinterpret(slot_indices, np.uint64)
    nsrc, spans, params, limit = source_args(real_kv_sources, real_kv_hash_mode, fallback)
    name = f"fingerprint_src{nsrc}"
    n = int(slot_indices.shape[0])
    if n == 0:
        return
    block = _common.block_size(_GPU_BLOCK)
    kernel, signature = _kernels.KERNELS[name], _kernels.SIGNATURES[name][0]
    grid = _common.resident_grid(kernel, signature, n, block)
    _common.launch(kernel, signature, grid, block, (slots, dest, limit, *spans, params))
