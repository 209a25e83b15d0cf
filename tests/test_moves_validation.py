"""Bad input to the moved-records operations: each gets its coded error, and a rejected call changes nothing.

The public (fast-wing) functions are called; a second call with the same layouts but other
values re-runs the value checks a memo hit owes (run tables are values, KVC-K006 / KVC-K007).
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import FakeCudaArray
from helpers import raises_code
from move_helpers import make_pool, runs, write_request

from kvcanary_numba import (
    CanaryContext,
    HandoffDigest,
    HandoffSignature,
    RealKvHashMode,
    check_handoff_digest,
    compute_handoff_digest,
    gather_canary_records,
    move_canary_records,
    scatter_canary_records,
    verify_canary_records,
)
from kvcanary_numba.fast.calls import OPERATIONS

i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731


@pytest.fixture
def ctx(rng):
    ctx = make_pool(rng, 16, mode=RealKvHashMode.PARTIAL)
    write_request(ctx, [3, 4, 5], [1, 2, 3])
    return ctx


def snapshot(ctx) -> list[np.ndarray]:
    return [a.copy() for a in (ctx.canary_buf, ctx.violation_ring, ctx.violation_write_index, ctx.slot_run_counter)]


def unchanged(before, ctx) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(before, snapshot(ctx)))


SLOTS = i64([3, 4, 5])


@pytest.mark.parametrize(
    ("code", "changes"),
    [
        ("KVC-K001", dict(out_records=np.zeros((2, 32), np.uint8))),
        ("KVC-K002", dict(out_records=np.zeros((3, 40), np.uint8))),
        ("KVC-C002", dict(out_records=np.zeros((3, 4), np.int64))),
        ("KVC-C003", dict(out_records=np.zeros(96, np.uint8))),
        ("KVC-C006", dict(out_records=np.zeros((3, 64), np.uint8)[:, ::2])),
        ("KVC-C002", dict(slot_indices=SLOTS.astype(np.int32))),
        ("KVC-C003", dict(slot_indices=SLOTS.reshape(3, 1))),
        ("KVC-C007", dict(slot_indices=FakeCudaArray(SLOTS))),
        ("KVC-V001", dict(context="ctx")),
        ("KVC-C014", dict(out_records=np.zeros(3 * 32 + 1, np.uint8)[1:].reshape(3, 32))),
    ],
)
def test_gather_rejects(ctx, code, changes):
    args = {**dict(context=ctx, slot_indices=SLOTS, out_records=np.zeros((3, 32), np.uint8)), **changes}
    before = snapshot(ctx)
    with raises_code(code):
        gather_canary_records(**args)
    assert unchanged(before, ctx)


def test_outputs_may_not_share_memory(ctx):
    with raises_code("KVC-C017"):  # the pack over the canary buffer itself
        gather_canary_records(context=ctx, slot_indices=SLOTS, out_records=ctx.canary_buf[:3])
    before = snapshot(ctx)
    with raises_code("KVC-C017"):  # scatter writes the canary buffer: the pack may not be in it
        scatter_canary_records(context=ctx, records=ctx.canary_buf[8:11], slot_indices=SLOTS)
    scratch = ctx.canary_buf[8:11]
    with raises_code("KVC-C017"):
        move_canary_records(context=ctx, src_slot_indices=SLOTS, dst_slot_indices=SLOTS + 4, scratch_records=scratch)
    assert unchanged(before, ctx)


def test_scatter_and_move_need_a_writeable_buffer_and_matching_lengths(ctx):
    read_only = ctx.replace(canary_buf=ctx.canary_buf.copy())
    read_only.canary_buf.setflags(write=False)
    with raises_code("KVC-C013"):
        scatter_canary_records(context=read_only, records=np.zeros((3, 32), np.uint8), slot_indices=SLOTS)
    with raises_code("KVC-K001"):
        scatter_canary_records(context=ctx, records=np.zeros((4, 32), np.uint8), slot_indices=SLOTS)
    with raises_code("KVC-K003"):
        move_canary_records(
            context=ctx, src_slot_indices=SLOTS, dst_slot_indices=SLOTS[:2], scratch_records=np.zeros((3, 32), np.uint8)
        )
    with raises_code("KVC-K001"):
        move_canary_records(
            context=ctx, src_slot_indices=SLOTS, dst_slot_indices=SLOTS, scratch_records=np.zeros((2, 32), np.uint8)
        )


def records_args(ctx, **changes):
    slots, offsets, starts, prevs = runs([3, 4], [5], starts=[0, 2], prevs=[-1, 4])
    args = dict(context=ctx, slot_indices=slots, run_offsets=offsets, run_start_positions=starts, run_prev_slots=prevs)
    return {**args, **changes}


@pytest.mark.parametrize(
    ("code", "changes"),
    [
        ("KVC-K004", dict(run_offsets=i64([]), run_start_positions=i64([]), run_prev_slots=i64([]))),
        ("KVC-K005", dict(run_offsets=i64([0]), run_start_positions=i64([]), run_prev_slots=i64([]))),
        ("KVC-K006", dict(run_offsets=i64([0, 3, 2]))),
        ("KVC-K006", dict(run_offsets=i64([1, 2, 3]))),
        ("KVC-K006", dict(run_offsets=i64([0, 2, 4]))),
        ("KVC-K007", dict(run_start_positions=i64([0, -2]))),
        ("KVC-K007", dict(run_start_positions=i64([2**63 - 1, 0]))),  # run 0 holds two positions
        ("KVC-C004", dict(run_prev_slots=i64([-1]))),
        ("KVC-C004", dict(run_start_positions=i64([0, 2, 4]))),
        ("KVC-C002", dict(run_offsets=np.array([0, 2, 3], np.int32))),
    ],
)
def test_records_check_rejects(ctx, code, changes):
    before = snapshot(ctx)
    with raises_code(code):
        verify_canary_records(**records_args(ctx, **changes))
    assert unchanged(before, ctx)


def test_a_memo_hit_still_checks_the_run_table_values(ctx):
    offsets = i64([0, 2, 3])
    verify_canary_records(**records_args(ctx, run_offsets=offsets))
    hits = OPERATIONS["verify_canary_records"].memo
    offsets[1] = 4  # same layout, other values
    with raises_code("KVC-K006"):
        verify_canary_records(**records_args(ctx, run_offsets=offsets))
    out, table = np.zeros(2, np.int64), i64([0, 2, 3])
    compute_handoff_digest(context=ctx, slot_indices=SLOTS, run_offsets=table, out_digests=out)
    table[2] = 1
    with raises_code("KVC-K006"):
        compute_handoff_digest(context=ctx, slot_indices=SLOTS, run_offsets=table, out_digests=out)
    assert hits is OPERATIONS["verify_canary_records"].memo


def test_digest_rejects(ctx):
    with raises_code("KVC-C004"):
        compute_handoff_digest(
            context=ctx, slot_indices=SLOTS, run_offsets=i64([0, 3]), out_digests=np.zeros(2, np.int64)
        )
    with raises_code("KVC-C013"):
        out = np.zeros(1, np.int64)
        out.setflags(write=False)
        compute_handoff_digest(context=ctx, slot_indices=SLOTS, run_offsets=i64([0, 3]), out_digests=out)
    with raises_code("KVC-K005"):
        compute_handoff_digest(context=ctx, slot_indices=SLOTS, run_offsets=i64([0]), out_digests=np.zeros(0, np.int64))
    table = dict(context=ctx, slot_indices=SLOTS, run_offsets=i64([0, len(SLOTS)]), out_digests=np.zeros(1, np.int64))
    before = ctx.canary_buf.copy(), int(ctx.kernel_run_counter[0])
    with raises_code("KVC-K001"):
        compute_handoff_digest(**table, out_records=np.zeros((len(SLOTS) + 1, 32), np.uint8))
    with raises_code("KVC-K002"):
        compute_handoff_digest(**table, out_records=np.zeros((len(SLOTS), 24), np.uint8))
    with raises_code("KVC-C017"):  # the pack over the digests
        both = np.zeros(len(SLOTS) * 32 + 8, np.uint8)
        out = both[:8].view(np.int64)
        compute_handoff_digest(**{**table, "out_digests": out}, out_records=both[: len(SLOTS) * 32].reshape(-1, 32))
    assert np.array_equal(ctx.canary_buf, before[0]) and int(ctx.kernel_run_counter[0]) == before[1]


def test_handoff_objects_reject(ctx):
    with raises_code("KVC-K008"):
        HandoffSignature.of(ctx, ctx.replace(real_kv_hash_mode=RealKvHashMode.ALL))
    with raises_code("KVC-K008"):
        HandoffSignature.of()
    with raises_code("KVC-V001"):
        HandoffSignature.of("ctx")
    with raises_code("KVC-K010"):
        HandoffDigest(signature=(1, 2), digests=i64([1]))
    with raises_code("KVC-C002"):
        HandoffDigest(signature=HandoffSignature.of(ctx), digests=np.zeros(2, np.int32))
    sent = HandoffDigest(signature=HandoffSignature.of(ctx), digests=i64([1, 2]))
    with raises_code("KVC-K009"):
        check_handoff_digest(sent, i64([1, 2]))
    with raises_code("KVC-K011"):
        check_handoff_digest(sent, HandoffDigest(signature=sent.signature, digests=i64([1])))
    with raises_code("KVC-C009"):
        check_handoff_digest(sent, sent, on_mismatch="ignore")
    with raises_code("KVC-K012"):
        check_handoff_digest(sent, HandoffDigest(signature=sent.signature, digests=i64([1, 3])))


def test_a_context_without_sources_is_fine_and_folds_nothing(rng):
    ctx = CanaryContext.allocate(num_slots=8)
    out = np.zeros(1, np.int64)
    compute_handoff_digest(context=ctx, slot_indices=i64([1, 2]), run_offsets=i64([0, 2]), out_digests=out)
    assert HandoffSignature.of(ctx).sources == () and int(ctx.kernel_run_counter[0]) == 1


# --- one mutated argument at a time: a coded error or a clean run, never anything else ---------

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from kvcanary_numba import KvCanaryError  # noqa: E402

MUTATIONS = {
    "int32": lambda a: a.astype(np.int32) if isinstance(a, np.ndarray) else a,
    "float": lambda a: a.astype(np.float64) if isinstance(a, np.ndarray) else 1.5,
    "2-D": lambda a: a.reshape(1, -1) if isinstance(a, np.ndarray) else a,
    "shorter": lambda a: a[:-1] if isinstance(a, np.ndarray) and a.shape[0] else a,
    "longer": lambda a: np.concatenate([a, a[:1]]) if isinstance(a, np.ndarray) and a.shape[0] else a,
    "strided": lambda a: np.repeat(a, 2, axis=0)[::2] if isinstance(a, np.ndarray) else a,
    "read-only": lambda a: _read_only(a),
    "list": lambda a: a.tolist() if isinstance(a, np.ndarray) else [a],
    "None": lambda a: None,
    "device": lambda a: FakeCudaArray(a) if isinstance(a, np.ndarray) else a,
    "huge slot": lambda a: np.full_like(a, 2**62) if isinstance(a, np.ndarray) and a.dtype == np.int64 else a,
    "negative": lambda a: -a if isinstance(a, np.ndarray) and a.dtype == np.int64 else a,
}


def _read_only(a):
    if not isinstance(a, np.ndarray):
        return a
    b = a.copy()
    b.setflags(write=False)
    return b


def valid_call(name: str, ctx):
    slots = i64([3, 4, 5])
    if name == "gather":
        return gather_canary_records, dict(context=ctx, slot_indices=slots, out_records=np.zeros((3, 32), np.uint8))
    if name == "scatter":
        return scatter_canary_records, dict(context=ctx, records=np.zeros((3, 32), np.uint8), slot_indices=slots + 6)
    if name == "move":
        scratch = np.zeros((3, 32), np.uint8)
        return move_canary_records, dict(
            context=ctx, src_slot_indices=slots, dst_slot_indices=slots + 1, scratch_records=scratch
        )
    if name == "records":
        return verify_canary_records, records_args(ctx)
    kwargs = dict(context=ctx, slot_indices=slots, run_offsets=i64([0, 1, 3]), out_digests=np.zeros(2, np.int64))
    if name == "gather with digest":
        kwargs["out_records"] = np.zeros((3, 32), np.uint8)
    return compute_handoff_digest, kwargs


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(["gather", "scatter", "move", "records", "digest", "gather with digest"]),
    st.data(),
    st.sampled_from(sorted(MUTATIONS)),
)
def test_one_bad_argument_is_a_coded_error_or_a_clean_run(ctx, name, data, mutation):
    function, kwargs = valid_call(name, ctx)
    argument = data.draw(st.sampled_from(sorted(k for k in kwargs if k != "context")))
    kwargs[argument] = MUTATIONS[mutation](kwargs[argument])
    before = snapshot(ctx)
    try:
        function(**kwargs)
    except KvCanaryError as exc:
        assert str(exc).endswith(exc.entry.ending)
        assert unchanged(before, ctx), f"{name}: rejected with {exc.code} after changing state"
        return
    # Accepted: a slot value outside the buffer is data, reported by a row (bit 64; 128 for a run's
    # predecessor), never read.
    reported = mutation == "huge slot" or argument != "run_prev_slots"  # a negative predecessor: a chain head
    if mutation in ("huge slot", "negative") and "slot" in argument and reported:
        new = ctx.violation_ring[: int(ctx.violation_write_index[0])]
        bit = 128 if argument == "run_prev_slots" else 64
        assert any(int(row[7]) & bit for row in new), f"{name}: {argument} {mutation} not reported"


def test_a_memo_hit_still_tests_shared_memory(ctx):
    pack = np.zeros((3, 32), np.uint8)
    gather_canary_records(context=ctx, slot_indices=SLOTS, out_records=pack)
    alias = ctx.canary_buf[10:13]  # the same layout as ``pack``: the same snapshot
    before = snapshot(ctx)
    with raises_code("KVC-C017"):
        gather_canary_records(context=ctx, slot_indices=SLOTS, out_records=alias)
    assert unchanged(before, ctx)
