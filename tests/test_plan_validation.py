"""Plan argument validation: every rejected input raises its catalogue code, before any write.

The public plan functions check shapes, dtypes, devices, capacities and host
scalars first; a rejected call must leave the output plans untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import FakeCudaArray, fake_launch_module
from helpers import i64, linear_rtt, raises_code

from kvcanary_numba import VerifyPlan, WritePlan, launch_canary_plan_kernels, launch_plan_offsets_kernel
from kvcanary_numba.plans import ENTRY_FIELDS


def plan_kwargs(**changes):
    kwargs = dict(
        verify_plan_out=VerifyPlan.allocate(verify_capacity=8),
        write_plan_out=WritePlan.allocate(write_req_capacity=4),
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([1, 2]),
        extend_seq_lens=i64([1, 1]),
        req_to_token=linear_rtt(),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=8,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
        backend="numpy",
    )
    kwargs.update(changes)
    return kwargs


def offsets_kwargs(**changes):
    kwargs = dict(
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([1, 2]),
        extend_seq_lens=i64([1, 1]),
        req_to_token=linear_rtt(),
        full_to_swa_index_mapping=None,
        out_verify_offsets_scratch=np.zeros(3, np.int64),
        out_write_offsets=np.zeros(5, np.int64),
        out_write_seed_slot_indices=np.zeros(4, np.int64),
        out_verify_num_valid=np.zeros(1, np.int32),
        out_verify_enable=np.zeros(1, np.int32),
        out_write_num_valid_reqs=np.zeros(1, np.int32),
        swa_window_size=0,
        verify_capacity=8,
        backend="numpy",
    )
    kwargs.update(changes)
    return kwargs


def _wplan(offsets=5, seeds=4):
    return WritePlan(
        write_offsets=np.zeros(offsets, np.int64),
        write_seed_slot_indices=np.zeros(seeds, np.int64),
        write_num_valid_reqs=np.zeros(1, np.int32),
    )


def _vplan(**changes):
    arrays = VerifyPlan.allocate(verify_capacity=8).arrays()
    arrays.update(changes)
    return VerifyPlan(**arrays)


def _readonly(array):
    array = array.copy()
    array.flags.writeable = False
    return array


LUT = np.arange(200, dtype=np.int64)
POOL = np.zeros((9, 8), np.int32)


def _pool_args(pool=POOL, lens=(4, 4)):
    return dict(req_to_verify_expected_tokens=pool, req_to_verify_expected_tokens_valid_lens=np.asarray(lens))


PLAN_REJECTIONS = [
    ("KVC-P001", lambda: dict(write_plan_out=_wplan(offsets=0))),
    ("KVC-P002", lambda: dict(write_plan_out=_wplan(offsets=4))),
    ("KVC-P002", lambda: dict(write_plan_out=_wplan(offsets=6))),
    ("KVC-P003", lambda: dict(write_plan_out=WritePlan.allocate(write_req_capacity=1))),
    ("KVC-P004", lambda: dict(verify_capacity=7)),
    ("KVC-P004", lambda: dict(verify_capacity=9)),
    ("KVC-P005", lambda: dict(swa_window_size=4)),
    ("KVC-P005", lambda: dict(full_to_swa_index_mapping=LUT)),
    ("KVC-P006", lambda: dict(req_to_verify_expected_tokens=POOL)),
    ("KVC-P006", lambda: dict(req_to_verify_expected_tokens_valid_lens=i64([4, 4]))),
    ("KVC-P007", lambda: dict(verify_plan_out=WritePlan.allocate(write_req_capacity=4))),
    ("KVC-P008", lambda: dict(swa_window_size=4, full_to_swa_index_mapping=LUT + 1)),
    ("KVC-P008", lambda: dict(swa_window_size=4, full_to_swa_index_mapping=np.full(3, -1, np.int64))),
    ("KVC-P007", lambda: dict(write_plan_out=VerifyPlan.allocate(verify_capacity=8).arrays())),
    ("KVC-C001", lambda: dict(prefix_lens=[1, 2])),
    ("KVC-C002", lambda: dict(req_to_token=linear_rtt().astype(np.int64))),
    ("KVC-C002", lambda: dict(req_pool_indices=np.array([1, 2], np.int32))),
    ("KVC-C002", lambda: dict(swa_window_size=4, full_to_swa_index_mapping=LUT.astype(np.int32))),
    ("KVC-C002", lambda: _pool_args(pool=POOL.astype(np.int64))),
    ("KVC-C002", lambda: _pool_args(lens=np.array([4, 4], np.int32))),
    ("KVC-C002", lambda: dict(verify_plan_out=_vplan(verify_expected_positions=np.zeros(8, np.int32)))),
    ("KVC-C002", lambda: dict(verify_plan_out=_vplan(enable=np.zeros(1, np.int64)))),
    ("KVC-C003", lambda: dict(prefix_lens=i64([[1, 2]]))),
    ("KVC-C003", lambda: dict(req_to_token=linear_rtt().reshape(-1))),
    ("KVC-C003", lambda: _pool_args(pool=POOL.reshape(-1))),
    ("KVC-C004", lambda: dict(extend_seq_lens=i64([1, 1, 1]))),
    ("KVC-C004", lambda: _pool_args(lens=i64([4]))),
    ("KVC-C004", lambda: dict(verify_plan_out=_vplan(verify_prev_slot_indices=np.zeros(7, np.int64)))),
    ("KVC-C004", lambda: dict(verify_plan_out=_vplan(verify_num_valid=np.zeros(2, np.int32)))),
    ("KVC-C005", lambda: dict(swa_window_size=4, full_to_swa_index_mapping=np.zeros(0, np.int64))),
    ("KVC-C006", lambda: dict(req_to_token=linear_rtt(width=32)[:, ::2])),
    ("KVC-C006", lambda: dict(req_pool_indices=i64([1, 9, 2, 9])[::2])),
    ("KVC-C007", lambda: dict(prefix_lens=FakeCudaArray(i64([1, 2])))),
    ("KVC-C009", lambda: dict(backend="gpu")),
    ("KVC-C011", lambda: dict(swa_window_size=-1)),
    ("KVC-C011", lambda: dict(swa_window_size=True)),
    ("KVC-C011", lambda: dict(verify_capacity="8")),
    ("KVC-C011", lambda: dict(kv_token_id_vs_position_offset=1.0)),
    ("KVC-C011", lambda: dict(kv_token_id_vs_position_offset=2**63)),
    ("KVC-C013", lambda: dict(verify_plan_out=_vplan(verify_slot_indices=_readonly(np.zeros(8, np.int64))))),
    (
        "KVC-C013",
        lambda: dict(
            write_plan_out=WritePlan(
                write_offsets=np.zeros(5, np.int64),
                write_seed_slot_indices=np.zeros(4, np.int64),
                write_num_valid_reqs=_readonly(np.zeros(1, np.int32)),
            )
        ),
    ),
]


@pytest.mark.parametrize(("code", "changes"), PLAN_REJECTIONS)
def test_plan_rejects_bad_arguments_before_writing(code, changes):
    kwargs = plan_kwargs(**changes())
    before = [
        a.copy()
        for plan in ("verify_plan_out", "write_plan_out")
        if hasattr(kwargs[plan], "arrays")
        for a in kwargs[plan].arrays().values()
    ]
    with raises_code(code):
        launch_canary_plan_kernels(**kwargs)
    after = [
        a
        for plan in ("verify_plan_out", "write_plan_out")
        if hasattr(kwargs[plan], "arrays")
        for a in kwargs[plan].arrays().values()
    ]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


OFFSETS_REJECTIONS = [
    ("KVC-P001", lambda: dict(out_write_offsets=np.zeros(0, np.int64))),
    ("KVC-P002", lambda: dict(out_write_offsets=np.zeros(4, np.int64))),
    (
        "KVC-P003",
        lambda: dict(out_write_offsets=np.zeros(2, np.int64), out_write_seed_slot_indices=np.zeros(1, np.int64)),
    ),
    ("KVC-P005", lambda: dict(swa_window_size=3)),
    ("KVC-P005", lambda: dict(full_to_swa_index_mapping=LUT)),
    ("KVC-P008", lambda: dict(swa_window_size=3, full_to_swa_index_mapping=LUT[::-1].copy())),
    ("KVC-C002", lambda: dict(out_verify_offsets_scratch=np.zeros(3, np.int32))),
    ("KVC-C002", lambda: dict(out_verify_enable=np.zeros(1, np.int64))),
    ("KVC-C004", lambda: dict(out_write_num_valid_reqs=np.zeros(0, np.int32))),
    ("KVC-C005", lambda: dict(out_verify_offsets_scratch=np.zeros(2, np.int64))),
    ("KVC-C011", lambda: dict(verify_capacity=-1)),
    ("KVC-C011", lambda: dict(verify_capacity=2**31)),
    ("KVC-C013", lambda: dict(out_verify_offsets_scratch=_readonly(np.zeros(3, np.int64)))),
    ("KVC-C013", lambda: dict(out_verify_num_valid=_readonly(np.zeros(1, np.int32)))),
]


@pytest.mark.parametrize(("code", "changes"), OFFSETS_REJECTIONS)
def test_offsets_rejects_bad_arguments(code, changes):
    with raises_code(code):
        launch_plan_offsets_kernel(**offsets_kwargs(**changes()))


def test_offsets_accepts_exact_scratch_and_zero_capacity():
    kwargs = offsets_kwargs(verify_capacity=0)
    launch_plan_offsets_kernel(**kwargs)
    assert kwargs["out_verify_offsets_scratch"].tolist() == [0, 1, 2]  # lengths 1 and 2, each capped at 0 + 1
    assert (int(kwargs["out_verify_num_valid"][0]), int(kwargs["out_verify_enable"][0])) == (0, 0)


def _fake_cuda(kwargs):
    def wrap(value):
        if isinstance(value, np.ndarray):
            return FakeCudaArray(value)
        if isinstance(value, (VerifyPlan, WritePlan)):
            return type(value)(**{k: FakeCudaArray(v) for k, v in value.arrays().items()})
        return value

    return {k: wrap(v) for k, v in kwargs.items()}


@pytest.mark.parametrize(
    ("function", "make"),
    [
        (
            launch_canary_plan_kernels,
            lambda: plan_kwargs(
                backend="auto",
                swa_window_size=np.int64(4),
                full_to_swa_index_mapping=LUT,
                kv_token_id_vs_position_offset=np.int32(1),
            ),
        ),
        (launch_plan_offsets_kernel, lambda: offsets_kwargs(backend="cuda", verify_capacity=np.int64(8))),
    ],
)
def test_cuda_arrays_dispatch_to_launch_glue(function, make, monkeypatch):
    calls = fake_launch_module(monkeypatch, "plan", "launch_canary_plan_kernels", "launch_plan_offsets_kernel")
    kwargs = _fake_cuda(make())
    function(**kwargs)
    assert len(calls) == 1
    name, got = calls[0]
    assert name == function.__name__
    want = {k: v for k, v in kwargs.items() if k != "backend"}
    # The glue also gets the stream (None: CuPy's current) and, from the fast wing, its launch scratch.
    assert got.pop("stream") == 0 and got.pop("scratch") is not None
    assert got.keys() == want.keys()
    for key, value in got.items():
        assert value is want[key] or (value == want[key] and type(value) is int), key  # ints normalised
    with raises_code("KVC-C008"):
        function(**{**kwargs, "backend": "numpy"})


def test_lut_in_gpu_memory_is_not_read(monkeypatch):
    # lut[0] is checked only in host memory: a device LUT (never indexable here) is passed on unread.
    calls = fake_launch_module(monkeypatch, "plan", "launch_canary_plan_kernels")
    kwargs = _fake_cuda(plan_kwargs(backend="cuda", swa_window_size=4, full_to_swa_index_mapping=LUT + 1))
    launch_canary_plan_kernels(**kwargs)
    assert len(calls) == 1 and calls[0][1]["full_to_swa_index_mapping"] is kwargs["full_to_swa_index_mapping"]


def test_lut_mapping_slot_zero_to_zero_is_accepted():
    kwargs = plan_kwargs(swa_window_size=4, full_to_swa_index_mapping=np.array([0, 7, 7], np.int64))
    launch_canary_plan_kernels(**kwargs)
    assert int(kwargs["verify_plan_out"].enable[0]) == 1


@pytest.mark.parametrize(
    ("function", "make"),
    [
        (launch_canary_plan_kernels, lambda lut: plan_kwargs(swa_window_size=4, full_to_swa_index_mapping=lut)),
        (launch_plan_offsets_kernel, lambda lut: offsets_kwargs(swa_window_size=4, full_to_swa_index_mapping=lut)),
    ],
)
def test_lut_head_is_checked_on_every_call(function, make):
    """The validation memo remembers layouts, not values: a LUT whose entry 0 changed after a
    passing call of the same layout (same array edited in place, or a new one) is still refused."""
    lut = LUT.copy()
    function(**make(lut))
    function(**make(lut))  # second call: served by the memo
    lut[0] = 7
    with raises_code("KVC-P008"):
        function(**make(lut))
    other = LUT.copy()
    other[0] = -1
    with raises_code("KVC-P008"):
        function(**make(other))


@pytest.mark.parametrize("field", ENTRY_FIELDS)
def test_an_entry_array_of_another_length_is_the_one_named(field):
    # Fuzz case 212: an emptied verify_slot_indices was reported as the three arrays that agree.
    for length in (0, 7):
        with raises_code("KVC-C004") as excinfo:
            launch_canary_plan_kernels(**plan_kwargs(verify_plan_out=_vplan(**{field: np.zeros(length, np.int64)})))
        assert f"verify_plan_out.{field} must have shape (8,), got ({length},)" in str(excinfo.value)
