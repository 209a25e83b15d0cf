"""The GPU readback's quiet steps (``launch/_native.py``, ``monitor/readback.py``), on a CPU.

The compiled readback call reads the finished copy's write index and plan flags; when they
show nothing new, the monitor builds no snapshot and processes nothing. These tests check the
call's rule against hand-set status words, and that a monitor skipping quiet snapshots reports
exactly what one processing every snapshot reports: rows, warnings, health checks. The GPU
tier runs the same readback on the device (tests/test_monitor.py, tests/test_gpu_monitor*).
"""

from __future__ import annotations

import logging
import pathlib
import sys

import monitor_helpers
import numpy as np
import pytest
from monitor_helpers import DECODE, PREFILL, Driver

from kvcanary_numba.monitor import readback as readback_module
from kvcanary_numba.monitor.status import StatusBlock

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fake_runtime import CompiledFunctions, FakeRuntime, fake_cuda_readback  # noqa: E402

LOGGER = "kvcanary_numba.monitor"


def gpu_readback(block: StatusBlock):
    """A CudaReadback of ``block`` whose driver calls are the compiled ones, into a fake runtime."""
    runtime = FakeRuntime()
    functions = CompiledFunctions(runtime)
    rb = fake_cuda_readback(block, runtime, functions=functions.addresses)
    rb.functions = functions  # the callbacks live as long as the readback
    assert rb.native is not None
    return rb


#: (write index, each group's enable lane, the index the monitor expects, whether the copy is quiet)
QUIET_CASES = [
    (5, (1, 1), 5, True),
    (0, (1, 7), 0, True),
    (6, (1, 1), 5, False),  # new rows since the last snapshot processed
    (5, (1, 0), 5, False),  # group 1's plan overflowed
    (5, (0, 1), 5, False),  # group 0's
    (5, (1, 1), -1, False),  # the monitor asks for the snapshot (health check or re-check due)
]


def _set_status(block: StatusBlock, index: int, enables) -> None:
    lanes = block.words.view(np.int32)
    lanes[0], lanes[1] = index, -5  # the high half of word 0 is not the write index
    for lane, enable in zip(block.plan_lanes, enables):
        lane[0], lane[1] = enable, 9  # a nonzero high half must not stand in for enable


@pytest.mark.parametrize("index, enables, expect, quiet", QUIET_CASES)
def test_a_finished_copy_is_quiet_only_when_nothing_in_it_is_new(index, enables, expect, quiet):
    block = StatusBlock(np, 2)
    rb = gpu_readback(block)
    _set_status(block, index, enables)
    assert rb.push(0, expect) is None  # nothing was in flight
    block.kernel_run_counters[:] += 3  # counters move every step; they are never "new"
    snapshot = rb.push(1, expect)
    if quiet:
        assert snapshot is None
    else:
        assert (snapshot.step, snapshot.write_index) == (0, index)
        assert snapshot.kernel_run_counters.sum() == 0  # step 0's copy, not the block as it is now
    assert [step for step, _ in rb._queue] == [1]  # quiet or not, step 0's copy was consumed


def count_snapshots(monkeypatch, snapshot=readback_module._snapshot) -> list[int]:
    """The steps of the snapshots the readback builds from now on (``snapshot``: the real builder,
    bound when this module loads, so a second count does not wrap the first)."""
    built = []
    monkeypatch.setattr(readback_module, "_snapshot", lambda step, words: built.append(step) or snapshot(step, words))
    return built


