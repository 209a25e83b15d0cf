"""Array-library interop on the CPU: CAI devices from the pointer, read-only inputs, DLPack-only
objects and the ``stream=`` argument, with fakes standing in for the driver and the launch glue."""

from __future__ import annotations

import ctypes
import dataclasses
import sys
import types

import interop_helpers
import numpy as np
import pytest
from canary_helpers import FakeCudaArray, fake_launch_module, make_context, verify_plan, write_index
from helpers import raises_code
from interop_helpers import check_fault_caught, patch_public_calls, run_pipeline

from kvcanary_numba import RealKvHashMode, VerifyPlan, _interop, _validate, launch_canary_verify_kernel
from kvcanary_numba.fast import memo as _memo


class DlpackOnly(interop_helpers.DlpackOnly):
    """The benchmarks' DLPack-only wrapper, counting its exports and able to claim another device."""

    exported = 0

    def __init__(self, array, device_type=None):
        super().__init__(array)
        self._device_type = device_type

    def __dlpack__(self, **kwargs):
        DlpackOnly.exported += 1
        return super().__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return super().__dlpack_device__() if self._device_type is None else (self._device_type, 0)


class OnDevice(FakeCudaArray):
    """A fake CUDA array whose library attribute names a device the memory is not on."""

    def __init__(self, array, readonly=False):
        super().__init__(array)
        self.device = type("Device", (), {"id": 7})()
        self.__cuda_array_interface__["data"] = (array.ctypes.data, readonly)


@pytest.fixture
def driver(monkeypatch):
    """A fake driver: ``owners[ptr] = device`` decides what cuPointerGetAttribute answers."""
    owners: dict[int, int] = {}
    monkeypatch.setattr(_interop, "_driver_ordinal", lambda ptr: owners.get(ptr, 0))
    monkeypatch.setattr(_interop, "_DEVICE_OF", {})
    return owners


def _cuda_verify_args(wrap):
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    fake_ctx = type(ctx)(
        **{f: getattr(ctx, f) for f in ("real_kv_sources", "real_kv_hash_mode", "kernel_kind")},
        **{
            f: wrap(getattr(ctx, f))
            for f in (
                "canary_buf",
                "violation_ring",
                "violation_write_index",
                "slot_run_counter",
                "kernel_run_counter",
                "enable_chain_position_assert",
            )
        },
    )
    return fake_ctx, VerifyPlan(**{name: wrap(a) for name, a in plan.arrays().items()})


def test_cai_device_comes_from_the_pointer_not_the_library_attribute(driver, monkeypatch):
    calls = fake_launch_module(monkeypatch, "verify", "launch_canary_verify_kernel")
    ctx, plan = _cuda_verify_args(OnDevice)
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    assert [name for name, _ in calls] == ["launch_canary_verify_kernel"]  # ".device.id = 7" everywhere is ignored
    other = OnDevice(np.ones(1, np.int32))
    driver[other.__cuda_array_interface__["data"][0]] = 1  # memory the driver puts on GPU 1
    with raises_code("KVC-C007") as info:
        launch_canary_verify_kernel(
            context=ctx, plan=VerifyPlan(**{**plan.arrays(), "enable": other}), check_verify_expected_token=False
        )
    assert "plan.enable is a cuda:1 array" in str(info.value)


def test_pointer_device_is_cached_per_pointer(monkeypatch):
    asked = []
    monkeypatch.setattr(_interop, "_driver_ordinal", lambda ptr: asked.append(ptr) or 3)
    monkeypatch.setattr(_interop, "_DEVICE_OF", {})
    assert [_interop.pointer_device(p) for p in (4096, 4096, 8192, 0)] == [3, 3, 3, None]
    assert asked == [4096, 8192]  # pointer 0 (an empty array) has no device and is not asked about


def test_read_only_cai_is_an_input_only(driver, monkeypatch):
    fake_launch_module(monkeypatch, "verify", "launch_canary_verify_kernel")
    ctx, plan = _cuda_verify_args(OnDevice)
    read_only_plan = VerifyPlan(**{name: OnDevice(a._array, readonly=True) for name, a in plan.arrays().items()})
    launch_canary_verify_kernel(context=ctx, plan=read_only_plan, check_verify_expected_token=False)  # inputs: fine
    ring = OnDevice(ctx.violation_ring._array, readonly=True)
    ro_ctx = type(ctx)(**{**{f: getattr(ctx, f) for f in ctx.__dataclass_fields__}, "violation_ring": ring})
    with raises_code("KVC-C013"):  # the ring is written
        launch_canary_verify_kernel(context=ro_ctx, plan=plan, check_verify_expected_token=False)


