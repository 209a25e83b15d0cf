"""Write on the CPU (public wrapper, backend="numpy"): seeds, chains and the asserts (SGLang's tests, docs/concepts/sglang.md).

Slots, requests, real-KV and the out-of-range extensions are in test_reference_write_slots.py.
"""

from __future__ import annotations

import pytest
from canary_helpers import (
    HEAD,
    chain_prev_hashes,
    counters,
    make_context,
    record,
    ring_rows,
    row_bits,
    run_verify,
    run_write,
    seeded,
    stamp,
    verify_plan,
    write_index,
    write_plan,
)
from canary_oracles import explicit_mix3, random_source, scalar_real_kv_hash

from kvcanary_numba import CanaryLaunchTag, RealKvHashMode
from kvcanary_numba.hashing import splitmix64_mix3, to_signed

WTOKEN, WPOS = 8, 16
ALL = RealKvHashMode.ALL


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
