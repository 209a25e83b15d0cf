"""The optimised CPU verify: :mod:`kvcanary_numba.reference.verify` compiled for many cores.

One compiled pass over the plan's entries, in chunks spread over the cores (``prange``),
computes each entry's fail bits; the few rows are then built with NumPy and appended in
entry order (the GPU appends them in atomic order; compare rings as multisets). Semantics:
docs/concepts/semantics.md; ``tests/test_spec_against_cpu.py`` compares it with the
specification byte for byte.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..._jit import cpu_jit, run_parallel, twin
from ...constants import (  # fail bits as int64 scalars, under this module's short names
    CANARY_CHAIN_HEAD,
    CANARY_FIELDS_PER_SLOT,
    EXPECTED_TOKEN_UNCHECKED,
    FAIL_CHAIN as _CHAIN,
    FAIL_POSITION as _POSITION,
    FAIL_PREV_RANGE as _PREV_RANGE,
    FAIL_REAL_KV as _REAL_KV,
    FAIL_SLOT_RANGE as _SLOT_RANGE,
    FAIL_TOKEN as _TOKEN,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    TOKEN_TO_KV_SLOT_PADDING,
    VIOLATION_FIELDS,
    VIOLATION_INDEX_SATURATED,
)
from ...hashing import splitmix64_mix3_u64
from ...reference.ring import bump, canary_fields
from .fingerprint import fold_slots

__all__ = ["launch_canary_verify_kernel", "append_violation_rows", "canary_fields", "bump"]

_HEAD = np.uint64(CANARY_CHAIN_HEAD).view(np.int64)
_PADDING = np.int64(TOKEN_TO_KV_SLOT_PADDING)


def append_violation_rows(context, rows: np.ndarray) -> None:
    """Record ``rows`` (int64 [k, 8]) fill-once into the context's ring, in order.

    Row ``j`` takes ticket ``seq = write_index + j`` and lands only when
    ``0 <= seq < ring_capacity``; the index advances by ``k`` whether or not the
    rows fit, up to ``VIOLATION_INDEX_SATURATED`` (rows from there on are neither
    kept nor counted: the index never wraps).
    """
    ring, index = context.violation_ring, context.violation_write_index
    start = int(index[0])
    counted = min(rows.shape[0], max(VIOLATION_INDEX_SATURATED - start, 0))
    if counted == 0:
        return
    tickets = np.arange(counted, dtype=np.int64) + start
    fits = (tickets >= 0) & (tickets < ring.shape[0])
    ring[tickets[fits]] = rows[:counted][fits]
    index[0] = start + counted  # at most the saturation value: no wrap


#: Entries per chunk of the compiled pass (its gathered records stay in cache).
_CHUNK = 2048


def _check_entries_loop(records, slots, positions, prevs, tokens, check_token, expected_real, bits, aux):
    """Per entry: fail bits and ``expected_aux`` (the CPU path's hot loop).

    ``records`` is the canary buffer as int64 [num_slots, stride // 8] (fields 0-3 are
    read); slot 0 is padding (bits 0), a slot outside the buffer gets only the out-of-range bit. Each
    chunk first gathers its records (independent loads, many cache misses in
    flight), then checks them; a chain's predecessor is then mostly in cache.
    """
    num_slots = records.shape[0]
    for chunk in prange((slots.shape[0] + _CHUNK - 1) // _CHUNK):  # chunks are independent: one per core
        c0 = chunk * _CHUNK
        c1 = min(c0 + _CHUNK, slots.shape[0])
        own = np.empty((_CHUNK, CANARY_FIELDS_PER_SLOT), dtype=np.int64)
        for i in range(c0, c1):
            slot = slots[i]
            if slot > 0 and slot < num_slots:
                for f in range(CANARY_FIELDS_PER_SLOT):
                    own[i - c0, f] = records[slot, f]
        for i in range(c0, c1):
            slot = slots[i]
            bits[i] = 0
            if slot == _PADDING:
                continue
            if slot < 0 or slot >= num_slots:
                bits[i] = _SLOT_RANGE
                aux[i] = num_slots
                continue
            stored_hash = own[i - c0, FIELD_PREV_HASH]
            prev = prevs[i]
            b = 0
            expected = stored_hash  # prev == 0: predecessor unreachable, chain not checked
            if prev < 0:
                expected = _HEAD
                if stored_hash != expected:
                    b |= _CHAIN
            elif prev >= num_slots:
                expected = prev
                b |= _PREV_RANGE
            elif prev != 0:
                expected = np.int64(
                    splitmix64_mix3_u64(
                        np.uint64(records[prev, FIELD_PREV_HASH]),
                        np.uint64(records[prev, FIELD_TOKEN]),
                        np.uint64(records[prev, FIELD_POSITION]),
                    )
                )
                if stored_hash != expected:
                    b |= _CHAIN
            if own[i - c0, FIELD_POSITION] != positions[i]:
                b |= _POSITION
            if own[i - c0, FIELD_REAL_KV_HASH] != expected_real[i]:
                b |= _REAL_KV
            if check_token and tokens[i] != EXPECTED_TOKEN_UNCHECKED and own[i - c0, FIELD_TOKEN] != tokens[i]:
                b |= _TOKEN
            bits[i] = b
            aux[i] = expected


#: The same loop compiled twice: one chunk per core, and on one thread for a single chunk
#: (where starting the parallel loop would cost more than the check).
_check_entries = cpu_jit(nogil=True, parallel=True)(_check_entries_loop)
_check_entries_serial = cpu_jit(nogil=True)(twin(_check_entries_loop, "_serial"))


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
    check = bool(check_verify_expected_token)
    tokens = plan.verify_expected_tokens[:active] if check else positions  # not read when unchecked
    records = canary_fields(context.canary_buf)  # fields past the record's four are never read
    # Fingerprint of each slot's live KV bytes (0 in NONE mode, for uncovered or padding slots).
    expected_real = fold_slots(context.real_kv_sources, context.real_kv_hash_mode, slots).view(np.int64)
    bits = np.empty(active, dtype=np.int64)
    aux = np.empty(active, dtype=np.int64)
    args = (records, slots, positions, prevs, tokens, check, expected_real, bits, aux)
    if active > _CHUNK:  # several chunks: one per core
        run_parallel(_check_entries, _check_entries_serial, *args)
    else:
        _check_entries_serial(*args)

    hit = bits.nonzero()[0]  # entry order: the order rows are appended in
    if hit.shape[0] == 0:
        return
    slot, hit_bits = slots[hit], bits[hit]
    in_range = (hit_bits & _SLOT_RANGE) == 0
    # Out-of-range rows carry the plan's position, -1 / 0 for the record fields they have none of.
    record = np.zeros((hit.shape[0], CANARY_FIELDS_PER_SLOT), dtype=np.int64)
    record[in_range] = records[slot[in_range], :CANARY_FIELDS_PER_SLOT]
    record[~in_range, FIELD_TOKEN] = -1
    record[~in_range, FIELD_POSITION] = positions[hit][~in_range]
    expected_token = tokens[hit] if check else np.full(hit.shape[0], EXPECTED_TOKEN_UNCHECKED, dtype=np.int64)
    rows = np.empty((hit.shape[0], VIOLATION_FIELDS), dtype=np.int64)
    for k, column in enumerate(
        (
            int(context.kernel_kind),
            slot,
            record[:, FIELD_POSITION],
            record[:, FIELD_TOKEN],
            expected_token,
            record[:, FIELD_PREV_HASH],
            aux[hit],
            hit_bits,
        )
    ):
        rows[:, k] = column
    append_violation_rows(context, rows)
