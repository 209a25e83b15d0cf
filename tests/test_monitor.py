"""CanaryMonitor on hand-driven steps: buffers, counters, reports, modes, warm-up, health, sweeps, SWA, GPU readback.

Rejected input is in test_monitor_validation.py.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from monitor_helpers import DECODE, NUM_SLOTS, PREFILL, Driver, flip_and_step, monitor_records, source, token_bytes

from kvcanary_numba.constants import CANARY_CHAIN_HEAD, CanaryLaunchTag
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed
from kvcanary_numba.monitor import CanaryMonitor, CanaryStalledError, CanaryViolationError, KvGroup, SlotChain
from kvcanary_numba.monitor.status import Snapshot, StatusBlock

T = CanaryLaunchTag
LOGGER = "kvcanary_numba.monitor"


def hand_chain(tokens: list[int]) -> list[int]:
    """prev_hash stored at each position of a chain written from the anchor (independent of the package)."""
    out, h = [], CANARY_CHAIN_HEAD
    for position, token in enumerate(tokens):
        out.append(to_signed(h))
        h = splitmix64_mix3(h, token, position)
    return out


def hand_fingerprint(data: np.ndarray) -> int:
    """One ALL-mode source: fold the little-endian words, then fold the source result once more."""
    acc = 0
    for word in data.view("<u8"):
        acc = splitmix64(acc ^ int(word))
    return to_signed(splitmix64(acc))


def test_clean_steps_write_the_hand_computed_records_and_count_every_launch():
    d = Driver()
    d.step(PREFILL)
    d.step(DECODE)
    m = d.monitor
    assert m.violations == []
    tokens = [101, 102, 103, 104]
    for stage in ("HEAD", "TAIL"):
        rec = monitor_records(m.groups[0].buffers[stage, "K"])[3:7]
        np.testing.assert_array_equal(rec[:, 0], tokens)
        np.testing.assert_array_equal(rec[:, 1], [0, 1, 2, 3])
        np.testing.assert_array_equal(rec[:, 2], hand_chain(tokens))
    assert (monitor_records(m.groups[0].buffers["HEAD", "K"])[:, 3] == 0).all()  # HEAD: KV not yet written
    tail = monitor_records(m.groups[0].buffers["TAIL", "K"])
    assert [int(x) for x in tail[3:7, 3]] == [hand_fingerprint(token_bytes(t, 0)) for t in tokens]
    tail_v = monitor_records(m.groups[0].buffers["TAIL", "V"])
    assert int(tail_v[6, 3]) == hand_fingerprint(token_bytes(104, 1))
    stats = m.stats()
    # Per K/V and HEAD/TAIL: step 0 writes 3 entries, step 1 verifies 3 and writes 1.
    assert stats["protected_tokens"] == 4 * (3 + 4)
    assert stats["kernel_runs"] == 2 * 4 * 2  # 2 steps x 4 endpoints x (verify + write)
    assert stats["step"] == 2 and stats["violations_recorded"] == 0


def test_kv_byte_flip_is_reported_by_the_tail_verify_only():
    d = Driver()
    d.step(PREFILL)
    d.k[4, 5] ^= 0x10
    d.step(DECODE)
    assert d.rows() == [("TAIL_K_FULL", 4, 1, ("verify_real_kv_hash",))]
    v = d.monitor.violations[0]
    assert v.stored_chain_hash == v.expected_aux == hand_chain([101, 102])[1] == 0x542FE5061275A6AB
    assert (v.stored_token, v.expected_token, v.step) == (102, -1, 1)  # -1: no expected-token pool


@pytest.mark.parametrize("has_v", [True, False])
def test_v_half_is_guarded_only_when_enabled(has_v):
    d = Driver(has_v=has_v)
    d.step(PREFILL)
    d.v[5, 0] ^= 1
    d.step(DECODE)
    assert d.rows() == ([("TAIL_V_FULL", 5, 2, ("verify_real_kv_hash",))] if has_v else [])
    ran_v = d.monitor.stats()["kernel_runs"]
    assert ran_v == (16 if has_v else 8)


def test_raise_mode_raises_once_with_every_row_of_the_readback():
    d = Driver(mode="raise")
    d.step(PREFILL)
    d.k[3, 0] ^= 1
    d.k[5, 0] ^= 1
    with pytest.raises(CanaryViolationError) as info:
        d.step(DECODE)
    assert [v.slot_idx for v in info.value.violations] == [3, 5]
    assert str(info.value).splitlines()[1] == info.value.violations[0].summary()
    assert isinstance(info.value, RuntimeError)
    d.k[6, 0] ^= 1
    d.step({1: [(105, 7)]})  # later rows are collected, not raised again
    assert [v.slot_idx for v in d.monitor.violations] == [3, 5, 3, 5, 6]


def test_log_mode_logs_one_line_per_row_and_the_detail_at_debug(caplog):
    d = Driver(mode="log")
    d.step(PREFILL)
    d.k[4, 0] ^= 1
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        d.step(DECODE)
        d.k[4, 0] ^= 1  # restored: the next step re-checks the row (INFO, not shown at WARNING)
        d.step({1: [(105, 7)]})
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages == [d.monitor.violations[0].summary()]
    caplog.clear()
    d.k[3, 0] ^= 1
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        d.step({1: [(106, 8)]})
    found = d.monitor.violations[1]
    levels = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert ("WARNING", found.summary()) in levels and ("DEBUG", found.describe()) in levels
    assert "why: verify_real_kv_hash:" in found.describe()


def test_chain_position_assert_is_off_during_warmup_then_on():
    d = Driver(warmup_steps=2)
    flag = d.monitor.enable_chain_position_assert
    d.step(PREFILL)
    assert int(flag[0]) == 0
    d.step(DECODE, positions=[9])  # warm-up: a position jump the write assert would flag is let through
    assert d.rows() == [] and int(flag[0]) == 1
    d.step({1: [(105, 7)]})
    got = {(tag, slot, reasons) for tag, slot, _, reasons in d.rows()}
    assert got == {
        (tag, 6, ("verify_position",)) for tag in ("HEAD_K_FULL", "HEAD_V_FULL", "TAIL_K_FULL", "TAIL_V_FULL")
    } | {(tag, 7, ("write_position",)) for tag in ("HEAD_K_FULL", "HEAD_V_FULL", "TAIL_K_FULL", "TAIL_V_FULL")}
    write_row = next(v for v in d.monitor.violations if v.is_write)
    assert (write_row.position, write_row.expected_aux) == (4, 10)  # seed stored 9, so 10 was expected


def test_write_input_assert_reports_the_token_the_oracle_expected():
    d = Driver(has_v=False)
    d.step(PREFILL)
    d.step(DECODE, fed_tokens=[999], expected=[104])
    assert d.rows() == [("HEAD_K_FULL", 6, 3, ("write_token",)), ("TAIL_K_FULL", 6, 3, ("write_token",))]
    assert {(v.stored_token, v.expected_token) for v in d.monitor.violations} == {(999, 104)}


def test_expected_token_pool_catches_a_wrong_token_on_the_next_verify():
    d = Driver(has_v=False, check_verify_expected_token=True, max_requests=4, max_context_len=16)
    d.step(PREFILL)
    d.step(DECODE, fed_tokens=[999])  # the request's token list still says 104
    assert d.rows() == []  # no oracle for the write: nothing yet
    d.step({1: [(105, 7)]})
    assert d.rows() == [("HEAD_K_FULL", 6, 3, ("verify_token",)), ("TAIL_K_FULL", 6, 3, ("verify_token",))]
    assert {(v.stored_token, v.expected_token) for v in d.monitor.violations} == {(999, 104)}


def test_plan_overflow_warns_and_skips_verify(caplog):
    d = Driver(verify_capacity=2)
    d.step(PREFILL)
    d.k[4, 0] ^= 1
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        d.step(DECODE)  # 3 prefix entries > capacity 2
    assert d.rows() == []
    assert any("overflowed verify_capacity=2" in r.getMessage() for r in caplog.records)


def test_plan_overflow_warns_only_for_steps_that_planned(caplog):
    d = Driver(verify_capacity=2)
    d.step(PREFILL)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        d.step(DECODE)  # overflows: the plan lane's enable stays 0 after it
        for _ in range(5):  # steps with no forward: their snapshots show the stale lane, no plan ran
            d.monitor.end_step()
    warned = [r.getMessage() for r in caplog.records if "overflowed" in r.getMessage()]
    assert len(warned) == 1 and "at step 1 " in warned[0]


def test_full_ring_keeps_the_first_rows_and_warns_once(caplog):
    d = Driver(ring_capacity=1, has_v=False)
    d.step(PREFILL)
    messages = flip_and_step(d, caplog, [3, 4], DECODE, {1: [(105, 7)]})
    assert [v.slot_idx for v in d.monitor.violations] == [3]
    assert sum("violation ring full" in m for m in messages) == 1


@pytest.mark.parametrize("mode", ["raise", "log"])
def test_health_check_notices_a_launch_that_stopped_running(mode, caplog):
    d = Driver(mode=mode, health_interval=2, health_warmup_steps=0)
    d.step(PREFILL)
    d.step(DECODE)
    assert d.monitor.health.last.ok and d.monitor.health.last.launched["TAIL_V_FULL"] == 4
    d.monitor.groups[0].tail = d.monitor.groups[0].tail[:1]  # the TAIL V launch silently disappears
    d.step({1: [(105, 7)]})
    if mode == "raise":
        with pytest.raises(CanaryStalledError) as info:
            d.step({1: [(106, 8)]})
        report = info.value.report
    else:
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            d.step({1: [(106, 8)]})
        report = d.monitor.health.last
        assert any("TAIL_V_FULL ran 0 of 4" in r.getMessage() for r in caplog.records)
    assert report.stalled == ("TAIL_V_FULL",)
    assert (report.since_step, report.step) == (1, 3)


def test_sweep_finds_corruption_in_a_chain_no_request_touches():
    d = Driver(has_v=False)
    d.step(PREFILL)
    d.step({2: [(201, 9)]})  # request 1 is idle (cached): per-step verify never looks at it
    d.k[4, 0] ^= 1
    d.step({2: [(202, 10)]}, sweep=[SlotChain(slots=[3, 4, 5])])
    assert d.rows() == [("SWEEP_K_FULL", 4, 1, ("verify_real_kv_hash",))]
    assert d.monitor.sweeps == 1


def test_sweep_chain_from_the_middle_needs_the_right_predecessor():
    d = Driver(has_v=False)
    d.step(PREFILL)
    d.monitor.sweep([SlotChain(slots=[4, 5], start_position=1, prev_slot=3)])
    d.monitor.sweep([SlotChain(slots=[5], start_position=2, prev_slot=0)])  # 0: chain check skipped
    d.monitor.sweep([SlotChain(slots=[5], start_position=2, prev_slot=3)])  # wrong predecessor
    d.monitor.end_step()
    assert d.rows() == [("SWEEP_K_FULL", 5, 2, ("verify_chain_hash",))]


def test_swa_group_translates_slots_and_verifies_only_the_window():
    d = Driver(has_v=False, swa_window=2)
    d.step(PREFILL)
    swa_tail = monitor_records(d.monitor.groups[1].buffers["TAIL", "K"])
    np.testing.assert_array_equal(swa_tail[4:7, 0], [101, 102, 103])  # FULL slots 3..5 -> SWA 4..6
    d.swa_k[4, 0] ^= 1  # position 0: outside the window of the next step
    d.swa_k[6, 0] ^= 1  # position 2: inside
    d.step(DECODE)
    assert d.rows() == [("TAIL_K_SWA", 6, 2, ("verify_real_kv_hash",))]
    d.monitor.sweep([SlotChain(slots=[3, 4, 5, 6])])
    d.monitor.end_step()
    assert {(t, s) for t, s, _, _ in d.rows(1)} == {("SWEEP_K_SWA", 4), ("SWEEP_K_SWA", 6)}


def test_status_block_views_alias_one_array():
    block = StatusBlock(np, num_groups=2)
    block.violation_write_index[0] = 7
    block.kernel_run_counters[T.TAIL_V_SWA] = 5
    block.slot_run_counters[T.HEAD_K_FULL] = 11
    block.plan_lanes[1][0] = 0
    block.plan_lanes[0][0] = 1
    snap = Snapshot(3, block.words.copy())
    assert snap.write_index == 7
    assert snap.kernel_run_counters[T.TAIL_V_SWA] == 5 and snap.slot_run_counters[0] == 11
    assert (snap.plan_enable(0), snap.plan_enable(1)) == (1, 0)


@pytest.mark.gpu
def test_gpu_readback_is_one_step_late_and_flush_catches_up():
    import cupy

    d = Driver(has_v=False)  # host bookkeeping; the monitor below runs on the GPU
    d.k = cupy.asarray(d.k)
    d.monitor = CanaryMonitor(
        full=KvGroup(kind="full", num_slots=NUM_SLOTS, k_sources=(source(d.k),), has_v=False),
        device="cuda",
        write_req_capacity=3,
        health_interval=0,
    )
    host = d.batch(PREFILL)  # built on the host, then moved whole (a batch is of one array kind)
    names = (
        "req_pool_indices",
        "prefix_lens",
        "extend_seq_lens",
        "req_to_token",
        "input_ids",
        "positions",
        "out_cache_loc",
        "token_ids_flat",
        "token_offsets",
    )
    batch = dataclasses.replace(
        host,
        expected_input_tokens=None,
        expected_input_positions=None,
        **{name: cupy.asarray(getattr(host, name)) for name in names},
    )
    with d.monitor.forward(batch):
        d.k[3:6] = 1
    d.monitor.end_step()
    d.k[4, 0] ^= 1
    d.monitor.sweep([SlotChain(slots=[3, 4, 5])])
    d.monitor.end_step()  # reads back step 0: clean
    assert d.monitor.violations == []
    d.monitor.flush()
    assert d.rows() == [("SWEEP_K_FULL", 4, 1, ("verify_real_kv_hash",))]


def test_swa_translation_follows_the_plan_rules():
    from kvcanary_numba.constants import OUT_OF_RANGE_SLOT

    d = Driver(has_v=False, swa_window=2)
    group = d.monitor.groups[1]
    loc = np.array([3, -1, 15, NUM_SLOTS + 1, 0], dtype=np.int64)
    got = group.translate_loc(np, loc, len(loc))
    # 3 -> 4 (LUT), negative passes through, 15 -> 0 (not resident), past the LUT -> out of range, 0 -> 0
    np.testing.assert_array_equal(got, [4, -1, 0, OUT_OF_RANGE_SLOT, 0])
    assert np.shares_memory(got, group.loc_scratch[0])  # scratch, no per-step allocation
    assert d.monitor.groups[0].translate_loc(np, loc, 5) is loc  # FULL: the engine's own array
