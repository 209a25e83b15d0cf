"""The toy engine's KV in transit on a GPU (CuPy pools, the kernels; skipped without one).

The CPU tests (tests/test_engine_transit.py) on device memory: the host tier's clean run is
silent and each transit fault is caught where it hit; a pair's faulted hand-off is a digest miss.
"""

from __future__ import annotations

import pytest

from kvcanary_numba.engine import TRANSIT_FAULT_CLASSES, EngineConfig, EnginePair, ToyEngine
from kvcanary_numba.engine.transit import LANDING_FAULTS

pytestmark = pytest.mark.gpu


def test_gpu_host_tier_clean_run_is_silent():
    engine = ToyEngine(EngineConfig(seed=2), device="cuda", host_tier=0)
    monitor = engine.attach_monitor(mode="log", sweep_interval=4)
    engine.run(40)
    assert engine.host_tier.reloads >= 3 and monitor.violations == []


@pytest.mark.parametrize("fault", list(TRANSIT_FAULT_CLASSES))
def test_gpu_host_tier_fault_is_caught(fault):
    engine = ToyEngine(EngineConfig(seed=2), device="cuda", faults={fault: 8})
    engine.attach_monitor(mode="log", sweep_interval=4)
    engine.run(40)
    (record,) = engine.faults
    caught = engine.catches()[fault]
    assert caught and {v.slot_idx for v in caught} <= set(record.slots)


@pytest.mark.parametrize("fault", [None, "host_bit_flip", *LANDING_FAULTS])
def test_gpu_pair_hand_off(fault):
    pair = EnginePair(EngineConfig(seed=3), device="cuda", fault=fault, fault_step=4, sweep_interval=4)
    pair.run(20)
    if fault is None:
        assert pair.misses == [] and [m.violations for m in pair.monitors] == [[], []]
    else:
        (record,) = pair.faults
        assert [step for step, _ in pair.misses] == [record.step] and pair.decode.catches()[fault]
