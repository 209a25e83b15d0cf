"""Launch glue of the record-move kernels (:mod:`kvcanary_numba.kernels.move`).

Called by :mod:`kvcanary_numba.move` with validated arguments: CUDA arrays on a GPU, NumPy
arrays under the simulator. A move within a pool is two launches on one stream: a gather of
the sources into the scratch pack, then a scatter of the pack to the destinations, so every
record is read before any is written.
"""

from __future__ import annotations

import numpy as np

from ..constants import CANARY_FIELDS_PER_SLOT, RealKvHashMode
from ..kernels import move as kernels
from ._launch import block_size, kernel_array, launch, persistent_views, reinterpret, resident_grid
from .context import source_args

__all__ = ["build_of", "gather_canary_records", "move_canary_records", "ring_args", "scatter_canary_records"]


def ring_args(context) -> tuple:
    """The context's ring, write index, slot and kernel counters (persistent views) and tag."""
    views = persistent_views(
        context.violation_ring, context.violation_write_index, context.slot_run_counter, context.kernel_run_counter
    )
    return (*views, int(context.kernel_kind))


def buffer_words(context):
    """The canary buffer as int64 ``[num_slots, stride // 8]``."""
    buf = context.canary_buf
    return reinterpret(buf, np.int64, (buf.shape[0], buf.shape[1] // 8), persistent=True)


def pack_words(records):
    """A pack (uint8 ``[n, 32]``) as int64 ``[n, 4]``."""
    return reinterpret(records, np.int64, (records.shape[0], CANARY_FIELDS_PER_SLOT))


def build_of(module, prefix: str, nsrc: int) -> tuple:
    """(kernel, signature) of ``module``'s ``prefix`` kernel for ``nsrc`` real-KV sources."""
    name = f"{prefix}_src{nsrc}"
    return module.KERNELS[name], module.SIGNATURES[name][0]


def _launch(prefix: str, nsrc: int, n: int, args: tuple, stream) -> None:
    kernel, signature = build_of(kernels, prefix, nsrc)
    block = block_size(kernels.MOVE_THREADS)
    items = n * 4 if nsrc == 0 else n  # without a fold, a thread moves one word of a record
    launch(kernel, signature, resident_grid(kernel, signature, items, block), block, args, stream)


def _gather(context, slot_indices, out_records, *, check: bool, count: int, stream) -> None:
    # Unused source slots get a view of an array the kernel only reads (the simulator copies arguments back).
    fallback = reinterpret(slot_indices, np.uint64)
    mode = context.real_kv_hash_mode if check else RealKvHashMode.NONE
    nsrc, spans, params, _ = source_args(context.real_kv_sources, mode, fallback)
    slots, out = kernel_array(slot_indices), pack_words(out_records)
    args = (buffer_words(context), slots, out, *ring_args(context), count, *spans, params)
    _launch("gather", nsrc, int(slot_indices.shape[0]), args, stream)


def _scatter(context, records, slot_indices, guard, stream) -> None:
    fallback = reinterpret(slot_indices, np.uint64)
    nsrc, spans, params, _ = source_args(context.real_kv_sources, context.real_kv_hash_mode, fallback)
    guarded = guard is not None
    args = (
        buffer_words(context),
        pack_words(records),
        kernel_array(slot_indices),
        kernel_array(guard if guarded else slot_indices),
        int(guarded),
        *ring_args(context),
        *spans,
        params,
    )
    _launch("scatter", nsrc, int(slot_indices.shape[0]), args, stream)


def gather_canary_records(*, context, slot_indices, out_records, stream: int | None = None) -> None:
    """Queue the gather of ``slot_indices``' records into ``out_records`` (uint8 [n, 32]) on ``stream``."""
    _gather(context, slot_indices, out_records, check=True, count=1, stream=stream)


def scatter_canary_records(*, context, records, slot_indices, stream: int | None = None) -> None:
    """Queue the scatter of ``records`` (uint8 [n, 32]) to ``slot_indices`` on ``stream``."""
    _scatter(context, records, slot_indices, None, stream)


def move_canary_records(
    *, context, src_slot_indices, dst_slot_indices, scratch_records, stream: int | None = None
) -> None:
    """Queue a move within the pool: the sources into ``scratch_records``, then the scratch to the destinations."""
    _gather(context, src_slot_indices, scratch_records, check=False, count=0, stream=stream)
    _scatter(context, scratch_records, dst_slot_indices, src_slot_indices, stream)
