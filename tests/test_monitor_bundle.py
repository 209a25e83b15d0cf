"""Violation bundles: what they hold, their replay on the NumPy path (and the simulator), `kvcanary inspect`."""

from __future__ import annotations

import os

import numpy as np
import pytest
from monitor_helpers import DECODE, PREFILL, Driver, monitor_records

from kvcanary_numba import cli
from kvcanary_numba.constants import FailReason
from kvcanary_numba.engine import FAULT_CLASSES, EngineConfig, ToyEngine
from kvcanary_numba.errors import KvCanaryError
from kvcanary_numba.monitor import CanaryViolationError
from kvcanary_numba.monitor.bundle import BUNDLE_KEYS, load_bundle
from kvcanary_numba.monitor.replay import explain_bundle, replay_bundle

F = FailReason


def _kv_flip(tmp_path, **options):
    d = Driver(bundle_dir=tmp_path / "bundles", **options)
    d.step(PREFILL)
    d.k[4, 0] ^= 0xFF
    return d


def test_bundle_holds_rows_entries_records_and_kv_bytes_of_the_slots(tmp_path):
    d = _kv_flip(tmp_path)
    d.step(DECODE)
    (path,) = d.monitor.bundles
    b = load_bundle(path)
    assert set(BUNDLE_KEYS) <= set(b) and all(isinstance(b[k], np.ndarray) for k in BUNDLE_KEYS if k != "config")
    v = d.monitor.violations[0]
    np.testing.assert_array_equal(b["rows"], [[v.kernel_kind, 4, 1, 102, -1, v.stored_chain_hash, v.expected_aux, 4]])
    tag = v.kernel_kind
    # The TAIL plan verified slots 3, 4, 5 (positions 0..2) with predecessors -1, 3, 4; slot 4 is the one.
    np.testing.assert_array_equal(b["entries"], [[tag, 4, 1, 3, -1]])
    assert b["entry_origin"].tolist() == [0]
    tail = monitor_records(d.monitor.groups[0].buffers["TAIL", "K"])
    np.testing.assert_array_equal(b["records"], [[tag, 3, *tail[3]], [tag, 4, *tail[4]]])
    np.testing.assert_array_equal(b["kv"][:, 0, :], d.k[[3, 4]])  # ALL mode: the 32 bytes of K
    assert b["kv_lengths"].tolist() == [[32, 0, 0, 0], [32, 0, 0, 0]]
    assert b["config"]["num_slots"] == {"FULL": 16} and b["config"]["step"] == 1


def test_replay_reproduces_the_row_field_for_field(tmp_path):
    d = _kv_flip(tmp_path)
    d.step(DECODE)
    r = replay_bundle(d.monitor.bundles[0])
    assert [v.to_dict()["summary"] for v in r.replayed] == [v.summary() for v in d.monitor.violations]
    assert r.reproduced(r.recorded[0])


@pytest.mark.parametrize("check_tokens", [True, False])
def test_a_slot_in_several_plan_entries_keeps_each_entrys_own_expected_token(tmp_path, check_tokens):
    # A trampled page-table entry makes slot 2 (position 0 of a shared prompt) position 13 of another
    # request too: the plan verifies it three times, with two different expected tokens. Each bundle
    # entry carries its plan entry's token (-1 when the monitor checks no tokens), so the replay
    # fails only where the engine's verify did.
    engine = ToyEngine(EngineConfig(seed=1), faults={"req_to_token": 6})
    monitor = engine.attach_monitor(mode="log", bundle_dir=tmp_path, check_tokens=check_tokens)
    engine.run(10)
    b = load_bundle(monitor.bundles[0])
    recorded = b["rows"]
    plan_slot = b["entry_origin"] == 0
    slots = b["entries"][plan_slot, 1]
    assert np.any(np.unique(slots, return_counts=True)[1] > 1), "the scenario must verify one slot twice"
    tokens = {int(x) for _, s, _, _, x in b["entries"][plan_slot] if s == 2}
    assert len(tokens) > 1 if check_tokens else tokens == {-1}  # one slot, two expected tokens
    replay = replay_bundle(b)
    of_slot_2 = lambda rows: sorted(v.summary() for v in rows if v.slot_idx == 2)  # noqa: E731
    assert of_slot_2(replay.replayed) == of_slot_2(replay.recorded) and of_slot_2(replay.recorded)
    assert len(replay.replayed) == recorded.shape[0]  # a row per recorded row (write rows: their verify twins)
    assert all(replay.reproduced(v) for v in replay.recorded)


@pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="replays build NumPy arrays: kernels need the simulator"
)
def test_replay_on_the_simulator_equals_the_numpy_replay(tmp_path):
    d = _kv_flip(tmp_path)
    d.step(DECODE)
    numpy_rows = [v.summary() for v in replay_bundle(d.monitor.bundles[0]).replayed]
    assert [v.summary() for v in replay_bundle(d.monitor.bundles[0], backend="cuda").replayed] == numpy_rows


def test_restored_kv_replays_clean(tmp_path):
    d = _kv_flip(tmp_path)
    d.step(DECODE)
    b = load_bundle(d.monitor.bundles[0])
    b["kv"][1, 0, 0] ^= 0xFF  # undo the flip inside the bundle: nothing left to find
    r = replay_bundle(b)
    assert r.replayed == [] and not r.reproduced(r.recorded[0])


