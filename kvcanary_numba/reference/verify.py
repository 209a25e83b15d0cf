"""NumPy reference of the verify kernel (reference notes §5, docs/concepts/semantics.md).

Vectorised over the plan's entries: this is the CPU production path, not only
the specification. Rows are appended in entry order (the GPU appends them in
atomic order; compare rings as multisets).
"""

from __future__ import annotations

import numpy as np

from ..constants import (
    CANARY_CHAIN_HEAD,
    CANARY_FIELDS_PER_SLOT,
    EXPECTED_TOKEN_UNCHECKED,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    TOKEN_TO_KV_SLOT_PADDING,
    VIOLATION_FIELDS,
    FailReason,
)
from ..hashing import splitmix64_mix3_array
from .fingerprint import fold_slots

__all__ = ["launch_canary_verify_kernel", "append_violation_rows", "canary_fields", "bump"]

_HEAD = np.uint64(CANARY_CHAIN_HEAD).view(np.int64)


def canary_fields(canary_buf: np.ndarray) -> np.ndarray:
    """The canary buffer as int64 [num_slots, stride // 8], sharing memory (field k = column k)."""
    return canary_buf.view(np.int64)


def bump(counter: np.ndarray, amount: int) -> None:
    """``counter[0] += amount`` with the device's wrap-around (no NumPy overflow warning)."""
    counter += np.asarray(amount).astype(counter.dtype)


def append_violation_rows(context, rows: np.ndarray) -> None:
    """Record ``rows`` (int64 [k, 8]) fill-once into the context's ring, in order.

    Row ``j`` takes ticket ``seq = write_index + j`` (int32 wrap-around, as the
    GPU's atomicAdd) and lands only when ``0 <= seq < ring_capacity``; the
    index advances by ``k`` whether or not the rows fit.
    """
    if rows.shape[0] == 0:
        return
    ring, index = context.violation_ring, context.violation_write_index
    tickets = (np.arange(rows.shape[0], dtype=np.int64) + np.int64(index[0])).astype(np.int32)
    fits = (tickets >= 0) & (tickets < ring.shape[0])
    ring[tickets[fits]] = rows[fits]
    bump(index, rows.shape[0])


def _rows(kind, slot, position, stored_token, expected_token, stored_hash, expected_aux, bits) -> np.ndarray:
    columns = (kind, slot, position, stored_token, expected_token, stored_hash, expected_aux, bits)
    n = np.shape(bits)[0]
    rows = np.empty((n, VIOLATION_FIELDS), dtype=np.int64)
    for k, column in enumerate(columns):
        rows[:, k] = column
    return rows


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token) -> None:
    """Check the plan's prefix slots against the canary buffer; record mismatches.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays. ``canary_buf`` is only read; the ring, write index and
        counters are updated in place.
    plan : VerifyPlan
        NumPy arrays; entries ``[0, clamp(verify_num_valid, 0, capacity))`` are
        checked when ``enable[0] != 0``.
    check_verify_expected_token : bool
        Compare stored tokens with ``verify_expected_tokens`` (-1 = unchecked);
        when False that array is never read.
    """
    bump(context.kernel_run_counter, 1)
    if int(plan.enable[0]) == 0:
        return
    capacity = plan.verify_slot_indices.shape[0]
    active = min(max(int(plan.verify_num_valid[0]), 0), capacity)
    bump(context.slot_run_counter, active)

    slots = plan.verify_slot_indices[:active]
    positions = plan.verify_expected_positions[:active]
    prevs = plan.verify_prev_slot_indices[:active]
    if check_verify_expected_token:
        expected_tokens = plan.verify_expected_tokens[:active]
    else:
        expected_tokens = np.full(active, EXPECTED_TOKEN_UNCHECKED, dtype=np.int64)

    fields = canary_fields(context.canary_buf)
    records = fields[:, :CANARY_FIELDS_PER_SLOT]
    num_slots = fields.shape[0]
    checked = slots != TOKEN_TO_KV_SLOT_PADDING
    out_of_range = checked & ((slots < 0) | (slots >= num_slots))
    entries = np.flatnonzero(checked & ~out_of_range)
    # The usual plan has every entry checkable: then slices replace index gathers.
    every = entries.shape[0] == active
    pick = (lambda column: column) if every else (lambda column: column[entries])  # noqa: E731

    slot = pick(slots)
    # One gather of whole records is several times faster than one gather per field.
    record = np.take(records, slot, axis=0)
    stored_token = record[:, FIELD_TOKEN]
    stored_position = record[:, FIELD_POSITION]
    stored_hash = record[:, FIELD_PREV_HASH]
    stored_real = record[:, FIELD_REAL_KV_HASH]

    prev = pick(prevs)
    prev_in_range = (prev > 0) & (prev < num_slots)
    prev_out_of_range = prev >= num_slots
    # Unreachable predecessors (0, or out of range) expect what is stored: no chain bit.
    expected_hash = np.where(prev < 0, _HEAD, stored_hash)
    reachable = slice(None) if prev_in_range.all() else prev_in_range
    pred = np.take(records, prev[reachable], axis=0)
    expected_hash[reachable] = splitmix64_mix3_array(
        pred[:, FIELD_PREV_HASH], pred[:, FIELD_TOKEN], pred[:, FIELD_POSITION]
    ).view(np.int64)
    expected_real = fold_slots(context.real_kv_sources, context.real_kv_hash_mode, slot).view(np.int64)
    token = pick(expected_tokens)

    bits = (expected_hash != stored_hash) * np.int64(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
    bits |= (stored_position != pick(positions)) * np.int64(FailReason.VERIFY_POSITION_MISMATCH)
    bits |= (stored_real != expected_real) * np.int64(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
    if check_verify_expected_token:
        token_wrong = (token != EXPECTED_TOKEN_UNCHECKED) & (stored_token != token)
        bits |= token_wrong * np.int64(FailReason.VERIFY_TOKEN_MISMATCH)
    bits |= prev_out_of_range * np.int64(FailReason.PREV_SLOT_OUT_OF_RANGE)
    hit = np.flatnonzero(bits)
    aux = np.where(prev_out_of_range[hit], prev[hit], expected_hash[hit])
    kind = int(context.kernel_kind)
    checked_rows = _rows(
        kind, slot[hit], stored_position[hit], stored_token[hit], token[hit], stored_hash[hit], aux, bits[hit]
    )

    bad = np.flatnonzero(out_of_range)
    range_rows = _rows(
        kind,
        slots[bad],
        positions[bad],
        -1,
        expected_tokens[bad],
        0,
        num_slots,
        np.full(bad.shape[0], int(FailReason.SLOT_OUT_OF_RANGE)),
    )
    # Merge both kinds of rows back into entry order.
    order = np.concatenate([entries[hit], bad])  # entry index of every row
    rows = np.concatenate([checked_rows, range_rows])
    append_violation_rows(context, rows[np.argsort(order, kind="stable")])
