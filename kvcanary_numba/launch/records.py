"""Launch glue of the records check (:mod:`kvcanary_numba.kernels.records`)."""

from __future__ import annotations

import numpy as np

from ..kernels import records as kernels
from ._launch import block_size, kernel_array, launch, reinterpret, resident_grid
from .context import source_args
from .move import buffer_words, build_of, ring_args

__all__ = ["verify_canary_records"]


def verify_canary_records(
    *, context, slot_indices, run_offsets, run_start_positions, run_prev_slots, stream: int | None = None
) -> None:
    """Queue the check of the runs of ``slot_indices`` on ``stream``.

    Parameters
    ----------
    context : CanaryContext
        The buffer the records rest in (only read), its ring, counters, tag, sources and mode.
    slot_indices : int64 [n]
    run_offsets : int64 [num_runs + 1]
    run_start_positions, run_prev_slots : int64 [num_runs]
    stream : int or None
        CUDA stream handle (None: CuPy's current stream).
    """
    fallback = reinterpret(slot_indices, np.uint64)
    nsrc, spans, params, _ = source_args(context.real_kv_sources, context.real_kv_hash_mode, fallback)
    kernel, signature = build_of(kernels, "verify_records", nsrc)
    block = block_size(kernels.MOVE_THREADS)
    n = max(int(slot_indices.shape[0]), int(run_offsets.shape[0]))  # threads for the entries and the runs
    args = (
        buffer_words(context),
        kernel_array(slot_indices),
        kernel_array(run_offsets),
        kernel_array(run_start_positions),
        kernel_array(run_prev_slots),
        *ring_args(context),
        *spans,
        params,
    )
    launch(kernel, signature, resident_grid(kernel, signature, n, block), block, args, stream)
