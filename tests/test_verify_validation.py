"""Verify argument validation: every rejected input raises its catalogue code before any write."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    FakeCudaArray,
    counters,
    make_context,
    run_verify,
    verify_plan,
    write_index,
    write_plan,
)
from canary_oracles import random_source
from helpers import raises_code

from kvcanary_numba import VerifyPlan
from kvcanary_numba.plans import ENTRY_FIELDS


def _valid():
    ctx = make_context(8)
    return ctx, verify_plan([1], [0], [-1], capacity=4)


CONTEXT_CASES = [
    ("canary_buf", [[0] * 32], "KVC-C001"),
    ("canary_buf", np.zeros((8, 32), np.int8), "KVC-C002"),
    ("canary_buf", np.zeros(256, np.uint8), "KVC-C003"),
    ("canary_buf", np.zeros((0, 32), np.uint8), "KVC-C005"),
    ("canary_buf", np.zeros((8, 64), np.uint8)[:, :32], "KVC-C006"),
    ("canary_buf", np.zeros((8, 16), np.uint8), "KVC-C012"),
    ("canary_buf", np.zeros((8, 36), np.uint8), "KVC-C012"),
    ("violation_ring", np.zeros((4, 7), np.int64), "KVC-C004"),
    ("violation_ring", np.zeros((0, 8), np.int64), "KVC-C005"),
    ("violation_ring", np.zeros((4, 8), np.int32), "KVC-C002"),
    ("violation_write_index", np.zeros(1, np.int64), "KVC-C002"),
    ("violation_write_index", np.zeros(2, np.int32), "KVC-C004"),
    ("slot_run_counter", np.zeros(1, np.int32), "KVC-C002"),
    ("kernel_run_counter", np.zeros((1, 1), np.int64), "KVC-C003"),
    ("kernel_run_counter", None, "KVC-C001"),
    ("kernel_kind", 12, "KVC-C011"),
    ("kernel_kind", -1, "KVC-C011"),
    ("real_kv_hash_mode", 3, "KVC-C011"),
    ("real_kv_sources", None, "KVC-R009"),
    ("real_kv_sources", [np.zeros((8, 16), np.uint8)], "KVC-R009"),
    ("enable_chain_position_assert", np.zeros(1, np.int64), "KVC-C002"),
]


@pytest.mark.parametrize(("field", "value", "code"), CONTEXT_CASES, ids=[f"{f}-{c}" for f, _, c in CONTEXT_CASES])
def test_rejects_bad_context(field, value, code):
    ctx, plan = _valid()
    with raises_code(code):
        run_verify(ctx.replace(**{field: value}), plan)


def test_rejects_misaligned_canary_buffer():
    raw = np.zeros(8 * 32 + 16, dtype=np.uint8)
    offset = next(k for k in range(1, 8) if (raw.ctypes.data + k) % 8)
    buf = raw[offset : offset + 8 * 32].reshape(8, 32)
    ctx, plan = _valid()
    with raises_code("KVC-C014"):
        run_verify(ctx.replace(canary_buf=buf), plan)


def test_real_kv_source_limits():
    ctx, plan = _valid()
    source = random_source(np.random.default_rng(0), 8)
    with raises_code("KVC-R008"):
        run_verify(ctx.replace(real_kv_sources=(source,) * 5), plan)
    with raises_code("KVC-R007"):
        run_verify(ctx.replace(real_kv_sources=(random_source(np.random.default_rng(0), 7),)), plan)


def test_verify_accepts_read_only_buffer_and_plan_and_no_chain_flag():
    ctx, plan = _valid()
    ctx.canary_buf.flags.writeable = False
    for array in plan.arrays().values():
        array.flags.writeable = False
    run_verify(ctx.replace(enable_chain_position_assert=None), plan)
    assert write_index(ctx) == 1


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("verify_slot_indices", np.zeros(4, np.int32), "KVC-C002"),
        ("verify_expected_tokens", np.zeros(3, np.int64), "KVC-C004"),
        ("verify_expected_positions", np.zeros((4, 1), np.int64), "KVC-C003"),
        ("verify_prev_slot_indices", list(range(4)), "KVC-C001"),
        ("verify_num_valid", np.zeros(1, np.int64), "KVC-C002"),
        ("enable", np.zeros(2, np.int32), "KVC-C004"),
        ("verify_slot_indices", np.zeros(8, np.int64)[::2], "KVC-C006"),
    ],
)
def test_rejects_bad_plan(field, value, code):
    ctx, plan = _valid()
    bad = VerifyPlan(**{**plan.arrays(), field: value})
    with raises_code(code):
        run_verify(ctx, bad)


@pytest.mark.parametrize("field", ENTRY_FIELDS)
def test_an_entry_array_of_another_length_is_the_one_named(field):
    ctx, plan = _valid()  # capacity 4: the other three arrays agree, whichever is first
    with raises_code("KVC-C004") as excinfo:
        run_verify(ctx, VerifyPlan(**{**plan.arrays(), field: np.zeros(0, np.int64)}))
    assert f"plan.{field} must have shape (4,), got (0,)" in str(excinfo.value)


@pytest.mark.parametrize("plan", [None, {}, "plan"])
def test_rejects_plan_of_wrong_type(plan):
    ctx, _ = _valid()
    with raises_code("KVC-V001"):
        run_verify(ctx, plan)


def test_rejects_write_plan_and_non_context():
    ctx, plan = _valid()
    with raises_code("KVC-V001"):
        run_verify(ctx, write_plan([1], [-1]))
    with raises_code("KVC-V001"):
        run_verify(ctx.canary_buf, plan)


@pytest.mark.parametrize("check", [1, None, np.array([True])])
def test_rejects_non_bool_switch(check):
    ctx, plan = _valid()
    with raises_code("KVC-C010"):
        run_verify(ctx, plan, check=check)


def test_accepts_numpy_bool_switch():
    ctx, plan = _valid()
    run_verify(ctx, plan, check=np.bool_(True))
    assert counters(ctx) == (1, 1)


def test_rejects_read_only_outputs():
    ctx, plan = _valid()
    ctx.violation_ring.flags.writeable = False
    with raises_code("KVC-C013"):
        run_verify(ctx, plan)


def test_backend_resolution():
    ctx, plan = _valid()
    with raises_code("KVC-C009"):
        run_verify(ctx, plan, backend="gpu")
    fake_plan = VerifyPlan(**{name: FakeCudaArray(a) for name, a in plan.arrays().items()})
    with raises_code("KVC-C007"):
        run_verify(ctx, fake_plan)
    fake_ctx = ctx.replace(
        **{
            f: FakeCudaArray(getattr(ctx, f))
            for f in (
                "canary_buf",
                "violation_ring",
                "violation_write_index",
                "slot_run_counter",
                "kernel_run_counter",
                "enable_chain_position_assert",
            )
        }
    )
    with raises_code("KVC-C008"):
        run_verify(fake_ctx, fake_plan, backend="numpy")
    assert counters(ctx) == (0, 0)
