"""CanaryMonitor rejects bad input: hooks out of order, oversized batches, bad sweeps, groups, modes and capacities."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_code
from monitor_helpers import NUM_SLOTS, PREFILL, Driver, source

from kvcanary_numba.monitor import CanaryMonitor, KvGroup, SlotChain


def test_hooks_out_of_order_are_rejected():
    d = Driver()
    m = d.monitor
    with raises_code("KVC-M005"):
        m.post_forward()
    m.pre_forward(d.batch(PREFILL))
    for call in (lambda: m.pre_forward(d.batch(PREFILL)), m.end_step, lambda: m.sweep([])):
        with raises_code("KVC-M005"):
            call()
    m.post_forward()
    m.end_step()
    assert m.step == 1


def test_forward_context_abandons_the_step_on_error():
    d = Driver()
    with pytest.raises(ZeroDivisionError), d.monitor.forward(d.batch(PREFILL)):
        1 / 0
    d.step({2: [(7, 9)]})  # the monitor accepts the next step
    assert d.monitor.step == 1


def test_batch_larger_than_the_capacities_is_rejected():
    d = Driver(write_req_capacity=1, write_token_capacity=2)
    with raises_code("KVC-M002"):
        d.monitor.pre_forward(d.batch({1: [(1, 1)], 2: [(2, 2)]}))
    with raises_code("KVC-M003"):
        d.monitor.pre_forward(d.batch(PREFILL))
    with raises_code("KVC-M009"):
        d.monitor.pre_forward({"input_ids": None})


def test_a_batch_grown_in_place_past_the_capacities_is_rejected():
    # Sizes are checked with the arrays: a batch object the monitor accepted, whose token arrays then grow
    # in place (same objects, other memory and shape), is checked again in full before any launch.
    d = Driver(write_token_capacity=3)
    m = d.monitor
    batch = d.batch(PREFILL)
    m.pre_forward(batch)
    m.post_forward()
    m.end_step()
    for name in ("input_ids", "positions", "out_cache_loc"):
        getattr(batch, name).resize(4, refcheck=False)
    checked = m.batch_checks.checked
    with raises_code("KVC-M003"):
        m.pre_forward(batch)
    assert m.batch_checks.checked is checked and m.step == 1  # the rejected call changed nothing


@pytest.mark.parametrize(
    ("field", "source_field"),
    [("positions", "input_ids"), ("out_cache_loc", "input_ids"), ("prefix_lens", "req_pool_indices")],
)
def test_a_length_mismatch_names_both_arrays(field, source_field):
    # A shorter input_ids makes positions "wrong" too: the message names the array its length came from.
    d = Driver()
    batch = d.batch(PREFILL)
    setattr(batch, field, getattr(batch, field)[1:])
    with raises_code("KVC-C004") as info:
        d.monitor.pre_forward(batch)
    n = getattr(batch, source_field).shape[0]
    assert f"batch.{field} must have shape ({n},) (that of batch.{source_field}), got ({n - 1},)" in str(info.value)


def test_token_check_needs_pool_sizes_and_snapshots():
    with raises_code("KVC-M008"):
        Driver(check_verify_expected_token=True, max_requests=4)
    d = Driver(check_verify_expected_token=True, max_requests=4, max_context_len=16)
    batch = d.batch(PREFILL)
    batch.token_offsets = None
    with raises_code("KVC-M008"):
        d.monitor.pre_forward(batch)


def test_sweep_arguments_are_checked():
    m = Driver(sweep_capacity=3).monitor
    with raises_code("KVC-M004"):
        m.sweep([SlotChain(slots=[1, 2]), SlotChain(slots=[3, 4])])
    with raises_code("KVC-M009"):
        m.sweep([[1, 2]])
    with raises_code("KVC-C011"):
        m.sweep([SlotChain(slots=[1], start_position=-1)])


def test_groups_and_modes_are_checked():
    k = np.zeros((NUM_SLOTS, 32), dtype=np.uint8)
    lut = np.zeros(NUM_SLOTS + 1, dtype=np.int64)
    full = KvGroup(kind="full", num_slots=NUM_SLOTS, k_sources=(source(k),))
    with raises_code("KVC-M006"):
        KvGroup(kind="swa", num_slots=NUM_SLOTS, full_to_swa_index_mapping=lut)
    with raises_code("KVC-M006"):
        KvGroup(kind="full", num_slots=NUM_SLOTS, swa_window_size=4)
    with raises_code("KVC-M007"):
        KvGroup(kind="swa", num_slots=NUM_SLOTS, swa_window_size=4)
    with raises_code("KVC-M007"):
        KvGroup(kind="full", num_slots=NUM_SLOTS, full_to_swa_index_mapping=lut)
    with raises_code("KVC-C009"):
        KvGroup(kind="sliding", num_slots=NUM_SLOTS)
    with raises_code("KVC-C002"):
        KvGroup(kind="swa", num_slots=NUM_SLOTS, swa_window_size=4, full_to_swa_index_mapping=lut.astype(np.int32))
    with raises_code("KVC-M001"):
        CanaryMonitor(full=full, write_req_capacity=1, mode="none")
    with raises_code("KVC-M009"):
        CanaryMonitor(full={"kind": "full"}, write_req_capacity=1)
    swa = KvGroup(kind="swa", num_slots=NUM_SLOTS, swa_window_size=4, full_to_swa_index_mapping=lut)
    with raises_code("KVC-C009"):
        CanaryMonitor(full=swa, write_req_capacity=1)
    with raises_code("KVC-C009"):
        CanaryMonitor(full=full, swa=full, write_req_capacity=1)
    with raises_code("KVC-C011"):
        CanaryMonitor(full=full, write_req_capacity=0)
    with raises_code("KVC-C009"):
        CanaryMonitor(full=full, write_req_capacity=1, device="gpu")


@pytest.mark.parametrize("name", ["write_token_capacity", "verify_capacity", "sweep_capacity", "ring_capacity"])
def test_zero_capacities_are_rejected_not_defaulted(name):
    with raises_code("KVC-C011"):
        Driver(**{name: 0})


def test_backend_and_prepared_are_checked():
    k = np.zeros((NUM_SLOTS, 32), dtype=np.uint8)
    full = KvGroup(kind="full", num_slots=NUM_SLOTS, k_sources=(source(k),))
    with raises_code("KVC-C009"):
        CanaryMonitor(full=full, write_req_capacity=1, backend="gpu")
    with raises_code("KVC-C010"):
        CanaryMonitor(full=full, write_req_capacity=1, prepared="yes")
    with raises_code("KVC-C008"):  # prepared steps launch the kernels: not on the NumPy path
        CanaryMonitor(full=full, write_req_capacity=1, prepared=True)
    m = CanaryMonitor(full=full, write_req_capacity=1, backend="numpy", prepared=False)
    assert (m.backend, m.fast, m.step_plan.kernels) == ("numpy", None, False)


@pytest.mark.simulator
def test_the_kernel_backend_on_numpy_buffers_runs_under_the_simulator_only():
    import os

    k = np.zeros((NUM_SLOTS, 32), dtype=np.uint8)
    full = KvGroup(kind="full", num_slots=NUM_SLOTS, k_sources=(source(k),))
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        with raises_code("KVC-C008"):
            CanaryMonitor(full=full, write_req_capacity=1, backend="cuda")
        return
    eager = CanaryMonitor(full=full, write_req_capacity=1, backend="cuda")
    prepared = CanaryMonitor(full=full, write_req_capacity=1, backend="cuda", prepared=True)
    assert eager.fast is None and eager.step_plan.kernels
    assert prepared.fast is not None and prepared.fast.plan is prepared.step_plan


def test_the_backend_switches_between_steps_only_and_is_checked(monkeypatch):
    from kvcanary_numba import _runtime, _validate

    d = Driver()
    m = d.monitor
    m.pre_forward(d.batch(PREFILL))
    with raises_code("KVC-M005"):  # mid-step: the TAIL phase must run where HEAD ran
        m.backend = "numpy"
    m.post_forward()
    m.end_step()
    with raises_code("KVC-C009"):
        m.backend = "gpu"
    monkeypatch.setattr(_validate, "kernels_unavailable", lambda: _runtime.NO_NUMBA_CUDA)
    with raises_code("KVC-C008"):
        m._backend = "cuda"  # the older spelling, same checks
    assert (m.backend, m.step_plan.backend, m.step_plan.kernels) == ("numpy", "numpy", False)


@pytest.mark.simulator
def test_a_numpy_monitor_switched_to_the_kernels_finds_what_the_reference_finds():
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("the kernels on NumPy buffers run under the simulator only")
    found = []
    for switch in (False, True):
        d = Driver()
        if switch:
            d.monitor._backend = "cuda"
            assert d.monitor.backend == "cuda" and d.monitor.step_plan.kernels
        d.step(PREFILL)
        slot = d.requests[1][0][1]
        d.k[slot, 0] ^= 1  # a planted fault in the KV of a cached token
        d.step({1: [(104, 6)]})  # request 1 again: its prefix is verified
        found.append(d.rows())
    assert found[0] == found[1] and found[0], found
