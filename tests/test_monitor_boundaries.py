"""CanaryMonitor at its exact boundaries: partial launch loss, a ring filled exactly, warm-up of one step,
a sweep of exactly its capacity, the health warm-up's first check.

Each test sits on the comparison it pins (one more or one less changes the outcome), so an
off-by-one in the monitor fails here. Rejected input is in test_monitor_validation.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_code
from monitor_helpers import DECODE, PREFILL, Driver, flip_and_step

from kvcanary_numba.constants import NUM_LAUNCH_TAGS, CanaryLaunchTag
from kvcanary_numba.monitor import SlotChain
from kvcanary_numba.monitor.health import HealthChecker
from kvcanary_numba.monitor.status import Snapshot, StatusBlock

TAIL_K = int(CanaryLaunchTag.TAIL_K_FULL)


def _snapshot(step: int, ran: dict[int, int]) -> Snapshot:
    block = StatusBlock(np, 1)
    for tag, count in ran.items():
        block.kernel_run_counters[tag] = count
    return Snapshot(step, block.words.copy())


def _checker(launched_per_step: int, steps: int, *, interval: int = 1, warmup_steps: int = 0) -> HealthChecker:
    checker = HealthChecker(interval=interval, warmup_steps=warmup_steps)
    launches = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
    launches[TAIL_K] = launched_per_step
    for step in range(steps):
        checker.add(launches)
        checker.end_step(step)
    return checker


# --- health: partial loss, and the first check after warm-up --------------------------------


def test_health_counts_phases_and_other_launches_per_step():
    # The monitor counts phases (ints); host multiplies them out, and each step's counts are kept
    # as of its end: a check of an older snapshot compares what had been issued by then.
    head = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
    tail = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
    head[int(CanaryLaunchTag.HEAD_K_FULL)], tail[TAIL_K] = 2, 3
    checker = HealthChecker(interval=1, warmup_steps=0, phases=(head, tail))
    sweep = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
    sweep[int(CanaryLaunchTag.SWEEP_K_FULL)] = 1
    checker.pre += 1
    checker.post += 1
    checker.add(sweep)
    checker.end_step(0)
    checker.pre += 1
    checker.post += 1
    checker.end_step(1)
    np.testing.assert_array_equal(checker.host, 2 * head + 2 * tail + sweep)
    report = checker.check(_snapshot(0, {int(CanaryLaunchTag.HEAD_K_FULL): 2, TAIL_K: 3}))
    assert report.launched == {"HEAD_K_FULL": 2, "TAIL_K_FULL": 3, "SWEEP_K_FULL": 1}  # as of step 0
    assert report.stalled == ("SWEEP_K_FULL",)
    report = checker.check(
        _snapshot(1, {int(CanaryLaunchTag.HEAD_K_FULL): 4, TAIL_K: 6, int(CanaryLaunchTag.SWEEP_K_FULL): 1})
    )
    assert report.launched == {"HEAD_K_FULL": 2, "TAIL_K_FULL": 3} and report.ok  # since step 0


@pytest.mark.parametrize(("ran", "stalled"), [(7, True), (8, False), (9, False), (0, True)])
def test_health_flags_partial_loss_of_launches(ran, stalled):
    # 8 launches issued over the interval: one that did not run is a stall (SGLang only flags a
    # counter that did not move at all); extra device runs (e.g. a replay) are not.
    checker = _checker(4, 2, interval=2)
    report = checker.check(_snapshot(1, {TAIL_K: ran}))
    assert report is not None and report.launched == {"TAIL_K_FULL": 8}
    assert report.stalled == (("TAIL_K_FULL",) if stalled else ())


def test_health_partial_loss_through_the_monitor():
    # Two steps per check; the TAIL V launches are dropped in only one of them: half of them ran.
    d = Driver(health_interval=2, health_warmup_steps=0)
    d.step(PREFILL)
    d.step(DECODE)
    assert d.monitor.health.last.ok
    tail = d.monitor.groups[0].tail
    d.monitor.groups[0].tail = tail[:1]
    d.step({1: [(105, 7)]})
    d.monitor.groups[0].tail = tail
    d.step({1: [(106, 8)]})
    report = d.monitor.health.last
    assert (report.since_step, report.step) == (1, 3)
    assert report.stalled == ("TAIL_V_FULL",) and report.ran["TAIL_V_FULL"] == report.launched["TAIL_V_FULL"] - 2


@pytest.mark.parametrize("warmup", [0, 1, 2, 5])
def test_first_health_check_comes_when_the_warmup_steps_have_ended(warmup):
    # health_warmup_steps=W: the snapshot of step W - 1 (W steps done) is the first one checked.
    checker = _checker(1, warmup + 3, interval=1, warmup_steps=warmup)
    checked = [step for step in range(warmup + 3) if checker.check(_snapshot(step, {TAIL_K: step + 1})) is not None]
    assert checked == list(range(max(warmup - 1, 0), warmup + 3))


def test_first_health_check_through_the_monitor_after_one_warmup_step():
    d = Driver(health_interval=1, health_warmup_steps=2)
    d.step(PREFILL)
    assert d.monitor.health.last is None  # one step done: still warming up
    d.step(DECODE)
    assert d.monitor.health.last is not None and (d.monitor.health.last.since_step, d.monitor.health.last.step) == (
        -1,
        1,
    )


def test_health_interval_boundary():
    # interval=3: the first check at step 2 (3 steps since the start), the next exactly 3 steps later.
    checker = _checker(1, 6, interval=3)
    checked = [s for s in range(6) if checker.check(_snapshot(s, {TAIL_K: s + 1})) is not None]
    assert checked == [2, 5]


# --- the chain-position warm-up of one step ------------------------------------------------


def test_one_warmup_step_turns_the_chain_position_assert_on_after_the_first_step():
    d = Driver(warmup_steps=1, has_v=False)
    flag = d.monitor.enable_chain_position_assert
    assert int(flag[0]) == 0  # off while step 0 runs
    d.step(PREFILL)
    assert int(flag[0]) == 1  # on from step 1
    d.step(DECODE, positions=[9])  # a position jump after the warm-up is reported
    assert ("HEAD_K_FULL", 6, 9, ("write_position",)) in d.rows()


def test_no_warmup_has_the_assert_on_from_the_start():
    d = Driver(warmup_steps=0, has_v=False)
    assert int(d.monitor.enable_chain_position_assert[0]) == 1


# --- the violation ring filled exactly to capacity ------------------------------------------


def test_ring_filled_exactly_keeps_every_row_and_does_not_warn(caplog):
    d = Driver(ring_capacity=2, has_v=False)
    d.step(PREFILL)
    messages = flip_and_step(d, caplog, [3, 4], DECODE)  # the tail verify reports slots 3 and 4: exactly 2 rows
    assert [v.slot_idx for v in d.monitor.violations] == [3, 4]
    assert not any("violation ring full" in m for m in messages)
    messages = flip_and_step(d, caplog, [], {1: [(105, 7)]})  # two more rows: counted, not kept
    assert [v.slot_idx for v in d.monitor.violations] == [3, 4]
    assert sum("violation ring full" in m for m in messages) == 1
    assert d.monitor.stats()["violations_recorded"] == 4


# --- a sweep of exactly its capacity ------------------------------------------------------


def test_sweep_of_exactly_its_capacity_is_verified_one_more_is_rejected():
    d = Driver(has_v=False, sweep_capacity=3)
    d.step(PREFILL)
    d.k[5, 0] ^= 1
    d.monitor.sweep([SlotChain(slots=[3, 4]), SlotChain(slots=[5], start_position=2, prev_slot=4)])  # 3 slots
    d.monitor.end_step()
    assert d.rows() == [("SWEEP_K_FULL", 5, 2, ("verify_real_kv_hash",))]
    with raises_code("KVC-M004"):
        d.monitor.sweep([SlotChain(slots=[3, 4, 5, 6])])
