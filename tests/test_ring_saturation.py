"""The violation write index saturates instead of wrapping: it never goes negative, never comes back
over the first rows kept, and a monitor that saw more rows than it counts says "saturated".

No test records 2**31 rows: a fixture presets the index (a context's, or the monitor's status word)
just below the saturation value, as if that many rows had come before.
"""

from __future__ import annotations

import logging
import pathlib
import sys

import numpy as np
import pytest
from canary_helpers import make_context, ring_rows, verify_plan, write_args, write_index, write_plan
from kernel_pairs import run_pair, verify
from monitor_helpers import Driver

from kvcanary_numba import launch_canary_verify_kernel, launch_canary_write_kernel
from kvcanary_numba.constants import VIOLATION_INDEX_SATURATED as SATURATED
from kvcanary_numba.monitor.report import ring_summary
from kvcanary_numba.verify import launch_canary_verify_kernel as core_verify
from kvcanary_numba.write import launch_canary_write_kernel as core_write

INT32_MAX = 2**31 - 1
ROOT = pathlib.Path(__file__).resolve().parent.parent
#: (the index before, rows recorded) -> the index after: saturation, not wrap-around.
EXPECTED = {
    (SATURATED - 3, 5): SATURATED,
    (SATURATED - 1, 5): SATURATED,
    (SATURATED, 5): SATURATED,
    (INT32_MAX - 1, 5): INT32_MAX - 1,  # set by a caller past the saturation value: left as it is
    (INT32_MAX, 5): INT32_MAX,
    (SATURATED - 9, 5): SATURATED - 4,
    (-3, 5): 2,  # a negative index counts up; its tickets are never stored
}
#: Five entries whose records are all zero but expect position 9: five position rows.
FIVE = dict(slots=[1, 2, 3, 4, 5], positions=[9] * 5, prevs=[0] * 5)

VERIFY_PATHS = {
    "reference": lambda ctx, plan: core_verify(context=ctx, plan=plan, check_verify_expected_token=False),
    "cpu path": lambda ctx, plan: launch_canary_verify_kernel(
        context=ctx, plan=plan, check_verify_expected_token=False, backend="numpy"
    ),
}


def _preset(ctx, index: int):
    ctx.violation_write_index[0] = index  # the fixture: as if index rows had come before
    return ctx


def test_saturation_value():
    assert SATURATED == 2**31 - 2**24 and (SATURATED + (1 << 24) - 1) == INT32_MAX


@pytest.mark.parametrize("path", sorted(VERIFY_PATHS))
@pytest.mark.parametrize(("start", "rows"), sorted(EXPECTED))
def test_the_index_saturates_on_the_cpu(path, start, rows):
    ctx = _preset(make_context(ring_capacity=4), start)
    VERIFY_PATHS[path](ctx, verify_plan(FIVE["slots"], FIVE["positions"], FIVE["prevs"]))
    assert write_index(ctx) == EXPECTED[start, rows] and write_index(ctx) >= min(start, 0)
    landed = [k for k in range(4) if ctx.violation_ring[k].any()]
    assert landed == ([0, 1] if start == -3 else [])  # tickets -3..1: rows 0 and 1 land (tickets 0, 1)


@pytest.mark.parametrize("path", ["reference", "cpu path"])
def test_write_rows_saturate_too(path):
    launch = core_write if path == "reference" else launch_canary_write_kernel
    ctx = _preset(make_context(ring_capacity=4), SATURATED - 1)
    kwargs = write_args(write_plan([3], [-1]), [42, 7, 5], [0, 1, 2], [3, 4, 5], [99, 98, 97], [0, 1, 2])
    launch(context=ctx, **kwargs, **({} if path == "reference" else {"backend": "numpy"}))
    assert write_index(ctx) == SATURATED and not ctx.violation_ring.any()  # three token rows: one counted


def _first_rows_then_saturate(run) -> tuple[list, list]:
    """Fill a 4-row ring, jump the index to just below saturation, record more: the first rows stay."""
    ctx = make_context(ring_capacity=4)
    run(ctx, verify_plan(FIVE["slots"], FIVE["positions"], FIVE["prevs"]))
    first = ring_rows(ctx)
    _preset(ctx, SATURATED - 2)
    for _ in range(3):
        run(ctx, verify_plan([6, 7, 8], [9, 9, 9], [0, 0, 0]))
        assert write_index(ctx) == SATURATED
    return first, ring_rows(ctx)


@pytest.mark.parametrize("path", sorted(VERIFY_PATHS))
def test_the_first_rows_kept_are_never_overwritten(path):
    first, last = _first_rows_then_saturate(VERIFY_PATHS[path])
    assert len(first) == 4 and last == first


# --- the kernels (simulator, or a GPU): byte for byte against the reference --------------------


