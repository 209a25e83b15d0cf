"""Caches of the fast wing and the launch layer, keyed per device (and stream, and monitor), on the CPU
with fake device ids: a compiled kernel loaded once per device, device queries and stream objects per
device, launch scratch per device and lane, replays never crossing devices or scratch owners, and the
monitor's hooks running on the monitor's device with its scratch owned."""

from __future__ import annotations

import types

import numpy as np
import pytest
from launch_fakes import KERNEL_A, SIG, args_for, gpu  # noqa: F401
from monitor_helpers import DECODE, PREFILL, Driver, source

from kvcanary_numba.fast import driver as _driver, glue_memo, replay, scratch
from kvcanary_numba.fast.memo import Entry
from kvcanary_numba.launch import _device, _launch as _common
from kvcanary_numba.monitor.hooks import HookScope, on_device


class Devices:
    """A settable current device for the fakes."""

    def __init__(self):
        self.current = 0

    def __call__(self) -> int:
        return self.current


class FakeKernel:
    """``kernel.compile(signature)`` records which device each compiled object was bound on."""

    def __init__(self, devices: Devices):
        self.devices, self.bound = devices, []

    def compile(self, signature):
        kernel = self

        class Compiled:
            def bind(self):
                kernel.bound.append((self, kernel.devices.current))

        return Compiled()


def test_a_compiled_kernel_is_loaded_once_per_device(monkeypatch):
    devices = Devices()
    monkeypatch.setattr(_driver, "driver", types.SimpleNamespace(current_device=devices))
    kernel = FakeKernel(devices)
    first = _driver.bound_kernel(kernel, "void()")
    assert _driver.bound_kernel(kernel, "void()") is first and len(kernel.bound) == 1
    devices.current = 1
    second = _driver.bound_kernel(kernel, "void()")
    assert second is not first and [device for _, device in kernel.bound] == [0, 1]
    devices.current = 0
    assert _driver.bound_kernel(kernel, "void()") is first and len(kernel.bound) == 2


@pytest.fixture
def device_queries(monkeypatch):
    """The launch layer's device queries as on a GPU, over fake devices 0 and 1."""
    from numba import cuda

    devices = Devices()
    asked: list = []
    monkeypatch.setattr(_device, "ON_SIMULATOR", False)
    monkeypatch.setattr(_device, "current_device", devices)

    def get_current_device():
        asked.append(("sm", devices.current))
        return types.SimpleNamespace(MULTIPROCESSOR_COUNT=(132, 78)[devices.current])

    monkeypatch.setattr(cuda, "get_current_device", get_current_device)
    monkeypatch.setattr(cuda, "external_stream", lambda handle: ("stream", handle, devices.current))
    monkeypatch.setattr(cuda, "default_stream", lambda: ("default", 0, devices.current))

    class Compiled:
        def max_cooperative_grid_blocks(self, block):
            asked.append(("blocks", devices.current))
            return (264, 156)[devices.current] * 128 // block

    monkeypatch.setattr(_device, "compile_kernel", lambda kernel, signature: Compiled())
    for cached in (_device._sm_count, _device._resident_blocks, _device._numba_stream):
        cached.cache_clear()
    yield devices, asked
    for cached in (_device._sm_count, _device._resident_blocks, _device._numba_stream):
        cached.cache_clear()


def test_device_queries_and_stream_objects_are_per_device(device_queries):
    devices, asked = device_queries
    kernel = object()
    assert (_device.sm_count(), _device.resident_blocks(kernel, "void()", 128)) == (132, 264)
    assert _device.numba_stream(0) == ("default", 0, 0) and _device.numba_stream(0x77) == ("stream", 0x77, 0)
    devices.current = 1
    assert (_device.sm_count(), _device.resident_blocks(kernel, "void()", 128)) == (78, 156)
    assert _device.numba_stream(0) == ("default", 0, 1) and _device.numba_stream(0x77) == ("stream", 0x77, 1)
    devices.current = 0
    assert (_device.sm_count(), _device.resident_blocks(kernel, "void()", 128)) == (132, 264)
    assert asked == [("sm", 0), ("blocks", 0), ("sm", 1), ("blocks", 1)]  # each asked once per device


@pytest.fixture
def fresh_scratch(gpu, monkeypatch):  # noqa: F811 - the fixture of launch_fakes
    devices = Devices()
    monkeypatch.setattr(gpu.driver, "current_device", devices)
    monkeypatch.setattr(scratch.STREAM_SCRATCH, "_arrays", {})
    monkeypatch.setattr(scratch, "stream_capturing", lambda stream: False)
    return devices


