"""What the fast wing adds to the moved-records operations: their launch glue, CPU runs and memo value checks.

On NumPy arrays these operations are the host tier's path (a host copy of moved KV, checked
where it rests), so they run the vectorised specification (:mod:`kvcanary_numba.reference.move`,
``records``, ``digest``), block by block
(:data:`BLOCK_ENTRIES` entries: every temporary array of a block stays in the CPU's cache, where
the hash passes run several times faster than over a million entries) on two threads, which
NumPy's array operations let run at once (they release the GIL). The rows and values are the
specification's: each block computes its entries' rows, and the rows are recorded in entry order.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import digest as _digest, records as _records
from ..reference import digest as reference_digest, move as reference_move, records as reference_records
from ..reference.move import record_in_order
from ..reference.ring import bump

__all__ = [
    "cpu_digest",
    "cpu_gather",
    "cpu_move",
    "cpu_records",
    "cpu_scatter",
    "digest_glue",
    "digest_values",
    "gather_glue",
    "move_glue",
    "records_glue",
    "records_values",
    "scatter_glue",
]

#: Entries per block: the block's uint64 temporaries (a few per entry) fit a core's L2 cache.
BLOCK_ENTRIES = 1 << 15
_THREADS = 2
_POOL: ThreadPoolExecutor | None = None


def _chunks(n: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` blocks of the entries, in order (one empty block for no entry)."""
    return [(lo, min(lo + BLOCK_ENTRIES, n)) for lo in range(0, n, BLOCK_ENTRIES)] or [(0, 0)]


def _map(function: Callable, chunks: list[tuple[int, int]]) -> list:
    global _POOL
    if len(chunks) == 1:
        return [function(*chunks[0])]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="kvcanary-moves")
    return list(_POOL.map(lambda chunk: function(*chunk), chunks))


def _blocks(n: int, rows_of: Callable[[int, int], np.ndarray]) -> list[np.ndarray]:
    """``rows_of(lo, hi)`` of every block (rows numbered within the block), renumbered by entry."""

    def block(lo: int, hi: int) -> np.ndarray:
        rows = rows_of(lo, hi)
        rows[:, 0] += lo
        return rows

    return _map(block, _chunks(n))


def _counted(context, n: int) -> None:
    bump(context.kernel_run_counter, 1)
    bump(context.slot_run_counter, n)


def cpu_gather(*, context, slot_indices, out_records) -> None:
    """:func:`kvcanary_numba.reference.move.gather_canary_records`, block by block on two threads."""
    slots, fields = np.asarray(slot_indices, dtype=np.int64), reference_move.pack_fields(out_records)
    _counted(context, slots.shape[0])
    take = lambda lo, hi: reference_move.take(context, slots[lo:hi], fields[lo:hi], check=True)  # noqa: E731
    record_in_order(context, *_blocks(slots.shape[0], take))


def cpu_scatter(*, context, records, slot_indices) -> None:
    """:func:`kvcanary_numba.reference.move.scatter_canary_records`, block by block on two threads
    (destinations are distinct: the blocks write disjoint records)."""
    slots, fields = np.asarray(slot_indices, dtype=np.int64), reference_move.pack_fields(records)
    _counted(context, slots.shape[0])
    put = lambda lo, hi: reference_move.put(context, fields[lo:hi], slots[lo:hi])  # noqa: E731
    record_in_order(context, *_blocks(slots.shape[0], put))


def cpu_move(*, context, src_slot_indices, dst_slot_indices, scratch_records) -> None:
    """:func:`kvcanary_numba.reference.move.move_canary_records`: every block's gather, then every block's scatter."""
    src, dst = np.asarray(src_slot_indices, dtype=np.int64), np.asarray(dst_slot_indices, dtype=np.int64)
    scratch = reference_move.pack_fields(scratch_records)
    _counted(context, src.shape[0])
    take = lambda lo, hi: reference_move.take(context, src[lo:hi], scratch[lo:hi], check=False)  # noqa: E731
    taken = _blocks(src.shape[0], take)  # every read before the first write
    put = lambda lo, hi: reference_move.put(context, scratch[lo:hi], dst[lo:hi], guard=src[lo:hi])  # noqa: E731
    record_in_order(context, *taken, *_blocks(src.shape[0], put))


def cpu_records(*, context, slot_indices, run_offsets, run_start_positions, run_prev_slots) -> None:
    """:func:`kvcanary_numba.reference.records.verify_canary_records`, its entries in two threads."""
    slots = np.asarray(slot_indices, dtype=np.int64)
    _counted(context, slots.shape[0])
    entries = reference_records.run_entries(slots, run_offsets, run_start_positions, run_prev_slots)
    rows = _map(lambda lo, hi: reference_records.entry_rows(context, slots, *entries, lo, hi), _chunks(slots.shape[0]))
    record_in_order(context, *rows)


def cpu_digest(*, context, slot_indices, run_offsets, out_digests, out_records=None) -> None:
    """:func:`kvcanary_numba.reference.digest.compute_handoff_digest`, its entry hashes in two threads
    (and, given ``out_records``, :func:`cpu_gather` first)."""
    if out_records is not None:
        cpu_gather(context=context, slot_indices=slot_indices, out_records=out_records)
    slots = np.asarray(slot_indices, dtype=np.int64)
    _counted(context, slots.shape[0])
    index = reference_digest.run_index(slots, run_offsets)
    parts = _map(lambda lo, hi: reference_digest.entry_terms(context, slots, index, lo, hi), _chunks(slots.shape[0]))
    reference_digest.finish(context, out_digests, run_offsets, parts)


def gather_glue() -> Callable:
    from ..launch import move as glue

    return glue.gather_canary_records


def scatter_glue() -> Callable:
    from ..launch import move as glue

    return glue.scatter_canary_records


def move_glue() -> Callable:
    from ..launch import move as glue

    return glue.move_canary_records


def records_glue() -> Callable:
    from ..launch import records as glue

    return glue.verify_canary_records


def digest_glue() -> Callable:
    from ..launch import digest as glue

    return glue.compute_handoff_digest


def records_values(kwargs: dict) -> None:
    """The run table's value checks a memo hit still owes (host arrays: KVC-K006, KVC-K007)."""
    n = kwargs["slot_indices"].shape[0]
    _records.check_run_values(_records.FUNCTION, n, kwargs["run_offsets"], kwargs["run_start_positions"])


def digest_values(kwargs: dict) -> None:
    """The run table's value checks a memo hit still owes (host arrays: KVC-K006)."""
    _records.check_run_values(_digest.FUNCTION, kwargs["slot_indices"].shape[0], kwargs["run_offsets"])
