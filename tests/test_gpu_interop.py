"""Every array library on a real GPU: the pipeline's plan -> verify -> write flow, with a planted
fault, runs on CuPy, Numba device arrays, PyTorch tensors, JAX inputs and DLPack-only wrappers, and
its ring rows and canary bytes equal the NumPy path's byte for byte. Skipped without a GPU."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from interop_helpers import DlpackOnly, check_fault_caught, patch_public_calls, run_pipeline

pytestmark = pytest.mark.gpu
FAULTS = [None, "position", "real_kv", "token"]


def _sync():
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _cupy(array, top):
    import cupy

    dev = cupy.asarray(array)
    return dev, lambda: np.copyto(array, cupy.asnumpy(dev))


def _numba(array, top):
    from numba import cuda

    dev = cuda.to_device(array)
    return dev, lambda: np.copyto(array, dev.copy_to_host())


def _torch(array, top):
    torch = pytest.importorskip("torch")
    dev = torch.from_numpy(np.ascontiguousarray(array)).cuda()
    return dev, lambda: np.copyto(array, dev.cpu().numpy())


def _jax():
    """JAX on the GPU with 64-bit ints, not grabbing most of the GPU's memory (skips otherwise)."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    if jax.devices()[0].platform != "gpu":
        pytest.skip("JAX has no GPU backend here")
    return jax


def _jax_inputs(array, top):
    """JAX arrays (read-only CAI) for the per-step inputs, CuPy for everything a call may write."""
    if not top:
        return _cupy(array, top)
    return _jax().numpy.asarray(array), None


def _dlpack(array, top):
    dev, back = _cupy(array, top)
    return DlpackOnly(dev), back


LIBRARIES = {"cupy": _cupy, "numba": _numba, "torch": _torch, "jax": _jax_inputs, "dlpack": _dlpack}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_library_pipeline_is_byte_equal_to_numpy(monkeypatch, library, fault):
    if library == "torch":
        pytest.importorskip("torch")
    if library == "jax":
        _jax()
    rows, buf, expected = run_pipeline(fault)
    check_fault_caught(rows, expected)
    patch_public_calls(monkeypatch, LIBRARIES[library], after=_sync)
    on_gpu = run_pipeline(fault)
    assert on_gpu[0] == rows
    np.testing.assert_array_equal(on_gpu[1], buf)


@pytest.mark.parametrize("kind", ["cupy", "torch", "protocol", "int"])
def test_stream_argument_runs_the_flow_on_that_stream(monkeypatch, kind):
    import cupy

    if kind == "torch":
        torch = pytest.importorskip("torch")
        stream = torch.cuda.Stream()
        handle = stream.cuda_stream
    else:
        owner = stream = cupy.cuda.Stream(non_blocking=True)  # noqa: F841 - keeps the handle's stream alive
        handle = stream.ptr
        if kind == "protocol":
            stream = type("Proto", (), {"__cuda_stream__": lambda self, h=handle: (0, h)})()
        elif kind == "int":
            stream = handle
    rows, buf, expected = run_pipeline("position")

    def sync():
        cupy.cuda.runtime.streamSynchronize(handle)

    # Before each call the whole device: the conversions run on CuPy's current stream, which a
    # non-blocking stream does not wait for. After it only that stream: the flow ran there.
    patch_public_calls(monkeypatch, _cupy, before=cupy.cuda.runtime.deviceSynchronize, after=sync, stream=stream)
    on_stream = run_pipeline("position")
    assert on_stream[0] == rows
    np.testing.assert_array_equal(on_stream[1], buf)


def test_freed_cupy_pool_returns_its_memory_after_calls():
    import cupy

    from kvcanary_numba import CanaryContext, RealKvHashMode, RealKvSource, VerifyPlan, launch_canary_verify_kernel

    pool = cupy.get_default_memory_pool()
    _sync()
    before = pool.used_bytes()
    kv = cupy.zeros((4096, 4096), dtype=cupy.uint8)  # 16 MiB of "KV"
    ctx = CanaryContext.allocate(
        num_slots=4096,
        slot_stride_bytes=32,
        ring_capacity=64,
        kernel_kind=0,
        real_kv_sources=(RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=4096, read_bytes=64),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        device="cuda",
    )
    plan = VerifyPlan.allocate(verify_capacity=16, device="cuda")
    for _ in range(3):
        launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    _sync()
    refs = [weakref.ref(kv), weakref.ref(ctx.canary_buf)]
    del kv, ctx, plan
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert pool.used_bytes() <= before + (1 << 20)  # the 16 MiB pool and the buffer are back


def test_dlpack_only_cuda_arrays_are_read_without_a_view_and_interned():
    import cupy

    from kvcanary_numba import _interop
    from kvcanary_numba.fast.dlpack import DlpackView, native_array

    dev = cupy.arange(12, dtype=cupy.int64).reshape(3, 4)[:, 1:]
    first = native_array("test", "x", DlpackOnly(dev))  # the fast wing's capsule reader
    assert isinstance(first, DlpackView)
    assert first._kvcanary_layout == (dev.data.ptr, dev.shape, dev.strides, dev.dtype)
    assert native_array("test", "x", DlpackOnly(dev)) is first  # same memory: the same object again
    core = _interop.native_array("test", "x", DlpackOnly(dev))  # the core's: a CuPy view of the same memory
    assert isinstance(core, cupy.ndarray) and core.data.ptr == dev.data.ptr


def test_freed_dlpack_producer_returns_its_memory_after_calls():
    import cupy

    from kvcanary_numba import CanaryContext, RealKvHashMode, RealKvSource, VerifyPlan, launch_canary_verify_kernel

    pool = cupy.get_default_memory_pool()
    _sync()
    before = pool.used_bytes()
    kv = cupy.zeros((4096, 4096), dtype=cupy.uint8)
    ctx = CanaryContext.allocate(
        num_slots=4096,
        slot_stride_bytes=32,
        ring_capacity=64,
        kernel_kind=0,
        real_kv_sources=(RealKvSource(tensor=DlpackOnly(kv), page_size=1, num_bytes_per_token=4096, read_bytes=64),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        device="cuda",
    )
    plan = VerifyPlan.allocate(verify_capacity=16, device="cuda")
    for _ in range(3):
        launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    _sync()
    ref = weakref.ref(kv)
    del kv, ctx, plan
    gc.collect()
    assert ref() is None
    assert pool.used_bytes() <= before + (1 << 20)


def test_numba_device_arrays_are_snapshotted_from_their_attributes():
    from numba import cuda

    from kvcanary_numba.fast import memo as _memo

    a = cuda.to_device(np.arange(8, dtype=np.int64))
    b = cuda.to_device(np.arange(8, dtype=np.int64))
    ptr = a.__cuda_array_interface__["data"][0]
    (key,), _ = _memo.snapshot((a,))
    assert key == (ptr, (8,), (8,), np.dtype(np.int64))
    assert _memo.snapshot((b,))[0] != _memo.snapshot((a,))[0]  # other memory, other snapshot
    assert _memo.snapshot((a[::2],))[0] != _memo.snapshot((a,))[0]  # other strides, other snapshot
