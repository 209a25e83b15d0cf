"""int32 request and token arrays in a StepBatch (SGLang's ForwardBatch takes int32 or int64).

The monitor hands its launches int64 copies in buffers it allocates once: every path (eager
NumPy, the kernels under the simulator with prepared steps, a captured CUDA graph on a GPU)
must record and report exactly what the same steps with int64 arrays do.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import raises_code
from monitor_helpers import DECODE, PREFILL, Driver, monitor_records

from kvcanary_numba.monitor import StepBatch
from kvcanary_numba.monitor.batch import INDEX_FIELDS

STEPS = [PREFILL, DECODE, {1: [(105, 7)], 2: [(201, 9), (202, 10)]}, {1: [(106, 8)], 2: [(203, 11)]}]


def narrowed(batch: StepBatch, names=INDEX_FIELDS) -> StepBatch:
    return dataclasses.replace(batch, **{name: getattr(batch, name).astype(np.int32) for name in names})


class NarrowDriver(Driver):
    """The same steps, with the batch's index fields as int32."""

    names = INDEX_FIELDS

    def batch(self, new, **options):
        return narrowed(super().batch(new, **options), self.names)


def _run(driver: Driver, flips=(4,)) -> tuple:
    for i, new in enumerate(STEPS):
        driver.step(new)
        if i == 1:
            for slot in flips:
                driver.k[slot, 0] ^= 1
    driver.monitor.flush()
    buffers = [monitor_records(b).copy() for g in driver.monitor.groups for b in g.buffers.values()]
    return driver.rows(), buffers, driver.monitor.stats()


def _assert_same_run(narrow: Driver, wide: Driver) -> None:
    rows, buffers, stats = _run(narrow)
    want_rows, want_buffers, want_stats = _run(wide)
    assert sorted(rows) == sorted(want_rows) and rows, "the flipped byte is caught"
    for got, want in zip(buffers, want_buffers):
        np.testing.assert_array_equal(got, want)
    assert stats == want_stats


@pytest.mark.parametrize("names", [INDEX_FIELDS, ("out_cache_loc",), ("req_pool_indices", "prefix_lens")])
@pytest.mark.parametrize("swa_window", [0, 2])
def test_int32_batches_record_and_report_what_int64_batches_do(names, swa_window):
    NarrowDriver.names = names
    _assert_same_run(NarrowDriver(swa_window=swa_window), Driver(swa_window=swa_window))


def test_a_refilled_int32_batch_is_copied_every_step_into_buffers_allocated_once():
    d = Driver(has_v=False)
    d.step(PREFILL)
    want = Driver(has_v=False)
    want.step(PREFILL)
    batch = narrowed(d.batch({1: [(104, 6)]}))
    checks = d.monitor.batch_checks
    twins, buffers = set(), set()
    for token, slot, position in ((104, 6, 3), (105, 7, 4), (106, 8, 5)):
        batch.input_ids[0], batch.out_cache_loc[0], batch.positions[0] = token, slot, position
        batch.prefix_lens[0] = position
        d.req_to_token[1, position] = slot
        with d.monitor.forward(batch):
            d.k[slot] = 1
        d.monitor.end_step()
        twins.add(id(checks.widened.twin))
        buffers |= {id(b) for b in checks.widened.buffers.values()}
        want.step({1: [(token, slot)]})
        want.k[slot] = 1  # the same KV bytes as the refilled batch's forward wrote
    assert len(twins) == 1 and len(buffers) == len(INDEX_FIELDS)  # nothing allocated after the first step
    assert d.monitor.violations == [] == want.monitor.violations
    assert checks.widened.twin.out_cache_loc.dtype == np.int64 and batch.out_cache_loc.dtype == np.int32
    for g_got, g_want in zip(d.monitor.groups, want.monitor.groups):
        for name in g_got.buffers:
            records = monitor_records(g_got.buffers[name])
            np.testing.assert_array_equal(records[:, :3], monitor_records(g_want.buffers[name])[:, :3])


