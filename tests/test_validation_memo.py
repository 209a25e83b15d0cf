"""The validation memo: repeated calls skip the checks, a changed array is still rejected, and no
cache keeps a user's array alive (NumPy here; the CuPy variant is in tests/test_gpu_interop.py)."""

from __future__ import annotations

import gc
import warnings
import weakref

import numpy as np
import pytest
from canary_helpers import make_context, verify_plan, write_args, write_index, write_plan
from canary_pipeline import Pipeline
from helpers import raises_code

from kvcanary_numba import (
    CanaryContext,
    RealKvHashMode,
    VerifyPlan,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)
from kvcanary_numba.fast.calls import OPERATIONS


@pytest.fixture
def validations(monkeypatch):
    """Counts the full validations of verify and write calls."""
    count = {"verify": 0, "write": 0}
    for name in ("verify", "write"):
        operation = OPERATIONS[f"launch_canary_{name}_kernel"]

        def counted(*a, _name=name, _f=operation.validate, **k):
            count[_name] += 1
            return _f(*a, **k)

        monkeypatch.setattr(operation, "validate", counted)
        operation.memo.clear()
    return count


def _verify(ctx, plan, **extra):
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False, **extra)


def test_a_repeated_call_skips_validation_but_still_runs(validations):
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    for _ in range(3):
        _verify(ctx, plan)
    assert validations["verify"] == 1
    assert int(ctx.kernel_run_counter[0]) == 3 and write_index(ctx) == 3  # slot 1 holds no record: one row per call
    _verify(ctx, plan, backend="numpy")  # another backend argument is another snapshot
    assert validations["verify"] == 2


def test_per_step_arrays_of_the_same_layout_share_one_validation(validations):
    ctx, plan = make_context(16), write_plan([2], [-1], capacity=2)
    for step in range(3):  # new input arrays every step, as an engine makes them
        launch_canary_write_kernel(context=ctx, **write_args(plan, [5, 6], [0, 1], [3 + 2 * step, 4 + 2 * step]))
    assert validations["write"] == 1
    args = write_args(plan, [5, 6], [0, 1], [3, 4])
    with raises_code("KVC-C002"):  # same call, one per-step array of another dtype
        launch_canary_write_kernel(context=ctx, **{**args, "positions": args["positions"].astype(np.int16)})
    with raises_code("KVC-C004"):
        launch_canary_write_kernel(context=ctx, **{**args, "positions": np.zeros(3, np.int64)})


@pytest.mark.parametrize(
    "change, code",
    [
        (lambda ctx: setattr(ctx.violation_ring, "shape", (16, 4)), "KVC-C004"),  # same object, new shape
        (lambda ctx: setattr(ctx.violation_ring.flags, "writeable", False), "KVC-C013"),  # made read-only
        (lambda ctx: setattr(ctx.slot_run_counter, "dtype", np.int32), "KVC-C002"),  # new dtype (2 x int32)
    ],
)
def test_an_array_changed_in_place_is_validated_again(validations, change, code):
    ctx, plan = make_context(8, ring_capacity=8), verify_plan([1], [0], [-1], capacity=4)
    _verify(ctx, plan)
    with warnings.catch_warnings():  # newer NumPy deprecates some in-place layout changes; they still happen
        warnings.simplefilter("ignore", DeprecationWarning)
        change(ctx)
    with raises_code(code):
        _verify(ctx, plan)
    assert validations["verify"] == 2


def test_an_array_freed_and_replaced_at_the_same_address_is_validated_again(validations):
    plan = verify_plan([1], [0], [-1], capacity=4)
    seen = set()
    for attempt in range(50):  # until CPython hands the new context's buffer a freed buffer's id
        ctx = make_context(8)
        _verify(ctx, plan)
        seen.add(id(ctx.canary_buf))
        del ctx
        big = np.zeros(8 * 32 + 8, np.uint8)
        misaligned = big[1:].view()[: 8 * 32].reshape(8, 32)  # same layout, address off by one byte
        if id(misaligned) in seen:
            break
    else:
        pytest.skip("no id was recycled")
    good = make_context(8)
    bad = CanaryContext(
        **{**{f: getattr(good, f) for f in CanaryContext.__dataclass_fields__}, "canary_buf": misaligned}
    )
    with raises_code("KVC-C014"):
        _verify(bad, plan)


