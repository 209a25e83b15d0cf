"""Verify on the CPU: plan handling, counters, the ring, expected tokens and out-of-range indices (docs/concepts/sglang.md)."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    chain_plan,
    counters,
    fields,
    make_context,
    ring_rows,
    row_bits,
    run_verify,
    run_write,
    stamp,
    stamp_clean_chain,
    verify,
    verify_plan,
    write_index,
    write_plan,
)
from canary_oracles import scalar_verify_rows

from kvcanary_numba import OUT_OF_RANGE_SLOT, CanaryLaunchTag

CHAIN, POSITION, TOKEN = 1, 2, 32
SLOT_RANGE, PREV_RANGE = 64, 128


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
    else:  # past the saturation value: the index stays, nothing lands (it never wraps)
        assert landed == [] and write_index(ctx) == start


@pytest.mark.parametrize("kind", [CanaryLaunchTag.HEAD_K_FULL, CanaryLaunchTag.SWEEP_V_SWA, CanaryLaunchTag.HEAD_V_SWA])
def test_kernel_kind_is_stamped(kind):
    ctx = make_context(kind=kind)
    verify(ctx, verify_plan([2, 3], [1, 1], [-1, -1]))
    assert [r[0] for r in ring_rows(ctx)] == [int(kind)] * 2 and {r[1] for r in ring_rows(ctx)} == {2, 3}


def test_many_violations_all_counted():
    ctx = make_context(64, ring_capacity=64)
    verify(ctx, verify_plan(range(1, 51), [0] * 50, [-1] * 50))  # zero records as heads: chain mismatch
    assert write_index(ctx) == 50 and set(row_bits(ctx)) == {CHAIN}


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
