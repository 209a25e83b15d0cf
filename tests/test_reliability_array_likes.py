"""Array-likes that lie or refuse: every public call and the monitor answer with a coded error and
change nothing (issue 33).

Each hostile object (``tests/hostile_arrays.py``: interface dicts, DLPack producers, PyTorch tensors
that require grad, masked arrays, matrices, dates, text, records) takes the place of one array
argument of one valid call (``tests/first_calls.py``), every argument of every public operation in
turn; the call must raise a KvCanaryError (KVC-C001 naming the object's fault, unless the object is
a well-formed array of another dtype or layout), and every array of the call must keep its bytes.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from first_calls import CALLS, on_device
from hostile_arrays import CLASSES, array_paths, at, interface, memory_of, random_interface, replaced
from monitor_helpers import DECODE, PREFILL, Driver
from test_reliability_state import snapshot

from kvcanary_numba import KvCanaryError, RealKvSource
from kvcanary_numba.errors import REGISTRY
from kvcanary_numba.fast.calls import OPERATIONS
from kvcanary_numba.fast.memo import Memo, snapshot as memo_snapshot
from kvcanary_numba.monitor import KvGroup, SlotChain

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

CASES = [(cls, name) for cls, cases in CLASSES.items() for name in cases]
#: Cases whose object is a well-formed array of another dtype or layout: refused with the code of
#: what is wrong with it (dtype, contiguity, strides, the array kind), not always KVC-C001.
WELL_FORMED = {
    "typestr big-endian",
    "typestr void",
    "typestr structured",
    "strides negative",
    "strides zero",
    "strides huge",
    "strides misaligned",
    "object",
}
#: What a KVC-C001 message says about each class of object.
SAYS = {
    "interface": r"__cuda_array_interface__",
    "dlpack": r"__dlpack|DLPack",
    "torch": r"requires grad|require gradient",
    "numpy": r"mask would be ignored|indexes as 2-D|not data",
}
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
BACKENDS = ["numpy", pytest.param("cuda", marks=pytest.mark.skipif(not SIMULATOR, reason="NumPy kernels: simulator"))]
#: (operation, path of one of its arrays), every array of every public operation.
SLOTS = [
    (name, path) for name, (build, _, _) in CALLS.items() for path in array_paths(build(np.random.default_rng(0))[0])
]


def _hostile_call(name: str, path: str, make, backend: str, seed: int = 0) -> KvCanaryError:
    """Build the valid call ``name``, put ``make(array at path)`` there, call; returns the error after
    checking that nothing changed."""
    build, call, _ = CALLS[name]
    kw, _ = build(np.random.default_rng(seed))
    before = memory_of(kw)
    with pytest.raises(KvCanaryError) as excinfo:
        call(**replaced(kw, path, make(at(kw, path))), backend=backend)
    assert memory_of(kw) == before, f"{name}: a rejected call changed an array"
    assert excinfo.value.code in REGISTRY
    return excinfo.value


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls, case", CASES)
def test_every_public_call_refuses_the_object_in_every_argument(cls, case, backend):
    make, refused = CLASSES[cls][case], []
    for name, path in SLOTS:
        exc = _hostile_call(name, path, make, backend)
        refused.append((name, path, exc.code))
        if case not in WELL_FORMED:
            assert exc.code == "KVC-C001", f"{name}({path}=...): {exc}"
            assert re.search(SAYS[cls], str(exc)), f"{name}({path}=...): {exc}"
    assert len(refused) == len(SLOTS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), slot=st.sampled_from(SLOTS))
def test_random_hostile_interfaces_are_refused_and_change_nothing(seed, slot):
    name, path = slot
    rng = np.random.default_rng(seed)
    exc = _hostile_call(name, path, lambda a: random_interface(a, rng), "numpy", seed % 7)
    assert exc.code in {"KVC-C001", "KVC-C003", "KVC-C007"}, str(exc)


# --- the fast wing's memo: a snapshot that passed is not a pass for a hostile object of its layout ----------


@pytest.mark.parametrize("case", ["masked array", "matrix (2-D) or masked", "datetime64"])
def test_an_object_with_the_layout_of_a_memoised_call_is_still_refused(case, monkeypatch):
    for name, path in SLOTS:
        build, call, _ = CALLS[name]
        operation = OPERATIONS[call.__wrapped__.__name__]
        validations: list = []
        monkeypatch.setattr(operation, "memo", Memo())
        count = lambda _v=operation.validate, _seen=validations, **kw: _seen.append(1) or _v(**kw)  # noqa: E731
        monkeypatch.setattr(operation, "validate", count)
        kw, _ = build(np.random.default_rng(0))
        call(**kw, backend="numpy")
        call(**kw, backend="numpy")
        assert len(validations) == 1  # the second call was a memo hit
        try:
            hostile = replaced(kw, path, CLASSES["numpy"][case](at(kw, path)))
        except KvCanaryError:  # refused when built: a RealKvSource checks its tensor
            continue
        with pytest.raises(KvCanaryError) as excinfo:
            call(**hostile, backend="numpy")
        assert excinfo.value.code in ({"KVC-C001"} if case != "datetime64" else {"KVC-C001", "KVC-C002"})
        assert len(validations) == 2  # validated in full, not taken for the remembered call


def test_an_interface_that_gains_a_mask_is_read_again():
    array = np.arange(4, dtype=np.int64)
    plain = interface(array)
    first, _ = memo_snapshot(((plain,),))
    plain.__cuda_array_interface__["mask"] = interface(np.zeros(4, np.bool_))
    second, _ = memo_snapshot(((plain,),))
    assert first != second


# --- the monitor ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, case", CASES)
def test_the_monitor_refuses_the_object_in_a_batch_and_changes_nothing(cls, case):
    make = CLASSES[cls][case]
    d = Driver()
    d.step(PREFILL)
    batch = d.batch(DECODE)
    for field in ("req_pool_indices", "req_to_token", "input_ids", "out_cache_loc", "token_offsets"):
        state = snapshot(d.monitor)
        valid = getattr(batch, field)
        with pytest.raises(KvCanaryError):  # built with it
            type(batch)(**{**{f: getattr(batch, f) for f in batch.__dataclass_fields__}, field: make(valid)})
        object.__setattr__(batch, field, make(valid))  # or given it after it was built
        with pytest.raises(KvCanaryError) as excinfo:
            d.monitor.pre_forward(batch)
        object.__setattr__(batch, field, valid)
        assert excinfo.value.code in REGISTRY
        assert snapshot(d.monitor) == state, f"batch.{field}: a rejected pre_forward changed the monitor"
    d.monitor.pre_forward(batch)  # the step goes on
    d.monitor.post_forward()
    d.monitor.end_step()
    assert d.monitor.violations == []


@pytest.mark.parametrize("cls, case", CASES)
def test_groups_sources_and_chains_refuse_the_object_when_built(cls, case):
    make = CLASSES[cls][case]
    kv, lut, slots = np.zeros((16, 32), np.uint8), np.arange(17, dtype=np.int64), np.arange(1, 5, dtype=np.int64)
    if case not in WELL_FORMED:  # a well-formed interface over host memory is a CUDA tensor here (no driver)
        with pytest.raises(KvCanaryError):
            RealKvSource(tensor=make(kv), page_size=1, num_bytes_per_token=32, read_bytes=32)
    with pytest.raises(KvCanaryError):
        KvGroup(kind="swa", num_slots=16, swa_window_size=4, full_to_swa_index_mapping=make(lut))
    with pytest.raises(KvCanaryError):
        SlotChain(slots=make(slots))


# --- pointers against the driver's allocations -------------------------------------------------------


class _Allocations:
    """Just enough of ``cuda.bindings.driver``: ``blocks[start] = size`` is device 0's memory."""

    blocks: dict[int, int] = {}

    class CUresult:
        CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE = 0, 1

    class CUpointer_attribute:
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 9, 11
        CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12

    @classmethod
    def cuPointerGetAttribute(cls, attribute, ptr):
        for start, size in cls.blocks.items():
            if start <= ptr < start + size:
                return 0, {9: 0, 11: start, 12: size}[attribute]
        return 1, 0


