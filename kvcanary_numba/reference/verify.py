"""Specification of the verify kernel (``kernels/verify.py``).

Verify reads the canary records of the slots a step's forward pass is about to
attend to (the verify plan's entries) and checks each against what the plan
expects. Nothing in the canary buffer is written; failing entries become
violation rows and two health counters move:

- ``kernel_run_counter`` grows by 1 per launch, even a disabled one;
- when ``plan.enable[0] != 0``, the first ``clamp(verify_num_valid, 0, capacity)``
  entries are checked and ``slot_run_counter`` grows by that count.

Per entry, in the kernel's order (``_check_entry``), with ``slot`` the entry's
slot and ``prev`` its predecessor:

1. ``slot == 0`` is the padding slot: skipped, no row.
2. ``slot`` negative or ``>= num_slots``: nothing is loaded; one row with
   ``fail_reason = 64`` (SLOT_OUT_OF_RANGE), ``expected_aux = num_slots``.
3. The chain: ``prev < 0`` means the slot heads its chain and its prev_hash
   must be ``CANARY_CHAIN_HEAD``; ``prev >= num_slots`` cannot be loaded
   (bit 128, PREV_SLOT_OUT_OF_RANGE, ``expected_aux = prev``); ``prev == 0``
   means the predecessor is unreachable and the chain is not checked;
   otherwise the prev_hash must be the chain step (``splitmix64_mix3``) of
   the predecessor's record (bit 1).
4. The token (bit 32), only when asked for and the expected token is not -1.
5. The position (bit 2).
6. The real-KV fingerprint of the slot's live bytes (bit 4; 0 in NONE mode).

An entry with any bit set records one row with all its bits OR-ed. Rows are
recorded in entry order here and in atomic order on the GPU (compare rings as
multisets). Row fields and the extension bits: ``docs/concepts/semantics.md``
("Verify"); the chain: ``docs/concepts/record-and-chain.md``.
"""

from __future__ import annotations

import numpy as np

from ..constants import (
    CANARY_CHAIN_HEAD,
    EXPECTED_TOKEN_UNCHECKED,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    TOKEN_TO_KV_SLOT_PADDING,
    FailReason,
    RealKvHashMode,
)
from ..hashing import splitmix64_mix3, to_signed
from .fingerprint import fold_slots
from .ring import bump, canary_fields, record_violation

__all__ = ["launch_canary_verify_kernel", "slot_hash"]

#: The prev_hash a chain's first slot holds, as the int64 stored in the record.
_CHAIN_HEAD = to_signed(CANARY_CHAIN_HEAD)


def slot_hash(records, slot: int) -> int:
    """Chain hash of the record at in-range ``slot``: ``mix3(prev_hash, token, position)``.

    ``records`` is :func:`~.ring.canary_fields` of the buffer. Returns the hash
    as an unsigned Python int in ``[0, 2**64)`` (``to_signed`` gives the int64
    a record stores).
    """
    record = records[slot]
    return splitmix64_mix3(int(record[FIELD_PREV_HASH]), int(record[FIELD_TOKEN]), int(record[FIELD_POSITION]))


def check_entry(context, records, slot: int, token: int, position: int, prev: int, real: int) -> None:
    """The checks of one entry with a non-padding ``slot``; records its row if any check fails.

    Parameters
    ----------
    context : CanaryContext
        Receives the row.
    records : int64 [num_slots, stride // 8]
        The canary buffer's fields (only read).
    slot, token, position, prev : int
        The entry: its slot, expected token (-1 when unchecked), expected
        position and chain predecessor.
    real : int
        The live fingerprint of ``slot`` (signed int64; 0 in NONE mode).
    """
    num_slots = records.shape[0]
    if not 0 <= slot < num_slots:  # negative or past the buffer: no load
        record_violation(context, slot, position, -1, token, 0, num_slots, int(FailReason.SLOT_OUT_OF_RANGE))
        return
    stored_token = int(records[slot, FIELD_TOKEN])
    stored_position = int(records[slot, FIELD_POSITION])
    stored_hash = int(records[slot, FIELD_PREV_HASH])
    stored_real = int(records[slot, FIELD_REAL_KV_HASH])
    bits = 0
    aux = stored_hash  # prev == 0: predecessor unreachable, chain not checked
    if prev < 0:
        aux = _CHAIN_HEAD
        if stored_hash != aux:
            bits |= FailReason.VERIFY_CHAIN_HASH_MISMATCH
    elif prev >= num_slots:
        aux = prev
        bits |= FailReason.PREV_SLOT_OUT_OF_RANGE
    elif prev != 0:
        aux = to_signed(slot_hash(records, prev))
        if stored_hash != aux:
            bits |= FailReason.VERIFY_CHAIN_HASH_MISMATCH
    if token != EXPECTED_TOKEN_UNCHECKED and stored_token != token:
        bits |= FailReason.VERIFY_TOKEN_MISMATCH
    if stored_position != position:
        bits |= FailReason.VERIFY_POSITION_MISMATCH
    if stored_real != real:
        bits |= FailReason.VERIFY_REAL_KV_HASH_MISMATCH
    if bits:
        record_violation(context, slot, stored_position, stored_token, token, stored_hash, aux, int(bits))


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token) -> None:
    """Check the plan's entries against the canary buffer; record the failing ones.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays. ``canary_buf`` (uint8 [num_slots, stride]) is only read;
        ``violation_ring``, ``violation_write_index``, ``slot_run_counter`` and
        ``kernel_run_counter`` are updated in place.
    plan : VerifyPlan
        NumPy arrays: four int64 [capacity] entry arrays, ``verify_num_valid``
        and ``enable`` int32 [1].
    check_verify_expected_token : bool
        Compare stored tokens with ``verify_expected_tokens``; when False that
        array is never read and rows carry -1 as the expected token.
    """
    bump(context.kernel_run_counter, 1)
    if int(plan.enable[0]) == 0:  # the plan overflowed: its entries are stale
        return
    capacity = plan.verify_slot_indices.shape[0]
    active = min(max(int(plan.verify_num_valid[0]), 0), capacity)
    bump(context.slot_run_counter, active)  # every submitted entry counts, padding included
    records = canary_fields(context.canary_buf)
    slots = plan.verify_slot_indices[:active]
    # The fingerprints of all entries at once (the kernel folds a warp's 32 slots together);
    # NONE mode reads no byte: every fingerprint is 0. A slot no source covers also gets 0:
    # through the public launch that is only a slot outside the buffer (KVC-R007), whose
    # fingerprint is never compared.
    if context.real_kv_hash_mode == RealKvHashMode.NONE or not context.real_kv_sources:
        real = np.zeros(active, dtype=np.int64)
    else:
        real = fold_slots(context.real_kv_sources, context.real_kv_hash_mode, slots).view("i8")
    for i in range(active):
        slot = int(slots[i])
        if slot == TOKEN_TO_KV_SLOT_PADDING:  # padding slot: never verified
            continue
        token = int(plan.verify_expected_tokens[i]) if check_verify_expected_token else EXPECTED_TOKEN_UNCHECKED
        check_entry(
            context,
            records,
            slot,
            token,
            int(plan.verify_expected_positions[i]),
            int(plan.verify_prev_slot_indices[i]),
            int(real[i]),
        )
