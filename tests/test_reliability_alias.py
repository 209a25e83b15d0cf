"""An output that shares memory with an input or another output never makes a NumPy plan call fail half-way (issue 14).

Aliased arrays are accepted (the fuzz harness's ALIAS class). The NumPy plan computes every output from the
inputs as they were at the call and only then writes, so an input passed as an output gives the plan of the
inputs' values (the output then holds its own result), and outputs that share one array hold the last write.
Before this, the vectorised plan re-read its inputs and ``enable`` after the offsets step had written, and
raised a NumPy ``ValueError`` with the plan already half-written (fuzz seed 2, cases 4733 and 9878).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvcanary_numba import VerifyPlan, WritePlan, launch_canary_plan_kernels, launch_plan_offsets_kernel


def _inputs() -> dict:
    """Fuzz seed 2, case 4733: four requests, no SWA, no expected-token pool."""
    return dict(
        req_pool_indices=np.array([0, 2, 3, 1], dtype=np.int64),
        prefix_lens=np.array([3, 3, 1, 6], dtype=np.int64),
        extend_seq_lens=np.array([2, 2, 0, 1], dtype=np.int64),
        req_to_token=np.array([[8, 5, 4, 5, 4, 11, 10], [8, 4, 1, 15, 9, 12, 8], [9, 10, 15, 10, 9, 12, 11],
                               [9, 3, 11, 15, 11, 10, 7]], dtype=np.int32),
        swa_window_size=0, full_to_swa_index_mapping=None, req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0,
    )  # fmt: skip


def _plans(vcap: int, wcap: int) -> tuple[VerifyPlan, WritePlan]:
    vplan, wplan = VerifyPlan.allocate(verify_capacity=vcap), WritePlan.allocate(write_req_capacity=wcap)
    for array in (*vplan.arrays().values(), *wplan.arrays().values()):
        array[...] = -7
    return vplan, wplan


def _spec(inputs: dict, vcap: int, wcap: int) -> tuple[VerifyPlan, WritePlan]:
    """The plan of unaliased copies of the inputs."""
    vplan, wplan = _plans(vcap, wcap)
    copies = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=vcap, backend="numpy",
                               **copies)  # fmt: skip
    return vplan, wplan


def _arrays(vplan, wplan) -> dict:
    return {**vplan.arrays(), **wplan.arrays()}


def test_seeds_written_into_req_pool_indices_give_the_plan_of_the_rows_before_the_call():
    inputs = _inputs()
    want_v, want_w = _spec(inputs, 20, 4)
    vplan, wplan = _plans(20, 4)
    wplan = dataclasses.replace(wplan, write_seed_slot_indices=inputs["req_pool_indices"])
    launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=20, backend="numpy",
                               **inputs)  # fmt: skip
    for name, want in _arrays(want_v, want_w).items():
        np.testing.assert_array_equal(_arrays(vplan, wplan)[name], want, err_msg=name)


def test_enable_sharing_write_num_valid_reqs_does_not_turn_an_overflowed_plan_on():
    # Fuzz seed 2, case 9878: 10 verify entries for a capacity of 4 overflow; the write count (4) landed in
    # enable and the entries were then written past the capacity.
    inputs = _inputs()
    want_v, want_w = _spec(inputs, 4, 4)
    assert int(want_v.enable[0]) == 0
    vplan, wplan = _plans(4, 4)
    vplan = dataclasses.replace(vplan, enable=wplan.write_num_valid_reqs)
    launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=4, backend="numpy",
                               **inputs)  # fmt: skip
    for name in ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                 "verify_prev_slot_indices", "verify_num_valid", "write_offsets", "write_seed_slot_indices"):  # fmt: skip
        np.testing.assert_array_equal(_arrays(vplan, wplan)[name], _arrays(want_v, want_w)[name], err_msg=name)
    assert int(vplan.enable[0]) in (int(want_v.enable[0]), int(want_w.write_num_valid_reqs[0]))


@pytest.mark.parametrize("alias", ["out_verify_offsets_scratch", "out_write_seed_slot_indices"])
def test_offsets_outputs_over_req_pool_indices_give_the_offsets_of_the_rows_before_the_call(alias):
    inputs = _inputs()
    bs = inputs["req_pool_indices"].shape[0]
    kwargs = {k: inputs[k] for k in ("prefix_lens", "extend_seq_lens", "req_to_token", "swa_window_size",
                                     "full_to_swa_index_mapping")}  # fmt: skip

    def outputs():
        return dict(out_verify_offsets_scratch=np.full(bs + 1, -7, np.int64), out_write_offsets=np.full(bs + 1, -7, np.int64),
                    out_write_seed_slot_indices=np.full(bs, -7, np.int64), out_verify_num_valid=np.full(1, -7, np.int32),
                    out_verify_enable=np.full(1, -7, np.int32), out_write_num_valid_reqs=np.full(1, -7, np.int32))  # fmt: skip

    want = outputs()
    launch_plan_offsets_kernel(req_pool_indices=inputs["req_pool_indices"].copy(), verify_capacity=20,
                               backend="numpy", **kwargs, **want)  # fmt: skip
    got = outputs()
    rows = np.zeros(bs + 1, np.int64)  # req_pool_indices is a view of an array that can hold bs + 1 scratch entries
    rows[:bs] = inputs["req_pool_indices"]
    got[alias] = rows if alias == "out_verify_offsets_scratch" else rows[:bs]
    launch_plan_offsets_kernel(req_pool_indices=rows[:bs], verify_capacity=20, backend="numpy", **kwargs, **got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
