"""Verify kernel against the reference: counters, grid, ring, expected tokens, out-of-range indices, garbage, GPU."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    counters,
    fields,
    make_context,
    ring_rows,
    stamp,
    stamp_clean_chain,
    verify_plan,
    write_index,
)
from canary_oracles import random_source
from kernel_pairs import verify

from kvcanary_numba import OUT_OF_RANGE_SLOT, CanaryLaunchTag, RealKvHashMode
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.launch._launch import SIM_BLOCK, SIM_MAX_BLOCKS

pytestmark = pytest.mark.simulator

POSITION, TOKEN, SLOT_RANGE, PREV_RANGE = 2, 32, 64, 128
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


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
    pick = lambda low, high: np.where(
        rng.random(n) < 0.1, rng.integers(-(2**63), 2**63 - 1, n), rng.integers(low, high, n)
    )  # noqa: E731
    plan = verify_plan(
        pick(-2, 44), pick(0, 5), pick(-2, 44), pick(-1, 50), capacity=70, num_valid=int(rng.integers(0, 71))
    )
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
