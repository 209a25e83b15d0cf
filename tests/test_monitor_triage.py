"""Triage of violations: the diagnosis of each bit pattern, per fault class, and the next-step re-check."""

from __future__ import annotations

import logging

import pytest
from monitor_helpers import DECODE, PREFILL, Driver

from kvcanary_numba.constants import CanaryLaunchTag, FailReason
from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.monitor import Violation
from kvcanary_numba.monitor.triage import diagnose, recheck_row

F = FailReason
LOGGER = "kvcanary_numba.monitor"


@pytest.mark.parametrize(
    ("bits", "category"),
    [
        (F.VERIFY_CHAIN_HASH_MISMATCH, "addressing"),
        (F.VERIFY_POSITION_MISMATCH, "addressing"),
        (F.VERIFY_TOKEN_MISMATCH, "addressing"),
        (F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_REAL_KV_HASH_MISMATCH, "addressing"),  # record and KV both foreign
        (F.VERIFY_REAL_KV_HASH_MISMATCH, "data_corruption"),
        (F.WRITE_TOKEN_MISMATCH, "write_path"),
        (F.WRITE_POSITION_MISMATCH, "write_path"),
        (F.SLOT_OUT_OF_RANGE, "out_of_range"),
        (F.PREV_SLOT_OUT_OF_RANGE | F.VERIFY_POSITION_MISMATCH, "out_of_range"),
        (F.WRITE_RANGE_OUT_OF_BOUNDS, "out_of_range"),
        (1 << 20, "unknown"),
    ],
)
def test_diagnosis_follows_the_bits(bits, category):
    assert diagnose(int(bits), "TAIL_K_FULL").category == category


def test_causes_name_the_likely_bug():
    assert "reused" in diagnose(int(F.VERIFY_POSITION_MISMATCH)).cause
    assert "req_to_token" in diagnose(int(F.VERIFY_CHAIN_HASH_MISMATCH)).cause
    assert "sweep" in diagnose(int(F.VERIFY_CHAIN_HASH_MISMATCH), "SWEEP_K_FULL").cause
    assert "prefix-cache" in diagnose(int(F.VERIFY_TOKEN_MISMATCH)).cause
    assert "write offsets" in diagnose(int(F.WRITE_RANGE_OUT_OF_BOUNDS)).cause


def _row(bits, *, position=5, expected_token=7, aux=99):
    return Violation(int(CanaryLaunchTag.TAIL_K_FULL), 3, position, 7, expected_token, 11, aux, int(bits))


@pytest.mark.parametrize(
    ("bits", "record", "live", "expected"),
    [
        (F.VERIFY_CHAIN_HASH_MISMATCH, (7, 5, 11, 0), None, "persistent"),  # prev_hash 11 != expected 99
        (F.VERIFY_CHAIN_HASH_MISMATCH, (7, 5, 99, 0), None, "transient"),
        (F.VERIFY_POSITION_MISMATCH, (7, 5, 0, 0), None, "persistent"),  # the foreign record is still there
        (F.VERIFY_POSITION_MISMATCH, (7, 6, 0, 0), None, "transient"),
        (F.VERIFY_REAL_KV_HASH_MISMATCH, (7, 5, 0, 42), 43, "persistent"),
        (F.VERIFY_REAL_KV_HASH_MISMATCH, (7, 5, 0, 42), 42, "transient"),
        (F.VERIFY_TOKEN_MISMATCH, (8, 5, 0, 0), None, "persistent"),
        (F.WRITE_TOKEN_MISMATCH, (7, 5, 0, 0), None, "transient"),
        (F.WRITE_POSITION_MISMATCH, (7, 5, 0, 0), None, "persistent"),  # expected position 99
    ],
)
def test_recheck_re_evaluates_the_rows_comparison(bits, record, live, expected):
    assert recheck_row(_row(bits), record, live) == expected


def _flip_and_step(restore: bool):
    d = Driver()
    d.step(PREFILL)
    d.k[4, 0] ^= 0xFF
    d.step(DECODE)  # TAIL verify sees slot 4's KV changed
    rows = list(d.monitor.violations)
    assert [(v.tag, v.slot_idx, v.bits, v.persistence) for v in rows] == [
        ("TAIL_K_FULL", 4, F.VERIFY_REAL_KV_HASH_MISMATCH, "pending")
    ]
    if restore:
        d.k[4, 0] ^= 0xFF
    return d, rows[0]


