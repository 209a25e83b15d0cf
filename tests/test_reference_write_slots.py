"""Write on the CPU: slots and requests walked, real-KV fingerprints, out-of-range ranges, seeds and slots."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    chain_prev_hashes,
    counters,
    make_context,
    record,
    ring_rows,
    row_bits,
    run_write,
    seeded,
    write_index,
    write_plan,
)
from canary_oracles import KNOWN_REAL_KV_HASH, explicit_mix3, known_source, random_source, scalar_real_kv_hash

from kvcanary_numba import OUT_OF_RANGE_SLOT, RealKvHashMode, RealKvSource
from kvcanary_numba.hashing import to_signed

WTOKEN, WPOS = 8, 16
SLOT_RANGE, SEED_RANGE, RANGE = 64, 128, 256
NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL


# --- slots -----------------------------------------------------------------------------------


def test_negative_slots_are_skipped_entirely():
    ctx = make_context()
    before = ctx.canary_buf.copy()
    run_write(ctx, write_plan([3], [-1]), [1, 2, 3], [0, 1, 2], [5, -1, 7], [1, 9, 3], [0, 9, 2])
    changed = sorted(set(np.flatnonzero((ctx.canary_buf != before).any(axis=1))))
    assert changed == [5, 7] and ring_rows(ctx) == [] and counters(ctx) == (2, 1)


def test_inactive_requests_are_not_walked():
    ctx = make_context()
    plan = write_plan([1, 1, 1, 1], [-1] * 4, num_valid=1)
    run_write(ctx, plan, [1, 2, 3, 4], [0, 0, 0, 0], [1, 2, 3, 4])
    assert [record(ctx, s)[0] for s in (1, 2, 3, 4)] == [1, 0, 0, 0]


@pytest.mark.parametrize("num_valid", [-3, 0])
def test_no_active_request_only_counts_the_launch(num_valid):
    ctx = make_context()
    for call in range(3):
        run_write(ctx, write_plan([2], [-1], num_valid=num_valid), [1, 2], [0, 1], [1, 2])
    assert counters(ctx) == (0, 3) and not ctx.canary_buf.any()


def test_num_valid_clamped_to_capacity():
    ctx = make_context()
    run_write(ctx, write_plan([1, 1], [-1, -1], num_valid=50), [1, 2], [0, 0], [1, 2])
    assert counters(ctx) == (2, 1)


def test_shrinking_batch_leaves_old_slots_alone():
    ctx = make_context(32)
    plan = write_plan([1] * 8, [-1] * 8)
    run_write(ctx, plan, range(1, 9), [0] * 8, range(1, 9))
    snapshot = ctx.canary_buf.copy()
    plan.write_offsets[:4] = [0, 1, 2, 3]
    plan.write_num_valid_reqs[0] = 3
    run_write(ctx, plan, [7, 7, 7, 0, 0, 0, 0, 0], [0] * 8, [20, 21, 22, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(ctx.canary_buf[:9], snapshot[:9])
    assert [record(ctx, s)[0] for s in (20, 21, 22)] == [7, 7, 7]


def test_empty_token_arrays():
    ctx = make_context()
    run_write(ctx, write_plan([0, 0], [3, -1]), [], [], [])
    assert counters(ctx) == (0, 1) and ring_rows(ctx) == []


# --- real-KV -----------------------------------------------------------------------------------


def test_none_mode_stores_zero(rng):
    ctx = make_context(sources=(random_source(rng, 16),), mode=NONE)
    run_write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [1, 2])
    assert record(ctx, 1)[3] == record(ctx, 2)[3] == 0


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_known_answer_stored_at_slot_zero(mode):
    src = known_source(0)
    ctx = make_context(sources=(src,), mode=mode)
    run_write(ctx, write_plan([1], [-1]), [1], [0], [0])
    assert record(ctx, 0)[3] == KNOWN_REAL_KV_HASH


def test_paged_fingerprints_per_slot(rng):
    tensor = rng.integers(0, 256, size=(2, 16 * 128), dtype=np.uint8)
    src = RealKvSource(tensor=tensor, page_size=16, num_bytes_per_token=128, read_bytes=128)
    ctx = make_context(32, sources=(src,), mode=ALL)
    run_write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [3, 7])
    h3, h7 = record(ctx, 3)[3], record(ctx, 7)[3]
    assert h3 == scalar_real_kv_hash([src], ALL, 3) and h7 == scalar_real_kv_hash([src], ALL, 7) and h3 != h7


def test_fold_order_matters(rng):
    a, b = random_source(rng, 16), random_source(rng, 16)
    stored = []
    for sources in ((a, b), (b, a)):
        ctx = make_context(sources=sources, mode=ALL)
        run_write(ctx, write_plan([1], [-1]), [1], [0], [5])
        stored.append(record(ctx, 5)[3])
    assert stored[0] != stored[1] and 0 not in stored


def test_out_of_range_slot_reads_no_source(rng):
    src = random_source(rng, 16)
    ctx = make_context(sources=(src,), mode=ALL)
    run_write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [2**40, 3])
    assert row_bits(ctx) == [SLOT_RANGE] and record(ctx, 3)[3] == scalar_real_kv_hash([src], ALL, 3)


# --- extensions: out-of-range ranges, seeds and slots ----------------------------------------------


def test_range_past_the_tokens_is_clipped_and_reported():
    ctx = make_context()
    plan = write_plan([10], [-1])
    run_write(ctx, plan, [1, 2, 3, 4], [0, 1, 2, 3], [1, 2, 3, 4])
    assert ring_rows(ctx) == [(0, -1, -1, 0, 10, 0, 4, RANGE)]
    assert [record(ctx, s)[0] for s in (1, 2, 3, 4)] == [1, 2, 3, 4] and counters(ctx) == (4, 1)


def test_negative_range_start_is_clipped():
    ctx = make_context()
    plan = write_plan([2], [-1])
    plan.write_offsets[:2] = [-2, 2]
    run_write(ctx, plan, [1, 2, 3], [0, 1, 2], [1, 2, 3])
    assert ring_rows(ctx) == [(0, -1, -1, -2, 2, 0, 3, RANGE)] and counters(ctx) == (2, 1)


@pytest.mark.parametrize(
    ("offsets", "rows"),
    [
        ([3, 1], []),
        ([6, 9], [(0, -1, -1, 6, 9, 0, 4, RANGE)]),
        ([2, 2], []),
        # empty ranges whose bounds lie outside the 4 tokens record nothing (semantics.md, bit 256)
        ([6, 6], []),
        ([-3, -3], []),
        ([9, 5], []),
        ([2, -1], []),
    ],
)
def test_empty_or_outside_ranges_write_nothing(offsets, rows):
    ctx = make_context()
    plan = write_plan([0], [2**40])  # an out-of-range seed is only reported for a request with entries
    plan.write_offsets[:2] = offsets
    run_write(ctx, plan, [1, 2, 3, 4], [0, 1, 2, 3], [1, 2, 3, 4])
    assert ring_rows(ctx) == rows and counters(ctx) == (0, 1) and not ctx.canary_buf.any()


@pytest.mark.parametrize("seed", [16, 2**40, OUT_OF_RANGE_SLOT])
def test_out_of_range_seed_anchors_and_disables_position_assert(seed):
    ctx = make_context()
    run_write(ctx, write_plan([2], [seed]), [1, 2], [50, 80], [1, 2])
    assert ring_rows(ctx) == [(0, seed, -1, -1, -1, 0, 16, SEED_RANGE)]
    assert [record(ctx, s)[2] for s in (1, 2)] == chain_prev_hashes([1, 2], [50, 80])


@pytest.mark.parametrize("slot", [16, 2**40, OUT_OF_RANGE_SLOT])
def test_out_of_range_slot_is_reported_and_chain_advances(slot):
    ctx = seeded()
    run_write(ctx, write_plan([3], [9]), [1, 2, 3], [11, 12, 14], [1, slot, 2], [1, 7, 3], [11, 12, 14])
    seed_hash = explicit_mix3(HEAD, 5, 10)
    running = chain_prev_hashes([1, 2, 3], [11, 12, 14], seed_hash)
    assert ring_rows(ctx) == [
        (0, slot, 12, 2, 7, to_signed(running[1]), 12, WTOKEN),  # asserts first, as for a valid slot
        (0, slot, 12, 2, 2, to_signed(running[1]), 16, SLOT_RANGE),
        (0, 2, 14, 3, 3, to_signed(running[2]), 13, WPOS),
    ]
    assert record(ctx, 2)[2] == running[2] and counters(ctx) == (2, 1)


def test_bad_values_never_raise(rng):
    ctx = make_context(ring_capacity=8)
    plan = write_plan([3, 3, 3], [-5, 2**62, 3])
    plan.write_offsets[:4] = [-(2**62), 5, 2**62, -1]
    n = 6
    run_write(
        ctx,
        plan,
        rng.integers(-(2**63), 2**63 - 1, n),
        rng.integers(-(2**63), 2**63 - 1, n),
        [0, -1, 2**63 - 1, 15, 16, -(2**63)],
    )
    assert write_index(ctx) >= 1