def test_raise_mode_writes_the_bundle_before_raising(tmp_path):
    d = _kv_flip(tmp_path, mode="raise")
    with pytest.raises(CanaryViolationError):
        d.step(DECODE)
    assert len(d.monitor.bundles) == 1 and d.monitor.bundles[0].exists()


def _run_fault(kind, tmp_path):
    engine = ToyEngine(EngineConfig(seed=1), faults={kind: 6})
    monitor = engine.attach_monitor(mode="log", sweep_interval=3, bundle_dir=tmp_path)
    while not engine.faults and engine.step_index < 80:
        engine.step()
    engine.run(4)
    return engine, monitor


@pytest.mark.parametrize("kind", list(FAULT_CLASSES))
def test_every_fault_class_round_trips_through_a_bundle(kind, tmp_path):
    engine, monitor = _run_fault(kind, tmp_path)
    (record,) = engine.faults
    replays = [replay_bundle(p) for p in monitor.bundles]
    recorded = [v for r in replays for v in r.recorded]
    assert [v.summary() for v in recorded] == [v.summary() for v in monitor.violations]
    assert [v.step for v in recorded] == [v.step for v in monitor.violations]
    # Some bundle shows the fault again when replayed: a catching row at the fault's slot, reproduced.
    assert any(record.caught_by(v) and r.reproduced(v) for r in replays for v in r.recorded)
    text = explain_bundle(monitor.bundles[0])
    assert "triage:" in text and "replay:" in text


def test_inspect_prints_the_triage_and_the_replay(tmp_path, capsys):
    d = _kv_flip(tmp_path)
    d.step(DECODE)
    assert cli.main(["inspect", str(d.monitor.bundles[0])]) == 0
    out = capsys.readouterr().out
    assert "triage:     data_corruption: the KV bytes of the slot changed" in out
    assert "replay:     reproduced" in out
    assert "replay (verify on the NumPy path over the bundle): 1 row(s)" in out


def _bad_files(tmp_path):
    text = tmp_path / "log.npz"
    text.write_text("kv_canary violation: ...")
    partial = tmp_path / "partial.npz"
    np.savez(partial, rows=np.zeros((0, 8), np.int64))
    d = _kv_flip(tmp_path)
    d.step(DECODE)
    b = dict(np.load(d.monitor.bundles[0]))
    newer = tmp_path / "newer.npz"
    np.savez(newer, **{**b, "config": np.array(str(b["config"]).replace('"format": 1', '"format": 9'))})
    shape = tmp_path / "shape.npz"
    np.savez(shape, **{**b, "entries": np.zeros((2, 3), np.int64)})
    return {"missing": tmp_path / "nope.npz", "text": text, "partial": partial, "newer": newer, "shape": shape}


@pytest.mark.parametrize(
    ("case", "code", "reason"),
    [
        ("missing", "KVC-M020", "cannot be read (No such file or directory)"),
        ("text", "KVC-M020", "not a zip archive"),
        ("partial", "KVC-M020", "missing row_steps"),
        ("newer", "KVC-M020", "format 9"),
        ("shape", "KVC-M033", "entries has shape (2, 3)"),
    ],
)
def test_a_bad_bundle_file_is_rejected_with_its_code(case, code, reason, tmp_path, capsys):
    path = _bad_files(tmp_path)[case]
    with pytest.raises(KvCanaryError) as info:
        load_bundle(path)
    assert info.value.code == code and reason in str(info.value)
    assert cli.main(["inspect", str(path)]) == 2
    assert code in capsys.readouterr().err


def test_a_bundle_dir_that_is_a_file_is_rejected_with_m022(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(KvCanaryError) as info:
        Driver(bundle_dir=blocker)
    assert info.value.code == "KVC-M022"


def test_write_rows_without_a_slot_are_kept_but_not_replayed(tmp_path):
    from kvcanary_numba.constants import CanaryLaunchTag
    from kvcanary_numba.monitor import Violation
    from kvcanary_numba.monitor.bundle import dump_bundle

    d = Driver()
    d.step(PREFILL)
    tag = int(CanaryLaunchTag.HEAD_K_FULL)
    rows = [
        Violation(tag, -1, -1, 0, 9, 0, 3, int(F.WRITE_RANGE_OUT_OF_BOUNDS), step=0),  # clipped range
        Violation(tag, 99, -1, -1, -1, 0, 16, int(F.PREV_SLOT_OUT_OF_RANGE), step=0),  # seed past the buffer
        Violation(tag, 5, 9, 103, 103, 0, 2, int(F.WRITE_POSITION_MISMATCH), step=0),
    ]
    path = dump_bundle(d.monitor, rows, tmp_path, step=0)
    r = replay_bundle(path)
    assert load_bundle(path)["entries"].tolist() == [[tag, 5, 2, 0, 103]]  # the slot against the expected position
    assert [r.replayable(v) for v in r.recorded] == [False, False, True]
    # Slot 5 holds position 2, what the oracle expects: the replay finds nothing (the record is right now).
    assert r.replayed == [] and not r.reproduced(r.recorded[2])
    text = explain_bundle(path)
    assert text.count("not replayable (a write-side row that names no slot to verify)") == 2