def test_launch_scratch_is_per_device_and_stream(fresh_scratch):
    zeros = scratch.STREAM_SCRATCH.zeros
    a = zeros("lookback", (4,), np.int64, 5)
    assert zeros("lookback", (4,), np.int64, 5) is a
    assert zeros("lookback", (4,), np.int64, 6) is not a  # another stream
    fresh_scratch.current = 1
    b = zeros("lookback", (4,), np.int64, 5)
    assert b is not a and zeros("lookback", (4,), np.int64, 5) is b  # another device
    assert set(scratch.STREAM_SCRATCH._arrays) == {(0, 5), (0, 6), (1, 5)}


def test_an_owner_keeps_its_scratch_on_every_stream_and_owners_share_none(fresh_scratch):
    zeros = scratch.STREAM_SCRATCH.zeros
    per_stream = zeros("lookback", (4,), np.int64, 5)
    with scratch.owned_by("A"):
        a = zeros("lookback", (4,), np.int64, 5)
        assert a is not per_stream and zeros("lookback", (4,), np.int64, 9) is a
        with scratch.owned_by("B"):
            b = zeros("lookback", (4,), np.int64, 5)
            assert b is not a and scratch.owner() == "B"
        assert scratch.owner() == "A" and zeros("lookback", (4,), np.int64, 5) is a
        fresh_scratch.current = 1
        assert zeros("lookback", (4,), np.int64, 5) is not a  # the owner's scratch on another device
    assert scratch.owner() is None and zeros("lookback", (4,), np.int64, 5) is not per_stream


def test_a_replay_packed_for_one_owner_is_not_replayed_for_another(gpu):  # noqa: F811
    entry, runs = Entry("cuda"), []
    entry.hits = 1

    def glue(stream):
        runs.append(scratch.owner())
        _common.launch(KERNEL_A, SIG, 1, 32, args_for(0x10000), stream)

    with scratch.owned_by("A"):
        replay.run_launches(entry, glue, {}, 7)  # packed
        replay.run_launches(entry, glue, {}, 7)  # replayed
    assert runs == ["A"]
    with scratch.owned_by("B"):
        replay.run_launches(entry, glue, {}, 7)  # the glue would take B's scratch: packed again
    assert runs == ["A", "B"]


def test_internal_glue_replays_never_cross_devices(gpu, monkeypatch):  # noqa: F811
    devices = Devices()
    monkeypatch.setattr(gpu.driver, "current_device", devices)
    glue_memo.clear()
    runs = []

    def glue(stream, x):
        runs.append(devices.current)
        _common.launch(KERNEL_A, SIG, 1, 32, args_for(0x10000), stream)

    kwargs = dict(x=7)
    for device in (0, 0, 0, 1, 1, 0):
        devices.current = device
        glue_memo.run_memoised("probe", glue, kwargs, 3)
    # device 0: first sight, packed, replayed; device 1: packed anew (its handles), replayed; back: packed
    assert runs == [0, 0, 1, 0]
    assert [entry[0] for entry in gpu.log] == ["raw"] * 6  # and every call launched, replayed or not
    glue_memo.clear()


class FakeRuntime:
    def __init__(self, current: int):
        self.current, self.calls = current, []

    def getDevice(self):  # noqa: N802 - CuPy's name
        self.calls.append("get")
        return self.current

    def setDevice(self, device):  # noqa: N802 - CuPy's name
        self.calls.append(("set", device))
        self.current = device


class Hooked:
    """What ``on_device`` wraps: an object with a ``hook_scope``."""

    def __init__(self, device, runtime):
        self.hook_scope, self.runtime, self.seen = HookScope(device, runtime), runtime, []

    @on_device
    def hook(self, fail: bool = False):
        self.seen.append((self.runtime.current, scratch.owner()))
        if fail:
            raise RuntimeError("inside the hook")
        return "done"


def test_a_hook_runs_on_its_device_with_its_scratch_and_restores_both():
    runtime = FakeRuntime(current=0)
    on_one, also_one = Hooked(1, runtime), Hooked(1, runtime)
    assert on_one.hook() == "done"
    assert on_one.seen == [(1, on_one.hook_scope.token)] and runtime.current == 0
    assert runtime.calls == ["get", ("set", 1), ("set", 0)]
    assert on_one.hook_scope.token != also_one.hook_scope.token  # each monitor owns its scratch
    with pytest.raises(RuntimeError):
        on_one.hook(fail=True)
    assert runtime.current == 0 and scratch.owner() is None  # restored when the hook raises
    runtime.current, runtime.calls = 1, []
    on_one.hook()
    assert runtime.calls == ["get"]  # already current: nothing switched
    host = Hooked(None, runtime)  # a monitor on the host: no device switch, its scratch all the same
    host.hook()
    assert host.seen == [(1, host.hook_scope.token)] and runtime.calls == ["get"]


class FailingSwitch(FakeRuntime):
    """The first switch fails (an invalid device), later ones succeed."""

    def setDevice(self, device):  # noqa: N802 - CuPy's name
        if not self.calls.count("failed"):
            self.calls.append("failed")
            raise RuntimeError("cudaErrorInvalidDevice")
        super().setDevice(device)


