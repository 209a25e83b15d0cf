"""Write argument validation: every rejected input raises its catalogue code before any write."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import FakeCudaArray, counters, make_context, write_plan
from helpers import raises_code

from kvcanary_numba import VerifyPlan, WritePlan, launch_canary_write_kernel


def _write_kwargs(**changes):
    ctx = make_context(8)
    tokens = np.array([1, 2], dtype=np.int64)
    kwargs = dict(
        context=ctx,
        plan=write_plan([2], [-1], capacity=3),
        input_ids=tokens,
        positions=np.array([0, 1], dtype=np.int64),
        out_cache_loc=np.array([1, 2], dtype=np.int64),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
        backend="numpy",
    )
    kwargs.update(changes)
    return kwargs


def test_valid_arguments_write():
    kwargs = _write_kwargs()
    launch_canary_write_kernel(**kwargs)
    assert counters(kwargs["context"]) == (2, 1)


@pytest.mark.parametrize("length", [3, 5, 0])
def test_rejects_offsets_not_capacity_plus_one(length):
    plan = write_plan([2], [-1], capacity=3)
    bad = WritePlan(**{**plan.arrays(), "write_offsets": np.zeros(length, dtype=np.int64)})
    with raises_code("KVC-W001") as excinfo:
        launch_canary_write_kernel(**_write_kwargs(plan=bad))
    assert excinfo.value.fields["expected"] == 4


@pytest.mark.parametrize("missing", ["expected_input_tokens", "expected_input_positions"])
def test_rejects_assert_without_expected_inputs(missing):
    given = dict(expected_input_tokens=np.zeros(2, np.int64), expected_input_positions=np.zeros(2, np.int64))
    given[missing] = None
    with raises_code("KVC-W002") as excinfo:
        launch_canary_write_kernel(**_write_kwargs(enable_write_input_assert=True, **given))
    assert excinfo.value.fields["argument"] == missing


@pytest.mark.parametrize("extra", ["expected_input_tokens", "expected_input_positions"])
def test_rejects_expected_inputs_without_assert(extra):
    with raises_code("KVC-W003"):
        launch_canary_write_kernel(**_write_kwargs(**{extra: np.zeros(2, np.int64)}))


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        (dict(plan=VerifyPlan.allocate(verify_capacity=3)), "KVC-V001"),
        (dict(context=None), "KVC-V001"),
        (dict(input_ids=np.zeros(2, np.float32)), "KVC-C002"),
        (dict(input_ids=[1, 2]), "KVC-C001"),
        (dict(positions=np.zeros(3, np.int64)), "KVC-C004"),
        (dict(out_cache_loc=np.zeros((2, 1), np.int64)), "KVC-C003"),
        (dict(out_cache_loc=np.zeros(4, np.int64)[::2]), "KVC-C006"),
        (dict(enable_write_input_assert=1), "KVC-C010"),
        (
            dict(
                enable_write_input_assert=True,
                expected_input_tokens=np.zeros(3, np.int64),
                expected_input_positions=np.zeros(2, np.int64),
            ),
            "KVC-C004",
        ),
        (dict(backend="cpu"), "KVC-C009"),
    ],
)
def test_rejects_bad_arguments(changes, code):
    with raises_code(code):
        launch_canary_write_kernel(**_write_kwargs(**changes))


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("enable_chain_position_assert", None, "KVC-C001"),
        ("enable_chain_position_assert", np.zeros(2, np.int32), "KVC-C004"),
        ("canary_buf", np.zeros((8, 24), np.uint8), "KVC-C012"),
        ("real_kv_sources", "k_layer0", "KVC-R009"),
    ],
)
def test_rejects_bad_context(field, value, code):
    kwargs = _write_kwargs()
    kwargs["context"] = kwargs["context"].replace(**{field: value})
    with raises_code(code):
        launch_canary_write_kernel(**kwargs)


def test_rejects_read_only_canary_buffer():
    kwargs = _write_kwargs()
    kwargs["context"].canary_buf.flags.writeable = False
    with raises_code("KVC-C013"):
        launch_canary_write_kernel(**kwargs)


def test_rejects_mixed_backends():
    kwargs = _write_kwargs(input_ids=FakeCudaArray(np.zeros(2, np.int64)))
    with raises_code("KVC-C007"):
        launch_canary_write_kernel(**kwargs)
    assert counters(kwargs["context"]) == (0, 0)
