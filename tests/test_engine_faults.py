"""Every fault class planted into the toy engine is caught, with the expected bits at the expected slot."""

from __future__ import annotations

import pytest

from kvcanary_numba.constants import FailReason
from kvcanary_numba.engine import FAULT_CLASSES, EngineConfig, ToyEngine

F = FailReason
FAULT_STEP = 6
AFTER = 4  # steps run after the fault fired: the next verify and at least one sweep
STEPS = 16


def run(kind: str, swa_window: int):
    """Run until the fault fires (its preconditions may take a while), then AFTER more steps."""
    engine = ToyEngine(EngineConfig(seed=1, swa_window=swa_window), faults={kind: FAULT_STEP})
    monitor = engine.attach_monitor(mode="log", sweep_interval=3)
    while not engine.faults and engine.step_index < 80:
        engine.step()
    engine.run(AFTER)
    assert len(engine.faults) == 1, f"{kind} never fired"
    record = engine.faults[0]
    assert record.kind == kind and record.step >= FAULT_STEP
    assert all(v.step >= record.step for v in monitor.violations), "rows before the fault: a false positive"
    return engine, record, monitor.violations


def at(violations, slot, tag=None, step=None):
    return [
        v
        for v in violations
        if v.slot_idx == slot and (tag is None or v.tag == tag) and (step is None or v.step == step)
    ]


@pytest.fixture(params=[0, 4], ids=["full", "full+swa"])
def swa_window(request):
    return request.param


def test_token_flip_is_caught_by_both_writes_then_by_verify(swa_window):
    engine, record, rows = run("token_flip", swa_window)
    (slot,) = record.slots
    written = at(rows, slot, step=record.step)
    assert {v.tag for v in written} >= {"HEAD_K_FULL", "TAIL_K_FULL"}
    assert all(v.bits == F.WRITE_TOKEN_MISMATCH for v in written)
    assert all(v.stored_token == v.expected_token % (engine.config.vocab_size - 1) + 1 for v in written)
    later = at(rows, slot, tag="HEAD_K_FULL", step=record.step + 1)
    assert [v.bits for v in later] == [F.VERIFY_TOKEN_MISMATCH]
    if swa_window:
        assert at(rows, record.swa_slots[0], tag="TAIL_K_SWA", step=record.step)


def test_position_flip_is_caught_by_the_write_asserts_then_by_verify(swa_window):
    engine, record, rows = run("position_flip", swa_window)
    (slot,) = record.slots
    written = at(rows, slot, tag="HEAD_K_FULL", step=record.step)
    assert written and all(v.bits == F.WRITE_POSITION_MISMATCH and v.position == v.expected_aux + 1 for v in written)
    later = at(rows, slot, tag="TAIL_K_FULL", step=record.step + 1)
    assert [v.bits for v in later] == [F.VERIFY_POSITION_MISMATCH]
    if swa_window:
        assert at(rows, record.swa_slots[0], tag="HEAD_K_SWA", step=record.step)


def test_slot_reuse_is_seen_in_the_same_step_then_breaks_the_owners_chain(swa_window):
    engine, record, rows = run("slot_reuse", swa_window)
    first = record.slots[0]
    same_step = at(rows, first, tag="TAIL_K_FULL", step=record.step)
    assert [v.bits for v in same_step] == [F.VERIFY_REAL_KV_HASH_MISMATCH]  # the new owner's KV landed on it
    next_step = at(rows, first, tag="HEAD_K_FULL", step=record.step + 1)
    assert next_step and all(v.bits & F.VERIFY_CHAIN_HASH_MISMATCH for v in next_step)


def test_stale_page_hit_reads_foreign_records(swa_window):
    engine, record, rows = run("stale_page", swa_window)
    hit = [v for v in rows if v.slot_idx in record.slots and v.group == "FULL"]
    assert hit and all(
        v.bits & (F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH | F.VERIFY_REAL_KV_HASH_MISMATCH)
        for v in hit
    )
    assert any(v.bits & F.VERIFY_CHAIN_HASH_MISMATCH for v in hit)


def test_kv_byte_flip_is_only_a_real_kv_mismatch_at_that_slot(swa_window):
    engine, record, rows = run("kv_byte_flip", swa_window)
    (slot,) = record.slots
    expected_slots = {("FULL", slot)} | ({("SWA", record.swa_slots[0])} if swa_window else set())
    assert {(v.group, v.slot_idx) for v in rows} == expected_slots
    assert {v.bits for v in rows} == {F.VERIFY_REAL_KV_HASH_MISMATCH}
    assert {v.stage for v in rows} <= {"TAIL", "SWEEP"}  # HEAD has no real-KV sources
    assert min(v.step for v in rows) == record.step + 1


def test_cached_kv_flip_is_found_by_the_sweep(swa_window):
    engine, record, rows = run("cached_kv_flip", swa_window)
    (slot,) = record.slots
    swept = [v for v in rows if v.stage == "SWEEP" and v.group == "FULL"]
    assert swept and {v.slot_idx for v in swept} == {slot}
    assert {v.bits for v in swept} == {F.VERIFY_REAL_KV_HASH_MISMATCH}
    if swa_window:
        assert {v.slot_idx for v in rows if v.tag == "SWEEP_K_SWA"} == {record.swa_slots[0]}


def test_req_to_token_corruption_breaks_the_chain_and_the_seed(swa_window):
    engine, record, rows = run("req_to_token", swa_window)
    target, new_slot = record.slots
    verified = at(rows, target, tag="HEAD_K_FULL", step=record.step)
    assert len(verified) == 1 and verified[0].bits & F.VERIFY_CHAIN_HASH_MISMATCH
    seeded = at(rows, new_slot, tag="HEAD_K_FULL", step=record.step)
    assert [v.bits for v in seeded] == [F.WRITE_POSITION_MISMATCH]  # the write continued from the wrong seed


def test_every_fault_class_is_reported_by_catches():
    engine = ToyEngine(EngineConfig(seed=2), faults=list(FAULT_CLASSES), fault_step=5)
    engine.attach_monitor(sweep_interval=3)
    engine.run(STEPS)
    caught = engine.catches()
    assert set(caught) == set(FAULT_CLASSES)
    assert all(caught.values())
