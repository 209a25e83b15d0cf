"""Verify kernel (simulator or GPU) against the NumPy reference and pinned values.

Every launch goes through ``run_pair``: the kernels and the reference run on
byte-identical inputs and must agree on buffer, ring (as multisets), write
index and counters; the tests then check the expected rows (reference notes
§10.3, docs/concepts/semantics.md).
"""

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
    run_write,
    slot_hash,
    stamp,
    stamp_clean_chain,
    verify_plan,
    write_args,
    write_index,
    write_plan,
)
from kernel_pairs import run_pair, to_host

from kvcanary_numba import OUT_OF_RANGE_SLOT, CanaryLaunchTag, RealKvHashMode, RealKvSource
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.launch._common import SIM_BLOCK, SIM_MAX_BLOCKS

pytestmark = pytest.mark.simulator

CHAIN, POSITION, REAL_KV, TOKEN, SLOT_RANGE, PREV_RANGE = 1, 2, 4, 32, 64, 128
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def verify(ctx, plan, check=False):
    """Kernel and reference verify; returns the (agreeing) rows in ring order of the reference."""
    before = ctx.canary_buf.copy()
    kernel_ctx = run_pair(ctx, "verify", plan=plan, check_verify_expected_token=check)
    np.testing.assert_array_equal(to_host(kernel_ctx.canary_buf), before)  # verify never writes
    return ring_rows(ctx)


# --- chain ---------------------------------------------------------------------


def test_chain_head_anchor():
    ctx = make_context()
    stamp(ctx, 5, 42, 0, HEAD)
    assert verify(ctx, verify_plan([5], [0], [-1])) == []
    assert counters(ctx) == (1, 1)


def test_clean_chain_with_hand_computed_hashes():
    ctx = make_context()
    prevs = stamp_clean_chain(ctx, [1, 2, 3, 4, 5], [101, 202, 303, 404, 505])
    assert prevs[:2] == [0xDE7FAE23A9A1B716, 0x542FE5061275A6AB]  # reference notes §3
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
    src = RealKvSource(tensor=base[::2, : page_size * 32 + 16], page_size=page_size, num_bytes_per_token=32, read_bytes=32)
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


# --- counters, enable, grid ---------------------------------------------------------


def test_empty_plan_and_slot_zero():
    ctx = make_context()
    assert verify(ctx, verify_plan([], [], [], capacity=4)) == [] and counters(ctx) == (0, 1)
    fields(ctx)[0] = [9, 9, 9, 9]
    assert verify(ctx, verify_plan([0], [5], [3])) == [] and counters(ctx) == (1, 2)


def test_disabled_plan_only_counts_the_launch():
    ctx = make_context()
    ctx.violation_ring[0] = 5
    ctx.violation_write_index[0] = 1
    ctx.slot_run_counter[0] = 10
    verify(ctx, verify_plan([3], [99], [-1], enable=0))
    assert counters(ctx) == (10, 1) and write_index(ctx) == 1


@pytest.mark.parametrize(("num_valid", "checked"), [(-5, 0), (0, 0), (2, 2), (3, 3), (99, 3)])
def test_num_valid_is_clamped_to_capacity(num_valid, checked):
    ctx = make_context()
    rows = verify(ctx, verify_plan([3, 4, 5], [1, 1, 1], [-1, -1, -1], num_valid=num_valid))
    assert len(rows) == checked and counters(ctx) == (checked, 1)


@pytest.mark.parametrize("n", [SIM_BLOCK - 1, SIM_BLOCK, SIM_BLOCK + 1, SIM_BLOCK * SIM_MAX_BLOCKS * 3 + 5])
def test_grid_stride_covers_every_entry(rng, n):
    ctx = make_context(256, ring_capacity=512)
    slots = rng.choice(np.arange(1, 256), size=n, replace=n > 255)
    positions = rng.integers(0, 3, n)
    for slot in slots:
        stamp(ctx, int(slot), 1, 1, HEAD)
    rows = verify(ctx, verify_plan(slots, positions, [-1] * n))
    assert len(rows) == int((positions != 1).sum()) and counters(ctx) == (n, 1)


def test_counters_accumulate_over_launches():
    ctx = make_context()
    plan = verify_plan([3, 4, 5], [0, 0, 0], [0, 0, 0])
    for _ in range(3):
        verify(ctx, plan)
    assert counters(ctx) == (9, 3)


# --- ring ----------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 4, 10])
def test_ring_fill_once_and_overflow(capacity):
    ctx = make_context(ring_capacity=capacity)
    verify(ctx, verify_plan(list(range(1, 11)), [99] * 10, [0] * 10))  # 10 position mismatches
    assert write_index(ctx) == 10 and len(ring_rows(ctx)) == min(10, capacity)