@pytest.fixture
def allocations(monkeypatch):
    from kvcanary_numba import _interop

    monkeypatch.setattr(_interop, "_driver", lambda: _Allocations)
    monkeypatch.setattr(_interop, "_DEVICE_OF", {})
    monkeypatch.setattr(_interop, "_RANGE_OF", {})
    monkeypatch.setattr(_Allocations, "blocks", {})
    return _Allocations.blocks


def test_an_interface_must_lie_inside_the_allocation_at_its_pointer(allocations):
    from kvcanary_numba._validate import inspect_array

    memory = np.zeros(64, np.int64)
    ptr = memory.__array_interface__["data"][0]
    allocations[ptr] = memory.nbytes
    whole = inspect_array("f", "x", interface(memory))
    assert (whole.kind, whole.device, whole.shape) == ("cuda", 0, (64,))
    inspect_array("f", "x", interface(memory[:8], data=(ptr + 56 * 8, False)))  # the last 8 items
    lies = {
        "twice the elements": interface(memory, shape=(128,), shape_attribute=(128,)),
        "past the end by one item": interface(memory[:8], data=(ptr + 57 * 8, False)),
        "strides that leave it": interface(memory[:2], strides=(64 * 8,)),
        "before the start": interface(memory[:2], strides=(-8,)),
    }
    for what, lie in lies.items():
        with pytest.raises(KvCanaryError) as excinfo:
            inspect_array("f", "x", lie)
        assert excinfo.value.code == "KVC-C001" and "allocation" in str(excinfo.value), what
    with pytest.raises(KvCanaryError, match="not CUDA device memory"):
        inspect_array("f", "x", interface(np.zeros(4, np.int64)))  # memory the driver does not map