def _scenario(quiet: bool, monkeypatch, caplog):
    """Steps with a violation, a plan overflow, a lost launch and clean steps, on the GPU readback;
    returns what the monitor reported and how many snapshots it built."""
    built = count_snapshots(monkeypatch)
    monkeypatch.setattr(monitor_helpers, "NUM_SLOTS", 32)  # room for three requests' tokens
    d = Driver(health_interval=3, health_warmup_steps=0, verify_capacity=6)
    m = d.monitor
    m.readback = m.pump.readback = gpu_readback(m.status)
    if not quiet:
        monkeypatch.setattr(m.aftercare, "quiet_index", lambda pump, step: -1)
    reports = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        d.step(PREFILL)  # step 0: row 1, slots 3-5
        d.step({2: [(201, 20), (202, 21), (203, 22)]})
        d.step(DECODE)  # step 2: row 1 alone verifies 3 entries
        d.step({1: [(105, 7)], 2: [(204, 23)]})  # step 3: 4 + 3 entries > verify_capacity 6: overflow
        d.step({1: [(106, 8)]})
        d.k[4, 0] ^= 1  # row 1's position 1
        d.step({1: [(107, 9)]})  # step 5: 6 entries, the flipped one among them
        d.step({2: [(205, 24)]})
        d.step({2: [(206, 25)]})
        m.groups[0].tail = m.groups[0].tail[:1]  # the TAIL V launch silently disappears
        for new in ({2: [(207, 26)]}, {3: [(301, 27), (302, 28)]}, {3: [(303, 29)]}, {3: [(304, 30)]}):
            d.step(new)  # steps 8-11
            reports.append(m.health.last)
        m.flush()
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    seen = [(v.tag, v.slot_idx, v.position, v.reasons, v.step, v.persistence) for v in m.violations]
    return seen, messages, reports, built


def test_skipping_quiet_snapshots_reports_exactly_what_processing_all_of_them_does(monkeypatch, caplog):
    full = _scenario(False, monkeypatch, caplog)
    monkeypatch.undo()
    quiet = _scenario(True, monkeypatch, caplog)
    assert quiet[:3] == full[:3]
    seen, messages, reports, _ = full
    # The scenario is not trivial: each kind of finding is in it.
    assert ("TAIL_K_FULL", 4, 1) in {row[:3] for row in seen}
    assert any("overflowed verify_capacity=6" in text for text in messages)
    assert any("TAIL_V_FULL ran" in text for text in messages)
    assert reports[-1].stalled == ("TAIL_V_FULL",)
    assert full[3] == list(range(12))  # every step's snapshot, the last one from the flush
    # Skipped: the clean steps. Built: the health checks (2, 5, 8; 11 from the flush), the plan
    # overflow (3), the new rows (5) and their re-check a step later (6).
    assert quiet[3] == [2, 3, 5, 6, 8, 11]


# --- GPU: the real readback (pinned copies, libcuda's functions) ------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("index, enables, expect, quiet", QUIET_CASES)
def test_gpu_a_finished_copy_is_quiet_only_when_nothing_in_it_is_new(index, enables, expect, quiet):
    import cupy

    from kvcanary_numba.monitor.readback import CudaReadback

    host = StatusBlock(np, 2)
    _set_status(host, index, enables)
    block = StatusBlock(cupy, 2)
    block.words.set(host.words)
    rb = CudaReadback(block)
    assert rb.native is not None
    assert rb.push(0, expect) is None
    block.kernel_run_counters += 3
    cupy.cuda.Device().synchronize()  # step 0's copy is done: push(1) reads it
    snapshot = rb.push(1, expect)
    if quiet:
        assert snapshot is None
    else:
        assert (snapshot.step, snapshot.write_index) == (0, index)
        np.testing.assert_array_equal(snapshot.words, host.words)
    last = rb.flush()
    assert last.step == 1 and int(last.kernel_run_counters.sum()) == 3 * len(last.kernel_run_counters)


@pytest.mark.gpu
def test_gpu_monitor_reports_the_same_rows_with_quiet_steps_skipped(monkeypatch):
    from monitor_helpers import gpu_monitor_run

    from kvcanary_numba.monitor.bundle import Aftercare

    def run():
        built = count_snapshots(monkeypatch)
        _, m = gpu_monitor_run("fast", requests=4, prefix=40, bytes_per_token=32, steps=10, flips=[("k", 2, 5, 0)])
        return [(v.tag, v.slot_idx, v.position, v.reasons) for v in m.violations], built

    quiet_rows, quiet_built = run()
    monkeypatch.setattr(Aftercare, "quiet_index", lambda self, pump, step: -1)
    rows, built = run()
    assert rows and quiet_rows == rows  # the flipped byte was reported both ways
    assert len(quiet_built) < len(built)