def _dlpack_wrapped(array, top):
    return DlpackOnly(array), None  # same host memory: nothing to copy back


@pytest.mark.parametrize("fault", [None, "position", "real_kv", "token"])
def test_dlpack_only_arrays_run_the_pipeline_byte_equal_to_numpy(monkeypatch, fault):
    rows, buf, expected = run_pipeline(fault)
    check_fault_caught(rows, expected)
    before = DlpackOnly.exported
    patch_public_calls(monkeypatch, _dlpack_wrapped)
    via_dlpack = run_pipeline(fault)
    assert DlpackOnly.exported > before  # the public calls read the wrappers through DLPack
    assert via_dlpack[0] == rows
    np.testing.assert_array_equal(via_dlpack[1], buf)


def test_a_repeated_call_exports_each_dlpack_producer_once():
    # The snapshot reads each producer through DLPack; the call then runs on those views
    # instead of exporting the producers a second time.
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    wrapped = VerifyPlan(**{name: DlpackOnly(a) for name, a in plan.arrays().items()})
    for _ in range(2):  # the second call is a memo hit
        before = DlpackOnly.exported
        launch_canary_verify_kernel(context=ctx, plan=wrapped, check_verify_expected_token=False)
    assert DlpackOnly.exported - before == len(plan.arrays())


def test_dlpack_on_an_unknown_device_is_refused():
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    odd = VerifyPlan(**{**plan.arrays(), "enable": DlpackOnly(plan.enable, device_type=4)})
    with raises_code("KVC-C001"):
        launch_canary_verify_kernel(context=ctx, plan=odd, check_verify_expected_token=False)


class _Protocol:
    def __init__(self, handle, as_property=False):
        if as_property:
            self.__cuda_stream__ = (0, handle)
        else:
            self.__cuda_stream__ = lambda: (0, handle)


@pytest.mark.parametrize(
    "stream, handle",
    [
        (None, None),
        (0, 0),
        (np.int64(77), 77),
        (_Protocol(1234), 1234),
        (_Protocol(99, as_property=True), 99),
        (type("CupyStream", (), {"ptr": 5})(), 5),
        (type("TorchStream", (), {"cuda_stream": 6})(), 6),
        (type("NumbaStream", (), {"handle": ctypes.c_void_p(8)})(), 8),
    ],
)
def test_stream_handles(stream, handle):
    assert _validate.stream_handle("f", stream) == handle


@pytest.mark.parametrize("stream", ["side", -1, True, object(), _Protocol("x")])
def test_a_bad_stream_is_refused_with_a_code(stream):
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    with raises_code("KVC-C016"):
        launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False, stream=stream)
    assert write_index(ctx) == 0


def test_the_launches_of_a_call_run_on_its_stream(driver, monkeypatch):
    seen = []
    fake_launch_module(monkeypatch, "verify", "launch_canary_verify_kernel")
    import kvcanary_numba.launch.verify as fake

    monkeypatch.setattr(fake, "launch_canary_verify_kernel", lambda stream, **_: seen.append(stream))
    ctx, plan = _cuda_verify_args(OnDevice)
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False, stream=_Protocol(4242))
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    assert seen == [4242, 0]  # then back to the current stream (no CuPy here: the legacy default stream)


def test_snapshots_hold_no_user_object():
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    key, dlpack = _memo.snapshot((ctx, plan, False, "numpy"))
    assert not dlpack

    def leaves(value):
        if isinstance(value, tuple):
            for item in value:
                yield from leaves(item)
        else:
            yield value

    assert all(isinstance(v, (int, bool, str, type, np.dtype, type(None))) for v in leaves(key))


class _FakeCupyArray:
    """What the snapshot reads of a CuPy array: its pointer, shape, strides and dtype."""

    data = None  # a class attribute, as CuPy's (what tells the walker a CuPy array)

    def __init__(self, ptr, shape, strides, dtype=np.dtype(np.int64)):
        self.data, self.shape, self.strides, self.dtype = types.SimpleNamespace(ptr=ptr), shape, strides, dtype


_FakeCupyArray.__module__ = "cupy"


