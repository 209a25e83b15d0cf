"""The driver side of raw launches on the CPU: the kernel handle (``fast/driver.py``
``function_handle``), its fallback to the core's launch, and the ``cuLaunchKernel`` call, with fakes."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys

import pytest
from launch_fakes import KERNEL_A, SIG, FakeHandle, args_for, expected_values, gpu  # noqa: F401

from kvcanary_numba.fast import driver as _driver, prepared as prepared_module
from kvcanary_numba.fast.prepared import PreparedLaunch

# --- the kernel handle -----------------------------------------------------------


def test_the_handle_path_exists_in_the_installed_numba_cuda():
    # Every attribute function_handle reads, on the real (not simulated) classes: an upgrade
    # that renames one fails here on a CPU instead of silently slowing every launch on a GPU.
    script = (
        "from numba.cuda.dispatcher import _Kernel\n"
        "from numba.cuda.codegen import CUDACodeLibrary\n"
        "from numba.cuda.cudadrv.driver import CudaPythonFunction\n"
        "from cuda.core import Kernel\n"
        "assert isinstance(_Kernel.library, property)\n"
        "assert callable(CUDACodeLibrary.get_cufunc)\n"
        "assert 'kernel' in CudaPythonFunction.__slots__\n"
        "assert hasattr(Kernel, 'handle')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NUMBA_ENABLE_CUDASIM="0"),
    )
    assert done.returncode == 0, done.stderr[-3000:]


class _Cufunc:
    def __init__(self, kernel):
        self.kernel = kernel


class _Library:
    def __init__(self, cufunc):
        self.cufunc = cufunc

    def get_cufunc(self):
        return self.cufunc


def test_function_handle_reads_the_cuda_core_kernel_handle(monkeypatch):
    core = type("Kernel", (), {"handle": FakeHandle(0xAB)})()
    compiled = type("Compiled", (), {"library": _Library(_Cufunc(core))})()
    monkeypatch.setattr(_driver, "bound_kernel", lambda kernel, signature: compiled)
    assert int(_driver.function_handle(KERNEL_A, SIG)) == 0xAB


def test_a_missing_attribute_logs_once_and_takes_the_cores_launch(gpu, caplog, monkeypatch):
    # The real function_handle over compiled kernels without ``library`` (a renamed attribute).
    monkeypatch.setattr(_driver, "bound_kernel", lambda kernel, signature: object())
    monkeypatch.setattr(_driver, "_handle_failure", [])
    monkeypatch.setattr(gpu.driver, "function_handle", _driver.function_handle)
    with caplog.at_level(logging.WARNING, logger="kvcanary_numba.fast"):
        assert _driver.function_handle(KERNEL_A, SIG) is None
        assert _driver.function_handle(KERNEL_A, SIG) is None
    assert len([r for r in caplog.records if "no driver handle" in r.getMessage()]) == 1
    ran = []
    monkeypatch.setattr(prepared_module, "run", ran.append)  # the core's launch: the public API
    args = args_for(0x10000)
    prepared = PreparedLaunch(KERNEL_A, SIG, 1, 32, args)
    assert not prepared.raw and "no driver handle" in prepared.fallback_reason
    prepared.launch(stream=0x77)
    (spec,) = ran
    assert (spec.kernel, spec.grid, spec.block, spec.args, spec.stream) == (KERNEL_A, 1, 32, args, 0x77)
    assert gpu.log == []  # nothing went to the raw driver call


def test_a_packing_mismatch_falls_back_with_its_reason(gpu):
    def mismatch(handle, sizes):
        raise _driver.AbiMismatch("parameter 3 is 4 bytes, packed 8")

    gpu.driver.check_abi = mismatch
    prepared = PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))
    assert not prepared.raw and prepared.fallback_reason == "AbiMismatch: parameter 3 is 4 bytes, packed 8"


def test_a_raw_launch_goes_to_the_driver_with_the_packed_parameters(gpu):
    args = args_for(0x10000)
    prepared = PreparedLaunch(KERNEL_A, SIG, 4, 128, args)
    assert prepared.raw and prepared._func is gpu.handle(KERNEL_A, SIG) and prepared.packed[1] == -5
    prepared.launch(stream=0x77)
    assert gpu.log == [("raw", int(gpu.handle(KERNEL_A, SIG)), 4, 128, 0x77, expected_values(args))]


# --- the driver call ---------------------------------------------------------------


def test_a_driver_is_ready_once_and_finds_the_compiled_loops_function(monkeypatch):
    pytest.importorskip("cuda.bindings.driver")
    driver = _driver.Driver(raw=True)
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
    driver.select(FakeHandle(3), load=lambda: fn)
    assert driver.ready and driver.native == ctypes.cast(fn, ctypes.c_void_p).value
    driver.select(FakeHandle(3), load=lambda: None)  # once: a later call changes nothing
    assert driver.native == ctypes.cast(fn, ctypes.c_void_p).value
    monkeypatch.setattr(_driver, "DRIVER_CALLS", "python")
    python_loop = _driver.Driver(raw=True)
    python_loop.select(FakeHandle(3), load=lambda: fn)
    assert python_loop.native is None  # every launch is one cuda-bindings call


def test_the_bindings_route_launches_through_cuda_bindings_and_reports_errors(monkeypatch):
    cu = pytest.importorskip("cuda.bindings.driver")
    calls, result = [], [cu.CUresult.CUDA_SUCCESS]
    monkeypatch.setattr(cu, "cuLaunchKernel", lambda *a: calls.append(a) or (result[0],))
    driver = _driver.Driver(raw=True)
    driver.select(FakeHandle(3))
    driver.launch("func", 2, 64, 9, 0x5000)
    ((func, *shape, stream, params, extra),) = calls
    assert (func, shape, int(stream), params, extra) == ("func", [2, 1, 1, 64, 1, 1, 0], 9, 0x5000, 0)
    result[0] = cu.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE"):
        driver.launch("func", 2, 64, 9, 0x5000)


def test_a_library_kernel_handle_becomes_the_context_function(monkeypatch):
    cu = pytest.importorskip("cuda.bindings.driver")
    function = cu.CUfunction(0x77)
    monkeypatch.setattr(cu, "cuKernelGetFunction", lambda handle: (cu.CUresult.CUDA_SUCCESS, function))
    kernel = cu.CUkernel(0x55)
    assert _driver._context_function(kernel) is function
    monkeypatch.setattr(cu, "cuKernelGetFunction", lambda handle: (cu.CUresult.CUDA_ERROR_NOT_INITIALIZED, None))
    assert _driver._context_function(kernel) is kernel  # the driver cannot: the kernel handle launches
    other = FakeHandle(3)
    assert _driver._context_function(other) is other  # not a CUkernel: left as it is
