"""Hypothesis properties of the CPU path: clean runs stay clean, every planted fault is caught,
verify agrees with an entry-by-entry oracle (bad arguments: test_properties_arguments.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from canary_helpers import make_context, ring_rows, run_verify, verify_plan
from canary_oracles import random_source, scalar_verify_rows
from canary_pipeline import FAULTS, Pipeline, plant_fault
from hypothesis import HealthCheck, given, settings, strategies as st

from kvcanary_numba import RealKvHashMode

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
            st.lists(
                st.tuples(st.integers(0, num_reqs), st.integers(0, 3)), max_size=5, unique_by=lambda t: t[0] or -1
            ),
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