def test_other_dtypes_are_refused_naming_both_index_dtypes():
    d = Driver()
    batch = d.batch(PREFILL)
    for name in ("req_pool_indices", "positions"):
        with raises_code("KVC-C002") as info:
            StepBatch(
                **{
                    **{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)},
                    name: getattr(batch, name).astype(np.float32),
                }
            )
        assert "int64 or int32" in str(info.value)
    with raises_code("KVC-C002"):  # req_to_token stays int32 (SGLang's ReqToTokenPool)
        dataclasses.replace(batch, req_to_token=batch.req_to_token.astype(np.int64))


@pytest.mark.simulator
def test_prepared_kernel_steps_on_int32_batches_equal_int64(monkeypatch):
    from kvcanary_numba.launch import _launch

    if not _launch.ON_SIMULATOR:
        pytest.skip("NumPy batches through the kernels: the simulator")
    options = dict(has_v=False, backend="cuda", prepared=True)
    NarrowDriver.names = INDEX_FIELDS
    _assert_same_run(NarrowDriver(**options), Driver(**options))


@pytest.mark.gpu
def test_gpu_captured_graph_replays_refilled_int32_batches_as_int64():
    import cupy
    from monitor_helpers import NUM_SLOTS, source

    from kvcanary_numba.monitor import CanaryMonitor, KvGroup

    runs = {}
    for dtype in (np.int32, np.int64):
        k = cupy.zeros((NUM_SLOTS, 32), dtype=np.uint8)
        monitor = CanaryMonitor(
            full=KvGroup(kind="full", num_slots=NUM_SLOTS, k_sources=(source(k),), has_v=False),
            device="cuda",
            write_req_capacity=1,
            health_interval=0,
        )
        rtt = cupy.zeros((2, 16), dtype=np.int32)
        rtt[1, :3] = cupy.asarray([3, 4, 5], dtype=np.int32)
        prefill = StepBatch(
            req_pool_indices=cupy.asarray([1], dtype=dtype),
            prefix_lens=cupy.asarray([0], dtype=dtype),
            extend_seq_lens=cupy.asarray([3], dtype=dtype),
            req_to_token=rtt,
            input_ids=cupy.asarray([101, 102, 103], dtype=dtype),
            positions=cupy.arange(3, dtype=dtype),
            out_cache_loc=cupy.asarray([3, 4, 5], dtype=dtype),
        )
        with monitor.forward(prefill):
            k[3:6] = 1
        monitor.end_step()
        one = lambda v: cupy.asarray([v], dtype=dtype)  # noqa: E731
        decode = StepBatch(
            req_pool_indices=one(1),
            prefix_lens=one(3),
            extend_seq_lens=one(1),
            req_to_token=rtt,
            input_ids=one(104),
            positions=one(3),
            out_cache_loc=one(6),
        )
        rtt[1, 3] = 6
        monitor.capture_graph(decode)
        for step, slot in enumerate(range(6, 10)):
            decode.prefix_lens[0], decode.positions[0], decode.out_cache_loc[0] = 3 + step, 3 + step, slot
            decode.input_ids[0] = 104 + step
            rtt[1, 3 + step] = slot
            if step == 2:
                k[4, 0] ^= 1  # caught by the next TAIL verify
            with monitor.forward(decode):
                k[slot] = 1
            monitor.end_step()
        monitor.flush()
        assert monitor.graph.replays == 4
        runs[dtype] = (
            [(v.tag, v.slot_idx, v.position, v.reasons) for v in monitor.violations],
            [cupy.asnumpy(b) for b in monitor.groups[0].buffers.values()],
        )
    assert runs[np.int32][0] == runs[np.int64][0] and runs[np.int64][0]
    for got, want in zip(runs[np.int32][1], runs[np.int64][1]):
        np.testing.assert_array_equal(got, want)
