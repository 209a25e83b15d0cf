"""The compiled small-batch plan (fast/cpu/plan_loop.py) against the vectorised plan of the CPU path, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FILL, padded_lut

from kvcanary_numba import VerifyPlan, WritePlan
from kvcanary_numba.fast.cpu import plan as ref_plan
from kvcanary_numba.fast.cpu.plan_loop import SMALL_BATCH, offsets_small_batch, plan_small_batch

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from hypothesis import given, settings, strategies as st

_INT64 = (-(2**63), 2**63 - 1)


def _plans(vcap: int, wcap: int) -> tuple[VerifyPlan, WritePlan]:
    vplan, wplan = VerifyPlan.allocate(verify_capacity=vcap), WritePlan.allocate(write_req_capacity=wcap)
    for array in (*vplan.arrays().values(), *wplan.arrays().values()):
        array[...] = FILL
    return vplan, wplan


def _both(inputs: dict, vcap: int, wcap: int):
    """(vectorised plan, loop plan, whether the loop ran) from the same inputs and identically filled plans."""
    out = []
    for run in (ref_plan.plan_vectorised, plan_small_batch):
        vplan, wplan = _plans(vcap, wcap)
        ran = run(verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=vcap, **inputs)
        out.append((vplan, wplan, ran))
    return out


def _assert_same(a, b) -> None:
    for name in (
        "verify_slot_indices",
        "verify_expected_tokens",
        "verify_expected_positions",
        "verify_prev_slot_indices",
        "verify_num_valid",
        "enable",
    ):
        np.testing.assert_array_equal(getattr(a[0], name), getattr(b[0], name), err_msg=name)
    for name in ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs"):
        np.testing.assert_array_equal(getattr(a[1], name), getattr(b[1], name), err_msg=name)


@st.composite
def batches(draw):
    """Padding rows, negative and huge lengths, rows / positions outside the table, LUT and pool edges."""
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    bs = draw(st.integers(0, 10))
    ints = lambda lo, hi, n: np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), np.int64)  # noqa: E731
    edge = st.sampled_from([_INT64[0], -1, 0, 1, cols, cols + 1, 2**40, _INT64[1]])
    lengths = lambda hi: np.array(
        draw(st.lists(st.one_of(st.integers(-2, hi), edge), min_size=bs, max_size=bs)),  # noqa: E731
        np.int64,
    )
    rtt = ints(-3, 60, rows * cols).astype(np.int32).reshape(rows, cols)
    inputs = dict(
        req_pool_indices=ints(-1, rows + 1, bs),
        prefix_lens=lengths(cols + 3),
        extend_seq_lens=lengths(4),
        req_to_token=rtt,
    )
    window = draw(st.sampled_from([0, 0, 1, 3, 2**62]))
    lut = padded_lut(ints(-3, 70, draw(st.integers(1, 50)))) if window else None
    pool = lens = None
    if draw(st.booleans()):
        pool = ints(-5, 99, (rows + 1) * 7).astype(np.int32).reshape(rows + 1, 7)
        lens = np.array(draw(st.lists(st.one_of(st.integers(-2, 9), edge), min_size=bs, max_size=bs)), np.int64)
    inputs.update(
        swa_window_size=window,
        full_to_swa_index_mapping=lut,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=draw(st.sampled_from([-1, 0, 1, 2, _INT64[1]])),
    )
    vcap = draw(st.integers(1, 60))
    return inputs, vcap, bs + draw(st.integers(1, 3))


@settings(max_examples=300, deadline=None)
@given(batches())
def test_loop_plan_equals_vectorised_plan(case):
    inputs, vcap, wcap = case
    spec, loop = _both(inputs, vcap, wcap)
    assert loop[2] is True  # no aliasing here: the loop ran
    _assert_same(spec, loop)


def test_loop_plan_equals_vectorised_plan_on_a_large_window(rng):
    bs = SMALL_BATCH
    rtt = rng.integers(-2, 1 << 20, size=(bs + 2, 300), dtype=np.int32)
    inputs = dict(
        req_pool_indices=rng.integers(0, bs + 3, size=bs),
        prefix_lens=rng.integers(-5, 320, size=bs),
        extend_seq_lens=rng.integers(-2, 9, size=bs),
        req_to_token=rtt,
        swa_window_size=100,
        full_to_swa_index_mapping=padded_lut(rng.integers(-2, 1 << 20, size=1 << 19)),
        req_to_verify_expected_tokens=rng.integers(-1, 1000, size=(bs + 1, 290), dtype=np.int32),
        req_to_verify_expected_tokens_valid_lens=rng.integers(0, 300, size=bs),
        kv_token_id_vs_position_offset=1,
    )
    spec, loop = _both(inputs, 100 * bs, bs)
    assert loop[2] is True and int(spec[0].enable[0]) == 1
    _assert_same(spec, loop)


def _aliased_cases(inputs: dict, vcap: int):
    """(description, verify plan, write plan, inputs) with one output sharing memory with another array."""

    def fresh():
        return _plans(vcap, len(inputs["req_pool_indices"]) + 1)

    v, w = fresh()
    yield (
        "seeds = req_pool_indices",
        v,
        WritePlan(
            write_offsets=w.write_offsets,
            write_seed_slot_indices=inputs["req_pool_indices"],
            write_num_valid_reqs=w.write_num_valid_reqs,
        ),
        inputs,
    )
    v, w = fresh()
    shared = VerifyPlan(
        verify_slot_indices=v.verify_slot_indices,
        verify_expected_tokens=v.verify_slot_indices,
        verify_expected_positions=v.verify_expected_positions,
        verify_prev_slot_indices=v.verify_prev_slot_indices,
        verify_num_valid=v.verify_num_valid,
        enable=v.enable,
    )
    yield "two verify outputs are one array", shared, w, inputs
    v, w = fresh()
    yield "enable = write_num_valid_reqs", VerifyPlan(**{**v.arrays(), "enable": w.write_num_valid_reqs}), w, inputs
    v, w = fresh()
    lut = np.zeros(v.verify_capacity + 8, np.int64)
    overlapping = VerifyPlan(**{**v.arrays(), "verify_prev_slot_indices": lut[4 : 4 + v.verify_capacity]})
    yield (
        "an output overlaps the LUT",
        overlapping,
        w,
        {**inputs, "swa_window_size": 2, "full_to_swa_index_mapping": lut},
    )


def test_loop_plan_declines_aliased_arrays_and_writes_nothing():
    inputs = dict(
        req_pool_indices=np.array([1, 2], np.int64),
        prefix_lens=np.array([3, 2], np.int64),
        extend_seq_lens=np.array([1, 1], np.int64),
        req_to_token=np.arange(1, 25, dtype=np.int32).reshape(3, 8),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    for label, vplan, wplan, kwargs in _aliased_cases(inputs, 16):
        before = [a.copy() for a in (*vplan.arrays().values(), *wplan.arrays().values())]
        assert plan_small_batch(verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=16, **kwargs) is False, (
            label
        )
        after = [*vplan.arrays().values(), *wplan.arrays().values()]
        assert all(np.array_equal(x, y) for x, y in zip(before, after)), label


def test_reference_entry_point_falls_back_to_the_vectorised_plan_when_aliased(monkeypatch):
    calls = []
    monkeypatch.setattr(ref_plan, "plan_vectorised", lambda **kw: calls.append(kw))
    inputs = dict(
        req_pool_indices=np.array([1], np.int64),
        prefix_lens=np.array([2], np.int64),
        extend_seq_lens=np.array([1], np.int64),
        req_to_token=np.arange(1, 9, dtype=np.int32).reshape(2, 4),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    vplan, wplan = _plans(8, 2)
    ref_plan.launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=8, **inputs)
    assert calls == [] and int(vplan.verify_num_valid[0]) == 2  # the loop ran
    aliased = WritePlan(
        write_offsets=wplan.write_offsets,
        write_seed_slot_indices=inputs["req_pool_indices"],
        write_num_valid_reqs=wplan.write_num_valid_reqs,
    )
    ref_plan.launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=aliased, verify_capacity=8, **inputs)
    assert len(calls) == 1


# --- the offsets step alone (launch_plan_offsets_kernel's CPU path) ---------------------------------


def _offsets_outputs(bs: int, wcap: int) -> dict:
    """Every output of the offsets step, filled with FILL (the scratch has two spare words at its end)."""
    return dict(
        out_verify_offsets_scratch=np.full(bs + 3, FILL, np.int64),
        out_write_offsets=np.full(wcap + 1, FILL, np.int64),
        out_write_seed_slot_indices=np.full(wcap, FILL, np.int64),
        out_verify_num_valid=np.full(1, FILL, np.int32),
        out_verify_enable=np.full(1, FILL, np.int32),
        out_write_num_valid_reqs=np.full(1, FILL, np.int32),
    )


def _offsets_inputs(inputs: dict) -> dict:
    names = (
        "req_pool_indices",
        "prefix_lens",
        "extend_seq_lens",
        "req_to_token",
        "swa_window_size",
        "full_to_swa_index_mapping",
    )
    return {name: inputs[name] for name in names}


def _vectorised_offsets(**kwargs) -> None:
    """The reference entry point with the compiled loop switched off: the vectorised spec."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ref_plan, "SMALL_BATCH", -1)
        ref_plan.launch_plan_offsets_kernel(**kwargs)


