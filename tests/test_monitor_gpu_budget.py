"""Triage, bundles and budgeted verification with the monitor on a GPU (CuPy arrays; skipped without one)."""

from __future__ import annotations

import pytest

from kvcanary_numba.engine import FAULT_CLASSES, EngineConfig, ToyEngine
from kvcanary_numba.monitor import VerifyBudget
from kvcanary_numba.monitor.replay import replay_bundle

pytestmark = pytest.mark.gpu
PERIOD = 3


@pytest.mark.parametrize("kind", list(FAULT_CLASSES))
def test_gpu_budget_run_catches_every_fault_within_k_steps_and_its_bundles_replay_on_the_cpu(kind, tmp_path):
    config = EngineConfig(seed=1, min_new_tokens=12, max_new_tokens=16, num_pages=96)
    engine = ToyEngine(config, device="cuda", faults={kind: 5})
    monitor = engine.attach_monitor(
        mode="log", sweep_interval=3, bundle_dir=tmp_path, verify_budget=VerifyBudget(period=PERIOD, seed=1)
    )
    while not engine.faults and engine.step_index < 80:
        engine.step()
    engine.run(PERIOD + 3)
    (record,) = engine.faults
    caught = [v for hits in engine.catches().values() for v in hits]
    assert caught and min(v.step for v in caught) <= record.step + PERIOD
    last = max(v.step for v in monitor.violations)
    assert all(v.persistence != "pending" for v in monitor.violations if v.step < last)  # re-checked a readback later
    replays = [replay_bundle(p) for p in monitor.bundles]  # host arrays only: the NumPy path reads them
    assert [v.summary() for r in replays for v in r.recorded] == [v.summary() for v in monitor.violations]
