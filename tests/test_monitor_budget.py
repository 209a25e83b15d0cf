"""Budgeted verification: the selection rule and its bound, the kernel against the reference, the toy engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_pairs import KERNEL_DEVICE, to_device, to_host
from monitor_helpers import DECODE, PREFILL, Driver

from kvcanary_numba import VerifyPlan
from kvcanary_numba.engine import FAULT_CLASSES, EngineConfig, ToyEngine
from kvcanary_numba.errors import KvCanaryError
from kvcanary_numba.monitor.budget import VerifyBudget, seeded_affine, select_verify_entries
from kvcanary_numba.reference.budget import due_mask


@pytest.mark.parametrize("period", [1, 2, 3, 4, 7, 8, 12])
@pytest.mark.parametrize("seed", [0, 1, 5])
def test_every_position_is_due_exactly_once_in_any_k_consecutive_steps(period, seed):
    a, c = seeded_affine(period, seed)
    assert math.gcd(a, period) == 1 and 0 <= c < period
    positions = np.arange(-3 * period, 5 * period, dtype=np.int64)
    for t0 in range(-period, 2 * period):
        hits = sum(due_mask(positions, t, period, a, c).astype(int) for t in range(t0, t0 + period))
        assert (hits == 1).all()
    # Any run of L consecutive positions has at most ceil(L / K) due at one step (the per-request load bound).
    for length in range(1, 3 * period):
        for start in range(period):
            run = np.arange(start, start + length, dtype=np.int64)
            assert due_mask(run, 5, period, a, c).sum() <= -(-length // period)


def _plan(n, capacity, rng, *, enable=1, num_valid=None):
    plan = VerifyPlan.allocate(verify_capacity=capacity)
    plan.verify_slot_indices[:] = rng.integers(0, 1000, capacity)
    plan.verify_expected_tokens[:] = rng.integers(-1, 50, capacity)
    plan.verify_expected_positions[:] = rng.integers(-5, 200, capacity)
    plan.verify_prev_slot_indices[:] = rng.integers(-1, 1000, capacity)
    plan.verify_num_valid[0] = n if num_valid is None else num_valid
    plan.enable[0] = enable
    return plan


def _entries(plan):
    n = int(plan.verify_num_valid[0])
    cols = [
        plan.verify_slot_indices,
        plan.verify_expected_tokens,
        plan.verify_expected_positions,
        plan.verify_prev_slot_indices,
    ]
    return sorted(zip(*(c[:n].tolist() for c in cols)))


@pytest.mark.parametrize(
    ("n", "capacity", "period", "step", "enable", "num_valid"),
    [
        (40, 48, 3, 7, 1, None),
        (130, 140, 3, 4, 1, None),
        (48, 48, 1, 0, 1, None),
        (20, 24, 5, -3, 1, None),
        (20, 24, 4, 2, 0, None),
        (24, 24, 2, 1, 1, 10**6),
        (0, 8, 3, 1, 1, -4),
    ],
)
def test_kernel_selects_the_reference_set(n, capacity, period, step, enable, num_valid):
    rng = np.random.default_rng(n + period)
    a, c = seeded_affine(period, 3)
    plan = _plan(n, capacity, rng, enable=enable, num_valid=num_valid)
    outs = {}
    for backend, device in (("numpy", "cpu"), ("cuda", KERNEL_DEVICE)):
        out = VerifyPlan.allocate(verify_capacity=capacity, device=device)
        scratch, steps = to_device(np.zeros(2, np.int64), device), to_device(np.array([step], np.int64), device)
        select_verify_entries(
            plan=to_device(plan, device),
            out_plan=out,
            step=steps,
            scratch=scratch,
            period=period,
            multiplier=a,
            offset=c,
            backend=backend,
        )
        assert to_host(scratch).tolist() == [0, 0]  # the kernel leaves its counters reset for the next launch
        out = VerifyPlan(**{k: to_host(v) for k, v in out.arrays().items()})
        outs[backend] = (_entries(out), int(out.enable[0]))
    assert outs["cuda"] == outs["numpy"]
    # Independent expectation: the due entries of the active range, by the rule itself.
    active = min(max(int(plan.verify_num_valid[0]), 0), capacity) if enable else 0
    due = [
        i
        for i in range(active)
        if (a * (int(plan.verify_expected_positions[i]) % period) + c + step % period) % period == 0
    ]
    assert len(outs["numpy"][0]) == len(due) and outs["numpy"][1] == enable


def test_budget_derives_k_and_reports_the_delay():
    d = Driver(verify_budget=VerifyBudget(budget_entries=2, expected_entries=7))
    assert d.monitor.stats()["verify_period"] == 4 and d.monitor.stats()["max_detection_delay_steps"] == 3
    # One TAIL launch folds one 32-byte ALL source: 32 (plan) + 64 (records) + 32 = 128 bytes per entry.
    d = Driver(verify_budget=VerifyBudget(budget_bytes=10 * 128 + 127, expected_entries=100))
    assert d.monitor.stats()["verify_period"] == 10


@pytest.mark.parametrize(
    ("budget", "argument"),
    [
        (VerifyBudget(), "period / budget_entries"),
        (VerifyBudget(period=2, budget_entries=3), "period / budget_entries"),
        (VerifyBudget(period=0), "period"),
        (VerifyBudget(budget_entries=4), "expected_entries"),
        (VerifyBudget(budget_bytes=16, expected_entries=10), "budget_bytes"),
        (VerifyBudget(budget_entries=1, expected_entries=10**6, max_period=100), "period"),
        (VerifyBudget(period=2, seed=-1), "seed"),
        (VerifyBudget(period=True), "period"),
    ],
)
def test_a_bad_budget_is_rejected_with_m021(budget, argument):
    with pytest.raises(KvCanaryError) as info:
        Driver(verify_budget=budget)
    assert info.value.code == "KVC-M021" and argument in str(info.value)


def test_a_budgeted_monitor_verifies_a_subset_and_still_sees_a_flip_within_k_steps():
    d = Driver(verify_budget=VerifyBudget(period=3, seed=2))
    d.step(PREFILL)
    d.k[4, 0] ^= 0xFF
    verified, new = [], [(105 + i, 7 + i) for i in range(4)]
    for i, token in enumerate(new):
        d.step(DECODE if i == 0 else {1: [token]})
        verified.append(int(d.monitor.budget.plans[0].verify_num_valid[0]))
        if d.monitor.violations:
            break
    assert d.monitor.violations and d.monitor.violations[0].slot_idx == 4
    assert len(verified) <= 3  # within K steps of the flip
    assert all(v <= -(-(3 + i) // 3) for i, v in enumerate(verified))  # prefix of 3 + i entries, one request


def _long_lived(seed):
    return EngineConfig(seed=seed, min_new_tokens=12, max_new_tokens=16, num_pages=96)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", list(FAULT_CLASSES))
def test_every_fault_class_is_caught_within_k_steps_in_budget_mode(kind, seed):
    period = 3
    engine = ToyEngine(_long_lived(seed), faults={kind: 5})
    monitor = engine.attach_monitor(mode="log", sweep_interval=3, verify_budget=VerifyBudget(period=period, seed=seed))
    while not engine.faults and engine.step_index < 80:
        engine.step()
    engine.run(period + 3)
    (record,) = engine.faults
    caught = [v for hits in engine.catches().values() for v in hits]
    assert caught, f"{kind} missed in budget mode"
    assert all(v.step >= record.step for v in monitor.violations)
    # The fault is in the plans from the step after it fired; sweeps (cached_kv_flip) are not budgeted.
    bound = 3 if kind == "cached_kv_flip" else period
    assert min(v.step for v in caught) <= record.step + bound


def test_the_benchmark_plans_meet_the_load_bound_and_cover_every_entry_once_per_period():
    import pathlib
    import sys

    root = str(pathlib.Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.bench_budget import budget_entries
    from benchmarks.workloads import verify_case
    from kvcanary_numba import RealKvHashMode

    _, plan, _ = verify_case(np, entries=4 * 64, mode=RealKvHashMode.NONE, chain_len=64)
    for period in (2, 8, 32):
        a, c = seeded_affine(period, 0)
        seen = []
        for step in range(period):
            out = VerifyPlan.allocate(verify_capacity=4 * 64)
            select_verify_entries(
                plan=plan,
                out_plan=out,
                step=np.array([step], np.int64),
                scratch=np.zeros(2, np.int64),
                period=period,
                multiplier=a,
                offset=c,
            )
            assert int(out.verify_num_valid[0]) <= budget_entries(4, 64, period)
            seen += _entries(out)
        assert sorted(seen) == _entries(plan)  # K consecutive steps verify every entry exactly once
