"""Verify kernel (simulator or GPU) against the NumPy reference and pinned values: chains and real-KV.

Every launch goes through ``run_pair`` (``kernel_pairs.verify``): the kernels and
the reference run on byte-identical inputs and must agree on buffer, ring (as
multisets), write index and counters; the tests then check the expected rows
(SGLang's verify hand tests, docs/concepts/semantics.md). Counters, the ring, expected
tokens, out-of-range indices and the GPU runs are in test_kernels_verify_plans.py.
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
    run_write,
    slot_hash,
    stamp,
    stamp_clean_chain,
    verify_plan,
    write_args,
    write_plan,
)
from canary_oracles import KNOWN_REAL_KV_HASH, known_source, random_source
from kernel_pairs import run_pair, verify

from kvcanary_numba import RealKvHashMode, RealKvSource
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.launch._launch import SIM_BLOCK, SIM_MAX_BLOCKS

pytestmark = pytest.mark.simulator

CHAIN, POSITION, REAL_KV, SLOT_RANGE = 1, 2, 4, 64
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


# --- chain ---------------------------------------------------------------------


def test_chain_head_anchor():
    ctx = make_context()
    stamp(ctx, 5, 42, 0, HEAD)
    assert verify(ctx, verify_plan([5], [0], [-1])) == []
    assert counters(ctx) == (1, 1)


def test_clean_chain_with_hand_computed_hashes():
    ctx = make_context()
    prevs = stamp_clean_chain(ctx, [1, 2, 3, 4, 5], [101, 202, 303, 404, 505])
    assert prevs[:2] == [
        0xDE7FAE23A9A1B716,
        0x542FE5061275A6AB,
    ]  # SGLang's pinned chain values (docs/concepts/sglang.md)
    assert verify(ctx, chain_plan([1, 2, 3, 4, 5])) == []


def test_chain_head_checked_against_constant():
    ctx = make_context()
    stamp(ctx, 5, 42, 0, 0xDEADBEEF)
    assert verify(ctx, verify_plan([5], [0], [-1])) == [(0, 5, 0, 42, -1, 0xDEADBEEF, to_signed(HEAD), CHAIN)]


def test_random_chain_heads_are_clean(rng):
    ctx = make_context(64)
    slots = rng.choice(np.arange(1, 64), size=40, replace=False)
    positions = rng.integers(0, 2**40, 40)
    for slot, token, position in zip(slots, rng.integers(-(2**63), 2**63 - 1, 40), positions):
        stamp(ctx, int(slot), int(token), int(position), HEAD)
    assert verify(ctx, verify_plan(slots, positions, [-1] * 40)) == []


def test_prev_zero_skips_chain_check_but_not_position():
    ctx = make_context()
    stamp(ctx, 5, 7, 0, 0xDEADBEEFCAFEBABE)
    stored = to_signed(0xDEADBEEFCAFEBABE)
    assert verify(ctx, verify_plan([5], [0], [0])) == []
    assert verify(ctx, verify_plan([5], [99], [0])) == [(0, 5, 0, 7, -1, stored, stored, POSITION)]


def test_token_corruption_is_seen_by_the_successor():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2, 3], [10, 20, 30])
    fields(ctx)[2, 0] = 999
    rows = verify(ctx, chain_plan([1, 2, 3]))
    assert [(r[1], r[7], r[6]) for r in rows] == [(3, CHAIN, to_signed(slot_hash(ctx, 2)))]


@pytest.mark.parametrize(("stored_pos", "plan_pos"), [(0, 5), (0, 99), (10, 99)])
def test_position_mismatch_sets_position_bit_only(stored_pos, plan_pos):
    ctx = make_context()
    stamp(ctx, 7, 1, stored_pos, HEAD)
    assert [(r[2], r[7]) for r in verify(ctx, verify_plan([7], [plan_pos], [-1]))] == [(stored_pos, POSITION)]


def test_prev_hash_mismatch():
    ctx = make_context()
    stamp_clean_chain(ctx, [1, 2], [10, 20])
    fields(ctx)[2, 2] = 0x1234567812345678
    assert [r[7] for r in verify(ctx, chain_plan([1, 2]))] == [CHAIN]


def test_row_byte_layout_hardcoded():
    ctx = make_context()
    stamp(ctx, 5, 33, 0, HEAD)
    verify(ctx, verify_plan([5], [99], [-1]))
    anchor = to_signed(HEAD).to_bytes(8, "little", signed=True)
    want = b"".join(v.to_bytes(8, "little", signed=True) for v in (0, 5, 0, 33, -1)) + anchor + anchor
    assert ctx.violation_ring[0].tobytes() == want + (2).to_bytes(8, "little")


@pytest.mark.parametrize("token", [0, 1, 0xFFFFFFFF, -1, 0x80000000, 2**63 - 1, -(2**63)])
@pytest.mark.parametrize("position", [0, 127, 128, 0x7FFFFFFF, -1])
def test_boundary_tokens_and_positions(token, position):
    ctx = make_context()
    stamp(ctx, 3, token, position, HEAD)
    stamp(ctx, 4, token ^ 5, position + 1, slot_hash(ctx, 3))
    assert verify(ctx, verify_plan([3, 4], [position, position + 1], [-1, 3])) == []


@pytest.mark.parametrize("value", [0, 1, 2**64 - 1, 2**63, 0x5692161D100B05E5])
def test_boundary_stored_hashes(value):
    ctx = make_context()
    stamp(ctx, 3, 1, 0, value, value)
    rows = verify(ctx, verify_plan([3], [0], [-1]))
    assert [r[7] for r in rows] == [(CHAIN if value != HEAD else 0) | (REAL_KV if value else 0)]


# --- real-KV -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_known_answer_then_byte_flip(mode):
    src = known_source(1)
    ctx = make_context(sources=(src,), mode=mode)
    stamp(ctx, 1, 5, 0, HEAD, KNOWN_REAL_KV_HASH)
    assert verify(ctx, verify_plan([1], [0], [-1])) == []
    src.tensor[1, 7] ^= 0x01
    assert [r[7] for r in verify(ctx, verify_plan([1], [0], [-1]))] == [REAL_KV]


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_fingerprints_written_by_the_kernel_verify_clean(rng, mode, count):
    geometry = [(1, 32, 32, 0), (4, 16, 16, 16), (16, 128, 64, 0), (2, 64, 48, 32)][:count]
    sources = [random_source(rng, 16, page_size=p, nbytes=n, read_bytes=r, hole=h) for p, n, r, h in geometry]
    ctx = make_context(sources=sources, mode=mode)
    run_pair(ctx, "write", **write_args(write_plan([3], [-1]), [4, 5, 6], [0, 1, 2], [9, 10, 15]))
    assert all(record(ctx, s)[3] != 0 for s in (9, 10, 15))
    assert verify(ctx, chain_plan([9, 10, 15])) == []
    sources[-1].tensor[...] ^= 0x40  # every byte, holes included: all three slots now differ
    assert [(r[1], r[7]) for r in verify(ctx, chain_plan([9, 10, 15]))] == [(9, 4), (10, 4), (15, 4)]


def test_holes_and_none_mode_are_never_read(rng):
    src = random_source(rng, 16, nbytes=32, hole=16)
    ctx = make_context(sources=(src,), mode=ALL)
    run_write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [3, 4])
    src.tensor[:, 32:] = 0xAA  # holes
    assert verify(ctx, chain_plan([3, 4])) == []
    none = make_context(sources=(src,), mode=RealKvHashMode.NONE)
    stamp_clean_chain(none, [3, 4], [1, 2])
    assert verify(none, chain_plan([3, 4])) == []


@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_layout_with_strided_rows(rng, page_size):
    base = rng.integers(0, 256, size=(8, page_size * 32 + 48), dtype=np.uint8)
    src = RealKvSource(
        tensor=base[::2, : page_size * 32 + 16], page_size=page_size, num_bytes_per_token=32, read_bytes=32
    )
    slots = [page_size - 1, page_size, 2 * page_size + 1]
    ctx = make_context(4 * page_size, sources=(src,), mode=ALL)
    run_write(ctx, write_plan([3], [-1]), [1, 2, 3], [0, 1, 2], slots)
    assert verify(ctx, chain_plan(slots)) == []


@pytest.mark.parametrize("seed", range(3))
def test_long_reads_fold_in_several_staged_rounds(seed):
    # The warp fold stages 128 bytes of each slot per round: 272- and 400-byte reads take
    # three and four rounds, the last one partial; each warp's 32 lanes mix clean, corrupted,
    # padding and out-of-range slots, and more tiles than warps make the warps stride.
    rng = np.random.default_rng(seed)
    sources = [random_source(rng, 48, page_size=4, nbytes=272, hole=16), random_source(rng, 48, nbytes=400)]
    ctx = make_context(48, sources=sources, mode=ALL, ring_capacity=256)
    n = SIM_BLOCK * SIM_MAX_BLOCKS * 2 + 7
    slots = rng.integers(1, 48, n)
    run_write(ctx, write_plan([n], [-1]), rng.integers(1, 99, n), np.arange(n), slots)
    slots[rng.random(n) < 0.1] = 0
    slots[rng.random(n) < 0.05] = 48
    corrupted = int(slots[slots % 48 != 0][0])
    sources[1].tensor[corrupted, 399] ^= 0x10  # the last word of the last, partial round
    rows = verify(ctx, verify_plan(slots, rng.integers(0, n, n), [0] * n))
    assert {r[1] for r in rows if r[7] & REAL_KV} == {corrupted}
    assert {r[1] for r in rows if r[7] & SLOT_RANGE} == ({48} if (slots == 48).any() else set())
