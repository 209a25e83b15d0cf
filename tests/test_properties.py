"""Hypothesis properties of the CPU path: clean runs stay clean, every planted fault is caught,
verify agrees with an entry-by-entry oracle, and bad arguments raise only KvCanaryError."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from canary_helpers import make_context, ring_rows, run_verify, verify_plan
from canary_oracles import random_source, scalar_verify_rows
from canary_pipeline import FAULTS, Pipeline, plant_fault
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcanary_numba import CanaryContext, KvCanaryError, RealKvHashMode, RealKvSource, VerifyPlan, WritePlan
from kvcanary_numba.fingerprint import compute_real_kv_hash
from kvcanary_numba.verify import launch_canary_verify_kernel
from kvcanary_numba.write import launch_canary_write_kernel

# Examples are cheap but the first one compiles the write loop: no deadline.
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MAX_SEQ = 12
MODES = st.sampled_from(list(RealKvHashMode))


def _allocate(pipe: Pipeline, rng: np.random.Generator, num_reqs: int) -> None:
    """Give request rows 1..num_reqs distinct slots (slot 0 stays the padding slot) and tokens."""
    slots = rng.permutation(np.arange(1, pipe.ctx.num_slots))[: num_reqs * MAX_SEQ].reshape(num_reqs, MAX_SEQ)
    pipe.req_to_token[1 : num_reqs + 1, :MAX_SEQ] = slots
    pipe.tokens[1 : num_reqs + 1, :MAX_SEQ] = rng.integers(0, 2**31 - 1, size=(num_reqs, MAX_SEQ))


@st.composite
def schedules(draw):
    """(num_reqs, steps); a step lists (request row, extend length) in batch order, 0 = padding row."""
    num_reqs = draw(st.integers(1, 4))
    steps = draw(
        st.lists(
            st.lists(st.tuples(st.integers(0, num_reqs), st.integers(0, 3)), max_size=5, unique_by=lambda t: t[0] or -1),
            min_size=1,
            max_size=5,
        )
    )
    return num_reqs, steps


def _run(pipe: Pipeline, num_reqs: int, steps, lengths: list[int], *, check_tokens: bool, write_assert: bool) -> list:
    rows = []
    for batch in steps:
        batch = [(rp, n if rp else 0) for rp, n in batch]
        batch = [(rp, min(n, MAX_SEQ - lengths[rp])) if rp else (rp, n) for rp, n in batch]
        rpi = [rp for rp, _ in batch]
        prefix = [lengths[rp] if rp else 0 for rp in rpi]
        extend = [n for _, n in batch]
        expected = pipe.batch_inputs(rpi, prefix, extend)[:2] if write_assert else None
        verify_rows, write_rows = pipe.step(rpi, prefix, extend, check_tokens=check_tokens, expected=expected)
        rows += verify_rows + write_rows
        for rp, n in batch:
            if rp:
                lengths[rp] += n
    return rows


@FAST
@given(schedules(), MODES, st.sampled_from([0, 2, 5]), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_clean_pipeline_never_reports(schedule, mode, window, check_tokens, write_assert, seed):
    num_reqs, steps = schedule
    pipe = Pipeline(num_slots=64, mode=mode, window=window, seed=seed)
    _allocate(pipe, np.random.default_rng(seed), num_reqs)
    assert _run(pipe, num_reqs, steps, [0] * 8, check_tokens=check_tokens, write_assert=write_assert) == []


@FAST
@given(
    st.sampled_from(FAULTS),
    st.integers(3, MAX_SEQ - 1),
    st.data(),
    st.sampled_from([RealKvHashMode.PARTIAL, RealKvHashMode.ALL]),
    st.integers(0, 2**32 - 1),
)
def test_single_planted_fault_is_reported(fault, prefix, data, mode, seed):
    pipe = Pipeline(num_slots=64, mode=mode, seed=seed)
    _allocate(pipe, np.random.default_rng(seed), 3)
    assert pipe.step([1, 2, 3], [0, 0, 0], [prefix, 2, 1]) == ([], [])
    position = data.draw(st.integers(0, prefix - 3), label="position")
    slot, bit = plant_fault(pipe, fault, 1, position)
    verify_rows, _ = pipe.step([3, 1, 2], [1, prefix, 2], [1, 1, 0])
    assert any(row[1] == slot and row[7] & bit for row in verify_rows), (slot, bit, verify_rows)
    others = set(pipe.req_to_token[2, :2]) | set(pipe.req_to_token[3, :1])
    assert not any(row[1] in others for row in verify_rows)


# --- verify against the entry-by-entry oracle --------------------------------------------

SLOTS = st.one_of(st.integers(-2, 20), st.sampled_from([2**63 - 1, -(2**63), 2**40]))


@FAST
@given(
    st.lists(st.tuples(SLOTS, st.integers(-1, 6), SLOTS, st.integers(-2, 5)), max_size=24),
    st.integers(-3, 30),
    st.booleans(),
    MODES,
    st.integers(0, 2**32 - 1),
)
def test_verify_matches_entry_by_entry_oracle(entries, num_valid, check, mode, seed):
    rng = np.random.default_rng(seed)
    ctx = make_context(16, stride=48, sources=(random_source(rng, 16, page_size=4, nbytes=32),), mode=mode)
    records = ctx.canary_buf.view(np.int64)
    records[:, :4] = rng.integers(-3, 6, size=(16, 4))  # small values: matches happen
    slots, positions, prevs, tokens = (list(column) for column in zip(*entries)) if entries else ([], [], [], [])
    plan = verify_plan(slots, positions, prevs, tokens, capacity=max(1, len(entries)), num_valid=num_valid)
    want = scalar_verify_rows(ctx, plan, check)
    run_verify(ctx, plan, check)
    assert ring_rows(ctx) == want


# --- bad arguments ----------------------------------------------------------------------------

JUNK = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.lists(st.integers(-2, 2), max_size=3),
    st.sampled_from([np.int64, np.float32, np.uint8, np.int32]).flatmap(
        lambda dtype: st.sampled_from([(0,), (1,), (3,), (2, 8), (1, 1, 1), ()]).map(lambda shape: np.zeros(shape, dtype))
    ),
)


def _valid_call():
    ctx = CanaryContext.allocate(num_slots=8)
    tokens = np.zeros(2, dtype=np.int64)
    verify = dict(context=ctx, plan=VerifyPlan.allocate(verify_capacity=2), check_verify_expected_token=False)
    write = dict(
        context=ctx,
        plan=WritePlan.allocate(write_req_capacity=2),
        input_ids=tokens,
        positions=tokens.copy(),
        out_cache_loc=tokens.copy(),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    return ctx, verify, write


def _only_canary_errors(call) -> bool:
    try:
        call()
    except KvCanaryError:
        return False
    return True


@FAST
@given(st.data())
def test_bad_launch_arguments_raise_only_canary_errors(data):
    ctx, verify_kwargs, write_kwargs = _valid_call()
    op, kwargs = data.draw(st.sampled_from([("verify", verify_kwargs), ("write", write_kwargs)]))
    key = data.draw(st.sampled_from(sorted(kwargs) + ["context." + f for f in ctx.__dataclass_fields__]))
    junk = data.draw(JUNK)
    if key.startswith("context."):
        kwargs["context"] = ctx.replace(**{key.split(".")[1]: junk})
    else:
        kwargs[key] = junk
    launch = launch_canary_verify_kernel if op == "verify" else launch_canary_write_kernel
    _only_canary_errors(lambda: launch(**kwargs, backend="numpy"))


@FAST
@given(st.sampled_from(["real_kv_sources", "real_kv_hash_mode", "slot_indices", "out"]), JUNK)
def test_bad_fingerprint_arguments_raise_only_canary_errors(key, junk):
    tensor = np.zeros((4, 16), dtype=np.uint8)
    kwargs = dict(
        real_kv_sources=(RealKvSource(tensor=tensor, page_size=1, num_bytes_per_token=16, read_bytes=16),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        slot_indices=np.zeros(2, dtype=np.int64),
        out=np.zeros(2, dtype=np.int64),
    )
    kwargs[key] = junk
    _only_canary_errors(lambda: compute_real_kv_hash(**kwargs, backend="numpy"))


CONTEXT_KEYS = ["num_slots", "slot_stride_bytes", "ring_capacity", "kernel_kind", "real_kv_sources", "real_kv_hash_mode"]


@FAST
@given(st.sampled_from(["verify", "write", *CONTEXT_KEYS]), JUNK)
def test_bad_allocations_raise_only_canary_errors(what, junk):
    if what == "verify":
        _only_canary_errors(lambda: VerifyPlan.allocate(verify_capacity=junk))
    elif what == "write":
        _only_canary_errors(lambda: WritePlan.allocate(write_req_capacity=junk))
    else:
        _only_canary_errors(lambda: CanaryContext.allocate(**{"num_slots": 4, what: junk}))
