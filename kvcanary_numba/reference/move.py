"""Specification of the record moves (``kernels/move.py``): records travel with their KV.

A canary record never names its slot: it holds the token, the position, the chain hash of
its predecessor's record and the fingerprint of its KV bytes. So a record can be taken out
of a pool with its KV, kept anywhere, and put back at other slots, and every check still
holds where it lands (``docs/concepts/moves.md``). Three operations move the 32 record
bytes, the same way on every backend:

``gather_canary_records``
    Takes records out: row ``i`` of ``out_records`` (uint8 ``[n, 32]``, a *pack*) becomes
    the record of ``slot_indices[i]``. With real-KV sources and a mode other than NONE, the
    live fingerprint of each departing slot is compared with its record's field 3 (KV that
    changed before it left is reported here, not after the move).
``scatter_canary_records``
    Puts a pack back: the record of slot ``slot_indices[i]`` becomes row ``i`` of
    ``records``. With sources, the live fingerprint of each landing slot (the KV must land
    first) is compared with the record put there.
``move_canary_records``
    Moves records within one pool (compaction): ``dst_slot_indices[i]`` gets the record of
    ``src_slot_indices[i]``. Every record is read before any is written, so the two sets may
    overlap (a swap, a shift); ``scratch_records`` (uint8 ``[n, 32]``) holds them in between.
    An entry whose source is skipped or out of range moves nothing. Sources: the landing
    check, as for a scatter.

Slot rules, for every pool slot an operation reads or writes (as verify's): ``0`` is the
padding slot and is skipped (an SWA slot its LUT evicted); a slot outside ``[0, num_slots)``
records one row with bit 64 (SLOT_OUT_OF_RANGE), ``expected_aux = num_slots``, and is not
touched. A skipped or out-of-range entry of a gather leaves a zero row in the pack. A
fingerprint mismatch records one row with bit 4: ``(slot, record position, record token,
-1, record prev_hash, live fingerprint, 4)``. Rows are recorded in entry order here and in
atomic order on the GPU (compare rings as multisets). Each call adds 1 to
``kernel_run_counter`` and ``n`` to ``slot_run_counter``. Two entries of one scatter or
move that land on the same slot race on a GPU: keep destinations distinct.
"""

from __future__ import annotations

import numpy as np

from ..constants import (
    CANARY_FIELDS_PER_SLOT,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    FailReason as F,
)
from .live import live_fingerprints
from .ring import append_violation_rows, bump, canary_fields

__all__ = [
    "fingerprint_rows",
    "gather_canary_records",
    "move_canary_records",
    "pack_fields",
    "put",
    "range_rows",
    "record_in_order",
    "record_rows",
    "scatter_canary_records",
    "slot_classes",
    "take",
]

_FIELDS = CANARY_FIELDS_PER_SLOT


def pack_fields(records: np.ndarray) -> np.ndarray:
    """A pack (uint8 ``[n, 32]``, C-contiguous) as its int64 fields ``[n, 4]``, sharing memory."""
    return records.view(np.int64).reshape(records.shape[0], _FIELDS)


