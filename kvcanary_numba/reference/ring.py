"""The violation ring and the health counters, as the kernels update them.

A context's ring is ``violation_ring`` (int64 [capacity, 8]) with its
``violation_write_index`` (int32 [1]). Recording a row takes a ticket, the old
value of the index, and increments the index (on the GPU one ``atomicAdd``,
``kernels/verify.py`` ``record_violation``). The row lands at ``ring[ticket]``
only when ``0 <= ticket < capacity``: the ring fills once and then keeps
counting, so the index tells how many rows were ever recorded.

The count saturates at ``VIOLATION_INDEX_SATURATED`` (``2**31 - 2**24``): a
ticket at or above it leaves the index as it is and stores nothing, so the int32
index never wraps and never overwrites the first rows kept. An index at the
limit means "at least that many rows". A negative index (set by a caller) counts
up; its tickets are never stored.

Here rows land in call order; on the GPU they land in atomic order, so tests
compare GPU rings with these as multisets. The row layout and the fill-once
rule are described in ``docs/concepts/violation-ring.md`` and
``docs/concepts/semantics.md`` ("Ring").
"""

from __future__ import annotations

import numpy as np

from ..constants import VIOLATION_INDEX_SATURATED

__all__ = ["append_violation_rows", "bump", "canary_fields", "record_violation"]


def canary_fields(canary_buf: np.ndarray) -> np.ndarray:
    """The canary buffer as its 8-byte fields, sharing memory.

    Parameters
    ----------
    canary_buf : uint8 [num_slots, stride], C-contiguous, stride a multiple of 8

    Returns
    -------
    int64 [num_slots, stride // 8]
        Column ``k`` is field ``k`` of each slot's record (token, position,
        prev_hash, real_kv_hash; columns past 3 are padding and never touched).
    """
    return canary_buf.view(np.int64)


def bump(counter: np.ndarray, amount: int) -> None:
    """``counter[0] += amount``, wrapping at the counter's width as device integers do.

    Parameters
    ----------
    counter : int32 [1] or int64 [1]
        Updated in place.
    amount : int
        Any Python int (or NumPy integer).
    """
    # Python ints do not overflow, so the sum is exact; then fold it back into the
    # two's-complement range of the counter's dtype (no NumPy overflow warning).
    bits = 8 * counter.dtype.itemsize
    total = (int(counter[0]) + int(amount)) % (1 << bits)
    counter[0] = total - (1 << bits) if total >= 1 << (bits - 1) else total


def record_violation(context, slot, position, stored_token, expected_token, chain_hash, aux, bits) -> None:
    """Record one row stamped with ``context.kernel_kind`` (``kernels/verify.py`` ``record_violation``).

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays; ``violation_ring`` and ``violation_write_index`` are updated.
    slot, position, stored_token, expected_token, chain_hash, aux, bits : int
        Fields 1 to 7 of the row (slot_idx, position, stored_token,
        expected_token, stored_chain_hash, expected_aux, fail_reason), each in
        the int64 range (hashes as their signed view).
    """
    _store(context, (int(context.kernel_kind), slot, position, stored_token, expected_token, chain_hash, aux, bits))


def append_violation_rows(context, rows: np.ndarray) -> None:
    """Record ``rows`` one after the other, as :func:`record_violation` records one.

    Row ``j`` gets ticket ``write_index + j``, and the index ends ``k`` higher
    whether or not the rows fit, up to ``VIOLATION_INDEX_SATURATED`` (rows from
    there on are neither kept nor counted).

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays; ``violation_ring`` and ``violation_write_index`` are updated.
    rows : int64 [k, 8]
        Complete rows (field 0 included), in the order they are recorded.
    """
    for row in rows:
        _store(context, row)


def _store(context, row) -> None:
    """Take a ticket from the write index; store ``row`` (8 int64 values) if it fits."""
    ring, index = context.violation_ring, context.violation_write_index
    seq = int(index[0])  # the ticket: the index before this row (atomicAdd's return value)
    if seq >= VIOLATION_INDEX_SATURATED:  # saturated: the count stays, nothing is stored
        return
    index[0] = seq + 1  # below the int32 limit: no wrap
    if 0 <= seq < ring.shape[0]:  # a negative ticket (a caller's index) is never stored
        ring[seq] = row
