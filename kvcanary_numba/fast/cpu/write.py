"""The optimised CPU write: :mod:`kvcanary_numba.reference.write` with its loop compiled (docs/concepts/semantics.md).

The chain is serial within a request (each slot's prev_hash is the hash of
the slot written before it), so the per-entry loop is compiled with
``numba.njit`` for the CPU (range clipping with it); the real-KV fold of
the entries' slots is one vectorised pass before it. Requests run in order
and rows are appended in loop order (the GPU appends them in atomic order).
"""

from __future__ import annotations

import numpy as np

from ..._jit import cpu_jit
from ...constants import (
    CANARY_CHAIN_HEAD,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    VIOLATION_FIELDS,
    FailReason,
)
from ...hashing import splitmix64_mix3_u64 as _mix3  # tokens and positions enter as their uint64 bits
from .fingerprint import fold_slots
from .verify import append_violation_rows, bump, canary_fields

__all__ = ["launch_canary_write_kernel"]

_HEAD = np.uint64(CANARY_CHAIN_HEAD)
_TOKEN_BIT = int(FailReason.WRITE_TOKEN_MISMATCH)
_POSITION_BIT = int(FailReason.WRITE_POSITION_MISMATCH)
_SLOT_BIT = int(FailReason.SLOT_OUT_OF_RANGE)
_SEED_BIT = int(FailReason.PREV_SLOT_OUT_OF_RANGE)
_RANGE_BIT = int(FailReason.WRITE_RANGE_OUT_OF_BOUNDS)


@cpu_jit(nogil=True)
def _record(rows, n, kind, slot, position, token, expected_token, chain_hash, aux, bits):
    rows[n, 0], rows[n, 1], rows[n, 2], rows[n, 3] = kind, slot, position, token
    rows[n, 4], rows[n, 5], rows[n, 6], rows[n, 7] = expected_token, chain_hash, aux, bits
    return n + 1


@cpu_jit(nogil=True)
def _stamp_requests(
    fields,
    offsets,
    seeds,
    num_reqs,
    input_ids,
    positions,
    out_cache_loc,
    real_kv,
    input_assert,
    expected_tokens,
    expected_positions,
    chain_assert,
    kind,
    rows,
):
    """The per-request loop; returns (rows recorded, entries stored)."""
    num_slots, num_tokens = fields.shape[0], input_ids.shape[0]
    n = 0
    stored = 0
    for r in range(num_reqs):
        start, end = offsets[r], offsets[r + 1]
        if end <= start:
            continue
        lo, hi = max(start, 0), min(end, num_tokens)
        if lo != start or hi != end:
            n = _record(rows, n, kind, -1, -1, start, end, 0, num_tokens, _RANGE_BIT)
        if hi <= lo:
            continue
        seed = seeds[r]
        running = _HEAD
        track_position = False
        prev_position = 0
        if seed >= num_slots:
            n = _record(rows, n, kind, seed, -1, -1, -1, 0, num_slots, _SEED_BIT)
        elif seed >= 0:
            running = _mix3(
                np.uint64(fields[seed, FIELD_PREV_HASH]), fields[seed, FIELD_TOKEN], fields[seed, FIELD_POSITION]
            )
            track_position = chain_assert
            prev_position = fields[seed, FIELD_POSITION]
        for i in range(lo, hi):
            slot = out_cache_loc[i]
            if slot < 0:
                continue  # skipped entirely: no store, no count, chain state unchanged
            token, position = input_ids[i], positions[i]
            chain_hash = np.int64(running)
            if input_assert:
                bits = 0
                if token != expected_tokens[i]:
                    bits |= _TOKEN_BIT
                if position != expected_positions[i]:
                    bits |= _POSITION_BIT
                if bits:
                    n = _record(
                        rows,
                        n,
                        kind,
                        slot,
                        position,
                        token,
                        expected_tokens[i],
                        chain_hash,
                        expected_positions[i],
                        bits,
                    )
            if track_position:
                if position != prev_position + 1:
                    n = _record(
                        rows, n, kind, slot, position, token, token, chain_hash, prev_position + 1, _POSITION_BIT
                    )
                prev_position = position
            if slot >= num_slots:
                n = _record(rows, n, kind, slot, position, token, token, chain_hash, num_slots, _SLOT_BIT)
            else:
                fields[slot, FIELD_TOKEN] = token
                fields[slot, FIELD_POSITION] = position
                fields[slot, FIELD_PREV_HASH] = chain_hash
                fields[slot, FIELD_REAL_KV_HASH] = real_kv[i]
                stored += 1
            # The chain advances on the actual values, so one bad entry is reported once.
            running = _mix3(running, token, position)
    return n, stored


@cpu_jit(nogil=True)
def _max_rows(offsets, num_reqs, num_tokens):
    """Rows the request loop can record at most: 2 per walked request, 3 per walked entry."""
    rows = 0
    for r in range(num_reqs):
        start, end = offsets[r], offsets[r + 1]
        if end > start:
            rows += 2 + 3 * max(min(end, num_tokens) - max(start, 0), 0)
    return rows


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
    """Stamp the new slots of every request; record write-time assert failures.

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays; canary buffer, ring, write index and counters are
        updated in place. ``enable_chain_position_assert[0] != 0`` turns the
        chain-step position assert on.
    plan : WritePlan
        NumPy arrays; requests ``[0, clamp(write_num_valid_reqs, 0, capacity))``.
    input_ids, positions, out_cache_loc : int64 [num_tokens]
        Per-entry token, position and target slot (negative = skip).
    enable_write_input_assert : bool
        Compare tokens/positions with the expected arrays.
    expected_input_tokens, expected_input_positions : int64 [num_tokens] or None
        Present exactly when ``enable_write_input_assert``.
    """
    bump(context.kernel_run_counter, 1)
    capacity = plan.write_seed_slot_indices.shape[0]
    num_reqs = min(max(int(plan.write_num_valid_reqs[0]), 0), capacity)
    rows = np.empty((_max_rows(plan.write_offsets, num_reqs, input_ids.shape[0]), VIOLATION_FIELDS), dtype=np.int64)
    # Real-KV hash of each entry's slot (0 for skipped and uncovered slots); only stored entries read it.
    real_kv = fold_slots(context.real_kv_sources, context.real_kv_hash_mode, out_cache_loc).view(np.int64)
    unused = np.empty(0, dtype=np.int64)
    n_rows, stored = _stamp_requests(
        canary_fields(context.canary_buf),
        plan.write_offsets,
        plan.write_seed_slot_indices,
        num_reqs,
        input_ids,
        positions,
        out_cache_loc,
        real_kv,
        bool(enable_write_input_assert),
        unused if expected_input_tokens is None else expected_input_tokens,
        unused if expected_input_positions is None else expected_input_positions,
        bool(int(context.enable_chain_position_assert[0]) != 0),
        int(context.kernel_kind),
        rows,
    )
    append_violation_rows(context, rows[:n_rows])
    bump(context.slot_run_counter, stored)
