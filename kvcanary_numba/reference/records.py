"""Specification of ``verify_canary_records`` (``kernels/records.py``): check a moved set where it rests.

A moved set is described as *runs*: run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])``
of ``slot_indices``, the slots of consecutive positions of one sequence, starting at position
``run_start_positions[r]``; its first entry's predecessor is ``run_prev_slots[r]`` (negative:
the run starts its chain; 0: the predecessor is elsewhere, the link is not checked; else a
slot of the same buffer). Every later entry's predecessor is the entry before it. The runs
cover ``slot_indices`` in order (``run_offsets`` runs from 0 to ``n`` without going down;
checked on the host for host arrays, KVC-K006).

Each entry is then checked as verify checks a plan entry (``reference/verify.py``) with the
expected token unchecked: slot 0 is skipped (an SWA slot outside the window); a slot outside
``[0, num_slots)`` records a bit-64 row; otherwise the chain (bit 1, or 128 for a predecessor
past the buffer), the position (bit 2) and the live fingerprint (bit 4, 0 in NONE mode), one
row with all bits. On the host tier the buffer is the canary buffer of the host copy (rows =
host KV slots) and the sources are the host KV; on a device, the landed slots and the page
table's runs. ``kernel_run_counter`` += 1, ``slot_run_counter`` += ``n``.

Everything is vectorised: the host tier checks millions of slots per call.
"""

from __future__ import annotations

import numpy as np

from ..constants import (
    CANARY_CHAIN_HEAD,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    FailReason as F,
)
from .live import live_fingerprints, mix_into
from .move import range_rows, record_in_order, record_rows, slot_classes
from .ring import bump, canary_fields

__all__ = ["chain_hashes_of", "entry_rows", "run_entries", "verify_canary_records"]

_HEAD = np.uint64(CANARY_CHAIN_HEAD).view(np.int64)


def chain_hashes_of(fields: np.ndarray) -> np.ndarray:
    """``mix3(prev_hash, token, position)`` of records given as int64 fields [k, 4]: int64 [k] (the uint64 bits)."""
    fields = fields.view(np.uint64)
    h, scratch = np.zeros(fields.shape[0], dtype=np.uint64), np.empty(fields.shape[0], dtype=np.uint64)
    for column in (FIELD_PREV_HASH, FIELD_TOKEN, FIELD_POSITION):
        mix_into(h, fields[:, column], scratch)  # mix3(a, b, c) = S(S(S(0 ^ a) ^ b) ^ c)
    return h.view(np.int64)


def run_entries(slots: np.ndarray, run_offsets, run_start_positions, run_prev_slots) -> tuple[np.ndarray, ...]:
    """(expected position, predecessor slot, run-first mask) of every entry (int64, int64, bool [n])."""
    offsets = np.asarray(run_offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    run = np.repeat(np.arange(lengths.shape[0]), lengths)
    index = np.arange(slots.shape[0], dtype=np.int64) - offsets[run]  # index within the run
    positions = np.asarray(run_start_positions, dtype=np.int64)[run] + index
    prevs = np.empty_like(slots)
    prevs[1:] = slots[:-1]
    firsts = index == 0
    prevs[firsts] = np.asarray(run_prev_slots, dtype=np.int64)[run[firsts]]
    return positions, prevs, firsts


def entry_rows(context, slots, positions, prevs, firsts, lo: int, hi: int) -> np.ndarray:
    """The rows (``[k, 9]``: entry index, then the 8 row fields) of entries ``[lo, hi)``.

    ``slots``, ``positions``, ``prevs``, ``firsts``: every entry's, as :func:`run_entries`
    gives them. A predecessor inside the run is the entry before, whose record was read
    already: its chain hash is computed once, from that read (a run's first entry reads
    its predecessor's record itself).
    """
    records = canary_fields(context.canary_buf)
    num_slots = records.shape[0]
    start = max(lo - 1, 0)  # from the entry before the range: the predecessor of entry lo
    shift = lo - start
    span = np.clip(slots[start:hi], 0, num_slots - 1)  # rows read for bad slots are never used
    span_fields = np.take(records, span, axis=0)[:, :4]
    span_hashes = chain_hashes_of(span_fields)
    mine = slots[lo:hi]
    live, bad = slot_classes(mine, num_slots)
    entries = np.flatnonzero(live)  # relative to lo
    fields = span_fields[shift + entries]
    prev, first = prevs[lo:hi][entries], firsts[lo:hi][entries]
    stored_hash = fields[:, FIELD_PREV_HASH]
    aux = stored_hash.copy()  # predecessor 0: the chain is not checked, the row shows the stored hash
    bits = np.zeros(entries.shape[0], dtype=np.int64)
    head = prev < 0
    aux[head] = _HEAD
    linked = (prev > 0) & (prev < num_slots)
    inner = linked & ~first  # the predecessor is the entry before: its record was read with the span
    aux[inner] = span_hashes[shift + entries[inner] - 1]
    outer = linked & first  # a run's first entry: its predecessor's record is read now
    aux[outer] = chain_hashes_of(np.take(records, prev[outer], axis=0)[:, :4])
    bits[(head | linked) & (stored_hash != aux)] |= int(F.VERIFY_CHAIN_HASH_MISMATCH)
    past = prev >= num_slots
    aux[past] = prev[past]
    bits[past] |= int(F.PREV_SLOT_OUT_OF_RANGE)
    bits[fields[:, FIELD_POSITION] != positions[lo:hi][entries]] |= int(F.VERIFY_POSITION_MISMATCH)
    real = live_fingerprints(context.real_kv_sources, context.real_kv_hash_mode, mine[entries]).view(np.int64)
    bits[fields[:, FIELD_REAL_KV_HASH] != real] |= int(F.VERIFY_REAL_KV_HASH_MISMATCH)
    failed = bits != 0
    outside = np.flatnonzero(bad)
    return np.concatenate(
        [
            range_rows(context, lo + outside, mine[outside], positions[lo:hi][outside]),
            record_rows(
                context, lo + entries[failed], mine[entries[failed]], fields[failed], -1, aux[failed], bits[failed]
            ),
        ]
    )


def verify_canary_records(*, context, slot_indices, run_offsets, run_start_positions, run_prev_slots) -> None:
    """Check the runs of ``slot_indices`` against their records; record the failing entries.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays. ``canary_buf`` is only read; ring, write index and counters are updated.
    slot_indices : int64 [n]
        The slots of every run, run after run, each run in position order.
    run_offsets : int64 [num_runs + 1]
        Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])``; 0 to ``n``, never down.
    run_start_positions : int64 [num_runs]
        Position of each run's first entry.
    run_prev_slots : int64 [num_runs]
        Predecessor of each run's first entry: negative = chain head, 0 = not checked, else a slot.
    """
    slots = np.asarray(slot_indices, dtype=np.int64)
    bump(context.kernel_run_counter, 1)
    bump(context.slot_run_counter, slots.shape[0])
    entries = run_entries(slots, run_offsets, run_start_positions, run_prev_slots)
    record_in_order(context, entry_rows(context, slots, *entries, 0, slots.shape[0]))