def test_a_plan_swapped_for_an_invalid_one_is_rejected(validations):
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    _verify(ctx, plan)
    arrays = plan.arrays()
    bad = VerifyPlan(**{**arrays, "verify_expected_positions": np.zeros(3, np.int64)})
    with raises_code("KVC-C004"):
        _verify(ctx, bad)


def test_freed_pools_and_buffers_are_collected_after_calls():
    """Every cache (validation memo, tokens, DLPack views, launch views) lets go of the arrays."""
    pipe = Pipeline(32, max_reqs=3, max_seq=8, verify_capacity=16, write_capacity=2, mode=RealKvHashMode.PARTIAL)
    pipe.req_to_token[1, :8] = np.arange(1, 9)
    pipe.tokens[1, :8] = np.arange(100, 108)
    pipe.step([1], [0], [4])
    pipe.step([1], [4], [2])
    refs = [
        weakref.ref(a)
        for a in (
            pipe.kv,
            pipe.ctx.canary_buf,
            pipe.ctx.violation_ring,
            pipe.vplan.verify_slot_indices,
            pipe.req_to_token,
        )
    ]
    del pipe
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


def test_dlpack_producers_are_collected_after_calls():
    from test_interop import DlpackOnly

    from kvcanary_numba import RealKvSource

    kv = np.zeros((8, 32), np.uint8)
    ctx = make_context(
        8,
        sources=(RealKvSource(tensor=DlpackOnly(kv), page_size=1, num_bytes_per_token=32, read_bytes=32),),
        mode=RealKvHashMode.ALL,
    )
    plan = verify_plan([1], [0], [-1], capacity=4)
    wrapped = VerifyPlan(**{name: DlpackOnly(a) for name, a in plan.arrays().items()})
    producer = wrapped.enable
    for _ in range(2):
        _verify(ctx, wrapped)
    refs = [weakref.ref(kv), weakref.ref(producer), weakref.ref(plan.enable)]
    del kv, ctx, plan, wrapped, producer
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


def _numba_like_class(module: str) -> type:
    """A stand-in for Numba's ``DeviceNDArray``: the class carries the ``__cuda_ndarray__`` mark,
    ``gpu_data`` exists on instances only (as in numba-cuda 0.30)."""

    class Pointer:
        device_pointer = 0x7F0000001000

    def __init__(self):
        self.gpu_data = Pointer()
        self.shape, self.strides, self.dtype = (8,), (8,), np.dtype(np.int64)

    cai = property(
        lambda self: {"data": (0x7F0000001000, False), "shape": (8,), "strides": None, "typestr": "<i8", "version": 3}
    )
    return type(
        "DeviceNDArray",
        (),
        {"__module__": module, "__cuda_ndarray__": True, "__init__": __init__, "__cuda_array_interface__": cai},
    )


@pytest.mark.parametrize("module", ["numba.cuda.cudadrv.devicearray", "numba_cuda.numba.cuda.cudadrv.devicearray"])
def test_numba_device_arrays_are_snapshotted_from_their_attributes_not_their_interface(module):
    from kvcanary_numba.fast import memo as _memo

    cls = _numba_like_class(module)
    assert _memo._walker_for(cls) is _memo._numba
    (key,), _ = _memo.snapshot((cls(),))
    assert key == (0x7F0000001000, (8,), (8,), np.dtype(np.int64))


def test_simulator_arrays_are_not_read_as_numba_device_arrays():
    from kvcanary_numba.fast import memo as _memo

    cls = _numba_like_class("numba.cuda.simulator.cudadrv.devicearray")
    assert _memo._walker_for(cls) is not _memo._numba
