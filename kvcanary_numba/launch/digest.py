"""Launch glue of the hand-off digest (:mod:`kvcanary_numba.kernels.digest`): clear, then sum (and gather)."""

from __future__ import annotations

import numpy as np

from ..kernels import digest as kernels
from ..kernels.move import MOVE_THREADS
from ._launch import block_size, kernel_array, launch, persistent_grid, reinterpret, resident_grid
from .context import source_args
from .move import buffer_words, build_of, pack_words, ring_args

__all__ = ["compute_handoff_digest"]


def compute_handoff_digest(
    *, context, slot_indices, run_offsets, out_digests, out_records=None, stream: int | None = None
) -> None:
    """Queue the digests of the runs of ``slot_indices`` into ``out_digests`` on ``stream``.

    Parameters
    ----------
    context : CanaryContext
        The buffer holding the records (only read), its ring, counters, tag, sources and mode.
    slot_indices : int64 [n]
    run_offsets : int64 [num_runs + 1]
    out_digests : int64 [num_runs]
        Zeroed by the first launch, summed into by the second.
    out_records : uint8 [n, 32] or None
        The gather's pack, filled by the second launch (its ``gather_digest`` build).
    stream : int or None
        CUDA stream handle (None: CuPy's current stream).
    """
    n = int(slot_indices.shape[0])
    block = block_size(MOVE_THREADS)
    ring_and_counters = ring_args(context)
    ring, index, _, _, kind = ring_and_counters
    out, offsets = kernel_array(out_digests), kernel_array(run_offsets)
    clear, clear_signature = kernels.KERNELS["digest_clear"], kernels.SIGNATURES["digest_clear"][0]
    grid = persistent_grid(out_digests.shape[0], block)
    launch(clear, clear_signature, grid, block, (out, offsets, n, ring, index, kind), stream)
    fallback = reinterpret(slot_indices, np.uint64)
    nsrc, spans, params, _ = source_args(context.real_kv_sources, context.real_kv_hash_mode, fallback)
    buf = buffer_words(context)
    if out_records is None:
        kernel, signature, pack = *build_of(kernels, "digest", nsrc), buf  # the pack argument goes unused
    else:
        kernel, signature, pack = *build_of(kernels, "gather_digest", nsrc), pack_words(out_records)
    args = (buf, kernel_array(slot_indices), offsets, out, pack, *ring_and_counters, *spans, params)
    launch(kernel, signature, resident_grid(kernel, signature, n, block), block, args, stream)
