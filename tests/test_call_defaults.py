"""Defaults for the arguments that are off or follow from others, on the core and the fast wing alike.

A call that leaves them out must do exactly what SGLang's full call does (compared array by
array with the full call on fresh copies), the full call keeps working unchanged, and the fast
wing's memo keys a derived ``verify_capacity`` by the plan it came from.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from helpers import i64, linear_rtt, raises_code

import kvcanary_numba as kc
from kvcanary_numba import plan as core_plan, plan_offsets as core_offsets, verify as core_verify, write as core_write
from kvcanary_numba.fast import calls

#: Public function -> (core function, {argument: default}).
DEFAULTS = {
    "launch_canary_plan_kernels": (
        core_plan.launch_canary_plan_kernels,
        dict(
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=None,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        ),
    ),
    "launch_plan_offsets_kernel": (
        core_offsets.launch_plan_offsets_kernel,
        dict(full_to_swa_index_mapping=None, swa_window_size=0),
    ),
    "launch_canary_verify_kernel": (core_verify.launch_canary_verify_kernel, dict(check_verify_expected_token=False)),
    "launch_canary_write_kernel": (
        core_write.launch_canary_write_kernel,
        dict(enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None),
    ),
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_core_and_fast_wing_declare_the_same_defaults(name):
    core, defaults = DEFAULTS[name]
    fast = getattr(kc, name)
    assert fast is getattr(calls, name) and fast.__wrapped__ is core
    declared = inspect.signature(core).parameters
    wrapper = inspect.signature(fast, follow_wrapped=False).parameters
    assert list(declared) == list(wrapper), "same keywords, same order (SGLang's)"
    for param in declared.values():
        assert param.kind is inspect.Parameter.KEYWORD_ONLY
        assert wrapper[param.name].default == param.default, param.name
        want = defaults.get(param.name, param.default if param.name in ("backend", "stream") else param.empty)
        assert param.default == want, param.name


# --- the plan: six arguments or SGLang's twelve -----------------------------------------


def _step(capacity=12):
    vplan = kc.VerifyPlan.allocate(verify_capacity=capacity)
    wplan = kc.WritePlan.allocate(write_req_capacity=3)
    for array in (*vplan.arrays().values(), *wplan.arrays().values()):
        array[...] = -5  # whatever a call leaves unwritten shows
    batch = dict(
        req_pool_indices=i64([1, 3, 0]),
        prefix_lens=i64([4, 2, 0]),
        extend_seq_lens=i64([1, 3, 0]),
        req_to_token=linear_rtt(),
    )
    return vplan, wplan, batch


def _arrays(*plans) -> list[np.ndarray]:
    return [np.array(a) for p in plans for a in p.arrays().values()]


SGLANG_OFF = dict(
    swa_window_size=0,
    full_to_swa_index_mapping=None,
    req_to_verify_expected_tokens=None,
    req_to_verify_expected_tokens_valid_lens=None,
    kv_token_id_vs_position_offset=0,
)


@pytest.mark.parametrize("plan", [kc.launch_canary_plan_kernels, core_plan.launch_canary_plan_kernels])
@pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=pytest.mark.simulator)])
def test_plan_with_defaults_equals_sglangs_full_call(plan, backend):
    short_v, short_w, batch = _step()
    plan(verify_plan_out=short_v, write_plan_out=short_w, **batch, backend=backend)
    full_v, full_w, batch = _step()
    plan(
        verify_plan_out=full_v,
        write_plan_out=full_w,
        **batch,
        **SGLANG_OFF,
        verify_capacity=full_v.verify_capacity,
        backend=backend,
    )
    for short, full in zip(_arrays(short_v, short_w), _arrays(full_v, full_w)):
        np.testing.assert_array_equal(short, full)
    assert int(short_v.verify_num_valid[0]) == 6 and int(short_v.enable[0]) == 1  # 4 + 2 prefix slots


@pytest.mark.parametrize("plan", [kc.launch_canary_plan_kernels, core_plan.launch_canary_plan_kernels])
def test_a_given_verify_capacity_must_still_equal_the_plans(plan):
    vplan, wplan, batch = _step(capacity=12)
    before = _arrays(vplan, wplan)
    for wrong in (11, 13):
        with raises_code("KVC-P004"):
            plan(verify_plan_out=vplan, write_plan_out=wplan, **batch, verify_capacity=wrong)
    with raises_code("KVC-C011"):
        plan(verify_plan_out=vplan, write_plan_out=wplan, **batch, verify_capacity=-1)
    for array, old in zip(_arrays(vplan, wplan), before):
        np.testing.assert_array_equal(array, old)  # a rejected call changes nothing


def test_the_memo_derives_verify_capacity_from_each_calls_own_plan():
    """Overflow depends on the capacity: a plan of 4 entries overflows where one of 12 does not."""
    small, wplan, batch = _step(capacity=4)
    large, _, _ = _step(capacity=12)
    for _ in range(3):  # first sight, memo hit, replayed hits
        for vplan, enable, valid in ((large, 1, 6), (small, 0, 4)):
            kc.launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan, **batch)
            assert (int(vplan.enable[0]), int(vplan.verify_num_valid[0])) == (enable, valid)
        with raises_code("KVC-P004"):  # a memo of the default call does not let a wrong capacity through
            kc.launch_canary_plan_kernels(verify_plan_out=small, write_plan_out=wplan, **batch, verify_capacity=12)


def test_offsets_with_defaults_equal_the_full_call():
    outs = []
    for extra in ({}, dict(swa_window_size=0, full_to_swa_index_mapping=None)):
        out = dict(
            out_verify_offsets_scratch=np.full(4, -5, np.int64),
            out_write_offsets=np.full(4, -5, np.int64),
            out_write_seed_slot_indices=np.full(3, -5, np.int64),
            out_verify_num_valid=np.zeros(1, np.int32),
            out_verify_enable=np.zeros(1, np.int32),
            out_write_num_valid_reqs=np.zeros(1, np.int32),
        )
        kc.launch_plan_offsets_kernel(**_step()[2], **out, **extra, verify_capacity=12)
        outs.append(out)
    for name in outs[0]:
        np.testing.assert_array_equal(outs[0][name], outs[1][name], err_msg=name)
    assert outs[0]["out_verify_offsets_scratch"].tolist() == [0, 4, 6, 6]


# --- verify and write: the asserts are off unless asked for ------------------------------


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=pytest.mark.simulator)])
def test_write_and_verify_with_defaults_equal_the_full_calls(backend):
    results = []
    for full in (False, True):
        vplan, wplan, batch = _step()
        ctx = kc.CanaryContext.allocate(num_slots=64)
        kc.launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan, **batch)
        off = dict(enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None)
        kc.launch_canary_write_kernel(
            context=ctx,
            plan=wplan,
            input_ids=i64([7, 8, 9, 10]),
            positions=i64([4, 2, 3, 4]),
            out_cache_loc=i64([20, 50, 51, 52]),
            backend=backend,
            **(off if full else {}),
        )
        flag = dict(check_verify_expected_token=False) if full else {}
        kc.launch_canary_verify_kernel(context=ctx, plan=vplan, backend=backend, **flag)
        results.append([ctx.canary_buf.copy(), ctx.violation_ring.copy(), ctx.violation_write_index.copy()])
    for short, full in zip(*results):
        np.testing.assert_array_equal(short, full)
    assert int(results[0][2][0]) > 0  # the prefix was never written: verify reported it