def slot_classes(slots: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(in range and not padding, out of range) masks of ``slots`` (int64 [n])."""
    live = (slots > 0) & (slots < num_slots)
    return live, (slots != 0) & ~live


def range_rows(context, entries: np.ndarray, slots: np.ndarray, positions=None) -> np.ndarray:
    """Rows (``[k, 9]``: entry index, then the 8 row fields) for out-of-range slots.

    ``positions``: the expected position of each of ``slots`` (-1 when the operation has none).
    """
    rows = np.zeros((entries.shape[0], 9), dtype=np.int64)
    rows[:, 0] = entries
    rows[:, 1] = int(context.kernel_kind)
    rows[:, 2] = slots
    rows[:, 3] = -1 if positions is None else positions
    rows[:, 4] = -1  # no record was read
    rows[:, 5] = -1  # no expected token
    rows[:, 7] = context.num_slots
    rows[:, 8] = int(F.SLOT_OUT_OF_RANGE)
    return rows


def record_rows(context, entries, slots, fields, expected_token, aux, bits) -> np.ndarray:
    """Rows (``[k, 9]``: entry index, then the 8 row fields) naming each slot's record ``fields`` (int64 [k, 4])."""
    rows = np.empty((entries.shape[0], 9), dtype=np.int64)
    rows[:, 0] = entries
    rows[:, 1] = int(context.kernel_kind)
    rows[:, 2] = slots
    rows[:, 3] = fields[:, FIELD_POSITION]
    rows[:, 4] = fields[:, FIELD_TOKEN]
    rows[:, 5] = expected_token
    rows[:, 6] = fields[:, FIELD_PREV_HASH]
    rows[:, 7] = aux
    rows[:, 8] = bits
    return rows


def fingerprint_rows(context, entries: np.ndarray, slots: np.ndarray, fields: np.ndarray) -> np.ndarray:
    """Rows for the entries whose record's fingerprint differs from their slot's live one (none in NONE mode)."""
    if not context.real_kv_sources or int(context.real_kv_hash_mode) == 0:
        return np.zeros((0, 9), dtype=np.int64)
    live = live_fingerprints(context.real_kv_sources, context.real_kv_hash_mode, slots).view(np.int64)
    bad = live != fields[:, FIELD_REAL_KV_HASH]
    return record_rows(
        context, entries[bad], slots[bad], fields[bad], -1, live[bad], int(F.VERIFY_REAL_KV_HASH_MISMATCH)
    )


def record_in_order(context, *row_sets: np.ndarray) -> None:
    """Append rows to the context's ring in entry order (a stable sort keeps each entry's rows in turn)."""
    rows = np.concatenate(row_sets)
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    append_violation_rows(context, rows[:, 1:])


def take(context, slots: np.ndarray, out_fields: np.ndarray, *, check: bool) -> np.ndarray:
    """Gather into ``out_fields`` (int64 [n, 4]); returns the rows (unrecorded)."""
    records = canary_fields(context.canary_buf)
    live, bad = slot_classes(slots, records.shape[0])
    out_fields[...] = 0
    entries = np.flatnonzero(live)
    out_fields[entries] = records[slots[entries], :_FIELDS]
    rows = [range_rows(context, np.flatnonzero(bad), slots[bad])]
    if check:
        rows.append(fingerprint_rows(context, entries, slots[entries], out_fields[entries]))
    return np.concatenate(rows)


def put(context, fields: np.ndarray, slots: np.ndarray, guard: np.ndarray | None = None) -> np.ndarray:
    """Store ``fields`` (int64 [n, 4]) at ``slots``; returns the rows (unrecorded).

    ``guard``: entries whose guard slot is not in ``[1, num_slots)`` are skipped silently
    (a move's source, already reported).
    """
    records = canary_fields(context.canary_buf)
    num_slots = records.shape[0]
    live, bad = slot_classes(slots, num_slots)
    if guard is not None:
        moved = slot_classes(guard, num_slots)[0]
        live, bad = live & moved, bad & moved
    entries = np.flatnonzero(live)
    records[slots[entries], :_FIELDS] = fields[entries]
    rows = [range_rows(context, np.flatnonzero(bad), slots[bad])]
    rows.append(fingerprint_rows(context, entries, slots[entries], fields[entries]))
    return np.concatenate(rows)


def gather_canary_records(*, context, slot_indices, out_records) -> None:
    """Take the records of ``slot_indices`` out into ``out_records``, checking the departing KV.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays. ``canary_buf`` is only read; ring, write index and counters are updated.
    slot_indices : int64 [n]
        Pool slots, in the order their records go into the pack.
    out_records : uint8 [n, 32]
        The pack: row ``i`` receives the record of ``slot_indices[i]`` (zeros when skipped).
    """
    slots = np.asarray(slot_indices, dtype=np.int64)
    bump(context.kernel_run_counter, 1)
    bump(context.slot_run_counter, slots.shape[0])
    record_in_order(context, take(context, slots, pack_fields(out_records), check=True))


def scatter_canary_records(*, context, records, slot_indices) -> None:
    """Put the pack ``records`` back at ``slot_indices``, checking the landed KV.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays; ``canary_buf``, ring, write index and counters are updated.
    records : uint8 [n, 32]
        The pack; row ``i`` goes to ``slot_indices[i]``.
    slot_indices : int64 [n]
        Pool slots receiving the records.
    """
    slots = np.asarray(slot_indices, dtype=np.int64)
    bump(context.kernel_run_counter, 1)
    bump(context.slot_run_counter, slots.shape[0])
    record_in_order(context, put(context, pack_fields(records), slots))


def move_canary_records(*, context, src_slot_indices, dst_slot_indices, scratch_records) -> None:
    """Move records within ``context.canary_buf``: ``dst[i]`` gets the record of ``src[i]``.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays; ``canary_buf``, ring, write index and counters are updated.
    src_slot_indices, dst_slot_indices : int64 [n]
        Where each record is, and where it goes; the two sets may overlap.
    scratch_records : uint8 [n, 32]
        Holds every moved record between the reads and the writes (overwritten).
    """
    src = np.asarray(src_slot_indices, dtype=np.int64)
    dst = np.asarray(dst_slot_indices, dtype=np.int64)
    bump(context.kernel_run_counter, 1)
    bump(context.slot_run_counter, src.shape[0])
    scratch = pack_fields(scratch_records)
    taken = take(context, src, scratch, check=False)  # every read before the first write
    record_in_order(context, taken, put(context, scratch, dst, guard=src))
