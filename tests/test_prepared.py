"""Prepared launches (``fast/prepared.py``): parameter packing, the launch recorder, prepared launches.

On a CPU the packed parameter layout is checked against the sm_90 PTX of the
kernels (compiled without a GPU, in a subprocess), the recorder against the
launch glue, and prepared launches against the ordinary launch path under the
simulator. The monitor's prepared steps and the GPU runs
are in test_prepared_fastpath.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from launch_fakes import KERNEL_A, KERNEL_B, SIG, args_for, expected_values, gpu  # noqa: F401

from kvcanary_numba import RealKvHashMode, RealKvSource, compute_real_kv_hash
from kvcanary_numba.fast.prepared import PreparedLaunch, pack_buffer
from kvcanary_numba.fast.recording import recording
from kvcanary_numba.launch import _launch as _common
from kvcanary_numba.launch._launch import LaunchSpec, View

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIMULATED = _common.ON_SIMULATOR


class CaiArray:
    """Just a ``__cuda_array_interface__`` (never launched): for layout arithmetic."""

    def __init__(self, shape, typestr, ptr, strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


# --- parameter packing (no GPU, no simulator needed) ---------------------------------

_PTX_SCRIPT = r"""
import importlib, json, re, sys
from types import SimpleNamespace
import numba.cuda.dispatcher as dispatcher
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
from numba import cuda
out = {}
for spec in sys.argv[1:]:
    module_name, name = spec.split(":")
    package = "kvcanary_numba.fast.kernels." if module_name in ("endpoints", "scatter_lens") else "kvcanary_numba.kernels."
    module = importlib.import_module(package + module_name)
    ptx, _ = cuda.compile_ptx(module.KERNELS[name].py_func, module.SIGNATURES[name][0], cc=(9, 0))
    entry = re.search(r"\.entry\s+[^(]+\((.*?)\)", ptx, re.S).group(1)
    out[spec] = re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\s", entry)