def test_memory_allocated_anew_at_a_cached_pointer_is_asked_about_again(allocations):
    from kvcanary_numba._validate import inspect_array

    memory = np.zeros(64, np.int64)
    ptr = memory.__array_interface__["data"][0]
    allocations[ptr] = 8 * 8  # a small allocation, seen once
    inspect_array("f", "x", interface(memory[:8]))
    allocations[ptr] = memory.nbytes  # freed, and a larger one made at the same address
    assert inspect_array("f", "x", interface(memory)).shape == (64,)


def test_an_empty_interface_is_not_asked_about_its_allocation(allocations):
    from kvcanary_numba._validate import inspect_array

    info = inspect_array("f", "x", interface(np.zeros(4, np.int64)[:0], data=(0, False)))
    assert info.shape == (0,) and info.device is None


# --- the GPU tier: hostile interfaces over CuPy memory (run it under compute-sanitizer memcheck) --------

#: Lies only a driver can catch: the memory exists, but not as much of it as the interface claims
#: (far past it: CuPy's pool hands out pieces of larger driver allocations).
GPU_LIES = {
    "2**20 times the rows": lambda a: _claim(a, shape=(2**20 * a.shape[0],) + a.shape[1:]),
    "pointer 4 GiB past": lambda a: interface(a, data=(_unmapped(a, +1), False)),
    "pointer 4 GiB before": lambda a: interface(a, data=(_unmapped(a, -1), False)),
    "rows 1 GiB apart": lambda a: interface(a, strides=(2**30,) + a.strides[1:]),
    "device says CPU, capsule on the GPU": lambda a: _HostClaim(a),
}
#: Lies that change nothing on some arrays (the strides of an axis of one element are never used).
HARMLESS_ON_SOME = {"rows 1 GiB apart"}


def _claim(a, shape):
    return interface(a, shape=shape, shape_attribute=shape)


def _gpu_ptr(a) -> int:
    return a.__cuda_array_interface__["data"][0]


def _unmapped(a, direction: int) -> int:
    """The first address a multiple of 4 GiB away from ``a``'s in ``direction`` whose whole extent the
    driver maps to nothing: 4 GiB away can fall in another allocation of this process (JAX's pool, a
    grown CuPy pool), and a pointer into real memory is no lie."""
    import cupy

    def mapped(ptr: int) -> bool:
        try:
            return cupy.cuda.runtime.pointerGetAttributes(ptr).type != 0  # cudaMemoryTypeUnregistered
        except cupy.cuda.runtime.CUDARuntimeError:  # a runtime that refuses to describe unmapped memory
            return False

    for k in range(1, 256):
        ptr = _gpu_ptr(a) + direction * k * 2**32
        if ptr > 0 and not mapped(ptr) and not mapped(ptr + max(a.nbytes, 1) - 1):
            return ptr
    raise AssertionError("no unmapped address within 1 TiB of the array")


class _HostClaim:
    """A DLPack producer that says its memory is on the host while its capsule is CUDA memory."""

    def __init__(self, a):
        self._a = a

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__()


@pytest.mark.gpu
@pytest.mark.parametrize("cls, case", CASES + [("gpu", name) for name in GPU_LIES])
def test_hostile_objects_over_gpu_memory_are_refused_before_any_launch(cls, case):
    import cupy

    make = GPU_LIES[case] if cls == "gpu" else CLASSES[cls][case]
    for name, path in SLOTS:
        build, call, _ = CALLS[name]
        kw = {key: on_device(value) for key, value in build(np.random.default_rng(0))[0].items()}
        before = memory_of(kw)
        try:
            call(**replaced(kw, path, make(at(kw, path))))
        except KvCanaryError as exc:
            assert exc.code in REGISTRY
            cupy.cuda.runtime.deviceSynchronize()
            assert memory_of(kw) == before, f"{name}({path}=...): a rejected call changed an array"
            continue
        # Accepted: only a well-formed array of another layout, or a lie about an unused stride.
        assert case in WELL_FORMED | HARMLESS_ON_SOME, f"{name}({path}=...) accepted {case}"
        cupy.cuda.runtime.deviceSynchronize()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_real_pytorch_tensor_that_requires_grad_is_refused(device):
    torch = pytest.importorskip("torch")
    for name, path in SLOTS:
        build, call, _ = CALLS[name]
        kw, _ = build(np.random.default_rng(0))
        if device == "cuda":
            kw = {key: on_device(value) for key, value in kw.items()}
        # Only floating point tensors can require grad: refused for that before its dtype is looked at.
        tensor = torch.zeros(tuple(at(kw, path).shape), dtype=torch.float32, device=device, requires_grad=True)
        with pytest.raises(KvCanaryError) as excinfo:
            call(**replaced(kw, path, tensor))
        assert excinfo.value.code == "KVC-C001" and re.search(SAYS["torch"], str(excinfo.value))
