"""Hypothesis properties of the CPU path: bad arguments of launches, fingerprints and allocations
raise only KvCanaryError (valid junk aside)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from hypothesis import HealthCheck, given, settings, strategies as st

from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    KvCanaryError,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    WritePlan,
    compute_real_kv_hash,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)

# Examples are cheap but the first one compiles the write loop: no deadline.
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JUNK = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.lists(st.integers(-2, 2), max_size=3),
    st.sampled_from([np.int64, np.float32, np.uint8, np.int32]).flatmap(
        lambda dtype: st.sampled_from([(0,), (1,), (3,), (2, 8), (1, 1, 1), ()]).map(
            lambda shape: np.zeros(shape, dtype)
        )
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
LAUNCH_KEYS = {
    op: sorted(kwargs) + ["context." + f for f in _CTX_FIELDS]
    for op, kwargs in zip(("verify", "write"), _valid_call()[1:])
}
FINGERPRINT_KEYS = ["real_kv_sources", "real_kv_hash_mode", "slot_indices", "out"]
CONTEXT_KEYS = [
    "num_slots",
    "slot_stride_bytes",
    "ring_capacity",
    "kernel_kind",
    "real_kv_sources",
    "real_kv_hash_mode",
]


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
    np.zeros(shape, dtype)
    for dtype in (np.int64, np.float32, np.uint8, np.int32)
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
    [
        ("verify", "context.kernel_kind", 3),
        ("write", "expected_input_tokens", None),
        ("allocate", "verify", 2),
        ("fingerprint", "real_kv_sources", []),
    ],
)
def test_valid_junk_is_recognised(op, key, junk):
    # The oracle above lets through only documented values; everything else must be rejected.
    assert _is_valid(op, key, junk, None)
    assert not _is_valid(op, key, 1.5, None) and not _is_valid(op, key, "a", None)


def test_accepted_junk_fails_the_check():
    with pytest.raises(AssertionError, match="accepted silently"):
        _only_canary_errors(lambda: None, valid=False)