@pytest.mark.parametrize("start", [-7, 2**31 - 2])
def test_garbage_write_index_never_writes_outside_the_ring(start):
    ctx = make_context(ring_capacity=4)
    ctx.violation_write_index[0] = start
    verify(ctx, verify_plan([1, 2, 3], [9, 9, 9], [0, 0, 0]))
    assert not ctx.violation_ring.any()


@pytest.mark.parametrize("kind", [CanaryLaunchTag.HEAD_K_FULL, CanaryLaunchTag.SWEEP_V_SWA])
def test_kernel_kind_is_stamped(kind):
    ctx = make_context(kind=kind)
    assert [r[0] for r in verify(ctx, verify_plan([3], [1], [0]))] == [int(kind)]


# --- expected tokens and out-of-range indices ----------------------------------------


@pytest.mark.parametrize(
    ("expected", "check", "want"),
    [(-1, True, []), (42, True, []), (99, True, [TOKEN]), (99, False, []), (2**63 - 1, False, [])],
)
def test_expected_token(expected, check, want):
    ctx = make_context()
    stamp(ctx, 4, 42, 0, HEAD)
    rows = verify(ctx, verify_plan([4], [0], [-1], tokens=[expected]), check)
    assert [r[7] for r in rows] == want and all(r[4] == expected for r in rows)


def test_token_and_position_mismatch_share_one_row():
    ctx = make_context()
    stamp(ctx, 4, 42, 0, HEAD)
    assert verify(ctx, verify_plan([4], [99], [-1], tokens=[123]), True) == [
        (0, 4, 0, 42, 123, to_signed(HEAD), to_signed(HEAD), TOKEN | POSITION)
    ]


@pytest.mark.parametrize("slot", [16, 2**40, OUT_OF_RANGE_SLOT, -1, -(2**63)])
@pytest.mark.parametrize("check", [False, True])
def test_out_of_range_slot_row(slot, check):
    ctx = make_context()
    rows = verify(ctx, verify_plan([slot], [7], [3], tokens=[11]), check)
    assert rows == [(0, slot, 7, -1, 11 if check else -1, 0, 16, SLOT_RANGE)] and counters(ctx) == (1, 1)


@pytest.mark.parametrize("prev", [16, 2**40, OUT_OF_RANGE_SLOT])
def test_out_of_range_prev_row(prev):
    ctx = make_context()
    stamp(ctx, 3, 5, 0, 0x77)
    assert verify(ctx, verify_plan([3], [0], [prev])) == [(0, 3, 0, 5, -1, 0x77, prev, PREV_RANGE)]
    assert verify(ctx, verify_plan([3], [1], [prev]))[-1][7] == PREV_RANGE | POSITION


@pytest.mark.parametrize("seed", range(6))
def test_random_garbage_plans_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    sources = [random_source(rng, 40, page_size=4, nbytes=32, hole=16), random_source(rng, 40, nbytes=16)]
    ctx = make_context(40, stride=48, sources=sources[: seed % 3], mode=[ALL, PARTIAL][seed % 2], ring_capacity=8)
    fields(ctx)[...] = rng.integers(-3, 50, size=fields(ctx).shape)
    stamp_clean_chain(ctx, [3, 4, 5, 6], [11, 22, 33, 44])
    n = 60
    pick = lambda low, high: np.where(rng.random(n) < 0.1, rng.integers(-(2**63), 2**63 - 1, n), rng.integers(low, high, n))  # noqa: E731
    plan = verify_plan(pick(-2, 44), pick(0, 5), pick(-2, 44), pick(-1, 50), capacity=70, num_valid=int(rng.integers(0, 71)))
    verify(ctx, plan, check=bool(seed % 2))  # ring capacity 8: overflow races are checked against the reference


# --- at scale on a GPU -----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [RealKvHashMode.NONE, PARTIAL, ALL])
@pytest.mark.parametrize(("n", "ring"), [(1, 4), (1000, 64), (1 << 20, 1 << 12), (1 << 20, (1 << 20) + 1)])
def test_gpu_random_batches_match_the_reference(mode, n, ring):
    rng = np.random.default_rng(n)
    num_slots = max(64, n // 2)
    sources = [random_source(rng, num_slots, page_size=16, nbytes=128), random_source(rng, num_slots, nbytes=64)]
    ctx = make_context(num_slots, sources=sources, mode=mode, ring_capacity=ring)
    fields(ctx)[...] = rng.integers(0, 8, size=fields(ctx).shape)
    slots = rng.integers(-1, num_slots + 2, n)
    plan = verify_plan(slots, rng.integers(0, 8, n), rng.integers(-1, num_slots + 1, n), rng.integers(-1, 8, n))
    verify(ctx, plan, check=True)
