"""Launch tables (``fast/table.py``) and the compiled launch loop (``fast/native.py``) on the CPU:
the compiled loop calls a ctypes callback in place of libcuda's ``cuLaunchKernel``, which decodes
every parameter buffer it is given, so what it launches is compared with the Python loop's launches."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from launch_fakes import CU_LAUNCH_KERNEL, KERNEL_A, KERNEL_B, SIG, CaiArray, args_for, expected_values, gpu  # noqa: F401

from kvcanary_numba.fast import driver as _driver, native as _native, replay as _kernel_launch
from kvcanary_numba.fast.memo import Entry
from kvcanary_numba.fast.prepared import PreparedLaunch
from kvcanary_numba.fast.table import LaunchTable
from kvcanary_numba.launch import _launch
from kvcanary_numba.launch._launch import LaunchSpec


def _two_launches():
    return [
        PreparedLaunch(KERNEL_A, SIG, 4, 128, args_for(0x10000)),
        PreparedLaunch(KERNEL_B, SIG, 2, 64, args_for(0x30000, scalar=7)),
    ]


def test_the_compiled_loop_launches_what_the_python_loop_launches(gpu):
    python = LaunchTable(_two_launches())
    assert not python.compiled  # no C cuLaunchKernel yet: each launch's own route
    python.launch(0x77)
    by_python = list(gpu.log)
    gpu.log.clear()
    lib = gpu.native()
    compiled = LaunchTable(_two_launches())
    assert compiled.compiled and len(compiled) == 2 and compiled.table.dtype == np.int64
    compiled.launch(0x77)
    assert lib.calls == 2 and gpu.log == by_python
    assert [entry[2:5] for entry in gpu.log] == [(4, 128, 0x77), (2, 64, 0x77)]
    assert gpu.log[1][5] == expected_values(args_for(0x30000, scalar=7))


def test_a_rebound_argument_is_launched_by_the_table(gpu):
    gpu.native()
    launches = _two_launches()
    table = LaunchTable(launches)
    moved = CaiArray((5,), "<i8", 0x90000)
    launches[1].rebind(0, moved)  # the table keeps the parameter array, whose values change
    table.launch(5)
    assert gpu.log[1][5] == expected_values((moved, 7, *args_for(0x30000)[2:]))


def test_a_tabled_launch_refuses_a_refill(gpu):
    gpu.native()
    launches = _two_launches()
    untabled = PreparedLaunch(KERNEL_A, SIG, 4, 128, args_for(0x10000))
    LaunchTable(launches)
    spec = LaunchSpec(KERNEL_A, SIG, 8, 32, args_for(0x50000))
    with pytest.raises(RuntimeError, match="launch table holds it"):
        launches[0].refill(spec)
    assert launches[0].grid == 4  # unchanged
    untabled.refill(spec)  # one no table copied: refilled as before
    assert untabled.grid == 8


def test_a_driver_error_stops_the_table_at_that_launch(gpu):
    lib = gpu.native()
    launches = _two_launches() + [PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x70000))]
    table = LaunchTable(launches)
    lib.fail[1] = 1  # CUDA_ERROR_INVALID_VALUE at the second launch
    with pytest.raises(RuntimeError, match=r"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE \(grid 2, block 64\)"):
        table.launch(3)
    assert lib.calls == 2 and [entry[2] for entry in gpu.log] == [4]  # the first ran, the third not


def test_tables_that_cannot_be_compiled_loop_in_python(gpu, monkeypatch):
    gpu.native()
    fallback = PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))
    fallback.raw = False  # e.g. preparing failed: the core's launch
    assert not LaunchTable([fallback, *_two_launches()]).compiled
    assert not LaunchTable([]).compiled
    monkeypatch.setattr(_native, "compiled_launcher", lambda: None)  # Numba could not compile the loop
    table = LaunchTable(_two_launches())
    assert not table.compiled
    table.launch(9)
    assert [entry[4] for entry in gpu.log] == [9, 9]


def test_a_replayed_public_call_runs_its_launches_through_a_table(gpu):
    lib = gpu.native()
    entry, runs = Entry("cuda"), []

    def run(stream, **kwargs):
        runs.append(kwargs)
        _launch.launch(KERNEL_A, SIG, 1, 32, args_for(0x10000), stream)
        _launch.launch(KERNEL_B, SIG, 3, 64, args_for(0x18000), stream)

    entry.hits = 1
    _kernel_launch.run_launches(entry, run, {}, 7)  # packed while launched (each launch on its own)
    assert isinstance(entry.launches, LaunchTable) and entry.launches.compiled and lib.calls == 0
    gpu.log.clear()
    _kernel_launch.run_launches(entry, run, {}, 7)  # replayed: the compiled loop, the glue does not run
    assert lib.calls == 2 and len(runs) == 1
    assert [(e[2], e[3], e[4], e[5]) for e in gpu.log] == [
        (1, 32, 7, expected_values(args_for(0x10000))),
        (3, 64, 7, expected_values(args_for(0x18000))),
    ]


def test_the_loop_switch_and_the_native_address():
    lib = ctypes.CDLL(None).strlen  # any C function of the process: a foreign function with an address
    assert _driver.native_address(lib) == ctypes.cast(lib, ctypes.c_void_p).value
    assert _driver.native_address(None) is None and _driver.native_address(lambda *a: 0) is None
    driver = _driver.Driver(raw=True)
    driver.select(object(), load=lambda: lib)
    assert driver.native == _driver.native_address(lib)


@pytest.mark.parametrize("loop, native", [("python", False), ("sideways", None)])
def test_the_loop_switch_is_read_at_selection(monkeypatch, loop, native):
    pytest.importorskip("cuda.bindings.driver")
    monkeypatch.setattr(_driver, "DRIVER_CALLS", loop)
    driver = _driver.Driver(raw=True)
    lib = ctypes.CDLL(None).strlen
    if native is None:
        with pytest.raises(RuntimeError, match="DRIVER_CALLS must be"):
            driver.select(object(), load=lambda: lib)
    else:
        driver.select(object(), load=lambda: lib)
        assert driver.native is None


def test_the_compiled_loop_passes_the_c_arguments_in_order():
    calls = []

    def record(*args):
        calls.append(args)
        return 0 if len(calls) < 3 else 700  # CUDA_ERROR_ILLEGAL_ADDRESS at the third

    c_function = CU_LAUNCH_KERNEL(record)
    address = ctypes.cast(c_function, ctypes.c_void_p).value
    table = np.array(
        [[0x7F00_0000_1000 + i, 5 + i, 96, 0x7F00_0000_9000 + 8 * i, 0x7F00_0000_7000 * (i % 2)] for i in range(4)],
        dtype=np.int64,
    )
    status = _native.compiled_launcher()(address, table, 0x7F00_DEAD_BEEF)
    assert _native.decode_status(status) == (2, 700)
    assert calls == [
        (
            0x7F00_0000_1000 + i,
            5 + i,
            1,
            1,
            96,
            1,
            1,
            0,
            0x7F00_DEAD_BEEF,
            0x7F00_0000_9000 + 8 * i,
            0x7F00_0000_7000 * (i % 2),
        )
        for i in range(3)
    ]
    calls.clear()
    assert _native.compiled_launcher()(address, table[:2], 1) == 0 and len(calls) == 2
    with pytest.raises(RuntimeError, match="5 columns"):
        _native.compiled_launcher()(address, np.ascontiguousarray(table[:, :4]), 1)
    assert len(calls) == 2  # nothing launched


# --- one-buffer parameters (cuLaunchKernel's extra) -------------------------------------------------------


def test_pack_buffer_lays_parameters_out_at_their_alignment():
    from numba.core import types

    from kvcanary_numba.fast.prepared import pack_buffer

    a1, a2 = types.Array(types.int64, 1, "C"), types.Array(types.int32, 2, "C")
    argtypes = [a1, types.int32, a2, types.boolean, types.int64, types.UniTuple(types.int32, 3)]
    args = [CaiArray((5,), "<i8", 0x1000), -7, CaiArray((2, 3), "<i4", 0x2000), True, 2**40, (1, 2, 3)]
    buffer, size, offsets, slots, starts = pack_buffer(argtypes, args)
    assert offsets[:8] == [0, 8, 16, 24, 32, 40, 48, 56]  # array 1 (7 words), then the int32
    assert offsets[8] == 64 and offsets[17] == 136 and offsets[18] == 144  # array 2 realigned; bool; int64
    assert offsets[19:] == [152, 156, 160] and size == 164 and starts == [0, 7, 8, 17, 18, 19]
    raw = bytes(buffer)
    assert int.from_bytes(raw[56:60], "little", signed=True) == -7 and raw[136] == 1
    assert int.from_bytes(raw[144:152], "little") == 2**40 and int.from_bytes(raw[32:40], "little") == 0x1000
    slots[7].value = 99  # a slot is a view of its bytes in the block
    assert int.from_bytes(bytes(buffer)[56:60], "little") == 99


def test_a_launch_gets_the_one_buffer_form_only_when_the_driver_reports_our_layout(gpu):
    assert PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))._extra is None  # the driver cannot tell
    gpu.report_offsets()
    assert PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))._extra is not None
    gpu.driver.check_abi = lambda handle, sizes: [16 * i for i in range(len(sizes))]  # another layout
    assert PreparedLaunch(KERNEL_A, SIG, 1, 32, args_for(0x10000))._extra is None


@pytest.mark.parametrize("buffers", [False, True], ids=["kernelParams", "one buffer"])
def test_one_buffer_tables_launch_the_same_parameters(gpu, monkeypatch, buffers):
    monkeypatch.setattr(_driver, "PARAM_BUFFER", buffers)
    gpu.native()
    gpu.report_offsets()
    launches = _two_launches()
    table = LaunchTable(launches)
    moved = CaiArray((5,), "<i8", 0x90000)
    launches[1].rebind(0, moved)  # after tabling: the block is what the pointers lead to, rewritten in place
    table.launch(0x77)
    assert gpu.lib.buffers == (2 if buffers else 0)
    assert [entry[2:5] for entry in gpu.log] == [(4, 128, 0x77), (2, 64, 0x77)]
    assert gpu.log[0][5] == expected_values(args_for(0x10000))
    assert gpu.log[1][5] == expected_values((moved, 7, *args_for(0x30000)[2:]))
