"""int32 ``input_ids`` / ``positions`` / ``out_cache_loc`` in the public write, as SGLang's launcher takes them.

Every backend (the fast wing's CPU path, the core's specification, the kernels under the
simulator or on a GPU, glue / packed / replayed launches) must store and report exactly what
the same write with int64 arrays does: compared byte for byte with the int64 run. Skipped
(negative), out-of-range and chain-breaking entries are in the case, so sign extension and
every row kind are covered.
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import HEAD, make_context, stamp, write_args, write_plan
from helpers import raises_code

import kvcanary_numba as kc
from kvcanary_numba import write as core_write
from kvcanary_numba.launch import _launch as _common

INDEX = ("input_ids", "positions", "out_cache_loc")
STATE = ("canary_buf", "violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter")
LENGTHS, SEEDS = [5, 3, 4], [40, -1, 41]


def _case():
    ctx = make_context(64, ring_capacity=32)
    stamp(ctx, 40, 7, 2, HEAD)
    stamp(ctx, 41, 8, 9, HEAD)
    slots = [10, 11, -1, 12, 13, 20, 99, 21, 30, 31, 32, 33]  # -1: skipped, 99: out of range (bit 64)
    positions = [3, 4, 5, 6, 7, 0, 1, 2, 10, 11, 13, 14]  # 10 -> 13: the chain-position assert (bit 16)
    kwargs = write_args(write_plan(LENGTHS, SEEDS), range(300, 312), positions, slots)
    return ctx, kwargs


def _narrowed(kwargs: dict, names=INDEX) -> dict:
    return {k: (v.astype(np.int32) if k in names else v) for k, v in kwargs.items()}


def _state(ctx) -> list[np.ndarray]:
    arrays = [getattr(ctx, name) for name in STATE]
    return [np.array(a.get() if hasattr(a, "get") else a) for a in arrays]  # CuPy arrays copied to the host


def _assert_same(got, want) -> None:
    got_rows, want_rows = int(got[2][0]), int(want[2][0])
    assert got_rows == want_rows >= 3  # out of range, chain position, ...
    for name, a, b in zip(STATE, got, want):
        if name == "violation_ring":  # rows compare as multisets (kernels append in atomic order)
            assert sorted(map(tuple, a[:got_rows])) == sorted(map(tuple, b[:want_rows]))
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def _reference() -> list[np.ndarray]:
    ctx, kwargs = _case()
    kc.launch_canary_write_kernel(context=ctx, backend="numpy", **kwargs)
    return _state(ctx)


WRITES = {"fast": kc.launch_canary_write_kernel, "core": core_write.launch_canary_write_kernel}


@pytest.mark.parametrize("names", [INDEX, *((name,) for name in INDEX)])
@pytest.mark.parametrize("which", sorted(WRITES))
def test_numpy_int32_inputs_write_what_int64_inputs_write(which, names):
    ctx, kwargs = _case()
    narrow = _narrowed(kwargs, names)
    WRITES[which](context=ctx, backend="numpy", **narrow)
    _assert_same(_state(ctx), _reference())
    assert all(narrow[name].dtype == np.int32 for name in names)  # the caller's arrays stay as given


@pytest.mark.parametrize("which", sorted(WRITES))
def test_other_dtypes_and_layouts_are_still_refused(which):
    ctx, kwargs = _case()
    before = _state(ctx)
    bad = {
        "KVC-C002": dict(input_ids=kwargs["input_ids"].astype(np.float64)),
        "KVC-C006": dict(positions=np.arange(24, dtype=np.int32)[::2]),
        "KVC-C004": dict(out_cache_loc=np.arange(5, dtype=np.int32)),
    }
    for code, change in bad.items():
        with raises_code(code) as info:
            WRITES[which](context=ctx, **{**_narrowed(kwargs), **change})
        if code == "KVC-C002":
            assert "int64 or int32" in str(info.value) and isinstance(info.value, TypeError)
    with raises_code("KVC-C002"):  # int16 is no index dtype of SGLang's
        WRITES[which](context=ctx, **{**kwargs, "out_cache_loc": kwargs["out_cache_loc"].astype(np.int16)})
    with raises_code("KVC-C002"):  # the write-input assert's expected arrays stay int64
        WRITES[which](
            context=ctx,
            **{
                **_narrowed(kwargs),
                "enable_write_input_assert": True,
                "expected_input_tokens": kwargs["input_ids"].astype(np.int32),
                "expected_input_positions": kwargs["positions"],
            },
        )
    for a, b in zip(_state(ctx), before):
        np.testing.assert_array_equal(a, b)  # rejected calls change nothing


@pytest.mark.simulator
@pytest.mark.parametrize("which", sorted(WRITES))
def test_kernels_widen_int32_inputs_into_scratch(which, write_path):
    if not _common.ON_SIMULATOR:
        pytest.skip("NumPy arrays through the kernels: the simulator (the GPU test is below)")
    ctx, kwargs = _case()
    narrow = _narrowed(kwargs)
    WRITES[which](context=ctx, backend="cuda", **narrow)
    _assert_same(_state(ctx), _reference())


@pytest.mark.simulator
def test_glue_packed_and_replayed_int32_writes_read_the_callers_refilled_arrays(monkeypatch):
    """The widening launch is part of what a memoised call packs and replays: each replay widens the
    values the caller's int32 arrays hold now (refilled in place), into the same scratch."""
    if not _common.ON_SIMULATOR:
        pytest.skip("runs packed launches on the simulator")
    from launch_fakes import launched, run_packed

    from benchmarks.fake_launch import gpu_launch_layer
    from kvcanary_numba.fast import calls
    from kvcanary_numba.fast.memo import Memo
    from kvcanary_numba.fast.prepared import PreparedLaunch
    from kvcanary_numba.kernels import widen

    monkeypatch.setattr(PreparedLaunch, "launch", run_packed)
    monkeypatch.setattr(calls.OPERATIONS["launch_canary_write_kernel"], "memo", Memo())
    got, kwargs = _case()
    want, _ = _case()
    narrow = _narrowed(kwargs)
    launched.clear()
    restore = gpu_launch_layer()
    try:
        for call in range(3):  # glue, packed, replayed
            narrow["input_ids"][:] = kwargs["input_ids"] + 1000 * call  # refilled in place
            kc.launch_canary_write_kernel(context=got, backend="cuda", **narrow)
            kc.launch_canary_write_kernel(
                context=want, backend="numpy", **{**kwargs, "input_ids": kwargs["input_ids"] + 1000 * call}
            )
    finally:
        restore()
    _assert_same(_state(got), _state(want))
    widened = [ptrs for signature, ptrs in launched if signature == widen.SIGNATURES["widen_int32"][0]]
    assert len(widened) == 3 * 3  # three arrays, three calls: the replays widen too
    assert len({tuple(p) for p in widened}) == 3  # each array into its own scratch, the same every call


@pytest.mark.gpu
@pytest.mark.parametrize("which", sorted(WRITES))
def test_gpu_int32_inputs_first_packed_and_replayed_equal_int64(which):
    import cupy

    want, kwargs = _case()
    got, _ = _case()
    device = {k: (cupy.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in _narrowed(kwargs).items()}
    device["plan"] = kc.WritePlan(**{k: cupy.asarray(v) for k, v in kwargs["plan"].arrays().items()})
    context = got.replace(
        **{name: cupy.asarray(getattr(got, name)) for name in (*STATE, "enable_chain_position_assert")}
    )
    for call in range(3):
        device["input_ids"][:] = cupy.asarray(kwargs["input_ids"] + 1000 * call, dtype=cupy.int32)
        WRITES[which](context=context, **device)
        kc.launch_canary_write_kernel(
            context=want, backend="numpy", **{**kwargs, "input_ids": kwargs["input_ids"] + 1000 * call}
        )
    cupy.cuda.get_current_stream().synchronize()
    _assert_same(_state(context), _state(want))