def _cupy_snapshots(monkeypatch, imported: bool):
    # A dataclass type of its own per call: walkers are generated (and cached) per type.
    holder = dataclasses.make_dataclass("Holder", ["array", "count"], frozen=True)
    # The type is seen anew: registered by the first snapshot, inlined from then on once CuPy is imported.
    monkeypatch.delitem(_memo._WALKERS, _FakeCupyArray, raising=False)
    monkeypatch.setattr(_memo, "_inlined_cupy", _memo._ABSENT)
    if imported:
        monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=_FakeCupyArray))
    else:
        monkeypatch.delitem(sys.modules, "cupy", raising=False)
    arrays = [
        _FakeCupyArray(4096, (4,), (8,)),
        _FakeCupyArray(4096, (2, 2), (16, 8)),
        _FakeCupyArray(8192, (4,), (8,)),
        _FakeCupyArray(4096, (4,), (8,), np.dtype(np.int32)),
    ]
    return [_memo.snapshot((a, holder(array=a, count=3), "cuda"))[0] for a in arrays]


def test_cupy_arrays_snapshot_alike_inlined_or_walked(monkeypatch):
    inlined = _cupy_snapshots(monkeypatch, imported=True)
    assert _memo._inlined_cupy is _FakeCupyArray  # the top-level arrays after the first were inlined
    walked = _cupy_snapshots(monkeypatch, imported=False)
    assert _memo._inlined_cupy is _memo._ABSENT
    strip = lambda key: (key[0], key[1][1:], key[2])  # noqa: E731 - the Holder types differ
    assert [strip(k) for k in inlined] == [strip(k) for k in walked]
    assert inlined[0][0] == (4096, (4,), (8,), np.dtype(np.int64))
    # A reshape in place, another pointer or another dtype is another snapshot.
    assert len({strip(k) for k in inlined}) == 4


def test_a_cai_over_memory_the_driver_does_not_map_is_refused(driver, monkeypatch):
    """A host array posing as a CUDA array (the fuzz harness's ``CAI``) faulted the write kernel on
    the H200; the driver's answer for its pointer now refuses it before any launch."""
    calls = fake_launch_module(monkeypatch, "verify", "launch_canary_verify_kernel")
    ctx, plan = _cuda_verify_args(OnDevice)
    host = OnDevice(np.ones(1, np.int32))
    driver[host.__cuda_array_interface__["data"][0]] = _interop.NOT_DEVICE_MEMORY
    with raises_code("KVC-C001") as info:
        launch_canary_verify_kernel(
            context=ctx, plan=VerifyPlan(**{**plan.arrays(), "enable": host}), check_verify_expected_token=False
        )
    assert "not CUDA device memory" in str(info.value) and calls == []


class _FakeDriver:
    """Just enough of ``cuda.bindings.driver`` for :func:`_interop._driver_ordinal`."""

    class CUresult:
        CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_CONTEXT = 0, 1, 201

    class CUpointer_attribute:
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9

    answers = {4096: (0, 2), 8192: (1, 0), 12288: (201, 0)}

    @classmethod
    def cuPointerGetAttribute(cls, attribute, ptr):
        assert attribute == cls.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return cls.answers[ptr]


def test_driver_ordinal_tells_device_memory_from_host_memory(monkeypatch):
    monkeypatch.setattr(_interop, "_driver", lambda: _FakeDriver)
    # mapped on GPU 2; not mapped (pageable host memory): refused; any other driver answer: unknown
    assert [_interop._driver_ordinal(p) for p in (4096, 8192, 12288)] == [2, _interop.NOT_DEVICE_MEMORY, None]


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_a_misaligned_cuda_array_is_refused(dtype):
    """A CUDA int64 array at an odd address faulted the plan kernel on the H200 (CUDA fuzz run)."""
    from kvcanary_numba._validate import check_array

    raw = np.zeros(64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 16  # an aligned base, then one byte past it
    misaligned = np.frombuffer(raw, dtype=dtype, count=4, offset=start + 1)
    aligned = np.frombuffer(raw, dtype=dtype, count=4, offset=start)
    check_array("f", "x", FakeCudaArray(aligned), dtype=dtype, ndim=1)
    with raises_code("KVC-C014") as info:
        check_array("f", "x", FakeCudaArray(misaligned), dtype=dtype, ndim=1)
    assert info.value.fields["expected"] == np.dtype(dtype).itemsize
