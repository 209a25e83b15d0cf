"""The DLPack capsule reader (``kvcanary_numba._dlpack``), exercised on NumPy producers.

The reader does not look at the device type, so host capsules check the parsing (pointer,
byte offset, shape, element strides, dtype codes, read-only flag, legacy capsules) and the
interning on a CPU; tests/test_gpu_interop.py runs the CUDA path.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from kvcanary_numba.fast import dlpack as _dlpack


class Producer:
    """A DLPack-only producer over a NumPy array; ``legacy`` refuses the max_version keyword."""

    def __init__(self, array: np.ndarray, legacy: bool = False):
        self.array, self.legacy, self.exports = array, legacy, 0

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        self.exports += 1
        if self.legacy and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if max_version is None:
            return self.array.__dlpack__()
        return self.array.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def _layout(a: np.ndarray) -> tuple:
    return a.ctypes.data, a.shape, a.strides, a.dtype


@pytest.mark.parametrize("legacy", [False, True], ids=["versioned", "legacy"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(24, dtype=np.int64).reshape(4, 6),
        lambda: np.arange(24, dtype=np.int64).reshape(4, 6)[1:, ::2],  # offset pointer, element strides
        lambda: np.zeros(0, dtype=np.int32),
        lambda: np.array([True, False]),
        lambda: np.arange(8, dtype=np.uint8),
        lambda: np.ones((2, 3), dtype=np.float16),
        lambda: np.full((), 7, dtype=np.int64),
    ],
    ids=["int64-2d", "strided-view", "empty-int32", "bool", "uint8", "float16", "0-d"],
)
def test_capsule_fields_match_the_producer(make, legacy):
    a = make()
    fields = _dlpack.capsule_fields(_dlpack._capsule(Producer(a, legacy), 1))
    ptr, shape, strides, dtype, device, read_only = fields
    assert (ptr, shape, dtype) == (a.ctypes.data, a.shape, a.dtype)
    if a.size:  # NumPy may describe the strides of an empty array either way
        assert strides == a.strides
    assert device == (1, 0)  # kDLCPU
    assert read_only is False


def test_a_read_only_producer_is_read_only_through_a_versioned_capsule():
    a = np.arange(4, dtype=np.int64)
    a.setflags(write=False)
    view = _dlpack.cuda_view(Producer(a), 1)
    assert view.__cuda_array_interface__["data"] == (a.ctypes.data, True)


def test_dtypes_numpy_does_not_name_the_same_way_are_not_read():
    assert _dlpack.capsule_fields(_dlpack._capsule(Producer(np.ones(2, dtype=np.complex64)), 1)) is None
    assert _dlpack.cuda_view(Producer(np.ones(2, dtype=np.complex128)), 1) is None


def test_views_are_interned_by_description_and_bounded(monkeypatch):
    monkeypatch.setattr(_dlpack, "_interned", type(_dlpack._interned)())
    monkeypatch.setattr(_dlpack, "INTERNED", 3)
    a, b = np.arange(6, dtype=np.int64), np.arange(6, dtype=np.int64)
    first = _dlpack.cuda_view(Producer(a), 1)
    assert _dlpack.cuda_view(Producer(a), 1) is first  # same memory, same description: same object
    other = _dlpack.cuda_view(Producer(b), 1)
    assert other is not first and other._kvcanary_layout == _layout(b)
    assert _dlpack.cuda_view(Producer(a[1:]), 1) is not first  # another pointer, another view
    for k in range(3):
        _dlpack.cuda_view(Producer(np.arange(k + 1, dtype=np.int8)), 1)
    assert len(_dlpack._interned) == 3
    assert _dlpack.cuda_view(Producer(a), 1) is not first  # pushed out by newer views, built again


def test_reading_a_capsule_keeps_nothing_alive():
    a = np.arange(1000, dtype=np.int64)
    alive = weakref.ref(a)
    producer = Producer(a)
    view = _dlpack.cuda_view(producer, 1)
    assert producer.exports == 1
    del producer, a
    gc.collect()
    assert alive() is None  # the unconsumed capsule handed the memory back
    assert "ptr=" in repr(view)  # the view is only numbers