@pytest.mark.simulator
@pytest.mark.parametrize(("start", "rows"), sorted(EXPECTED))
def test_verify_kernel_saturates_as_the_reference(start, rows):
    ctx = _preset(make_context(ring_capacity=4), start)
    verify(ctx, verify_plan(FIVE["slots"], FIVE["positions"], FIVE["prevs"]))  # asserts kernels == reference
    assert write_index(ctx) == EXPECTED[start, rows]


@pytest.mark.simulator
@pytest.mark.parametrize("start", [SATURATED - 2, SATURATED, INT32_MAX])
def test_write_kernel_saturates_as_the_reference(start):
    ctx = _preset(make_context(ring_capacity=4), start)
    kwargs = write_args(write_plan([3], [-1]), [42, 7, 5], [0, 1, 2], [3, 4, 5], [99, 98, 97], [0, 1, 2])
    run_pair(ctx, "write", **kwargs)
    assert write_index(ctx) == max(start, SATURATED)


@pytest.mark.simulator
def test_kernels_keep_the_first_rows():
    def run(ctx, plan):
        verify(ctx, plan)

    first, last = _first_rows_then_saturate(run)
    assert len(first) == 4 and last == first


# --- the monitor: stats, the log, the summary ---------------------------------------------------


def _saturated_monitor(caplog, **options) -> Driver:
    d = Driver(ring_capacity=2, **options)
    d.step({1: [(101, 3), (102, 4), (103, 5)]})
    with caplog.at_level(logging.WARNING, logger="kvcanary_numba.monitor"):
        d.k[4, 0] ^= 1
        d.k[5, 0] ^= 1
        d.step({1: [(104, 6)]})  # two rows: the ring is full
        d.monitor.status.violation_write_index[0] = SATURATED - 1  # the fixture: 2**31 - 2**24 - 3 rows later
        d.step({1: [(105, 7)]})  # two more rows: one counted, then saturated
        d.step({1: [(106, 8)]})
    return d


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=pytest.mark.simulator)])
def test_a_monitor_says_saturated_in_stats_and_the_log(caplog, backend):
    d = _saturated_monitor(caplog, backend=backend)
    stats = d.monitor.stats()
    assert stats["violations_recorded"] == SATURATED and stats["violations_saturated"] is True
    assert sorted((v.slot_idx, v.step) for v in d.monitor.violations) == [(4, 1), (5, 1)]  # the first two, kept
    messages = [r.getMessage() for r in caplog.records]
    saturated = [m for m in messages if "saturated" in m]
    assert len(saturated) == 1 and f"at least {SATURATED} rows recorded, 2 kept (ring capacity 2)" in saturated[0]
    assert sum("violation ring full" in m for m in messages) == 1


def test_an_unsaturated_monitor_says_so():
    d = Driver()
    d.step({1: [(101, 3)]})
    stats = d.monitor.stats()
    assert stats["violations_recorded"] == 0 and stats["violations_saturated"] is False


@pytest.mark.parametrize(
    ("recorded", "capacity", "text"),
    [
        (0, 4, "kv-canary: 0 violation row(s) recorded, 0 kept (ring capacity 4)"),
        (9, 4, "kv-canary: 9 violation row(s) recorded, 4 kept (ring capacity 4)"),
        (-5, 4, "kv-canary: 0 violation row(s) recorded, 0 kept (ring capacity 4)"),
        (SATURATED, 4, f"kv-canary: violation count saturated: at least {SATURATED} rows recorded, 4 kept"),
    ],
)
def test_ring_summary(recorded, capacity, text):
    assert ring_summary(recorded, capacity).startswith(text)


@pytest.mark.gpu
def test_a_gpu_monitor_saturates_and_keeps_its_first_rows():
    import cupy

    if str(ROOT) not in sys.path:  # the benchmarks package of the checkout
        sys.path.insert(0, str(ROOT))
    from benchmarks.workloads import MonitorWorkload

    w = MonitorWorkload(cupy, requests=2, prefix=4, max_steps=6, bytes_per_token=64, ring_capacity=2)
    m = w.monitor
    w.prefill()
    w.k[int(w.table[1, 0]), 0] ^= 1
    w.k[int(w.table[2, 0]), 0] ^= 1
    w.step()
    w.step()  # the ring is full (two rows per step, read back a step later)
    m.status.violation_write_index[0] = SATURATED - 1
    for _ in range(3):
        w.step()
    m.flush()
    stats = m.stats()
    assert stats["violations_recorded"] == SATURATED and stats["violations_saturated"] is True
    assert len(m.violations) == 2 and {v.slot_idx for v in m.violations} == {int(w.table[1, 0]), int(w.table[2, 0])}
    assert np.array_equal(cupy.asnumpy(m.ring)[:, 1], [v.slot_idx for v in m.violations])
