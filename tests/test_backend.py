"""Which backend runs a call, and the kernels' refusal to run without numba-cuda (KVC-C008).

Without numba-cuda, ``numba.cuda`` is numba's own CUDA target. Its simulator swaps a module's
``cuda`` global per call, not per module: a simulated thread leaving a device function puts the
real module back under the threads still inside it (the fuzz harness's case 142 in CI, which ran
the simulator before numba-cuda was installed). The kernel path refuses that setup up front.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest
from canary_helpers import FakeCudaArray, counters, make_context, run_verify, verify_plan, write_index
from helpers import raises_code

from kvcanary_numba import VerifyPlan, _runtime, _validate


@pytest.fixture
def no_numba_cuda(monkeypatch):
    monkeypatch.setattr(_validate, "kernels_unavailable", lambda: _runtime.NO_NUMBA_CUDA)
    monkeypatch.setattr(_runtime, "kernels_unavailable", lambda: _runtime.NO_NUMBA_CUDA)


def test_the_kernels_are_found_where_numba_cuda_provides_numba_cuda():
    import numba.cuda

    from_numba_cuda = "numba_cuda" in numba.cuda.__file__
    assert _runtime.kernels_available() is from_numba_cuda is (importlib.util.find_spec("numba_cuda") is not None)


def test_backend_cuda_without_numba_cuda_is_refused_before_anything_runs(no_numba_cuda, monkeypatch):
    monkeypatch.setattr(_validate, "simulator_enabled", lambda: True)  # NumPy arrays could reach the kernels
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    with raises_code("KVC-C008") as excinfo:
        run_verify(ctx, plan, backend="cuda")
    assert "backend='cuda'" in str(excinfo.value) and "numba-cuda" in str(excinfo.value)
    assert counters(ctx) == (0, 0) and write_index(ctx) == 0


def test_cuda_arrays_without_numba_cuda_are_refused_under_auto(no_numba_cuda):
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    fake_ctx = ctx.replace(
        **{
            f: FakeCudaArray(getattr(ctx, f))
            for f in (
                "canary_buf",
                "violation_ring",
                "violation_write_index",
                "slot_run_counter",
                "kernel_run_counter",
                "enable_chain_position_assert",
            )
        }
    )
    fake_plan = VerifyPlan(**{name: FakeCudaArray(a) for name, a in plan.arrays().items()})
    with raises_code("KVC-C008") as excinfo:
        run_verify(fake_ctx, fake_plan, backend="auto")
    assert "numba-cuda" in str(excinfo.value)
    assert counters(ctx) == (0, 0) and write_index(ctx) == 0


def test_numpy_calls_need_no_numba_cuda(no_numba_cuda):
    ctx, plan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    run_verify(ctx, plan, backend="auto")
    assert counters(ctx) == (1, 1)


def test_device_cuda_without_numba_cuda_is_refused(no_numba_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))  # CuPy importable ...
    monkeypatch.setattr(_runtime, "gpu_available", lambda: True)  # ... and a GPU visible
    with raises_code("KVC-C008") as excinfo:
        _runtime.array_module("CanaryMonitor", "cuda")
    assert "device='cuda'" in str(excinfo.value) and "numba-cuda" in str(excinfo.value)
    assert _runtime.array_module("CanaryMonitor", "cpu") is np


def test_numba_cuda_030_on_numpy_25_is_refused_with_its_reason(monkeypatch):
    # numba-cuda 0.30 fails at its first kernel compile on NumPy 2.5 (np.row_stack is gone): the
    # kernel path says so up front, with a coded error, instead of an AttributeError mid-launch.
    monkeypatch.setattr(_runtime.np, "__version__", "2.5.1")
    monkeypatch.setattr(_runtime.importlib.metadata, "version", lambda name: "0.30.4")
    # numba-cuda "installed" (the NumPy 2.5 lane has none: its reason would come first).
    monkeypatch.setattr(_runtime.importlib.util, "find_spec", lambda name: object())
    _runtime.kernels_unavailable.cache_clear()
    try:
        reason = _runtime.kernels_unavailable()
        assert reason is not None and "NumPy 2.5.1" in reason and not _runtime.kernels_available()
    finally:
        monkeypatch.undo()
        _runtime.kernels_unavailable.cache_clear()
    assert _runtime.kernels_available() is (importlib.util.find_spec("numba_cuda") is not None)


def test_launch_switches_are_arguments_and_no_environment_variable_is_read():
    # Issue 33: garbage in the GPU launch switches raised RuntimeError when they were environment
    # variables (KVCANARY_LAUNCH_ROUTE, _PARAM_BUFFER, _DRIVER_CALLS, _VERIFY_REPLAYS). The switches
    # are now the monitor's backend= / prepared= arguments (coded errors) and module attributes that
    # only tests set; the package reads no variable of its own, so garbage in them changes nothing.
    import os
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parent.parent
    readers = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted((root / "kvcanary_numba").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ("os.environ" in line or "getenv" in line)
        and "NUMBA_ENABLE_CUDASIM" not in line
        and "defensive=" not in line
    ]
    assert readers == []
    code = (
        "import numpy as np\n"
        "from kvcanary_numba import compute_real_kv_hash, RealKvSource, RealKvHashMode\n"
        "src = RealKvSource(tensor=np.ones((4, 32), np.uint8), page_size=1, num_bytes_per_token=32, read_bytes=32)\n"
        "out = np.zeros(2, np.int64)\n"
        "compute_real_kv_hash(real_kv_sources=(src,), real_kv_hash_mode=RealKvHashMode.ALL,"
        " slot_indices=np.arange(2), out=out)\n"
        "assert out.all()\n"
    )
    garbage = {
        f"KVCANARY_{name}": "garbage" for name in ("LAUNCH_ROUTE", "PARAM_BUFFER", "DRIVER_CALLS", "VERIFY_REPLAYS")
    }
    env = {**os.environ, **garbage, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "switch, value, code",
    [
        ("prepared", "yes", "KVC-C010"),
        ("prepared", 1, "KVC-C010"),
        ("backend", "gpu", "KVC-C009"),
        ("backend", None, "KVC-C009"),
    ],
)
def test_garbage_in_the_monitor_launch_switches_is_coded(switch, value, code):
    from kvcanary_numba.monitor import CanaryMonitor, KvGroup

    with raises_code(code):
        CanaryMonitor(full=KvGroup(kind="full", num_slots=8), write_req_capacity=2, **{switch: value})