def test_a_hook_scope_refuses_a_second_thread_and_a_failed_switch_leaves_nothing_held():
    import threading

    from kvcanary_numba.errors import KvCanaryError

    runtime = FakeRuntime(current=0)
    scope = HookScope(1, runtime)
    entered = scope.enter("CanaryMonitor.pre_forward")
    assert runtime.current == 1 and scratch.owner() == scope.token
    refused = []

    def other_thread():
        try:
            scope.enter("CanaryMonitor.end_step")
        except KvCanaryError as exc:
            refused.append(exc.code)
        reading = scope.enter(None)  # a reading call is not guarded: it enters beside the holder
        refused.append(scratch.owner() == scope.token)
        scope.leave(reading)

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert refused == ["KVC-M026", True]
    assert runtime.current == 1 and scratch.owner() == scope.token  # the holder's state is as it was
    inner = scope.enter("CanaryMonitor.sweep")  # the holder re-enters (end_step runs sweep)
    scope.leave(inner)
    scope.leave(entered)
    assert runtime.current == 0 and scratch.owner() is None and scope.owner() == "?"
    failing = HookScope(1, FailingSwitch(current=0))
    with pytest.raises(RuntimeError):
        failing.enter("CanaryMonitor.pre_forward")
    assert scratch.owner() is None  # nothing held after the failed switch: another thread is let in

    def flush_from_another_thread():
        entered = failing.enter("CanaryMonitor.flush")
        refused.append(entered)
        failing.leave(entered)

    worker = threading.Thread(target=flush_from_another_thread)
    worker.start()
    worker.join()
    assert refused[-1] == ("CanaryMonitor.flush", None, 0)  # it switched from device 0 to 1


def test_a_monitors_launches_take_its_own_scratch_lane():
    d = Driver()
    plan = d.monitor.step_plan
    owners = []
    original = plan.head

    def head(batch, pool, lens):
        owners.append(scratch.owner())
        return original(batch, pool, lens)

    plan.head = head
    d.step(PREFILL)
    other = Driver()
    other.monitor.step_plan.head = lambda batch, pool, lens: owners.append(scratch.owner())
    other.monitor.pre_forward(other.batch(DECODE))
    assert owners == [d.monitor.hook_scope.token, other.monitor.hook_scope.token]
    assert owners[0] != owners[1] and scratch.owner() is None


def test_every_hook_of_a_monitor_runs_on_its_device_and_reading_does_not_switch():
    from kvcanary_numba.monitor import SlotChain

    d = Driver(verdict=True, rank=0)
    m = d.monitor
    runtime = FakeRuntime(current=0)  # the engine's device is 0, the monitor's 1
    m.hook_scope = HookScope(1, runtime)
    seen = {}

    def on(name, call):
        runtime.calls = []
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - a refusal still ran on the device (capture on the CPU)
            seen[name + " (raised)"] = type(exc).__name__
        seen[name] = ("set", 1) in runtime.calls and runtime.current == 0

    on("pre_forward", lambda: m.pre_forward(d.batch(PREFILL)))
    on("post_forward", m.post_forward)
    on("end_step", m.end_step)
    on("sweep", lambda: m.sweep([SlotChain(slots=[1, 2])]))
    on("flush", m.flush)
    on("stats", m.stats)
    on("finish_warmup", m.finish_warmup)
    on("apply_verdict", lambda: m.apply_verdict(m.verdict.word.copy()))
    on("rebind_sources", lambda: m.rebind_sources(k_sources=(source(d.k),), v_sources=(source(d.v),)))
    on("capture_graph", lambda: m.capture_graph(d.batch(DECODE)))
    hooks = [k for k in seen if "(raised)" not in k]
    assert len(hooks) == 10 and all(seen[k] for k in hooks), seen
    raised = {k: v for k, v in seen.items() if "(raised)" in k}
    assert raised == {"capture_graph (raised)": "KvCanaryError"}  # KVC-C008 on the CPU, after the switch
    runtime.calls = []
    assert m.violations == [] and m.step == 1 and runtime.calls == []  # reading switches nothing


def test_the_forward_block_runs_the_engines_code_on_the_engines_device():
    d = Driver()
    m = d.monitor
    runtime = FakeRuntime(current=0)  # the engine's device is 0, the monitor's 1
    m.hook_scope = HookScope(1, runtime)
    inside = []
    with m.forward(d.batch(PREFILL)):
        inside.append((runtime.current, scratch.owner()))  # where the engine writes its KV
    m.end_step()
    assert inside == [(0, None)]  # the block holds the thread guard alone
    assert ("set", 1) in runtime.calls and runtime.current == 0  # the hooks inside did switch, and restored
    assert m.step == 1 and m.violations == []