@pytest.mark.parametrize(("restore", "expected"), [(False, "persistent"), (True, "transient")])
def test_next_step_marks_a_kv_flip_persistent_or_transient(restore, expected, caplog):
    d, _ = _flip_and_step(restore)
    with caplog.at_level(logging.INFO, logger=LOGGER):  # the re-check line is INFO (detail)
        d.step({1: [(105, 7)]})
    first = d.monitor.violations[0]
    assert first.persistence == expected and first.diagnosis.category == "data_corruption"
    assert f"TAIL_K_FULL slot 4 position 1 is {expected} (data_corruption)" in caplog.text
    assert f"triage: data_corruption ({expected})" in first.describe()
    assert first.to_dict()["persistence"] == expected


def test_the_debug_detail_of_a_new_row_carries_its_triage(caplog):
    d = Driver()
    d.step(PREFILL)
    d.k[4, 0] ^= 0xFF
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        d.step(DECODE)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and r.name == LOGGER]
    assert any("triage: data_corruption (pending): the KV bytes of the slot changed" in m for m in debug)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert warned == [d.monitor.violations[0].summary()]  # one line per row at WARNING


@pytest.mark.parametrize(
    ("kind", "categories"),
    [
        ("token_flip", {"write_path", "addressing"}),
        ("position_flip", {"write_path", "addressing"}),
        ("slot_reuse", {"data_corruption", "addressing"}),
        ("kv_byte_flip", {"data_corruption"}),
        ("cached_kv_flip", {"data_corruption"}),
        ("req_to_token", {"addressing", "write_path"}),
        ("stale_page", {"addressing"}),
    ],
)
def test_every_fault_class_gets_its_diagnosis_and_a_recheck(kind, categories):
    engine = ToyEngine(EngineConfig(seed=1), faults={kind: 6})
    monitor = engine.attach_monitor(mode="log", sweep_interval=3)
    while not engine.faults and engine.step_index < 80:
        engine.step()
    engine.run(5)
    caught = [v for hits in engine.catches().values() for v in hits]
    assert caught
    assert {v.diagnosis.category for v in caught} >= categories
    assert {v.diagnosis.category for v in caught} <= categories | {"data_corruption"}
    # Every row but the last readback's has been re-checked a step later.
    last = max(v.step for v in monitor.violations)
    assert all(v.persistence in ("persistent", "transient") for v in monitor.violations if v.step < last)


def test_demo_report_shows_the_triage_of_the_first_catch():
    from kvcanary_numba.engine.demo import format_report, report_dict, run_demo

    config = EngineConfig(seed=0)
    runs = run_demo(steps=20, faults=["kv_byte_flip", "token_flip"], device="cpu", config=config)
    text = format_report(runs, device="cpu", config=config)
    assert "  triage:   data_corruption (" in text and "  triage:   write_path (" in text
    first = report_dict(runs, device="cpu", config=config)["runs"][1]["first_catch"]
    assert first["category"] == "data_corruption" and first["persistence"] in ("persistent", "transient")


def test_slot_reuse_first_row_is_flagged_rewritten_a_kv_flip_is_not():
    def first_catch(kind):
        engine = ToyEngine(EngineConfig(seed=1), faults={kind: 6})
        engine.attach_monitor(mode="log")
        engine.run(12)
        return engine.catches()[kind][0]

    reuse = first_catch("slot_reuse")
    assert reuse.bits == F.VERIFY_REAL_KV_HASH_MISMATCH and reuse.rewritten  # the new owner's record landed
    assert "slot reuse" in reuse.diagnosis.cause and "slot rewritten" in reuse.describe()
    d, _ = _flip_and_step(restore=False)
    d.step({1: [(105, 7)]})
    flip = d.monitor.violations[0]
    assert flip.persistence == "persistent" and not flip.rewritten and "slot reuse" not in flip.diagnosis.cause


def test_rewritten_compares_the_record_the_row_saw():
    from kvcanary_numba.monitor.triage import rewritten

    row = _row(F.VERIFY_REAL_KV_HASH_MISMATCH)  # stored token 7, position 5, chain 11
    assert not rewritten(row, (7, 5, 11, 0)) and rewritten(row, (7, 6, 11, 0)) and rewritten(row, (8, 5, 11, 0))
    assert not rewritten(_row(F.WRITE_TOKEN_MISMATCH), (1, 2, 3, 4))  # write rows hold no stored record
