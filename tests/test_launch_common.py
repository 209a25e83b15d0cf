"""Launch utilities (kvcanary_numba.launch._launch) that run without a GPU."""

from __future__ import annotations

import types

import numpy as np
import pytest
from canary_helpers import FakeCudaArray

from kvcanary_numba.kernels import fingerprint, is_kernel, verify as verify_kernels
from kvcanary_numba.launch import _launch as _common


def test_array_layout_of_numpy_and_cuda_array_interface():
    base = np.zeros((4, 6), dtype=np.int32)
    view = base[::2, 1:]
    assert _common.array_layout(view) == (view.ctypes.data, (2, 5), (48, 4), np.dtype(np.int32))
    fake = FakeCudaArray(base)  # C-contiguous: no strides in its interface
    assert _common.array_layout(fake) == (base.ctypes.data, (4, 6), (24, 4), np.dtype(np.int32))
    cupy_like = types.SimpleNamespace(
        data=types.SimpleNamespace(ptr=4096), shape=(3,), strides=(8,), dtype=np.dtype("i8")
    )
    assert _common.array_layout(cupy_like) == (4096, (3,), (8,), np.dtype("i8"))


def test_reinterpret_and_byte_span_share_memory():
    buf = np.zeros((3, 32), dtype=np.uint8)
    words = _common.reinterpret(buf, np.int64, (3, 4)).materialize()
    words[2, 1] = -1
    assert buf[2, 8:16].tolist() == [255] * 8 and _common.reinterpret(buf, np.uint64).shape == (12,)
    rows = np.arange(4 * 48, dtype=np.uint8).reshape(4, 48)[::2, :32]  # 96-byte row stride
    span = _common.byte_span(rows, np.uint64)
    assert span.shape == ((96 + 32) // 8,) and np.shares_memory(span.materialize(), rows)
    assert span.materialize().view(np.uint8)[96:104].tolist() == rows[1, :8].tolist()
    assert _common.byte_span(rows[:0], np.uint64).shape == (0,)
    assert _common.byte_span(rows[:0], np.uint64).materialize().shape == (0,)


@pytest.mark.parametrize(("n", "block", "want"), [(0, 32, 1), (1, 32, 1), (32, 32, 1), (33, 32, 2), (10**6, 32, 2)])
def test_grids_under_the_simulator_stay_small(n, block, want):
    if not _common.ON_SIMULATOR:
        pytest.skip("simulator grid sizes")
    assert _common.persistent_grid(n, block) == want and _common.block_size(512) == _common.SIM_BLOCK
    assert _common.grid_for(n, block) == max(1, -(-n // block))


def test_resident_grid_under_the_simulator_is_the_persistent_grid():
    if not _common.ON_SIMULATOR:
        pytest.skip("simulator grid sizes")
    kernel = verify_kernels.KERNELS["verify_tok0_src1"]
    signature = verify_kernels.SIGNATURES["verify_tok0_src1"][0]
    for n in (1, 33, 10**6):
        assert _common.resident_grid(kernel, signature, n, 32) == _common.persistent_grid(n, 32)


@pytest.mark.gpu
def test_resident_grid_is_what_the_driver_keeps_resident():
    # The fold variants use more registers than 8 blocks of 256 threads per SM allow, so their
    # grid is smaller than the plain persistent grid; small inputs still get fewer blocks.
    name = "verify_tok0_src1"
    kernel, signature = verify_kernels.KERNELS[name], verify_kernels.SIGNATURES[name][0]
    compiled = _common.compile_kernel(kernel, signature)
    fit = compiled.max_cooperative_grid_blocks(256)
    per_sm = 65536 // (compiled.regs_per_thread * 256)
    assert fit <= _common.sm_count() * min(per_sm, 8)
    assert _common.resident_grid(kernel, signature, 10**9, 256) == fit < _common.persistent_grid(10**9, 256)
    assert _common.resident_grid(kernel, signature, 300, 256) == 2


def test_check_signature_catches_type_drift():
    signature = "void(int64[:, ::1], uint64[::1], int64, UniTuple(int64, 2))"
    good = (np.zeros((2, 2), np.int64), np.zeros(3, np.uint64), 5, (1, 2))
    _common.check_signature(signature, good)
    for index, bad in [
        (0, np.zeros(4, np.int64)),
        (1, np.zeros(6, np.uint64)[::2]),
        (1, np.zeros(3, np.int64)),
        (3, (1,)),
    ]:
        with pytest.raises(RuntimeError, match=f"argument {index}"):
            _common.check_signature(signature, good[:index] + (bad,) + good[index + 1 :])
    with pytest.raises(RuntimeError, match="arguments"):
        _common.check_signature(signature, good[:3])


def test_check_signature_reads_tuples_item_by_item():
    # The endpoint kernels' per-endpoint arrays: a read-only input makes NumPy's tuple type
    # heterogeneous, and the check still compares each item as it compares arrays.
    signature = "void(UniTuple(int64[::1], 2), UniTuple(UniTuple(uint64[::1], 2), 2))"
    ro = np.zeros(3, np.uint64)
    ro.flags.writeable = False
    good = ((np.zeros(2, np.int64), np.zeros(5, np.int64)), ((ro, ro), (np.zeros(1, np.uint64), ro)))
    _common.check_signature(signature, good)
    for bad in [
        ((np.zeros(2, np.int64),), good[1]),
        ((np.zeros(2, np.int64), np.zeros(5, np.int32)), good[1]),
        (good[0], ((ro, ro), (ro, np.zeros((1, 1), np.uint64)))),
    ]:
        with pytest.raises(RuntimeError, match="argument"):
            _common.check_signature(signature, bad)


def test_grids_in_parts_share_what_stays_resident(monkeypatch):
    # An endpoint launch of two parts gives each half of the resident blocks (GPU arithmetic).
    monkeypatch.setattr(_common, "ON_SIMULATOR", False)
    monkeypatch.setattr(_common, "sm_count", lambda: 132)
    assert _common.persistent_grid(10**6, 256) == 132 * 8
    assert _common.persistent_grid(10**6, 256, parts=2) == 132 * 4
    assert (
        _common.persistent_grid(3, 256, parts=2) == 1
        and _common.persistent_grid(10**6, 32, blocks_per_sm=1, parts=3) == 44
    )


def test_every_kernel_is_declared_with_its_signatures():
    assert sum(len(sigs) for sigs in fingerprint.SIGNATURES.values()) == 5
    assert set(fingerprint.SIGNATURES) == set(fingerprint.KERNELS)
    assert all(is_kernel(k) for k in fingerprint.KERNELS.values())
    assert not is_kernel(fingerprint.fold_source) and not is_kernel(len)
