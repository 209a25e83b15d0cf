"""Verify on the CPU (public wrapper, backend="numpy"): chains, real-KV, boundaries (SGLang's verify hand tests, docs/concepts/sglang.md).

Plan handling, counters, the ring, expected tokens and the out-of-range extensions
are in test_reference_verify_plans.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    chain_plan,
    counters,
    fields,
    make_context,
    record,
    row_bits,
    run_write,
    slot_hash,
    stamp,
    stamp_clean_chain,
    verify,
    verify_plan,
    write_index,
    write_plan,
)
from canary_oracles import KNOWN_REAL_KV_HASH, known_source, random_source, scalar_verify_rows

from kvcanary_numba import RealKvHashMode
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed

CHAIN, POSITION, REAL_KV = 1, 2, 4
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


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
    # First two from SGLang's pinned values; the rest pinned from an explicit three-step fold.
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
