"""The monitor's per-step host path on a CPU: when the prepared steps rebind, the GPU readback's calls
(against a fake runtime), the status lanes, and the benchmark's host-split rows. No timing is asserted."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from helpers import raises_code
from test_reliability_state import BAD_FIELDS, assert_rejected_without_change

from kvcanary_numba.fast import steps as fast_steps
from kvcanary_numba.fast.bound import BoundArrays, _exact_test
from kvcanary_numba.fast.capture import CapturedStep
from kvcanary_numba.fast.prepared import PreparedLaunch
from kvcanary_numba.fast.steps import PreparedPhase
from kvcanary_numba.fast.table import LaunchTable
from kvcanary_numba.launch import _launch as _common
from kvcanary_numba.monitor import StepBatch
from kvcanary_numba.monitor.status import Snapshot, StatusBlock
from kvcanary_numba.monitor.steps import BATCH_ROLES

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_step  # noqa: E402
from benchmarks.fake_runtime import CompiledFunctions  # noqa: E402
from benchmarks.host_step import FakeRuntime, decode_monitor, fake_cuda_readback  # noqa: E402

on_simulator = pytest.mark.skipif(not _common.ON_SIMULATOR, reason="drives NumPy arrays through the kernel glue")


@pytest.fixture
def stubbed(monkeypatch):
    """A small decode monitor on prepared steps, launches stubbed; counts of binds, recordings, array checks."""
    monkeypatch.setattr(PreparedLaunch, "launch", lambda self, stream=None: None)
    w, _ = decode_monitor(requests=3, prefix=4)
    counts = {"bind": 0, "check_arrays": 0}

    def counted(name, original):
        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        return call

    monkeypatch.setattr(PreparedPhase, "bind", counted("bind", PreparedPhase.bind))
    monkeypatch.setattr(StepBatch, "check_arrays", counted("check_arrays", StepBatch.check_arrays))
    return w, counts


def _step(w) -> None:
    m = w.monitor
    m.pre_forward(w.batch)
    m.post_forward()
    m.end_step()


@pytest.mark.simulator
@on_simulator
def test_a_batch_refilled_in_place_is_bound_once(stubbed):
    w, counts = stubbed
    for _ in range(4):
        w.fill(w.batch, w.length, w.extend)
        _step(w)
    fast = w.monitor.fast
    assert fast.prepared == 1 and counts["bind"] == 2  # HEAD and TAIL, at the first step only
    assert counts["check_arrays"] == 1  # the hooks' array checks, also memoized on the field objects


@pytest.mark.simulator
@on_simulator
def test_a_new_array_is_checked_and_rebound(stubbed):
    w, counts = stubbed
    _step(w)
    new = w.batch.positions.copy()
    w.batch.positions = new
    _step(w)
    assert counts["check_arrays"] == 2 and counts["bind"] == 4
    head, tail = w.monitor.fast.bound.head, w.monitor.fast.bound.tail
    assert head.bound("positions") is new and tail.bound("positions") is new


@pytest.mark.simulator
@on_simulator
def test_a_new_view_of_the_same_memory_is_checked_but_not_rebound(stubbed):
    w, counts = stubbed
    n = w.batch.positions.shape[0]
    buffer = np.zeros(n + 1, dtype=np.int64)
    w.batch.positions = buffer[:n]
    _step(w)
    binds = counts["bind"]
    w.batch.positions = buffer[:n]  # the engine slices its buffer again: a new object, the same argument
    _step(w)
    assert counts["check_arrays"] == 2 and counts["bind"] == binds
    w.batch.positions = buffer[1:]  # the same base, another pointer: rebound
    _step(w)
    assert counts["bind"] == binds + 2
    assert w.monitor.fast.bound.head.bound("positions") is w.batch.positions


@pytest.mark.simulator
@on_simulator
def test_an_in_place_shape_change_records_the_other_shape(stubbed):
    w, _ = stubbed
    fast = w.monitor.fast
    _step(w)
    table = w.batch.req_to_token
    rows, cols = table.shape
    table.shape = (cols, rows)  # the same object: only the shape check sees it
    _step(w)
    assert fast.prepared == 2
    table.shape = (rows, cols)
    _step(w)
    assert fast.prepared == 2 and len(fast.phase_pairs) == 2  # the first shape's phases again


@pytest.mark.simulator
@on_simulator
def test_a_failed_bind_forgets_the_bound_arrays_and_takes_the_validated_path(stubbed, monkeypatch):
    w, _ = stubbed
    m, fast = w.monitor, w.monitor.fast
    _step(w)
    calls = []
    monkeypatch.setattr(fast_steps, "_kind", lambda name, array: ("another kind",))
    monkeypatch.setattr(m.step_plan, "head", lambda *args: calls.append("head"))  # the validated path: the plan's
    monkeypatch.setattr(m.step_plan, "tail", lambda batch: calls.append("tail"))
    w.batch.positions = w.batch.positions.copy()
    _step(w)
    assert calls == ["head", "tail"] and fast.bound is None


@pytest.mark.simulator
@on_simulator
@pytest.mark.parametrize(
    "field, bad, code", BAD_FIELDS[:6], ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_FIELDS[:6])]
)
def test_a_rejected_fast_path_step_changes_nothing(stubbed, field, bad, code):
    w, _ = stubbed
    m = w.monitor
    _step(w)
    good = getattr(w.batch, field)
    setattr(w.batch, field, bad(good))
    assert_rejected_without_change(m, lambda: m.pre_forward(w.batch), code)
    setattr(w.batch, field, good)
    _step(w)
    assert m.fast.prepared == 1


# --- the GPU readback against a fake runtime -----------------------------------------------------------


def _readback(
    deferred: bool, compiled: bool = False, block: StatusBlock | None = None, runtime: FakeRuntime | None = None
):
    """A CUDA readback of ``block`` (default: a new one) on a fake runtime; ``compiled``: its usual
    step goes through the compiled readback calls (ctypes callbacks into the same fake runtime)."""
    block = StatusBlock(np, 1) if block is None else block
    runtime = FakeRuntime(deferred=deferred) if runtime is None else runtime
    functions = CompiledFunctions(runtime) if compiled else None
    rb = fake_cuda_readback(block, runtime, functions=None if functions is None else functions.addresses)
    rb.functions = functions  # kept alive with the readback
    assert (rb.native is not None) == compiled
    return block, runtime, rb


both_paths = pytest.mark.parametrize("compiled", [False, True], ids=["runtime calls", "compiled calls"])

#: Calls per step: the compute-stream event, the side stream's wait, the copy, its event.
CALLS_PER_STEP = {"eventRecord": 2, "streamWaitEvent": 1, "memcpyAsync": 1}


@both_paths
def test_readback_in_step_returns_the_previous_step_and_never_waits(compiled, monkeypatch):
    block, runtime, rb = _readback(deferred=False, compiled=compiled)
    if compiled:  # the usual state takes the compiled calls only
        monkeypatch.setattr(rb, "_issue", None)
        monkeypatch.setattr(rb, "_collect", None)
    got = []
    for step in range(4):
        block.words[0] = 10 + step
        snap = rb.push(step)
        got.append(None if snap is None else (snap.step, snap.write_index))
    assert got == [None, (0, 10), (1, 11), (2, 12)]
    assert runtime.synchronized == [] and "eventSynchronize" not in runtime.calls
    # Four steps' calls, and one query of the previous copy's event from step 1 on.
    assert runtime.calls == {**{name: 4 * n for name, n in CALLS_PER_STEP.items()}, "eventQuery": 3}


@both_paths
def test_readback_behind_waits_only_for_the_copy_two_steps_old(compiled):
    block, runtime, rb = _readback(deferred=True, compiled=compiled)
    block.words[0] = 5
    assert rb.push(0) is None
    block.words[0] = 6
    assert rb.push(1) is None  # step 0's copy is not done: no wait
    assert runtime.synchronized == []
    block.words[0] = 7
    snap = rb.push(2)  # buffer 0 is needed again: wait for step 0's copy, and only for it
    assert (snap.step, snap.write_index) == (0, 5)
    assert runtime.synchronized == [rb._buffers[0][1]]  # a copy event, never the compute stream's
    runtime.finish()
    snap = rb.push(3)
    assert (snap.step, snap.write_index) == (2, 7) and len(runtime.synchronized) == 1
    runtime.finish()
    snap = rb.flush()
    assert snap.step == 3


@pytest.mark.parametrize(
    "call, code, name",
    [
        ("cuEventQuery", 700, "cuEventQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("cuMemcpyDtoHAsync_v2", 1, "cuMemcpyDtoHAsync_v2 failed: CUDA_ERROR_INVALID_VALUE"),
    ],
)
def test_a_failed_compiled_readback_call_raises_with_its_name(call, code, name):
    block, runtime, rb = _readback(deferred=False, compiled=True)
    rb.push(0)
    rb.functions.fail[call] = code
    with pytest.raises(RuntimeError, match=name):
        rb.push(1)


@both_paths
def test_the_readback_calls_in_order_on_the_right_streams(compiled):
    runtime, calls = FakeRuntime(deferred=True), []

    def recorded(name, method):
        def call(*args):
            calls.append((name, *(args[:2] if name == "streamWaitEvent" else args)))  # flags: 0, or left out
            return method(*args)

        return call

    for name in ("eventQuery", "eventRecord", "streamWaitEvent", "memcpyAsync"):
        setattr(runtime, name, recorded(name, getattr(runtime, name)))
    block, runtime, rb = _readback(deferred=True, compiled=compiled, runtime=runtime)
    rb.push(0)
    runtime.finish()
    rb.push(1)
    (l0, c0, h0), (l1, c1, h1) = rb._buffers
    side, compute, device, nbytes = rb._copy[4], 7, block.words.ctypes.data, block.words.nbytes
    assert calls == [
        ("eventRecord", l0, compute),
        ("streamWaitEvent", side, l0),
        ("memcpyAsync", h0, device, nbytes, runtime.memcpyDeviceToHost, side),
        ("eventRecord", c0, side),
        ("eventQuery", c0),  # step 1: the previous copy's event first, then step 1's calls on buffer 1
        ("eventRecord", l1, compute),
        ("streamWaitEvent", side, l1),
        ("memcpyAsync", h1, device, nbytes, runtime.memcpyDeviceToHost, side),
        ("eventRecord", c1, side),
    ]


@pytest.mark.parametrize("low", [0, 1, 7, 2**31 - 1, -1, -(2**31)])
def test_status_lanes_read_the_low_half_of_their_word(low):
    words = np.zeros(StatusBlock(np, 2).words.shape, dtype=np.int64)
    lanes = words.view(np.int32)
    lanes[0], lanes[1] = low, -5  # the high half of word 0 must not leak into the write index
    lanes[2 * 27], lanes[2 * 27 + 1] = low, 123456  # group 1's enable lane
    snap = Snapshot(0, words)
    assert snap.write_index == low == int(words[0:1].view(np.int32)[0])
    assert snap.plan_enable(1) == low and snap.plan_enable(0) == 0


# --- the benchmark's host-split rows, on the fakes ------------------------------------------------------


class _Run:
    iters = 3

    def __init__(self):
        self.records = []

    def add(self, record):
        self.records.append(record)


@pytest.mark.simulator
@on_simulator
@pytest.mark.parametrize("graph", [False, True], ids=["prepared", "graph replay"])
@both_paths
def test_host_split_rows_count_the_launch_and_runtime_calls(stubbed, monkeypatch, graph, compiled):
    w, _ = stubbed
    _, _, rb = _readback(deferred=False, compiled=compiled, block=w.monitor.status)
    w.monitor.readback = w.monitor.pump.readback = rb
    monkeypatch.setattr(bench_step, "synchronize", lambda: None)
    # The spin before each step is a launch of its own: it must not count as one of the step's.
    monkeypatch.setattr(bench_step, "_spin", lambda us: PreparedLaunch.launch(None))
    _step(w)
    m, run = w.monitor, _Run()
    saved = dict(vars(m.readback))
    if graph:
        stand_in = types.SimpleNamespace(launch=lambda: None)
        m.graph = CapturedStep(w.batch, stand_in, stand_in, roles=BATCH_ROLES)
    launch, table_launch = PreparedLaunch.launch, LaunchTable.launch
    bench_step._host_split(run, w, "decode")
    rows = {r["variant"].split(", ")[1]: r for r in run.records}
    assert set(rows) == {
        "pre+post: launch calls",
        "pre+post: everything else",
        "end_step: runtime calls",
        "end_step: everything else",
    }
    assert rows["pre+post: launch calls"]["launches"] == (2 if graph else 6)  # 2 plan, HEAD and TAIL: verify + write
    assert rows["end_step: runtime calls"]["launches"] == 5
    assert all(r["iters"] == bench_step._host_iters(run) == 9 for r in run.records)
    # Everything the split wrapped is back as it was.
    assert PreparedLaunch.launch is launch and LaunchTable.launch is table_launch and vars(m.readback) == saved
    if graph:
        assert isinstance(m.graph.head, types.SimpleNamespace)
    with raises_code("KVC-M005"):
        m.post_forward()  # the monitor is idle again: the split ran whole steps


# --- GPU: CuPy views and the raw readback calls ---------------------------------------------------------


def _gpu_steps(resliced: bool, monkeypatch) -> tuple[dict, int]:
    """Decode steps of a small pool on the GPU; ``resliced``: positions is a new view of one buffer every step.
    Returns host copies of the canary state and the number of phase binds after the first decode step."""
    import cupy

    from benchmarks.workloads import MonitorWorkload

    w = MonitorWorkload(cupy, requests=4, prefix=40, max_steps=5, bytes_per_token=32)
    m, n = w.monitor, w.batch.positions.shape[0]
    w.prefill()
    buffer = cupy.zeros(n + 3, dtype=np.int64)
    binds = []
    original = PreparedPhase.bind
    monkeypatch.setattr(PreparedPhase, "bind", lambda self, roles: binds.append(1) or original(self, roles))
    for i in range(5):
        if resliced:
            w.batch.positions = buffer[:n]
        if i == 1:
            binds.clear()
        w.step()
    m.flush()
    out = {f"{stage}_{half}": buf.get() for (stage, half), buf in m.groups[0].buffers.items()}
    out["status"] = m.status.words.get()
    return out, len(binds)


@pytest.mark.gpu
def test_gpu_a_resliced_cupy_view_is_not_rebound_and_gives_the_same_records(monkeypatch):
    plain, _ = _gpu_steps(False, monkeypatch)
    resliced, binds = _gpu_steps(True, monkeypatch)
    assert binds == 0  # the same base and layout every step: the phases stay bound
    assert int(plain["status"][0] & 0xFFFFFFFF) == 0  # no violation rows
    for name, array in plain.items():
        np.testing.assert_array_equal(resliced[name], array, err_msg=name)


_LATE_WRITE = r"""
extern "C" __global__ void late_write(long long* words, long long value, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    words[0] = value;  // after ~cycles: a copy not ordered after this kernel reads the old value
}
"""


@pytest.mark.gpu
def test_gpu_each_copy_reads_the_block_after_its_step_s_launches():
    import cupy

    from kvcanary_numba.monitor.readback import CudaReadback

    block = StatusBlock(cupy, 1)
    rb = CudaReadback(block)
    late_write = cupy.RawKernel(_LATE_WRITE, "late_write")
    seen = []
    for step in range(6):
        late_write((1,), (1,), (block.words, np.int64(100 + step), np.int64(2_000_000)))  # ~1 ms
        snapshot = rb.push(step)
        seen += [] if snapshot is None else [(snapshot.step, snapshot.write_index)]
    last = rb.flush()
    seen.append((last.step, last.write_index))
    assert seen[-1][0] == 5 and [index for _, index in seen] == [100 + step for step, _ in seen]


def test_bound_arrays_without_a_shape_are_never_reused():
    table = np.zeros((2, 3), dtype=np.int32)
    shapeless = types.SimpleNamespace()  # what a DLPack-only object may look like to the memo
    assert BoundArrays((table, None), "head", "tail").holds((table, None))
    assert not BoundArrays((table, shapeless), "head", "tail").holds((table, shapeless))
    assert not BoundArrays((table,), "head", "tail").holds((table, None))  # another number of arrays


# --- the harness with a fake libcuda (a subprocess: the fake must not enter this process) ---------------


@pytest.mark.simulator
@on_simulator
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="builds a C library")
@pytest.mark.parametrize("loop", ["python", "compiled"])
def test_host_step_with_the_fake_driver_makes_every_launch_of_the_step(loop):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.host_step",
            "--driver",
            "fake",
            "--loop",
            loop,
            "--steps",
            "20",
            "--requests",
            "3",
            "--prefix",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    launches = int(re.search(r"(\d+) prepared launches per step", done.stdout).group(1))
    calls = float(re.search(r"fake driver: ([\d.]+) cuLaunchKernel calls per step", done.stdout).group(1))
    assert launches > 0 and calls == launches  # every prepared launch reached the driver, once per step
    assert f"({loop} loop)" in done.stdout


def test_the_fast_snapshot_is_the_dataclass():
    from kvcanary_numba.monitor.status import _snapshot

    words = np.arange(27, dtype=np.int64)
    fast, plain = _snapshot(4, words), Snapshot(4, words)
    assert type(fast) is Snapshot and fast == plain and fast.words is words and fast.step == 4
    with pytest.raises(AttributeError):
        fast.step = 5  # still frozen


def test_the_exact_test_of_bound_arrays():
    a, b = np.zeros(4, dtype=np.int64), np.zeros((2, 3), dtype=np.int32)
    arrays = (a, None, b, a)  # an absent role, an array bound under two roles
    exact = _exact_test(arrays)
    assert exact(arrays) and exact((a, None, b, a))
    assert not exact((a, None, b)) and not exact((a, None, b, a, None))  # another count
    assert not exact((a, a, b, a)) and not exact((a, None, b, b)) and not exact((a.copy(), None, b, a))
    assert _exact_test((b, a)) is not exact  # one closure per bound set ...
    b.shape = (3, 2)  # ... and an in-place shape change is seen
    assert not exact(arrays) and not BoundArrays(arrays[:3], "head", "tail").holds((a, None, np.zeros(1)))
    bound = BoundArrays((a, None, b), "head", "tail")
    assert bound.holds((a, None, b))
    b.shape = (2, 3)
    assert not bound.holds((a, None, b))  # the general path agrees: another shape
