"""Specification of the write kernel (``kernels/write.py``, helpers in ``kernels/write_chunk.py``).

Write stamps the canary record of every KV slot a forward pass writes, and
checks the inputs on the way. The write plan splits the step's flat entries
(``input_ids``, ``positions``, ``out_cache_loc``, one per new token) into
requests: request ``r`` owns entries ``[write_offsets[r], write_offsets[r + 1])``
and continues the chain of slot ``write_seed_slot_indices[r]``.

The chain is serial within a request: each stored prev_hash is the running
hash of the request's entries before it. So the specification is a plain loop,
request after request and entry after entry; the kernel walks requests in
parallel (a warp each) and computes the same values. Per request
(``request_range``, ``seed_state``):

1. The range is clipped to ``[0, num_tokens)``; if clipping changed a
   non-empty range, one row with bit 256 (WRITE_RANGE_OUT_OF_BOUNDS). An empty
   or fully clipped range stops here.
2. The seed: ``seed >= num_slots`` records one row with bit 128
   (PREV_SLOT_OUT_OF_RANGE) and anchors the chain; a negative seed anchors it
   (running hash ``CANARY_CHAIN_HEAD``); otherwise the running hash is the
   chain step of the seed's record. The chain-position assert runs only for a
   real seed slot, and only when ``enable_chain_position_assert[0] != 0``.

Per entry (``entry_checks``, ``store_record``), skipping a negative slot
entirely (no row, no store, no count, chain unchanged):

3. The write-input assert, when enabled: token (bit 8) and position (bit 16)
   against the expected inputs, one row for both.
4. The chain-position assert: the position must be the previous entry's + 1
   (the seed's position for the first entry), bit 16.
5. A slot ``>= num_slots`` records one row with bit 64 and is not stored or
   counted; otherwise the record (token, position, running hash, real-KV
   fingerprint) is stored and the entry counts in ``slot_run_counter``.
6. The running hash advances on the entry's actual token and position, so a
   bad entry is reported once, not again by every entry after it.

When several entries write one slot, the last one's record stays (the
kernel's chunks reproduce this). ``kernel_run_counter`` grows by 1 per launch.
Row fields: ``docs/concepts/semantics.md`` ("Write"); the chain:
``docs/concepts/record-and-chain.md``.
"""

from __future__ import annotations

from ..constants import (
    CANARY_CHAIN_HEAD,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    FailReason,
)
from ..hashing import splitmix64_mix3, to_signed
from .fingerprint import fold_slots
from .ring import bump, canary_fields, record_violation
from .verify import slot_hash

__all__ = ["entry_checks", "launch_canary_write_kernel", "request_range", "seed_state", "store_record"]


def request_range(context, offsets, r: int, num_tokens: int) -> tuple[int, int]:
    """Entry range ``[lo, hi)`` of request ``r``, clipped to the token arrays.

    Records the range row when clipping changed a non-empty range. Returns
    ``(0, 0)`` for an empty range (``end <= start``), whatever its bounds.
    """
    start, end = int(offsets[r]), int(offsets[r + 1])
    if end <= start:
        return 0, 0
    lo, hi = max(start, 0), min(end, num_tokens)
    if lo != start or hi != end:
        record_violation(context, -1, -1, start, end, 0, num_tokens, int(FailReason.WRITE_RANGE_OUT_OF_BOUNDS))
    return lo, hi


def seed_state(context, records, seed: int) -> tuple[int, int]:
    """(running hash, seed position) a request starts from; records the seed row if out of range.

    The running hash is a Python int in ``[0, 2**64)``; the position is the
    seed record's (0 when the chain anchors).
    """
    num_slots = records.shape[0]
    if seed >= num_slots:
        record_violation(context, seed, -1, -1, -1, 0, num_slots, int(FailReason.PREV_SLOT_OUT_OF_RANGE))
    elif seed >= 0:
        return slot_hash(records, seed), int(records[seed, FIELD_POSITION])
    return CANARY_CHAIN_HEAD, 0


