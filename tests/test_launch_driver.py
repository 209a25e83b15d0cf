"""The driver side of raw launches on the CPU: the kernel handle (``_compile.function_handle``),
its fallback, and the choice of the ``cuLaunchKernel`` route (``_driver``), with fakes."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys

import pytest
from launch_fakes import KERNEL_A, SIG, FakeHandle, args_for, expected_values, gpu  # noqa: F401

from kvcanary_numba.launch import _common, _compile, _driver
from kvcanary_numba.launch.prepared import PreparedLaunch


# --- the kernel handle -----------------------------------------------------------


def test_the_handle_path_exists_in_the_installed_numba_cuda():
    # Every attribute function_handle reads, on the real (not simulated) classes: an upgrade
    # that renames one fails here on a CPU instead of silently slowing every launch on a GPU.
    script = ("from numba.cuda.dispatcher import _Kernel\n"
              "from numba.cuda.codegen import CUDACodeLibrary\n"
              "from numba.cuda.cudadrv.driver import CudaPythonFunction\n"
              "from cuda.core import Kernel\n"
              "assert isinstance(_Kernel.library, property)\n"
              "assert callable(CUDACodeLibrary.get_cufunc)\n"
              "assert 'kernel' in CudaPythonFunction.__slots__\n"
              "assert hasattr(Kernel, 'handle')\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="0"))  # fmt: skip
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
    monkeypatch.setattr(_compile, "compile_kernel", lambda kernel, signature: compiled)
    assert int(_compile.function_handle(KERNEL_A, SIG)) == 0xAB


def test_a_missing_attribute_logs_once_and_takes_numbas_launch(gpu, caplog):
    # The real function_handle over compiled kernels without ``library`` (a renamed attribute).
    gpu.monkeypatch.setattr(_common, "function_handle", _compile.function_handle)
    gpu.monkeypatch.setattr(_compile, "compile_kernel", gpu.compile)
    with caplog.at_level(logging.WARNING, logger="kvcanary_numba.launch"):
        assert _compile.function_handle(KERNEL_A, SIG) is None
        assert _compile.function_handle(KERNEL_A, SIG) is None
    assert len([r for r in caplog.records if "no driver handle" in r.getMessage()]) == 1
    prepared = PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))
    assert not prepared.raw and "no driver handle" in prepared.fallback_reason
    args = args_for(0x20000)
    _common.launch(KERNEL_A, SIG, 2, 32, args)  # the ordinary path: Numba's launch, same arguments
    assert gpu.log == [("numba", args, 2, 32, "core:0")]


def test_a_packing_mismatch_falls_back_with_its_reason(gpu):
    def mismatch(handle, sizes):
        raise _driver.AbiMismatch("parameter 3 is 4 bytes, packed 8")

    gpu.driver.check_abi = mismatch
    prepared = PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))
    assert not prepared.raw and prepared.fallback_reason == "AbiMismatch: parameter 3 is 4 bytes, packed 8"


def test_a_raw_launch_passes_pointer_objects_to_libcuda(gpu):
    args = args_for(0x10000)
    prepared = PreparedLaunch(KERNEL_A, SIG, 4, 128, args)
    assert prepared.raw and isinstance(prepared._func, ctypes.c_void_p) and prepared.packed[1] == -5
    prepared.launch(stream=0x77)
    assert gpu.log == [("raw", int(gpu.handle(KERNEL_A, SIG)), 4, 128, 0x77, expected_values(args))]


# --- the route -------------------------------------------------------------------


def _lib():
    return lambda *args: 0


@pytest.mark.parametrize("preference, load, handle, route", [
    ("auto", _lib, FakeHandle(5), "ctypes"),
    ("auto", lambda: None, FakeHandle(5), "bindings"),  # libcuda did not load
    ("auto", _lib, object(), "bindings"),  # a handle that is no int
    ("ctypes", lambda: None, FakeHandle(5), "bindings"),  # forced, cannot: bindings, with a warning
    ("bindings", _lib, FakeHandle(5), "bindings"),
])  # fmt: skip
def test_route_choice(preference, load, handle, route):
    assert _driver.choose_route(preference, load, handle)[0] == route


def test_the_route_is_chosen_once_and_sets_the_launch_call():
    driver = _driver._Driver()
    with pytest.raises(RuntimeError, match="no launch route"):
        driver.launch(1, 1, 1, 0, 0)
    calls = []
    assert driver.select(FakeHandle(3), "auto", load=lambda: lambda *a: calls.append(a) or 0) == "ctypes"
    assert driver.select(object(), "bindings") == "ctypes"  # chosen once, for every launch
    driver.launch(driver.func_arg(FakeHandle(3)), 2, 64, 9, driver.params_arg(0x5000))
    driver.launch(driver.func_arg(FakeHandle(3)), 2, 64, 9, driver.params_arg(0x5000))
    (func, *shape, stream, params, extra), again = calls
    assert (func.value, shape, stream.value, params.value, extra) == (3, [2, 1, 1, 64, 1, 1, 0], 9, 0x5000, None)
    assert again[8] is stream  # one stream object per handle, built once
    with pytest.raises(RuntimeError, match="LAUNCH_ROUTE must be"):
        _driver.choose_route("fast", lambda: None, FakeHandle(3))


def test_a_failed_ctypes_launch_raises_with_the_error_code():
    driver = _driver._Driver()
    driver.select(FakeHandle(3), "ctypes", load=lambda: lambda *a: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE"):
        driver.launch(driver.func_arg(FakeHandle(3)), 1, 32, 0, driver.params_arg(0x5000))


def test_the_bindings_route_when_chosen():
    driver = _driver._Driver()
    assert driver.select(FakeHandle(3), "bindings") == "bindings"
    handle = FakeHandle(3)
    assert driver.func_arg(handle) is handle and driver.params_arg(0x5000) == 0x5000
    assert driver.launch == driver._launch_bindings


def test_the_bindings_route_launches_through_cuda_bindings_and_reports_errors(monkeypatch):
    cu = pytest.importorskip("cuda.bindings.driver")
    calls, result = [], [cu.CUresult.CUDA_SUCCESS]
    monkeypatch.setattr(cu, "cuLaunchKernel", lambda *a: calls.append(a) or (result[0],))
    driver = _driver._Driver()
    driver.select(FakeHandle(3), "bindings")
    driver.launch("func", 2, 64, 9, 0x5000)
    (func, *shape, stream, params, extra), = calls
    assert (func, shape, int(stream), params, extra) == ("func", [2, 1, 1, 64, 1, 1, 0], 9, 0x5000, 0)
    result[0] = cu.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE"):
        driver.launch("func", 2, 64, 9, 0x5000)


def test_a_library_kernel_handle_becomes_the_context_function(monkeypatch):
    cu = pytest.importorskip("cuda.bindings.driver")
    function = cu.CUfunction(0x77)
    monkeypatch.setattr(cu, "cuKernelGetFunction", lambda handle: (cu.CUresult.CUDA_SUCCESS, function))
    kernel = cu.CUkernel(0x55)
    assert _compile.context_function(kernel) is function
    monkeypatch.setattr(cu, "cuKernelGetFunction", lambda handle: (cu.CUresult.CUDA_ERROR_NOT_INITIALIZED, None))
    assert _compile.context_function(kernel) is kernel  # the driver cannot: the kernel handle launches
    other = FakeHandle(3)
    assert _compile.context_function(other) is other  # not a CUkernel: left as it is