@settings(max_examples=300, deadline=None)
@given(batches())
def test_loop_offsets_equal_vectorised_offsets(case):
    inputs, vcap, wcap = case
    bs = len(inputs["req_pool_indices"])
    spec, loop = _offsets_outputs(bs, wcap), _offsets_outputs(bs, wcap)
    _vectorised_offsets(**_offsets_inputs(inputs), verify_capacity=vcap, **spec)
    assert offsets_small_batch(**_offsets_inputs(inputs), verify_capacity=vcap, **loop) is True
    for name, want in spec.items():
        np.testing.assert_array_equal(loop[name], want, err_msg=name)
    assert (loop["out_verify_offsets_scratch"][bs + 1 :] == FILL).all()  # the scratch's tail is left alone


def test_loop_offsets_pin_a_small_batch():
    # Rows 1 and 2 verify 3 and 2 positions, row 0 is padding; seeds: slot (row 1, position 2) = 10 and
    # (row 2, position 1) = 17.
    inputs = dict(
        req_pool_indices=np.array([1, 0, 2], np.int64),
        prefix_lens=np.array([3, 5, 2], np.int64),
        extend_seq_lens=np.array([2, 4, 1], np.int64),
        req_to_token=np.arange(24, dtype=np.int32).reshape(3, 8),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
    )
    out = _offsets_outputs(3, 4)
    ref_plan.launch_plan_offsets_kernel(**inputs, verify_capacity=100, **out)
    assert out["out_verify_offsets_scratch"].tolist() == [0, 3, 3, 5, FILL, FILL]
    assert out["out_write_offsets"].tolist() == [0, 2, 2, 3, 0]
    assert out["out_write_seed_slot_indices"].tolist() == [10, -1, 17, -1]
    assert [int(out[k][0]) for k in ("out_verify_num_valid", "out_verify_enable", "out_write_num_valid_reqs")] == [
        5,
        1,
        3,
    ]


def test_loop_offsets_decline_aliased_arrays_and_write_nothing():
    inputs = dict(
        req_pool_indices=np.array([1, 2], np.int64),
        prefix_lens=np.array([3, 2], np.int64),
        extend_seq_lens=np.array([1, 1], np.int64),
        req_to_token=np.arange(1, 25, dtype=np.int32).reshape(3, 8),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
    )
    out = _offsets_outputs(2, 3)
    for label, change in (
        ("seeds = req_pool_indices", {"out_write_seed_slot_indices": inputs["req_pool_indices"]}),
        ("enable = write_num_valid_reqs", {"out_verify_enable": out["out_write_num_valid_reqs"]}),
        ("scratch = prefix_lens", {"out_verify_offsets_scratch": np.zeros(3, np.int64)}),
    ):
        kwargs = {**inputs, **out, **change}
        if label == "scratch = prefix_lens":
            kwargs["prefix_lens"] = kwargs["out_verify_offsets_scratch"][:2]
        before = {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}
        assert offsets_small_batch(**kwargs, verify_capacity=16) is False, label
        assert all(np.array_equal(kwargs[k], v) for k, v in before.items()), label
