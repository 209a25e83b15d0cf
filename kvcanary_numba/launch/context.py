"""Kernel arguments that come from a :class:`~kvcanary_numba.CanaryContext`, shared by verify and write.

The kernels take the canary buffer as int64 words, then (after their own arguments) the
ring, write index, counters and tag, and the real-KV sources as four uint64 word spans
plus 16 integers (``row_stride, page_size, words_per_token, read_words`` per source, in
words). A source slot that is not folded gets ``fallback``, a span the kernel never reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..constants import MAX_REAL_KV_SOURCES, PARTIAL_READ_BYTES, RealKvHashMode
from ._launch import array_layout, byte_span, persistent_views, reinterpret

__all__ = ["context_args", "source_args"]

_WORD = 8


def _row_stride_words(source) -> int:
    _, shape, strides, _ = array_layout(source.tensor)
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
    fallback : View, uint64 1-D
        Passed for unused source slots (never read). Take a view of an array the kernel
        only reads: the simulator copies each argument in and out, so an alias of an
        output would overwrite it.

    Returns
    -------
    nsrc : int
        Sources to fold (0 in NONE mode): selects the kernel variant.
    spans : tuple of 4 views
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
        spans.append(byte_span(source.tensor, np.uint64, persistent=True))
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


def context_args(context, fallback) -> tuple[int, Any, tuple]:
    """(``nsrc``, the canary buffer as int64 ``[num_slots, stride // 8]``, the kernels' last arguments:
    ring, write index, slot and kernel counters, tag, the four source spans and the source parameters).

    ``nsrc`` selects the kernel variant; ``fallback``: see :func:`source_args`.
    """
    buf = context.canary_buf
    words = reinterpret(buf, np.int64, (buf.shape[0], buf.shape[1] // 8), persistent=True)
    nsrc, spans, params, _ = source_args(context.real_kv_sources, context.real_kv_hash_mode, fallback)
    tail = (
        *persistent_views(
            context.violation_ring, context.violation_write_index, context.slot_run_counter, context.kernel_run_counter
        ),
        int(context.kernel_kind),
        *spans,
        params,
    )
    return nsrc, words, tail
