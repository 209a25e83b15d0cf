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

from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    KvCanaryError,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    WritePlan,
)
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


#: Junk values that are in fact valid for a key (documented inputs): the call may accept them.
_ENUMS = {"kernel_kind": {int(t) for t in CanaryLaunchTag}, "real_kv_hash_mode": {int(m) for m in RealKvHashMode}}
_SIZES = {"verify", "write", "num_slots", "ring_capacity"}  # allocation sizes: any int >= 1
_NONE_OK = {"expected_input_tokens", "expected_input_positions"}  # the write-input assert is off


def _is_valid(op: str, key: str, junk, valid) -> bool:
    """Whether ``junk`` is a valid value of argument ``key`` (``valid``: the value it replaced)."""
    name = key.split(".")[-1]
    if name in _ENUMS:
        return type(junk) is int and junk in _ENUMS[name]
    if name in _SIZES:
        return type(junk) is int and junk >= 1
    if name == "real_kv_sources":
        return isinstance(junk, (list, tuple)) and len(junk) == 0  # no sources: every fold is 0
    if junk is None:
        # verify never reads the chain-position flag (only write walks chains)
        return name in _NONE_OK or (op == "verify" and name == "enable_chain_position_assert")
    if not isinstance(junk, np.ndarray) or not isinstance(valid, np.ndarray) or junk.dtype != valid.dtype:
        return False
    if name == "violation_ring":  # any capacity >= 1 of 8-word rows
        return junk.ndim == 2 and junk.shape[0] >= 1 and junk.shape[1] == valid.shape[1]
    return junk.shape == valid.shape


def _only_canary_errors(call, *, valid: bool, what: str = "") -> None:
    """``call`` raises KvCanaryError, or (only when the junk is ``valid``) returns; anything else fails."""
    try:
        call()
    except KvCanaryError:
        return
    assert valid, f"junk was accepted silently: {what}"


def _launch_case(op: str, key: str, junk):
    """(call, junk is valid) for a verify / write launch with ``key`` replaced by ``junk``; None if the
    context itself rejects the junk (a KvCanaryError, as wanted)."""
    ctx, verify_kwargs, write_kwargs = _valid_call()
    kwargs = verify_kwargs if op == "verify" else write_kwargs
    if key.startswith("context."):
        field = key.split(".")[1]
        valid = getattr(ctx, field)
        try:
            kwargs["context"] = ctx.replace(**{field: junk})
        except KvCanaryError:
            return None
    else:
        valid, kwargs[key] = kwargs[key], junk
    launch = launch_canary_verify_kernel if op == "verify" else launch_canary_write_kernel
    return (lambda: launch(**kwargs, backend="numpy")), _is_valid(op, key, junk, valid)


def _fingerprint_case(key: str, junk):
    tensor = np.zeros((4, 16), dtype=np.uint8)
    kwargs = dict(
        real_kv_sources=(RealKvSource(tensor=tensor, page_size=1, num_bytes_per_token=16, read_bytes=16),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        slot_indices=np.zeros(2, dtype=np.int64),
        out=np.zeros(2, dtype=np.int64),
    )
    valid = _is_valid("fingerprint", key, junk, kwargs[key])
    kwargs[key] = junk
    return (lambda: compute_real_kv_hash(**kwargs, backend="numpy")), valid


def _allocation_case(what: str, junk):
    if what == "verify":
        call = lambda: VerifyPlan.allocate(verify_capacity=junk)  # noqa: E731
    elif what == "write":
        call = lambda: WritePlan.allocate(write_req_capacity=junk)  # noqa: E731
    else:
        call = lambda: CanaryContext.allocate(**{"num_slots": 4, what: junk})  # noqa: E731
    return call, _is_valid("allocate", what, junk, None)


def _check(case, what: str = "") -> None:
    if case is not None:
        _only_canary_errors(case[0], valid=case[1], what=what)


_CTX_FIELDS = sorted(CanaryContext.__dataclass_fields__)
LAUNCH_KEYS = {op: sorted(kwargs) + ["context." + f for f in _CTX_FIELDS] for op, kwargs in zip(("verify", "write"), _valid_call()[1:])}
FINGERPRINT_KEYS = ["real_kv_sources", "real_kv_hash_mode", "slot_indices", "out"]
CONTEXT_KEYS = ["num_slots", "slot_stride_bytes", "ring_capacity", "kernel_kind", "real_kv_sources", "real_kv_hash_mode"]


@FAST
@given(st.data())
def test_bad_launch_arguments_raise_only_canary_errors(data):
    op = data.draw(st.sampled_from(["verify", "write"]))
    _check(_launch_case(op, data.draw(st.sampled_from(LAUNCH_KEYS[op])), data.draw(JUNK)))


@FAST
@given(st.sampled_from(FINGERPRINT_KEYS), JUNK)
def test_bad_fingerprint_arguments_raise_only_canary_errors(key, junk):
    _check(_fingerprint_case(key, junk))


@FAST
@given(st.sampled_from(["verify", "write", *CONTEXT_KEYS]), JUNK)
def test_bad_allocations_raise_only_canary_errors(what, junk):
    _check(_allocation_case(what, junk))


#: Every kind of junk JUNK draws, at its boundaries: checked for every argument, not sampled.
JUNK_GRID = [None, -3, -1, 0, 1, 3, 4, 0.0, 1.5, "", "a", [], [0], [1, 2]] + [
    np.zeros(shape, dtype) for dtype in (np.int64, np.float32, np.uint8, np.int32)
    for shape in ((0,), (1,), (3,), (2, 8), (1, 1, 1), ())
]


@pytest.mark.parametrize(
    ("kind", "op", "key"),
    [("launch", op, key) for op, keys in LAUNCH_KEYS.items() for key in keys]
    + [("fingerprint", "", key) for key in FINGERPRINT_KEYS]
    + [("allocate", "", key) for key in ["verify", "write", *CONTEXT_KEYS]],
)
def test_every_junk_value_is_rejected_unless_valid(kind, op, key):
    for junk in JUNK_GRID:
        what = f"{key}={junk!r}"
        if kind == "launch":
            _check(_launch_case(op, key, junk), what)
        elif kind == "fingerprint":
            _check(_fingerprint_case(key, junk), what)
        else:
            _check(_allocation_case(key, junk), what)


@pytest.mark.parametrize(
    ("op", "key", "junk"),
    [("verify", "context.kernel_kind", 3), ("write", "expected_input_tokens", None), ("allocate", "verify", 2),
     ("fingerprint", "real_kv_sources", [])],
)
def test_valid_junk_is_recognised(op, key, junk):
    # The oracle above lets through only documented values; everything else must be rejected.
    assert _is_valid(op, key, junk, None)
    assert not _is_valid(op, key, 1.5, None) and not _is_valid(op, key, "a", None)


def test_accepted_junk_fails_the_check():
    with pytest.raises(AssertionError, match="accepted silently"):
        _only_canary_errors(lambda: None, valid=False)
