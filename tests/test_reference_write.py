"""Write on the CPU (public wrapper, backend="numpy"): reference notes §4 / §10.4 and the extensions."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    KNOWN_REAL_KV_HASH,
    chain_prev_hashes,
    counters,
    known_source,
    make_context,
    random_source,
    record,
    ring_rows,
    row_bits,
    run_verify,
    run_write,
    scalar_real_kv_hash,
    stamp,
    verify_plan,
    write_index,
    write_plan,
)

from kvcanary_numba import OUT_OF_RANGE_SLOT, CanaryLaunchTag, RealKvHashMode, RealKvSource
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed

WTOKEN, WPOS = 8, 16
SLOT_RANGE, SEED_RANGE, RANGE = 64, 128, 256
NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def explicit_mix3(a, b, c):
    return splitmix64(splitmix64(splitmix64(a) ^ (b & (2**64 - 1))) ^ (c & (2**64 - 1)))


# --- seeds and chain -------------------------------------------------------------------


def test_negative_seed_anchors_the_chain():
    ctx = make_context()
    run_write(ctx, write_plan([1], [-1]), [42], [0], [3])
    assert record(ctx, 3) == (42, 0, HEAD, 0) and ring_rows(ctx) == []


def test_seed_slot_continues_its_chain():
    ctx = make_context()
    stamp(ctx, 7, 100, 4, HEAD)
    run_write(ctx, write_plan([1], [7]), [999], [5], [2])
    assert record(ctx, 2) == (999, 5, explicit_mix3(HEAD, 100, 4), 0)
    run_verify(ctx, verify_plan([7, 2], [4, 5], [-1, 7]))
    assert ring_rows(ctx) == []


def test_seed_with_non_head_prev_hash():
    ctx = make_context()
    stamp(ctx, 3, 7, 1, 0x1234)
    run_write(ctx, write_plan([1], [3]), [13], [2], [4])
    assert record(ctx, 4)[2] == splitmix64_mix3(0x1234, 7, 1)


def test_seed_resume_five_steps_hardcoded():
    ctx = make_context(64)
    stamp(ctx, 42, 7, 10, HEAD)
    tokens = [101, 202, 303, 404, 505]
    run_write(ctx, write_plan([5], [42]), tokens, range(11, 16), [0, 1, 2, 3, 4])
    h = explicit_mix3(HEAD, 7, 10)
    for k, token in enumerate(tokens):
        assert record(ctx, k) == (token, 11 + k, h, 0)  # slot 0 is written: write does not skip it
        h = explicit_mix3(h, token, 11 + k)
    assert ring_rows(ctx) == [] and counters(ctx) == (5, 1)


def test_five_step_chain_hardcoded():
    ctx = make_context()
    run_write(ctx, write_plan([5], [-1]), [101, 202, 303, 404, 505], range(5), [1, 2, 3, 4, 5])
    want = [0xDE7FAE23A9A1B716, 0x542FE5061275A6AB, 0x9890D56BDE53142E, 0x5213C65EEE8A1DD1, 0xC749AFFE5A5A9634]
    assert [record(ctx, s)[2] for s in range(1, 6)] == want


def test_chain_ignores_real_kv_hash(rng):
    sources = (random_source(rng, 16, nbytes=64), random_source(rng, 16, page_size=4, nbytes=16))
    ctx = make_context(sources=sources, mode=ALL)
    run_write(ctx, write_plan([3], [-1]), [5, 6, 7], [0, 1, 2], [8, 9, 10])
    assert [record(ctx, s)[2] for s in (8, 9, 10)] == chain_prev_hashes([5, 6, 7], [0, 1, 2])
    assert all(record(ctx, s)[3] == scalar_real_kv_hash(sources, ALL, s) != 0 for s in (8, 9, 10))


def test_requests_are_independent_chains():
    ctx = make_context()
    stamp(ctx, 15, 1, 0, HEAD)
    run_write(ctx, write_plan([2, 0, 3], [-1, 4, 15]), [1, 2, 3, 4, 5], [0, 1, 1, 2, 3], [1, 2, 3, 4, 5])
    assert [record(ctx, s)[2] for s in (1, 2)] == chain_prev_hashes([1, 2], [0, 1])
    assert [record(ctx, s)[2] for s in (3, 4, 5)] == chain_prev_hashes([3, 4, 5], [1, 2, 3], explicit_mix3(HEAD, 1, 0))
    assert counters(ctx) == (5, 1)


# --- write-input assert ----------------------------------------------------------------------


def test_input_assert_match_records_nothing():
    ctx = make_context()
    run_write(ctx, write_plan([3], [-1]), [1, 2, 3], [0, 1, 2], [1, 2, 3], [1, 2, 3], [0, 1, 2])
    assert ring_rows(ctx) == []


def test_input_assert_off_records_nothing():
    ctx = make_context()
    run_write(ctx, write_plan([2], [-1]), [1, 2], [0, 5], [1, 2])
    assert ring_rows(ctx) == []  # seed -1: the chain-position assert is inactive too


def test_token_mismatch_row():
    ctx = make_context(kind=CanaryLaunchTag.TAIL_V_SWA)
    run_write(ctx, write_plan([1], [-1]), [42], [0], [3], [99], [0])
    assert ring_rows(ctx) == [(int(CanaryLaunchTag.TAIL_V_SWA), 3, 0, 42, 99, to_signed(HEAD), 0, WTOKEN)]
    assert record(ctx, 3)[0] == 42  # the actual token is stored


def test_position_mismatch_row():
    ctx = make_context()
    run_write(ctx, write_plan([1], [-1]), [42], [7], [3], [42], [0])
    assert ring_rows(ctx) == [(0, 3, 7, 42, 42, to_signed(HEAD), 0, WPOS)] and record(ctx, 3)[1] == 7


def test_token_and_position_mismatch_share_one_row():
    ctx = make_context()
    run_write(ctx, write_plan([1], [-1]), [42], [7], [3], [41], [6])
    assert row_bits(ctx) == [WTOKEN | WPOS] and ring_rows(ctx)[0][4] == 41 and ring_rows(ctx)[0][6] == 6


def test_chain_advances_on_actual_values():
    ctx = make_context()
    run_write(ctx, write_plan([3], [-1]), [1, 2, 3], [0, 1, 2], [4, 5, 6], [9, 9, 9], [0, 1, 2])
    assert row_bits(ctx) == [WTOKEN] * 3
    hashes = chain_prev_hashes([1, 2, 3], [0, 1, 2])
    assert [r[5] for r in ring_rows(ctx)] == [to_signed(h) for h in hashes]
    ctx.violation_write_index[0] = 0
    run_verify(ctx, verify_plan([4, 5, 6], [0, 1, 2], [-1, 4, 5], [1, 2, 3]), check=True)
    assert write_index(ctx) == 0


@pytest.mark.parametrize(("field", "bit"), [("token", WTOKEN), ("position", WPOS)])
@pytest.mark.parametrize("where", [0, 2, 4])
def test_input_assert_bit_injection(field, bit, where):
    ctx = make_context(chain_assert=0)
    tokens, positions = [10, 20, 30, 40, 50], [0, 1, 2, 3, 4]
    exp_tokens, exp_positions = list(tokens), list(positions)
    (exp_tokens if field == "token" else exp_positions)[where] += 999
    run_write(ctx, write_plan([5], [-1]), tokens, positions, [1, 2, 3, 4, 5], exp_tokens, exp_positions)
    assert [(r[1], r[7]) for r in ring_rows(ctx)] == [(where + 1, bit)]


# --- chain-step position assert (targeted directly) --------------------------------------------


def seeded(chain_assert=1):
    ctx = make_context(chain_assert=chain_assert)
    stamp(ctx, 9, 5, 10, HEAD)
    return ctx


def test_chain_position_assert_passes_on_consecutive_positions():
    ctx = seeded()
    run_write(ctx, write_plan([3], [9]), [1, 2, 3], [11, 12, 13], [1, 2, 3])
    assert ring_rows(ctx) == []


def test_chain_position_assert_row():
    ctx = seeded()
    run_write(ctx, write_plan([3], [9]), [1, 2, 3], [11, 13, 14], [1, 2, 3])
    running = chain_prev_hashes([1, 2], [11, 13], explicit_mix3(HEAD, 5, 10))[1]
    assert ring_rows(ctx) == [(0, 2, 13, 2, 2, to_signed(running), 12, WPOS)]  # 14 follows 13: no row


def test_chain_position_assert_checks_first_entry_against_seed():
    ctx = seeded()
    run_write(ctx, write_plan([1], [9]), [1], [512], [1])
    assert [(r[2], r[6], r[7]) for r in ring_rows(ctx)] == [(512, 11, WPOS)]


@pytest.mark.parametrize(("chain_assert", "seed"), [(0, 9), (1, -1)])
def test_chain_position_assert_inactive(chain_assert, seed):
    ctx = seeded(chain_assert)
    run_write(ctx, write_plan([2], [seed]), [1, 2], [40, 90], [1, 2])
    assert ring_rows(ctx) == []


def test_both_asserts_fire_as_two_rows():
    ctx = seeded()
    run_write(ctx, write_plan([1], [9]), [1], [20], [1], [1], [11])
    assert row_bits(ctx) == [WPOS, WPOS] and [r[6] for r in ring_rows(ctx)] == [11, 11]


def test_skipped_entry_does_not_advance_the_chain():
    ctx = seeded()
    run_write(ctx, write_plan([3], [9]), [1, 2, 3], [11, 12, 12], [1, -1, 2])
    assert ring_rows(ctx) == []
    assert record(ctx, 2)[2] == chain_prev_hashes([1, 3], [11, 12], explicit_mix3(HEAD, 5, 10))[1]
    assert counters(ctx) == (2, 1)


def test_seed_slot_zero_is_used_as_is():
    ctx = make_context()
    stamp(ctx, 0, 3, 4, HEAD)
    run_write(ctx, write_plan([2], [0]), [1, 2], [5, 7], [1, 2])
    assert record(ctx, 1)[2] == explicit_mix3(HEAD, 3, 4) and [r[6] for r in ring_rows(ctx)] == [6]


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


@pytest.mark.parametrize(("offsets", "rows"), [([3, 1], []), ([6, 9], [(0, -1, -1, 6, 9, 0, 4, RANGE)]), ([2, 2], [])])
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
    run_write(ctx, plan, rng.integers(-(2**63), 2**63 - 1, n), rng.integers(-(2**63), 2**63 - 1, n),
              [0, -1, 2**63 - 1, 15, 16, -(2**63)])  # fmt: skip
    assert write_index(ctx) >= 1
