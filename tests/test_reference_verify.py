"""Verify on the CPU (public wrapper, backend="numpy"): reference notes §5 / §10.3 and the extensions."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    KNOWN_REAL_KV_HASH,
    chain_plan,
    counters,
    fields,
    known_source,
    make_context,
    random_source,
    record,
    ring_rows,
    row_bits,
    run_verify,
    run_write,
    scalar_verify_rows,
    slot_hash,
    stamp,
    stamp_clean_chain,
    verify_plan,
    write_index,
    write_plan,
)

from kvcanary_numba import OUT_OF_RANGE_SLOT, CanaryLaunchTag, RealKvHashMode
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed

CHAIN, POSITION, REAL_KV, TOKEN = 1, 2, 4, 32
SLOT_RANGE, PREV_RANGE = 64, 128
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def verify(ctx, plan, check=False):
    """Run verify and assert the invariant that it never writes the canary buffer."""
    before = ctx.canary_buf.copy()
    run_verify(ctx, plan, check)
    np.testing.assert_array_equal(ctx.canary_buf, before)
    return ring_rows(ctx)


# --- chain ---------------------------------------------------------------------


def test_chain_head_anchor():
    ctx = make_context()
    stamp(ctx, 5, 42, 0, HEAD)
    assert verify(ctx, verify_plan([5], [0], [-1])) == []


def test_clean_five_step_chain():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2, 3, 4, 5], [11, 22, 33, 44, 55])
    assert verify(ctx, chain_plan([1, 2, 3, 4, 5])) == []
    assert counters(ctx) == (5, 1)


def test_clean_chain_hardcoded_prev_hashes():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2, 3, 4, 5], [101, 202, 303, 404, 505])
    # First two from the reference notes §3; the rest pinned from an explicit three-step fold.
    want = [0xDE7FAE23A9A1B716, 0x542FE5061275A6AB, 0x9890D56BDE53142E, 0x5213C65EEE8A1DD1, 0xC749AFFE5A5A9634]
    assert [record(ctx, s)[2] for s in range(1, 6)] == want
    h = HEAD
    for k, token in enumerate([101, 202, 303, 404, 505]):
        assert record(ctx, k + 1)[2] == h
        h = splitmix64(splitmix64(splitmix64(h) ^ token) ^ k)
    assert verify(ctx, chain_plan([1, 2, 3, 4, 5])) == []


def test_chain_head_checked_against_constant():
    ctx = make_context()
    stamp(ctx, 5, 42, 0, 0xDEADBEEF)
    rows = verify(ctx, verify_plan([5], [0], [-1]))
    assert rows == [(0, 5, 0, 42, -1, 0xDEADBEEF, to_signed(HEAD), CHAIN)]


def test_random_chain_heads_are_clean(rng):
    ctx = make_context(64)
    slots = rng.choice(np.arange(1, 64), size=50, replace=False)
    tokens, positions = rng.integers(-(2**63), 2**63 - 1, 50), rng.integers(0, 2**40, 50)
    for slot, token, position in zip(slots, tokens, positions):
        stamp(ctx, int(slot), int(token), int(position), HEAD)
    assert verify(ctx, verify_plan(slots, positions, [-1] * 50)) == []


def test_prev_zero_skips_chain_check():
    ctx = make_context()
    stamp(ctx, 5, 7, 3, 0xDEADBEEFCAFEBABE)
    assert verify(ctx, verify_plan([5], [3], [0])) == []


def test_prev_zero_does_not_mask_position_check():
    ctx = make_context()
    stamp(ctx, 5, 7, 0, 0xDEADBEEFCAFEBABE)
    stored = to_signed(0xDEADBEEFCAFEBABE)
    assert verify(ctx, verify_plan([5], [99], [0])) == [(0, 5, 0, 7, -1, stored, stored, POSITION)]


def test_token_corruption_is_seen_by_the_successor():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2, 3], [10, 20, 30])
    fields(ctx)[2, 0] = 999
    assert verify(ctx, chain_plan([1, 2])) == []  # slot 2's own hash input is slot 1
    rows = verify(ctx, verify_plan([3], [2], [2]))
    assert [r[7] for r in rows] == [CHAIN] and rows[0][6] == to_signed(slot_hash(ctx, 2))


@pytest.mark.parametrize(("stored_pos", "plan_pos"), [(0, 5), (0, 99), (10, 99), (5, 4)])
def test_position_mismatch_sets_position_bit_only(stored_pos, plan_pos):
    ctx = make_context()
    stamp(ctx, 7, 1, stored_pos, HEAD)
    rows = verify(ctx, verify_plan([7], [plan_pos], [-1]))
    assert [(r[2], r[7]) for r in rows] == [(stored_pos, POSITION)]  # row holds the STORED position


def test_prev_hash_mismatch():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2], [10, 20])
    fields(ctx)[2, 2] = 0x1234567812345678
    assert row_bits(ctx) == [] and [r[7] for r in verify(ctx, chain_plan([1, 2]))] == [CHAIN]


def test_real_kv_mismatch_after_write(rng):
    src = random_source(rng, 16, nbytes=64)
    ctx = make_context(sources=(src,), mode=ALL)
    run_write(ctx, write_plan([3], [-1]), [10, 20, 30], [0, 1, 2], [1, 2, 3])
    assert verify(ctx, chain_plan([1, 2, 3])) == []
    src.tensor[1, 0] ^= 0xFF
    rows = verify(ctx, chain_plan([1, 2, 3]))
    assert [(r[1], r[7]) for r in rows] == [(1, REAL_KV)]


def _corrupt(ctx, src, kind, slot):
    if kind == "position":
        fields(ctx)[slot, 1] += 99
    elif kind == "prev_hash":
        fields(ctx)[slot, 2] ^= 1
    else:
        src.tensor[slot, 3] ^= 0x10


@pytest.mark.parametrize("kind,bit", [("position", POSITION), ("prev_hash", CHAIN), ("real_kv", REAL_KV)])
@pytest.mark.parametrize("where", [0, 2, 4])
@pytest.mark.parametrize("ring_full", [False, True])
def test_bit_injection_matrix(rng, kind, bit, where, ring_full):
    src = random_source(rng, 16)
    ctx = make_context(sources=(src,), mode=PARTIAL, ring_capacity=4)
    slots = [3, 4, 5, 6, 7]
    run_write(ctx, write_plan([5], [-1]), [1, 2, 3, 4, 5], range(5), slots)
    if ring_full:
        ctx.violation_ring[...] = 77
        ctx.violation_write_index[0] = 4
    _corrupt(ctx, src, kind, slots[where])
    rows = verify(ctx, chain_plan(slots))
    if ring_full:
        assert write_index(ctx) > 4 and (ctx.violation_ring == 77).all()
    else:
        assert (slots[where], bit) in [(r[1], r[7] & bit) for r in rows]


def test_row_byte_layout_hardcoded():
    ctx = make_context()
    stamp(ctx, 5, 33, 0, HEAD)
    verify(ctx, verify_plan([5], [99], [-1]))
    anchor = to_signed(HEAD).to_bytes(8, "little", signed=True)
    want = b"".join(v.to_bytes(8, "little", signed=True) for v in (0, 5, 0, 33, -1)) + anchor + anchor
    want += (2).to_bytes(8, "little")
    assert ctx.violation_ring[0].tobytes() == want


# --- real-KV -----------------------------------------------------------------------


def test_none_mode_ignores_sources(rng):
    ctx = make_context(sources=(random_source(rng, 16), random_source(rng, 16)), mode=RealKvHashMode.NONE)
    stamp_clean_chain(ctx, [1, 2], [5, 6])
    assert verify(ctx, chain_plan([1, 2])) == []


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_written_fingerprints_verify_clean(rng, mode, count):
    sources = [random_source(rng, 16, page_size=p, nbytes=n) for p, n in [(1, 32), (4, 16), (16, 128), (2, 64)][:count]]
    ctx = make_context(sources=sources, mode=mode)
    run_write(ctx, write_plan([3], [-1]), [4, 5, 6], [0, 1, 2], [9, 10, 11])
    assert all(record(ctx, s)[3] != 0 for s in (9, 10, 11))
    assert verify(ctx, chain_plan([9, 10, 11])) == []


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_known_answer_then_byte_flip(mode):
    src = known_source(1)
    ctx = make_context(sources=(src,), mode=mode)
    stamp(ctx, 1, 9, 0, HEAD, KNOWN_REAL_KV_HASH)
    assert verify(ctx, verify_plan([1], [0], [-1])) == []
    src.tensor[1, 15] ^= 0x01  # a single bit
    assert row_bits(ctx) == [] and [r[7] for r in verify(ctx, verify_plan([1], [0], [-1]))] == [REAL_KV]


def test_holes_never_read(rng):
    src = random_source(rng, 16, nbytes=16, hole=16)
    ctx = make_context(sources=(src,), mode=ALL)
    run_write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [3, 4])
    src.tensor[:, 16:] = 0xAA
    assert verify(ctx, chain_plan([3, 4])) == []


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_layout(rng, page_size):
    src = random_source(rng, 32, page_size=page_size, nbytes=32)
    ctx = make_context(32, sources=(src,), mode=ALL)
    slots = [1, 5, 15, 16, 17]
    run_write(ctx, write_plan([5], [-1]), [1, 2, 3, 4, 5], range(5), slots)
    assert verify(ctx, chain_plan(slots)) == []
    src.tensor[16 // page_size, (16 % page_size) * 32] ^= 1
    assert [(r[1], r[7]) for r in verify(ctx, chain_plan(slots))] == [(16, REAL_KV)]


# --- plan handling and counters ----------------------------------------------------------


def test_empty_plan_is_a_no_op():
    ctx = make_context()
    assert verify(ctx, verify_plan([], [], [], capacity=4)) == []
    assert (write_index(ctx), *counters(ctx)) == (0, 0, 1)


def test_slot_zero_entry_is_skipped_but_counted():
    ctx = make_context()
    fields(ctx)[0] = -12345
    assert verify(ctx, verify_plan([0], [3], [1], [77]), check=True) == []
    assert counters(ctx) == (1, 1)


def test_disabled_plan_only_counts_the_launch():
    ctx = make_context(ring_capacity=4)
    ctx.violation_ring[...] = 5
    ctx.violation_write_index[0] = 2
    ctx.slot_run_counter[0] = 40
    verify(ctx, verify_plan([3, 4], [9, 9], [-1, -1], enable=0))
    assert (write_index(ctx), *counters(ctx)) == (2, 40, 1) and (ctx.violation_ring == 5).all()


@pytest.mark.parametrize(("num_valid", "checked"), [(-5, 0), (0, 0), (2, 2), (3, 3), (99, 3)])
def test_num_valid_is_clamped_to_capacity(num_valid, checked):
    ctx = make_context()
    verify(ctx, verify_plan([1, 2, 3], [9, 9, 9], [-1, -1, -1], num_valid=num_valid))
    assert counters(ctx) == (checked, 1) and write_index(ctx) == checked  # every checked entry mismatches


def test_counters_accumulate_over_calls():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2, 3], [1, 2, 3])
    plan = chain_plan([1, 2, 3])
    for call in range(1, 51):
        verify(ctx, plan if call % 2 else verify_plan([], [], []))
        assert counters(ctx) == (3 * ((call + 1) // 2), call)


def test_many_entries(rng):
    n = 40_000
    ctx = make_context(n + 1, ring_capacity=4)
    slots = np.arange(1, n + 1)
    tokens = rng.integers(0, 1000, n)
    run_write(ctx, write_plan([n], [-1]), tokens, range(n), slots)
    assert verify(ctx, chain_plan(list(slots))) == [] and counters(ctx) == (2 * n, 2)


# --- ring --------------------------------------------------------------------------


def test_ring_fill_once_and_overflow():
    ctx = make_context(ring_capacity=4)
    slots = list(range(1, 11))
    verify(ctx, verify_plan(slots, [50] * 10, [-1] * 10))
    assert write_index(ctx) == 10
    assert [r[1] for r in ring_rows(ctx)] == [1, 2, 3, 4]  # the first four, in entry order
    verify(ctx, verify_plan([5], [50], [-1]))
    assert write_index(ctx) == 11 and [r[1] for r in ring_rows(ctx)] == [1, 2, 3, 4]


@pytest.mark.parametrize("start", [-7, 2**31 - 2])
def test_garbage_write_index_never_writes_outside_the_ring(start):
    ctx = make_context(ring_capacity=4)
    ctx.violation_write_index[0] = start
    verify(ctx, verify_plan([1, 2, 3, 4, 5], [9] * 5, [-1] * 5))
    landed = [k for k in range(4) if ctx.violation_ring[k].any()]
    if start < 0:  # tickets -7..-3: none lands
        assert landed == [] and write_index(ctx) == start + 5
    else:  # tickets wrap to negative int32 values: none lands either
        assert landed == [] and write_index(ctx) == np.int32(start + 5 - 2**32)


@pytest.mark.parametrize("kind", [CanaryLaunchTag.HEAD_K_FULL, CanaryLaunchTag.SWEEP_V_SWA, CanaryLaunchTag.HEAD_V_SWA])
def test_kernel_kind_is_stamped(kind):
    ctx = make_context(kind=kind)
    verify(ctx, verify_plan([2, 3], [1, 1], [-1, -1]))
    assert [r[0] for r in ring_rows(ctx)] == [int(kind)] * 2 and {r[1] for r in ring_rows(ctx)} == {2, 3}


def test_many_violations_all_counted():
    ctx = make_context(64, ring_capacity=64)
    verify(ctx, verify_plan(range(1, 51), [0] * 50, [-1] * 50))  # zero records as heads: chain mismatch
    assert write_index(ctx) == 50 and set(row_bits(ctx)) == {CHAIN}


# --- boundaries --------------------------------------------------------------------------

TOKENS = [0, 1, 0xFFFFFFFF, -1, 0x80000000, 0x7FFFFFFF]
POSITIONS = [0, 1, 127, 128, 129, 0x7FFFFFFF]
HASHES = [0, splitmix64(0), 2**64 - 1, 2**63]


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize("position", POSITIONS)
def test_boundary_tokens_and_positions_chain_clean(token, position):
    ctx = make_context()
    stamp_clean_chain(ctx, [3, 4], [token, token], [position, position + 1])
    assert verify(ctx, chain_plan([3, 4], [position, position + 1]), check=False) == []
    plan = verify_plan([3, 4], [position, position + 1], [-1, 3], [token, token])
    assert verify(ctx, plan, check=True) == []


@pytest.mark.parametrize("prev_hash", HASHES)
@pytest.mark.parametrize("real_kv", HASHES)
def test_boundary_stored_hashes_match_scalar_oracle(prev_hash, real_kv):
    ctx = make_context()
    stamp(ctx, 3, 5, 0, prev_hash, real_kv)
    stamp(ctx, 4, 6, 1, splitmix64_mix3(prev_hash, 5, 0), real_kv)
    plan = verify_plan([3, 4, 4], [0, 1, 1], [-1, 3, 0])
    want = scalar_verify_rows(ctx, plan, False)
    assert verify(ctx, plan) == want
    assert {r[1] for r in want} == ({3} if prev_hash != HEAD else set()) | ({3, 4} if real_kv else set())


# --- expected tokens -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "check", "want"),
    [(-1, True, []), (42, True, []), (99, True, [(42, 99, TOKEN)]), (99, False, []), (2**63 - 1, False, [])],
)
def test_expected_token(expected, check, want):
    ctx = make_context()
    stamp(ctx, 3, 42, 0, HEAD)
    rows = verify(ctx, verify_plan([3], [0], [-1], [expected]), check=check)
    assert [(r[3], r[4], r[7]) for r in rows] == want


def test_token_and_position_mismatch_share_one_row():
    ctx = make_context()
    stamp(ctx, 3, 42, 0, HEAD)
    rows = verify(ctx, verify_plan([3], [99], [-1], [123]), check=True)
    assert [(r[3], r[4], r[7]) for r in rows] == [(42, 123, TOKEN | POSITION)]


# --- extensions: out-of-range indices ------------------------------------------------------------


@pytest.mark.parametrize("slot", [16, 17, 2**40, OUT_OF_RANGE_SLOT, -1, -(2**63)])
@pytest.mark.parametrize("check", [False, True])
def test_out_of_range_slot_row(slot, check):
    ctx = make_context()
    rows = verify(ctx, verify_plan([slot], [7], [-1], [55]), check=check)
    assert rows == [(0, slot, 7, -1, 55 if check else -1, 0, 16, SLOT_RANGE)]
    assert counters(ctx) == (1, 1)


@pytest.mark.parametrize("prev", [16, 2**40, OUT_OF_RANGE_SLOT])
def test_out_of_range_prev_row(prev):
    ctx = make_context()
    stamp(ctx, 3, 42, 4, 0xABCDEF)
    assert verify(ctx, verify_plan([3], [4], [prev])) == [(0, 3, 4, 42, -1, 0xABCDEF, prev, PREV_RANGE)]
    ctx.violation_write_index[0] = 0
    rows = verify(ctx, verify_plan([3], [5], [prev], [41]), check=True)
    assert rows == [(0, 3, 4, 42, 41, 0xABCDEF, prev, PREV_RANGE | POSITION | TOKEN)]


def test_rows_stay_in_entry_order_across_kinds():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2], [1, 2])
    plan = verify_plan([99, 1, 2, -4, 2], [0, 0, 1, 0, 5], [-1, -1, 1, -1, 1 << 40])
    assert [r[1] for r in verify(ctx, plan)] == [99, -4, 2]
    assert ring_rows(ctx) == scalar_verify_rows(ctx, plan, False)


# --- scale ---------------------------------------------------------------------------------------
# Speed against a Python loop is measured by benchmarks/run.py (no timed assertions in tests).


def test_million_entry_clean_chain_has_no_violation(rng):
    n = 1_000_000
    ctx = make_context(n + 1, ring_capacity=16)
    slots = np.arange(1, n + 1)
    run_write(ctx, write_plan([n], [-1]), rng.integers(0, 50_000, n), range(n), slots)
    run_verify(ctx, chain_plan(list(slots)))
    assert write_index(ctx) == 0
    assert int(ctx.slot_run_counter[0]) == 2 * n  # n written, then n verified
