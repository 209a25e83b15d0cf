"""The known blind spot: a corrupted token in a request's newest slot, invisible without the expected-token check."""

from __future__ import annotations

import warnings

import pytest
from monitor_helpers import PREFILL, ROWS, WIDTH, Driver, monitor_records

from kvcanary_numba.constants import FailReason
from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.monitor import triage
from kvcanary_numba.monitor.triage import BLIND_SPOT_MESSAGE, CanaryBlindSpotWarning

F = FailReason
CLOSED = dict(check_verify_expected_token=True, max_requests=ROWS, max_context_len=WIDTH)


def _corrupt_token(d: Driver, slot: int) -> None:
    """Change the token field of a slot's record in every canary buffer (what a stray write would do)."""
    for buffer in d.monitor.groups[0].buffers.values():
        monitor_records(buffer)[slot, 0] += 1


def _decode(d: Driver, steps: int) -> None:
    for i in range(steps):
        d.step({1: [(200 + i, 6 + i)]})


def test_blind_configuration_warns_once_per_process_and_briefly(monkeypatch):
    monkeypatch.setattr(triage, "_blind_spot_warned", False)  # as in a fresh process
    with pytest.warns(CanaryBlindSpotWarning, match="check_verify_expected_token=True") as caught:
        Driver()
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Driver()  # a second blind monitor: already said
        Driver(**CLOSED)  # the closing configuration builds silently
    assert "newest slot" in BLIND_SPOT_MESSAGE and len(BLIND_SPOT_MESSAGE) <= 200
    assert "\n" not in BLIND_SPOT_MESSAGE


def test_closed_configuration_never_warns(monkeypatch):
    monkeypatch.setattr(triage, "_blind_spot_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Driver(**CLOSED)
    assert triage._blind_spot_warned is False


def test_newest_slot_token_corruption_is_missed_without_the_token_check():
    d = Driver()
    d.step(PREFILL)  # slots 3, 4, 5 hold positions 0..2; 5 is the newest
    _corrupt_token(d, 5)
    _decode(d, 4)  # the next write chains from the corrupted record: every later check agrees with it
    assert d.monitor.violations == []


def test_an_older_slot_is_not_blind_its_successor_hashes_its_token():
    d = Driver()
    d.step(PREFILL)
    _corrupt_token(d, 4)
    _decode(d, 1)
    assert {(v.slot_idx, v.bits) for v in d.monitor.violations} >= {(5, F.VERIFY_CHAIN_HASH_MISMATCH)}


def test_the_expected_token_check_closes_the_blind_spot():
    d = Driver(**CLOSED)
    d.step(PREFILL)
    _corrupt_token(d, 5)
    _decode(d, 1)
    rows = d.monitor.violations
    assert rows and {(v.slot_idx, v.bits) for v in rows} == {(5, F.VERIFY_TOKEN_MISMATCH)}
    assert all(v.stored_token == 104 and v.expected_token == 103 for v in rows)


@pytest.mark.parametrize(("check_tokens", "caught"), [(False, False), (True, True)])
def test_toy_engine_token_flip_without_write_asserts(check_tokens, caught):
    engine = ToyEngine(EngineConfig(seed=1), faults={"token_flip": 6})
    monitor = engine.attach_monitor(mode="log", check_tokens=check_tokens, write_input_assert=False)
    while not engine.faults and engine.step_index < 80:
        engine.step()
    engine.run(4)
    assert bool(engine.catches()["token_flip"]) is caught
    if not caught:
        assert monitor.violations == []