def entry_checks(
    context,
    num_slots,
    slot,
    token,
    position,
    chain_hash,
    input_assert,
    expected_token,
    expected_position,
    track,
    chain_position,
) -> bool:
    """Rows of one non-skipped entry, in order; True when its slot can be stored."""
    if input_assert:
        bits = 0
        if token != expected_token:
            bits |= FailReason.WRITE_TOKEN_MISMATCH
        if position != expected_position:
            bits |= FailReason.WRITE_POSITION_MISMATCH
        if bits:
            record_violation(context, slot, position, token, expected_token, chain_hash, expected_position, int(bits))
    if track and position != chain_position:
        record_violation(
            context, slot, position, token, token, chain_hash, chain_position, int(FailReason.WRITE_POSITION_MISMATCH)
        )
    if slot >= num_slots:
        record_violation(
            context, slot, position, token, token, chain_hash, num_slots, int(FailReason.SLOT_OUT_OF_RANGE)
        )
        return False
    return True


def store_record(records, slot, token, position, chain_hash, real) -> None:
    """Write the four fields of ``slot``'s record (int64 values)."""
    records[slot, FIELD_TOKEN] = token
    records[slot, FIELD_POSITION] = position
    records[slot, FIELD_PREV_HASH] = chain_hash
    records[slot, FIELD_REAL_KV_HASH] = real


def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
) -> None:
    """Stamp the slots every request writes; record the write-time assert failures.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays. ``canary_buf`` (uint8 [num_slots, stride]), the ring, its
        write index and both counters are updated in place;
        ``enable_chain_position_assert`` (int32 [1]) is read.
    plan : WritePlan
        NumPy arrays: ``write_offsets`` int64 [capacity + 1],
        ``write_seed_slot_indices`` int64 [capacity], ``write_num_valid_reqs``
        int32 [1]; requests ``[0, clamp(write_num_valid_reqs, 0, capacity))``.
    input_ids, positions, out_cache_loc : int64 [num_tokens]
        Token, position and target slot of each entry (negative slot: skip).
    enable_write_input_assert : bool
        Compare tokens and positions with the expected arrays.
    expected_input_tokens, expected_input_positions : int64 [num_tokens] or None
        Read only when ``enable_write_input_assert``.
    """
    bump(context.kernel_run_counter, 1)
    records = canary_fields(context.canary_buf)
    num_slots = records.shape[0]
    num_tokens = input_ids.shape[0]
    num_reqs = min(max(int(plan.write_num_valid_reqs[0]), 0), plan.write_seed_slot_indices.shape[0])
    chain_on = int(context.enable_chain_position_assert[0]) != 0
    # The fingerprint of every entry's slot at once (0 for negative and uncovered slots); the
    # kernel folds each stored slot's bytes where it stores it. Only stored entries use it.
    real = fold_slots(context.real_kv_sources, context.real_kv_hash_mode, out_cache_loc).view("i8")
    stored = 0
    for r in range(num_reqs):
        lo, hi = request_range(context, plan.write_offsets, r, num_tokens)
        if hi <= lo:
            continue
        seed = int(plan.write_seed_slot_indices[r])
        track = chain_on and 0 <= seed < num_slots
        running, prev_position = seed_state(context, records, seed)
        for i in range(lo, hi):
            slot = int(out_cache_loc[i])
            if slot < 0:
                continue  # skipped entirely: no row, no store, no count, chain unchanged
            token, position = int(input_ids[i]), int(positions[i])
            chain_hash = to_signed(running)
            expected_token = int(expected_input_tokens[i]) if enable_write_input_assert else 0
            expected_position = int(expected_input_positions[i]) if enable_write_input_assert else 0
            chain_position = to_signed(prev_position + 1)  # int64 wrap-around, as on the device
            if entry_checks(
                context,
                num_slots,
                slot,
                token,
                position,
                chain_hash,
                enable_write_input_assert,
                expected_token,
                expected_position,
                track,
                chain_position,
            ):
                store_record(records, slot, token, position, chain_hash, int(real[i]))
                stored += 1
            prev_position = position
            running = splitmix64_mix3(running, token, position)
    bump(context.slot_run_counter, stored)
