"""The monitor's step on the endpoint launches (``fast/endpoints.py``): how many launches a step
issues, counted through the recording the prepared steps use, and every fault class of the toy
engine caught on the kernels (simulator) exactly as on the NumPy reference path."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from monitor_helpers import DECODE, PREFILL, ROWS, WIDTH, Driver, gpu_monitor_run

from kvcanary_numba.engine import FAULT_CLASSES, EngineConfig, ToyEngine
from kvcanary_numba.fast.kernels import scatter_lens as scatter_kernels
from kvcanary_numba.fast.recording import recording
from kvcanary_numba.launch import _launch as _common

simulated = pytest.mark.skipif(not _common.ON_SIMULATOR, reason="drives NumPy arrays through the kernel glue")


def _names() -> dict:
    from kvcanary_numba.fast.kernels import chain, endpoints, scatter_lens, tiled_endpoints, write_shared, write_tiled
    from kvcanary_numba.kernels import plan, scatter, verify, write

    modules = (chain, endpoints, plan, scatter, scatter_lens, tiled_endpoints, verify, write, write_shared, write_tiled)
    return {id(k): name for m in modules for name, k in m.KERNELS.items()}


def _recorded_step(m, batch) -> list:
    """The launches of one eager step of ``batch`` (the step plan's phases), recorded, not run."""
    plan = m.step_plan
    with recording() as rec:
        plan.head(batch, *plan.prepare_inputs(batch))
        plan.tail(batch)
    names = _names()
    return [names[id(spec.kernel)] for spec in rec.launches]


def _step_launches(driver: Driver, new: dict) -> list[str]:
    """Kernel names a step of ``new`` tokens issues (HEAD phase with its scatter and plans, then TAIL)."""
    return _recorded_step(driver.monitor, driver.batch(new))


def _kernel_driver(**options) -> Driver:
    # The kernels on NumPy arrays (simulator).
    return Driver(check_verify_expected_token=True, max_requests=ROWS, max_context_len=WIDTH, backend="cuda", **options)


@pytest.mark.simulator
@simulated
def test_a_decode_step_with_k_and_v_issues_seven_launches():
    # Was 11: scatter, 2 plan, then per phase verify K, write K, verify V, write V.
    names = _step_launches(_kernel_driver(), DECODE)
    assert names == [
        "scatter",
        "plan_offsets",
        "plan_entries",
        "verify_endpoints_tok1_src0",
        "write_endpoints_assert0_src0",
        "verify_endpoints_tok1_src1",
        "write_endpoints_assert0_src1",
    ]


@pytest.mark.simulator
@simulated
def test_the_prepared_phases_hold_the_fused_launches():
    driver = _kernel_driver(prepared=True)
    m = driver.monitor
    driver.step(PREFILL)
    driver.step(DECODE)
    assert m.fast.prepared == 2  # two batch shapes
    # HEAD: the token scatter with the valid lengths (the eager path's public scatter and CuPy
    # subtraction, as one launch of the phase), 2 plans, fused verify and write; TAIL: fused verify, write.
    for head, tail in m.fast.phase_pairs:
        assert (len(head.launches), len(tail.launches)) == (5, 2)
        assert head.launches[0].signature == scatter_kernels.SIGNATURES["scatter_lens"][0]


@pytest.mark.simulator
@simulated
def test_a_k_only_pool_keeps_its_plain_launches():
    names = _step_launches(_kernel_driver(has_v=False), DECODE)
    # The plain writes of a phase share the step's chain: the fast wing's write_shared kernels.
    assert names == [
        "scatter",
        "plan_offsets",
        "plan_entries",
        "verify_tok1_src0",
        "write_shared_assert0_src0",
        "verify_tok1_src1",
        "write_shared_assert0_src1",
    ]


@pytest.mark.simulator
@simulated
def test_a_long_step_fuses_its_verifies_and_its_tiled_writes():
    # Was 9 launches (chain_publish, then a write_tiled per endpoint and phase): the tiled stamps of
    # K and V of a phase are one launch each now, 2 fewer.
    names = _long_step_launches(_long_workload())
    assert names == [
        "plan_offsets",
        "plan_entries",
        "verify_endpoints_tok0_src0",
        "chain_publish",
        "tiled_endpoints_assert0_src0",
        "verify_endpoints_tok0_src1",
        "tiled_endpoints_assert0_src1",
    ]


@pytest.mark.simulator
@simulated
def test_a_long_step_on_plain_endpoint_launches_issues_two_more_writes(monkeypatch):
    # The same step with the endpoints not fused (as a K and V folding different source counts would):
    # the per-endpoint tiled path, chain_publish and a write_tiled per endpoint and phase.
    from kvcanary_numba.fast import endpoints

    w = _long_workload()
    monkeypatch.setattr(endpoints, "fused_count", lambda contexts: 0)
    names = _long_step_launches(w)
    writes = [n for n in names if n.startswith(("write", "tiled", "chain"))]
    assert writes == ["chain_publish"] + ["write_tiled_assert0_src0"] * 2 + ["write_tiled_assert0_src1"] * 2


def _long_workload():
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from benchmarks.workloads import MonitorWorkload

    # 80 tokens for 2 requests: prefill-shaped; the kernels on NumPy arrays (simulator).
    w = MonitorWorkload(np, requests=2, prefix=3, extend=40, backend="cuda")
    w.fill(w.batch, w.length, w.extend)
    return w


def _long_step_launches(w) -> list[str]:
    return _recorded_step(w.monitor, w.batch)


# --- every fault class, kernels against the reference ---------------------------------------------


def _engine_run(kernels: bool):
    # Every fault class at once (as test_engine_faults.py's catches test), with V, SWA and sweeps.
    engine = ToyEngine(EngineConfig(seed=2, swa_window=4), faults=list(FAULT_CLASSES), fault_step=5)
    # kernels: the prepared steps on NumPy arrays (simulator).
    options = {"backend": "cuda", "prepared": True} if kernels else {}
    monitor = engine.attach_monitor(mode="log", sweep_interval=3, v_half=True, **options)
    engine.run(STEPS)
    rows = sorted(
        (
            v.step,
            v.tag,
            v.slot_idx,
            v.position,
            int(v.bits),
            v.stored_token,
            v.expected_token,
            v.stored_chain_hash,
            v.expected_aux,
        )
        for v in monitor.violations
    )
    return engine, rows


STEPS = 16


@pytest.mark.simulator
@simulated
def test_every_fault_class_is_caught_on_the_fused_kernels_as_on_the_reference():
    _, want = _engine_run(kernels=False)
    engine, got = _engine_run(kernels=True)
    assert got == want
    caught = engine.catches()
    assert set(caught) == set(FAULT_CLASSES) and all(caught.values())
    assert engine.monitor.fast.prepared >= 1  # the prepared (recorded, fused) path ran


# --- GPU: fused monitor steps against plain-launch steps, at scale ---------------------------------


def _gpu_steps(kind: str) -> dict:
    """Decode steps of 64 requests with 200 cached tokens each (``eager`` / ``fast`` / ``graph``), KV bytes
    flipped before step 3; host copies of everything the canary keeps."""
    from kvcanary_numba.fast import glue_memo

    flips = [(half, r, position, byte) for r in (2, 40) for half, position, byte in (("k", 5, 0), ("v", 7, 3))]
    # The eager path replays repeated endpoint glue calls; with CuPy's pool handing the same addresses
    # to the next run, entries of a run with the other fused_count would replay its launches.
    glue_memo.clear()
    return gpu_monitor_run(kind, requests=64, prefix=200, bytes_per_token=64, flips=flips)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["eager", "fast", "graph"])
def test_gpu_fused_monitor_steps_equal_plain_launch_steps(kind, monkeypatch):
    from kvcanary_numba.fast import endpoints

    fused = _gpu_steps(kind)
    monkeypatch.setattr(endpoints, "fused_count", lambda contexts: 0)  # one plain launch per endpoint
    plain = _gpu_steps(kind)
    assert fused["violations"].shape[0] >= 4  # the flipped K and V bytes were caught
    for name, array in plain.items():
        np.testing.assert_array_equal(fused[name], array, err_msg=name)