print(json.dumps(out))
"""
_PTX_KERNELS = (
    "verify:verify_tok1_src2",
    "write:write_assert1_src1",
    "plan:plan_offsets",
    "plan:plan_entries",
    "scatter:scatter",
    "scatter_lens:scatter_lens",
    "fingerprint:fingerprint_src1",
    "endpoints:verify_endpoints_tok1_src2",
    "endpoints:write_endpoints_assert1_src1",
)


@pytest.fixture(scope="module")
def ptx_params() -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run(
        [sys.executable, "-c", _PTX_SCRIPT, *_PTX_KERNELS],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("spec", _PTX_KERNELS)
def test_packed_slots_match_the_kernel_parameters_of_the_sm90_build(spec, ptx_params):
    import importlib

    module_name, name = spec.split(":")
    package = (
        "kvcanary_numba.fast.kernels" if module_name in ("endpoints", "scatter_lens") else "kvcanary_numba.kernels"
    )
    module = importlib.import_module(f"{package}.{module_name}")
    types = _common._declared_types(module.SIGNATURES[name][0])

    def fake(t):  # an argument of type t (tuples of arrays too: the endpoint kernels' contexts)
        if hasattr(t, "ndim"):
            return CaiArray((3,) * t.ndim, np.dtype(str(t.dtype)).str, 4096)
        return tuple(fake(member) for member in t) if hasattr(t, "__len__") else 7

    args = [fake(t) for t in types]
    _, _, _, slots, starts = pack_buffer(types, args)
    widths = [ctypes.sizeof(s) * 8 for s in slots]
    assert widths == [int(bits) for _, bits in ptx_params[spec]]
    assert starts[0] == 0 and len(starts) == len(types)


def test_array_slots_follow_numbas_abi():
    from numba.core import types

    a2 = types.Array(types.int64, 2, "C")
    strided = CaiArray((4, 3), "<i8", 0x1000, strides=(64, 8))  # rows of a wider table
    _, _, _, slots, starts = pack_buffer(
        [a2, types.int32, a2, types.UniTuple(types.int64, 2)], [CaiArray((4, 3), "<i8", 0x2000), -5, strided, (11, 12)]
    )
    values = [s.value or 0 for s in slots]
    assert starts == [0, 9, 10, 19]
    assert values[:9] == [0, 0, 12, 8, 0x2000, 4, 3, 24, 8]  # meminfo, parent, nitems, itemsize, data, shape, strides
    assert values[9] == -5 and isinstance(slots[9], ctypes.c_int32)
    assert values[10:19] == [0, 0, 12, 8, 0x1000, 4, 3, 64, 8]
    assert values[19:] == [11, 12]


def test_refill_repacks_every_argument_as_a_fresh_pack_would(gpu):
    # The eager path refills one packed launch per kernel; its packing logic needs no GPU.
    launch = PreparedLaunch.from_spec(LaunchSpec(KERNEL_A, SIG, 1, 32, args_for(0x2000)))
    for args in (args_for(0x2000, scalar=9), args_for(0x4000, n=3, scalar=9), args_for(0x4000, n=3)):
        launch.refill(LaunchSpec(KERNEL_A, SIG, 3, 64, args))
        assert [s.value or 0 for s in launch._slots] == expected_values(args)
        assert (launch.grid, launch.block) == (3, 64) and launch.args == list(args)
        assert launch.packed == [_common.array_layout(args[0]), args[1], _common.array_layout(args[2]), args[3]]


def test_a_tuple_of_arrays_is_packed_and_remembered_as_layouts(gpu):
    # The endpoint kernels take per-endpoint arrays in tuples: packed flat, remembered as layouts
    # (no array object kept), re-packed by refill and compared by stale_arguments like any argument.
    sig = "void(UniTuple(int64[::1], 2), int64)"
    pair = (CaiArray((4,), "<i8", 0x2000), CaiArray((6,), "<i8", 0x3000))
    launch = PreparedLaunch.from_spec(LaunchSpec(KERNEL_A, sig, 2, 32, (pair, 5)))
    assert launch.packed == [tuple(_common.array_layout(a) for a in pair), 5]
    moved = (pair[0], CaiArray((6,), "<i8", 0x5000))
    assert launch.stale_arguments(LaunchSpec(KERNEL_A, sig, 2, 32, (moved, 5)))[0].startswith("argument 0:")
    launch.refill(LaunchSpec(KERNEL_A, sig, 2, 32, (moved, 5)))
    values = [s.value or 0 for s in launch._slots]
    assert values[4] == 0x2000 and values[11] == 0x5000 and values[14] == 5
    assert launch.stale_arguments(LaunchSpec(KERNEL_A, sig, 2, 32, (moved, 5))) == []


def test_stale_arguments_name_what_a_spec_would_launch_differently(gpu):
    launch = PreparedLaunch.from_spec(LaunchSpec(KERNEL_A, SIG, 1, 32, args_for(0x2000)))
    launch.release()
    assert launch.args == [] and launch.stale_arguments(LaunchSpec(KERNEL_A, SIG, 1, 32, args_for(0x2000))) == []
    stale = launch.stale_arguments(LaunchSpec(KERNEL_A, SIG, 2, 32, args_for(0x2000, n=4, scalar=3)))
    assert stale[0] == "grid 2 instead of 1" and stale[1].startswith("argument 0: (8192, (4,)")
    assert stale[2] == "argument 1: 3 instead of -5" and len(stale) == 3
    assert launch.stale_arguments(LaunchSpec(KERNEL_B, SIG, 1, 32, args_for(0x2000))) != []


def test_a_spec_is_immutable_and_names_its_per_call_arguments():
    spec = LaunchSpec(
        KERNEL_A,
        SIG,
        1,
        32,
        (
            1,
            _common.kernel_array(CaiArray((3,), "<i8", 0x10)),
            _common.kernel_array(CaiArray((3,), "<i8", 0x20), persistent=True),
        ),
    )
    with pytest.raises(AttributeError):
        spec.grid = 2
    assert spec.transient_arguments() == [1] and LaunchSpec(KERNEL_A, SIG, 1, 32, ()).transient_arguments() == []


def test_layouts_of_views_are_computed_without_building_them():
    i8, u8, b = np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.uint8)
    ids = CaiArray((5,), "<i8", 0x3000)
    assert _common.array_layout(ids) == (0x3000, (5,), (8,), i8)
    assert _common.kernel_array(ids).layout() == (0x3000, (5,), (8,), i8)
    assert _common.reinterpret(ids, np.uint64).layout() == (0x3000, (5,), (8,), u8)
    buf = CaiArray((4, 32), "|u1", 0x4000)
    assert _common.array_layout(buf) == (0x4000, (4, 32), (32, 1), b)
    assert _common.reinterpret(buf, np.int64).layout() == (0x4000, (16,), (8,), i8)
    assert _common.reinterpret(buf, np.int64, (4, 4)).layout() == (0x4000, (4, 4), (32, 8), i8)
    rows = CaiArray((3, 32), "|u1", 0x5000, strides=(96, 1))  # every third row of a wider pool
    assert _common.byte_span(rows, np.uint64).layout() == (0x5000, (28,), (8,), u8)  # (2 * 96 + 32) // 8 words
    assert _common.array_layout(_common.byte_span(rows, np.uint64)) == (0x5000, (28,), (8,), u8)
    moved = _common.reinterpret(buf, np.int64, (4, 4), persistent=True).on(CaiArray((4, 32), "|u1", 0x9000))
    assert moved.layout()[0] == 0x9000 and moved.persistent


# --- recording and prepared launches (simulator or GPU) ----------------------------


def _sources(n_slots: int = 64, row: int = 32):
    data = (np.arange(n_slots * row, dtype=np.int64) * 37 % 251).astype(np.uint8).reshape(n_slots, row)
    return (RealKvSource(tensor=data, page_size=1, num_bytes_per_token=row, read_bytes=row),)


def _fingerprint_inputs(xp, slots):
    sources = tuple(
        RealKvSource(tensor=xp.asarray(s.tensor), page_size=1, num_bytes_per_token=32, read_bytes=32)
        for s in _sources()
    )
    return sources, xp.asarray(np.asarray(slots, dtype=np.int64)), xp.zeros(len(slots), dtype=np.int64)


def _xp():
    if SIMULATED:
        return np
    import cupy

    return cupy


def _host(x):
    return x if isinstance(x, np.ndarray) else x.get()


@pytest.mark.simulator
def test_recording_launches_nothing_and_restores_the_glue():
    xp = _xp()
    sources, slots, out = _fingerprint_inputs(xp, [1, 2, 3])
    originals = {name: getattr(_common, name) for name in ("launch", "kernel_array", "reinterpret", "byte_span")}
    assert not _common.sink_active()
    with recording() as rec:
        assert _common.sink_active()
        compute_real_kv_hash(
            real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=slots, out=out, backend="cuda"
        )
    assert not _host(out).any()  # nothing ran
    assert {name: getattr(_common, name) for name in originals} == originals
    (launch,) = rec.launches
    assert launch.signature.startswith("void(int64[::1], int64[::1]")
    assert launch.args[0].source is slots and launch.args[0].builder == "array"
    assert launch.args[1].source is out and not launch.args[1].persistent  # per call
    assert launch.args[3].source is sources[0].tensor and launch.args[3].builder == "span"
    assert launch.args[3].persistent  # a KV source: long-lived
    with pytest.raises(ZeroDivisionError), recording():
        1 / 0  # noqa: B018
    assert _common.launch is originals["launch"] and not _common.sink_active()


@pytest.mark.simulator
def test_recording_refuses_a_tuple_holding_a_view_of_a_per_call_array():
    # A tuple argument has no origin: no role could rebind a per-call view inside it.
    xp = _xp()
    kept, per_call = xp.zeros(3, dtype=np.int64), xp.zeros(3, dtype=np.int64)
    sig = "void(UniTuple(int64[::1], 2))"
    with recording() as rec:
        _common.launch(KERNEL_A, sig, 1, 32, (_common.persistent_views(kept, kept),))
    assert rec.launches[0].transient_arguments() == []
    with pytest.raises(RuntimeError, match="tuple argument .* per-call"), recording():
        _common.launch(
            KERNEL_A, sig, 1, 32, ((_common.kernel_array(kept, persistent=True), _common.kernel_array(per_call)),)
        )


@pytest.mark.simulator
def test_recording_leaves_other_threads_launches_alone():
    import threading

    xp = _xp()
    sources, slots, out = _fingerprint_inputs(xp, [1, 2])
    _, other_slots, other_out = _fingerprint_inputs(xp, [3, 4])
    kwargs = dict(real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode.ALL, backend="cuda")
    with recording() as rec:
        worker = threading.Thread(
            target=lambda: compute_real_kv_hash(slot_indices=other_slots, out=other_out, **kwargs)
        )
        worker.start()
        worker.join()
        compute_real_kv_hash(slot_indices=slots, out=out, **kwargs)
    assert _host(other_out).all() and not _host(out).any()  # the worker's launch ran, ours was recorded
    assert len(rec.launches) == 1 and rec.launches[0].args[0].source is slots


@pytest.mark.simulator
def test_prepared_launch_matches_the_ordinary_launch_and_follows_rebinding():
    xp = _xp()
    sources, slots, out = _fingerprint_inputs(xp, [1, 5, 63, 0, 64])
    kwargs = dict(real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode.ALL)
    expected = xp.zeros(5, dtype=np.int64)
    compute_real_kv_hash(slot_indices=slots, out=expected, backend="cuda", **kwargs)
    with recording() as rec:
        compute_real_kv_hash(slot_indices=slots, out=out, backend="cuda", **kwargs)
    (record,) = rec.launches
    prepared = PreparedLaunch.from_spec(record)
    assert prepared.raw == (not SIMULATED), prepared.fallback_reason
    prepared.launch()
    np.testing.assert_array_equal(_host(out), _host(expected))
    assert _host(out)[4] == 0 and _host(out)[0] != 0  # slot 64 is past the source: 0, as documented

    # New per-step arrays of the same length: only their slots are re-packed.
    new_slots, new_out = xp.asarray(np.array([2, 3, 4, 6, 7], dtype=np.int64)), xp.zeros(5, dtype=np.int64)
    prepared.rebind(0, new_slots, record.args[0])
    prepared.rebind(1, new_out, record.args[1])
    prepared.launch()
    compute_real_kv_hash(slot_indices=new_slots, out=expected, backend="cuda", **kwargs)
    np.testing.assert_array_equal(_host(new_out), _host(expected))
    assert len(set(_host(new_out).tolist())) == 5


@pytest.mark.gpu
def test_gpu_ordinary_launches_refill_one_raw_launch_per_kernel():
    # Every public call on a GPU refills a cached raw launch: new arrays, grids and scalars each time.
    import cupy

    from kvcanary_numba.fast.driver import driver

    slot_lists = [[1, 5, 63, 0, 64], [2, 3], list(range(70)) * 40]  # 2800 slots: a grid of several blocks
    for mode in (RealKvHashMode.ALL, RealKvHashMode.PARTIAL, RealKvHashMode.ALL):  # read_words changes
        for slots in slot_lists:
            host_slots = np.asarray(slots, dtype=np.int64)
            want, got = np.zeros(len(slots), dtype=np.int64), cupy.zeros(len(slots), dtype=np.int64)
            compute_real_kv_hash(
                real_kv_sources=_sources(), real_kv_hash_mode=mode, slot_indices=host_slots, out=want, backend="numpy"
            )
            sources, device_slots, _ = _fingerprint_inputs(cupy, slots)
            compute_real_kv_hash(
                real_kv_sources=sources, real_kv_hash_mode=mode, slot_indices=device_slots, out=got, backend="cuda"
            )
            np.testing.assert_array_equal(got.get(), want, err_msg=f"{mode.name} {len(slots)} slots")
    cached = [p for p in driver.eager.by_kernel.values() if p.kernel.py_func.__name__ == "fingerprint_src1"]
    assert len(cached) == 1 and cached[0].raw, [p.fallback_reason for p in cached]


@pytest.mark.gpu
def test_gpu_views_materialize_with_the_layout_they_describe():
    # The core launch builds a Numba view from a View's layout; the packer reads the layout itself.
    import cupy

    pool = cupy.zeros((6, 48), dtype=np.uint8)[::2]  # rows 96 bytes apart
    views = [
        _common.kernel_array(cupy.arange(5)),
        _common.reinterpret(cupy.zeros((4, 32), np.uint8), np.int64, (4, 4)),
        _common.byte_span(pool, np.uint64),
        _common.kernel_array(pool),
    ]
    for view in views:
        cai = view.materialize().__cuda_array_interface__
        ptr, shape, strides, dtype = _common.array_layout(view)
        assert (ptr, shape, dtype.str) == (cai["data"][0], tuple(cai["shape"]), cai["typestr"])
        assert strides == (tuple(cai["strides"]) if cai["strides"] else np.empty(shape, dtype).strides)
    assert _common.array_layout(views[3])[2] == (96, 1)


def _dummy_argument(numba_type, cupy):
    """A dummy of ``numba_type``: a tiny CuPy array, a tuple of dummies (the endpoint kernels take
    tuples of arrays and tuples of tuples), or 0."""
    if hasattr(numba_type, "ndim"):
        return _common.kernel_array(cupy.zeros((2,) * numba_type.ndim, dtype=str(numba_type.dtype)))
    if hasattr(numba_type, "types"):
        return tuple(_dummy_argument(item, cupy) for item in numba_type.types)
    return 0


@pytest.mark.gpu
def test_gpu_every_declared_signature_gets_a_raw_launch():
    # Handle, packing and the driver's parameter sizes agree for every kernel variant the package
    # declares: none takes Numba's launch (built, not launched: the arrays are dummies).
    import importlib

    import cupy

    from kvcanary_numba.fast import driver as _driver

    fallbacks, count = [], 0
    paths = [("kvcanary_numba.kernels", p) for p in sorted((ROOT / "kvcanary_numba" / "kernels").glob("*.py"))]
    paths += [("kvcanary_numba.fast.kernels", p) for p in sorted((ROOT / "kvcanary_numba/fast/kernels").glob("*.py"))]
    for package, path in paths:
        module = importlib.import_module(f"{package}.{path.stem}")
        for name, signatures in getattr(module, "SIGNATURES", {}).items():
            for signature in signatures:
                args = [_dummy_argument(t, cupy) for t in _common._declared_types(signature)]
                launch = PreparedLaunch(module.KERNELS[name], signature, 1, 32, args)
                count += 1
                if not launch.raw:
                    fallbacks.append((name, signature, launch.fallback_reason))
    assert count > 20 and fallbacks == []
    assert _driver.driver.ready


@pytest.mark.gpu
@pytest.mark.parametrize("calls", ["compiled", "python"])
def test_gpu_a_recorded_launch_runs_through_the_driver_and_a_table(monkeypatch, calls):
    import cupy

    from kvcanary_numba.fast import driver as _driver
    from kvcanary_numba.fast.table import LaunchTable

    slots = [1, 5, 63, 0, 64, 7]
    want = np.zeros(len(slots), dtype=np.int64)
    compute_real_kv_hash(
        real_kv_sources=_sources(),
        real_kv_hash_mode=RealKvHashMode.ALL,
        slot_indices=np.asarray(slots, dtype=np.int64),
        out=want,
        backend="numpy",
    )
    sources, device_slots, out = _fingerprint_inputs(cupy, slots)
    with recording() as rec:
        compute_real_kv_hash(
            real_kv_sources=sources,
            real_kv_hash_mode=RealKvHashMode.ALL,
            slot_indices=device_slots,
            out=out,
            backend="cuda",
        )
    (record,) = rec.launches
    monkeypatch.setattr(_driver, "DRIVER_CALLS", calls)
    monkeypatch.setattr(_driver, "driver", _driver.Driver())
    launch = PreparedLaunch.from_spec(record)
    assert launch.raw, launch.fallback_reason
    launch.launch(int(cupy.cuda.get_current_stream().ptr))
    np.testing.assert_array_equal(out.get(), want)
    out[:] = 0
    table = LaunchTable([launch])
    assert table.compiled == (calls == "compiled")
    table.launch(int(cupy.cuda.get_current_stream().ptr))
    np.testing.assert_array_equal(out.get(), want)
