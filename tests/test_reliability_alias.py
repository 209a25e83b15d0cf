"""An output that shares memory with another array of its call is rejected up front, on every backend (KVC-C017).

On the kernels such a call is a data race (threads read inputs while others write outputs), so the
result would depend on scheduling; the NumPy path refuses the same calls with the same code, before
anything is written. Inputs sharing memory with inputs stay allowed and give the unaliased result, and so
do disjoint views of one buffer. Such calls once reached the vectorised NumPy plan, which raised NumPy's
``ValueError`` with the plan half-written (fuzz seed 2, cases 4733 and 9878); they are refused instead, as
they are on the kernels.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from alias_calls import ARGUMENT, assert_same_result, call, carve, mirrored, place, shares, unaliased
from helpers import raises_code

from kvcanary_numba import VerifyPlan, WritePlan, launch_canary_plan_kernels, launch_plan_offsets_kernel
from kvcanary_numba.fast import overlap as _overlap
from kvcanary_numba.fast.calls import OPERATIONS

BACKENDS = ["numpy", pytest.param("cuda", marks=pytest.mark.simulator)]
PLAN, OFFSETS, VERIFY = "launch_canary_plan_kernels", "launch_plan_offsets_kernel", "launch_canary_verify_kernel"
WRITE, SCATTER, FINGERPRINT = "launch_canary_write_kernel", "scatter_req_token_ids", "compute_real_kv_hash"

#: (function, {name: (target, byte delta)}): an output sharing memory with another array.
REJECTED = {
    "plan: seeds over req_pool_indices": (PLAN, {"write_seed_slot_indices": ("req_pool_indices", 0)}),
    "plan: enable over write_num_valid_reqs": (PLAN, {"enable": ("write_num_valid_reqs", 0)}),
    "plan: two verify outputs, half overlapping": (PLAN, {"verify_expected_tokens": ("verify_slot_indices", 16)}),
    "plan: prevs over the token pool": (PLAN, {"verify_prev_slot_indices": ("pool", 8)}),
    "offsets: seeds over req_pool_indices": (OFFSETS, {"out_write_seed_slot_indices": ("req_pool_indices", 0)}),
    "offsets: scratch over req_to_token": (OFFSETS, {"out_verify_offsets_scratch": ("req_to_token", 32)}),
    "offsets: enable over write_num_valid_reqs": (OFFSETS, {"out_verify_enable": ("out_write_num_valid_reqs", 0)}),
    "verify: both run counters one word": (VERIFY, {"kernel_run_counter": ("slot_run_counter", 0)}),
    "verify: ring over the canary buffer": (VERIFY, {"violation_ring": ("canary_buf", 64)}),
    "verify: write index over the plan's num_valid": (VERIFY, {"violation_write_index": ("verify_num_valid", 0)}),
    "write: canary buffer is its own real-KV source": (WRITE, {"kv": ("canary_buf", 0)}),
    "write: input_ids inside the ring": (WRITE, {"input_ids": ("violation_ring", 8)}),
    "write: slot counter over the plan's offsets": (WRITE, {"slot_run_counter": ("write_offsets", 8)}),
    "scatter: flat_in inside the pool": (SCATTER, {"flat_in": ("pool_out", 16)}),
    "scatter: offsets inside the pool": (SCATTER, {"offsets": ("pool_out", 16)}),
    "fingerprint: out = slot_indices": (FINGERPRINT, {"out": ("slot_indices", 0)}),
    "fingerprint: out inside the KV bytes": (FINGERPRINT, {"out": ("kv", 32)}),
}

#: Inputs sharing memory with inputs only: accepted, with the result of unaliased copies.
ACCEPTED = {
    "plan: prefix_lens = extend_seq_lens": (PLAN, {"extend_seq_lens": ("prefix_lens", 0)}),
    "plan: lens inside req_to_token": (PLAN, {"lens": ("req_to_token", 16)}),
    "offsets: req_pool_indices = prefix_lens": (OFFSETS, {"req_pool_indices": ("prefix_lens", 0)}),
    "verify: plan entries inside the canary buffer": (VERIFY, {"verify_expected_positions": ("canary_buf", 32)}),
    "write: positions = input_ids, offsets in KV": (WRITE, {"positions": ("input_ids", 0), "write_offsets": ("kv", 0)}),
    "scatter: offsets inside flat_in": (SCATTER, {"offsets": ("flat_in", 8)}),
    "fingerprint: slots inside the KV bytes": (FINGERPRINT, {"slot_indices": ("kv", 16)}),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(REJECTED))
def test_an_output_sharing_memory_is_rejected_before_anything_is_written(case, backend):
    function, rules = REJECTED[case]
    pool, arrays = carve(function, place(function, rules))
    assert shares(function, arrays)
    before = pool.copy()
    with raises_code("KVC-C017") as excinfo:
        call(function, arrays, backend)()
    np.testing.assert_array_equal(pool, before)  # every array of the call lives in the pool
    ((name, (target, _)),) = rules.items()
    assert all(ARGUMENT.get(n, n) in str(excinfo.value) for n in (name, target))  # both arguments are named


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_inputs_sharing_memory_give_the_unaliased_result(case, backend):
    function, rules = ACCEPTED[case]
    pool, arrays = carve(function, place(function, rules), seed=3)
    assert not shares(function, arrays)
    want = unaliased(function, arrays, backend)
    call(function, arrays, backend)()
    assert_same_result(arrays, want, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_disjoint_views_of_one_buffer_are_separate_arrays(backend):
    # As the monitor's status block: write index, counters and plan lanes are neighbouring words of one array.
    function = "launch_canary_verify_kernel"
    rules = {
        "slot_run_counter": ("violation_write_index", 8),
        "kernel_run_counter": ("violation_write_index", 16),
        "verify_num_valid": ("violation_write_index", 4),
        "enable": ("violation_write_index", 24),
    }
    _, arrays = carve(function, place(function, rules), seed=5)
    assert not shares(function, arrays)
    want = unaliased(function, arrays, backend)
    call(function, arrays, backend)()
    assert_same_result(arrays, want, backend)


@pytest.fixture
def validations(monkeypatch):
    """Counts the full validations of the functions that take top-level NumPy arrays."""
    count = {"n": 0}
    for name in (
        "launch_canary_write_kernel",
        "scatter_req_token_ids",
        "compute_real_kv_hash",
        "launch_plan_offsets_kernel",
        "launch_canary_plan_kernels",
    ):
        operation = OPERATIONS[name]

        def counted(*a, _f=operation.validate, **k):
            count["n"] += 1
            return _f(*a, **k)

        monkeypatch.setattr(operation, "validate", counted)
        operation.memo.clear()
    return count


#: function, and the top-level arrays that replace the unaliased ones (same layouts: same snapshot).
HITS = {
    "write: input_ids inside the ring": (
        "launch_canary_write_kernel",
        lambda a: {"input_ids": a["violation_ring"].reshape(-1)[1:4]},
    ),
    "plan: lens inside the verify prevs": (
        "launch_canary_plan_kernels",
        lambda a: {"lens": a["verify_prev_slot_indices"][1:3]},
    ),
    "offsets: seeds = req_pool_indices": (
        "launch_plan_offsets_kernel",
        lambda a: {"out_write_seed_slot_indices": a["req_pool_indices"]},
    ),
    "scatter: offsets inside pool_out": (
        "scatter_req_token_ids",
        lambda a: {"offsets": a["pool_out"].reshape(-1).view(np.int64)[2:5]},
    ),
    "fingerprint: out = slot_indices": ("compute_real_kv_hash", lambda a: {"out": a["slot_indices"]}),
}


@pytest.mark.parametrize("case", sorted(HITS))
def test_a_memo_hit_still_rejects_top_level_arrays_that_now_share_memory(case, validations):
    # A top-level NumPy array is snapshotted by layout, not address: the aliased call has the snapshot of
    # the unaliased calls that passed (contexts and plans hold the same objects), so it is a memo hit,
    # and the hit re-tests the top-level arrays.
    function, change = HITS[case]
    pool, arrays = carve(function, place(function))
    for _ in range(2):
        call(function, arrays, "numpy")()
    assert validations["n"] == 1
    before = pool.copy()
    with raises_code("KVC-C017"):
        call(function, {**arrays, **change(arrays)}, "numpy")()
    np.testing.assert_array_equal(pool, before)
    assert validations["n"] == 1, "expected a memo hit"
    call(function, arrays, "numpy")()  # the unaliased call still passes


def test_a_memo_hit_with_the_arrays_that_last_passed_reads_no_address(validations, monkeypatch):
    # The same live objects hold the same memory: after one full re-test they pass by identity; a new
    # object (even of the same layout) is tested again.
    tested = []
    original = _overlap.Recheck._test
    monkeypatch.setattr(_overlap.Recheck, "_test", lambda self, kwargs: (tested.append(1), original(self, kwargs)))
    function = "launch_plan_offsets_kernel"
    _, arrays = carve(function, place(function))
    for _ in range(4):
        call(function, arrays, "numpy")()
    assert validations["n"] == 1 and len(tested) == 1  # validated, then one full re-test, then identity
    fresh = {name: value.copy() if name == "req_pool_indices" else value for name, value in arrays.items()}
    call(function, fresh, "numpy")()
    assert validations["n"] == 1 and len(tested) == 2


def _seed2_inputs() -> dict:
    """Fuzz seed 2, case 4733: four requests, no SWA, no expected-token pool."""
    return dict(
        req_pool_indices=np.array([0, 2, 3, 1], dtype=np.int64),
        prefix_lens=np.array([3, 3, 1, 6], dtype=np.int64),
        extend_seq_lens=np.array([2, 2, 0, 1], dtype=np.int64),
        req_to_token=np.array(
            [[8, 5, 4, 5, 4, 11, 10], [8, 4, 1, 15, 9, 12, 8], [9, 10, 15, 10, 9, 12, 11], [9, 3, 11, 15, 11, 10, 7]],
            dtype=np.int32,
        ),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alias", ["seeds = req_pool_indices", "enable = write_num_valid_reqs"])
def test_the_seed2_plans_are_rejected_and_leave_every_array_as_it_was(alias, backend):
    # The very objects of fuzz seed 2 (cases 4733 and 9878), passed twice.
    inputs = _seed2_inputs()
    vplan, wplan = VerifyPlan.allocate(verify_capacity=4), WritePlan.allocate(write_req_capacity=4)
    if alias.startswith("seeds"):
        wplan = dataclasses.replace(wplan, write_seed_slot_indices=inputs["req_pool_indices"])
    else:
        vplan = dataclasses.replace(vplan, enable=wplan.write_num_valid_reqs)
    named = {
        **{f"verify.{k}": v for k, v in vplan.arrays().items()},
        **{f"write.{k}": v for k, v in wplan.arrays().items()},
        **{k: v for k, v in inputs.items() if hasattr(v, "copy")},
    }
    arrays = list(named.values())
    before = [a.copy() for a in arrays]
    with raises_code("KVC-C017"), mirrored(named, backend) as on:
        launch_canary_plan_kernels(
            verify_plan_out=VerifyPlan(**{k: on[f"verify.{k}"] for k in vplan.arrays()}),
            write_plan_out=WritePlan(**{k: on[f"write.{k}"] for k in wplan.arrays()}),
            verify_capacity=4,
            backend=backend,
            **{**inputs, **{k: on[k] for k in inputs if k in on}},
        )
    for got, want in zip(arrays, before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_offsets_scratch_over_a_longer_req_pool_indices_is_rejected(backend):
    # The scratch may be longer than bs + 1; an input that is a view of it still shares its memory.
    inputs = _seed2_inputs()
    rows = np.zeros(5, np.int64)
    rows[:4] = inputs["req_pool_indices"]
    outs = dict(
        out_write_offsets=np.full(5, -7, np.int64),
        out_write_seed_slot_indices=np.full(4, -7, np.int64),
        out_verify_num_valid=np.full(1, -7, np.int32),
        out_verify_enable=np.full(1, -7, np.int32),
        out_write_num_valid_reqs=np.full(1, -7, np.int32),
    )
    before = {name: array.copy() for name, array in outs.items()}
    named = {
        "req_pool_indices": rows[:4],
        "out_verify_offsets_scratch": rows,
        **outs,
        **{k: inputs[k] for k in ("prefix_lens", "extend_seq_lens", "req_to_token")},
    }
    with raises_code("KVC-C017"), mirrored(named, backend) as on:
        launch_plan_offsets_kernel(
            **on, full_to_swa_index_mapping=None, swa_window_size=0, verify_capacity=20, backend=backend
        )
    np.testing.assert_array_equal(rows[:4], inputs["req_pool_indices"])
    for name, array in outs.items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)
