"""The toy engine's KV in transit: the host tier, the prefill -> decode pair and their planted faults.

A clean run offloads and reloads prefixes (or hands requests over) and must stay silent, with
the reloaded KV equal to the bytes the toy model gives its tokens (``kv_bytes``, computed here
again) and the records where the page table says. Each transit fault must be reported at the
slots it hit with the bits its class names; a pair's hand-off digest must mark exactly the
faulted request as a miss.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import SIMULATOR
from helpers import raises_code

from kvcanary_numba.constants import FailReason
from kvcanary_numba.engine import TRANSIT_FAULT_CLASSES, EngineConfig, EnginePair, ToyEngine
from kvcanary_numba.engine.memory import kv_bytes
from kvcanary_numba.engine.transit import LANDING_FAULTS

F = FailReason
STEPS = 40
PAIR_FAULTS = ("host_bit_flip", *LANDING_FAULTS)


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR, logger="kvcanary_numba")


def host_tier_run(fault=None, *, config=None, steps=STEPS, **monitor_options) -> ToyEngine:
    engine = ToyEngine(config or EngineConfig(seed=2), faults={fault: 8} if fault else {}, host_tier=0)
    engine.attach_monitor(mode="log", sweep_interval=4, **monitor_options)
    engine.run(steps)
    return engine


def test_a_clean_host_tier_run_moves_prefixes_both_ways_and_reports_nothing():
    engine = host_tier_run()
    tier, monitor = engine.host_tier, engine.monitor
    assert tier.offloads >= 3 and tier.reloads >= 3 and engine.sched.prefix_hits >= 3
    assert monitor.violations == []
    # Every prefix in the pool holds its tokens' bytes (the toy model's, computed again) and its records.
    records = monitor.groups[0].buffers["TAIL", "K"].view(np.int64)
    for entry in engine.sched.entries.values():
        slots, n = np.asarray(entry.slots), len(entry.tokens)
        want = kv_bytes(np.asarray(entry.tokens), np.arange(n), 0, engine.config.bytes_per_token)
        np.testing.assert_array_equal(engine.kv.k[0].reshape(-1, engine.config.bytes_per_token)[slots], want)
        assert records[slots, 0].tolist() == entry.tokens and records[slots, 1].tolist() == list(range(n))


def test_reloads_land_in_other_pages_than_they_left():
    engine = ToyEngine(EngineConfig(seed=2), host_tier=0)
    engine.attach_monitor()
    left, landed = {}, []
    offload, reload = engine.host_tier.offload, engine.host_tier.reload

    def spy_offload(entry, step):
        left[entry.prefix_id] = set(entry.pages)
        offload(entry, step)

    def spy_reload(prefix_id):
        entry = reload(prefix_id)
        if entry is not None:
            landed.append(not set(entry.pages) & left[prefix_id])
        return entry

    engine.host_tier.offload, engine.sched.reload = spy_offload, spy_reload
    engine.run(STEPS)
    assert landed and all(landed)


@pytest.mark.parametrize("fault", list(TRANSIT_FAULT_CLASSES))
def test_each_transit_fault_of_the_host_tier_is_caught_where_it_hit(fault):
    engine = host_tier_run(fault)
    (record,) = engine.faults
    caught = engine.catches()[fault]
    assert caught, f"{fault} fired at step {record.step}, slots {record.slots}, and was missed"
    assert {v.slot_idx for v in caught} <= set(record.slots)
    bits = 0
    for v in caught:
        bits |= v.bits
    expected = {
        "host_bit_flip": F.VERIFY_REAL_KV_HASH_MISMATCH,
        "stale_host_copy": F.VERIFY_TOKEN_MISMATCH,  # another prefix's self-consistent records and KV
        "pages_swapped": F.VERIFY_POSITION_MISMATCH,
        "page_missing": F.VERIFY_POSITION_MISMATCH,
        "records_left_behind": F.VERIFY_POSITION_MISMATCH,
        "wrong_reload_slots": F.VERIFY_POSITION_MISMATCH,
    }[fault]
    assert bits & expected


def test_transit_faults_need_a_full_only_pool_and_known_names():
    with raises_code("KVC-C009"):
        ToyEngine(EngineConfig(swa_window=4), faults=["host_bit_flip"])
    with raises_code("KVC-E001"):
        ToyEngine(faults=["host_bit_rot"])
    with raises_code("KVC-E001"):
        EnginePair(fault="stale_host_copy")  # the pair has no host memory to reuse


def test_a_clean_pair_hands_requests_over_silently():
    pair = EnginePair(EngineConfig(seed=3), sweep_interval=4)
    pair.run(30)
    assert [m.violations for m in pair.monitors] == [[], []]
    assert len(pair.handoffs) >= 10 and pair.misses == [] and pair.decode.sched.finished >= 5
    assert pair.prefill.sched.running == [] or all(r.kv_len < r.prompt_len for r in pair.prefill.sched.running)


@pytest.mark.parametrize("fault", PAIR_FAULTS)
def test_a_fault_in_a_hand_off_is_a_digest_miss_and_a_decode_violation(fault):
    pair = EnginePair(EngineConfig(seed=3), fault=fault, fault_step=4, sweep_interval=4)
    pair.run(20)
    (record,) = pair.faults
    assert [step for step, _ in pair.misses] == [record.step]  # exactly the faulted request
    assert pair.monitors[0].violations == []  # the prefill side sent it intact
    assert pair.decode.catches()[fault]


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATOR, reason="drives the toy engine's NumPy pool through the kernels")
@pytest.mark.parametrize("fault", ["records_left_behind", "host_bit_flip"])
def test_transit_faults_are_caught_by_the_kernels(fault):
    config = EngineConfig(seed=2, max_running=2, num_pages=24, max_prompt_len=8, max_new_tokens=4)
    engine = ToyEngine(config, faults={fault: 2}, host_tier=0)
    engine.attach_monitor(mode="log", backend="cuda", prepared=False)
    while not engine.faults and engine.step_index < 30:
        engine.step()
    engine.run(2)
    assert engine.faults and engine.catches()[fault]
