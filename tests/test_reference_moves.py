"""The moved-records specification on the CPU: gather, scatter, move, the records check and the digest.

Expectations come from outside the specification: records written by the Python oracle of
``move_helpers`` (chain step by step, fingerprints byte by byte), NumPy indexing of the raw
buffers, the scalar verify oracle of ``canary_oracles``, the digest spelled out in Python ints,
and pinned values.
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_oracles import random_source, scalar_real_kv_hash, scalar_verify_rows
from helpers import raises_code
from move_helpers import copy_kv, live_hash, make_pool, oracle_digest, plan_of_runs, ring, runs, write_request

from kvcanary_numba import (
    CanaryHandoffWarning,
    CanaryLaunchTag,
    FailReason,
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
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.reference import digest as reference_digest, records as reference_records
from kvcanary_numba.reference.fingerprint import fold_slots
from kvcanary_numba.reference.live import live_fingerprints

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL
KIND = int(CanaryLaunchTag.SWEEP_K_FULL)
i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731


def fields(ctx) -> np.ndarray:
    return ctx.canary_buf.view(np.int64)[:, :4]


def counters(ctx) -> tuple[int, int]:
    return int(ctx.kernel_run_counter[0]), int(ctx.slot_run_counter[0])


# --- the live fingerprint by words ---------------------------------------------------


@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
@pytest.mark.parametrize(("page_size", "nbytes", "read", "hole"), [(1, 32, 32, 0), (4, 16, 16, 16), (3, 64, 48, 32)])
def test_live_fingerprints_are_the_byte_fold(rng, mode, page_size, nbytes, read, hole):
    sources = [random_source(rng, 30, page_size=page_size, nbytes=nbytes, read_bytes=read, hole=hole) for _ in range(2)]
    slots = i64(rng.permutation(30))
    got = live_fingerprints(sources, mode, slots)
    np.testing.assert_array_equal(got, fold_slots(sources, mode, slots))
    assert [int(v) for v in got[:5]] == [scalar_real_kv_hash(sources, mode, int(s)) for s in slots[:5]]


# --- gather -----------------------------------------------------------------------------


@pytest.mark.parametrize("stride", [32, 48])
def test_gather_copies_the_32_record_bytes_in_slot_order(rng, stride):
    ctx = make_pool(rng, 20, stride=stride)
    ctx.canary_buf[:] = rng.integers(0, 256, ctx.canary_buf.shape, dtype=np.uint8)
    write_request(ctx, [4, 9, 2], [7, 8, 9])  # fingerprints right for these three
    slots = i64([9, 2, 4])
    pack = np.full((3, 32), 0xAA, dtype=np.uint8)
    gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)
    np.testing.assert_array_equal(pack, ctx.canary_buf[slots, :32])
    assert ring(ctx) == [] and counters(ctx) == (1, 3)


def test_gather_zeroes_padding_and_reports_slots_outside_the_buffer(rng):
    ctx = make_pool(rng, 10, mode=NONE, nsrc=0)
    ctx.canary_buf[:] = 0x11
    pack = np.full((4, 32), 0xAA, dtype=np.uint8)
    gather_canary_records(context=ctx, slot_indices=i64([3, 0, 10, -2]), out_records=pack)
    assert (pack[0] == 0x11).all() and not pack[1:].any()
    assert ring(ctx) == [(KIND, 10, -1, -1, -1, 0, 10, 64), (KIND, -2, -1, -1, -1, 0, 10, 64)]
    assert counters(ctx) == (1, 4)


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_gather_reports_kv_that_changed_before_it_left(rng, mode):
    ctx = make_pool(rng, 12, mode=mode, nsrc=2, page_size=2)
    write_request(ctx, [5, 6, 7], [1, 2, 3])
    ctx.real_kv_sources[1].bytes_view()[3, 0] ^= 0x80  # slot 6: row 3, column 0, inside every fold
    pack = np.zeros((3, 32), dtype=np.uint8)
    gather_canary_records(context=ctx, slot_indices=i64([5, 6, 7]), out_records=pack)
    token, position, prev_hash, stored = (int(v) for v in fields(ctx)[6])
    assert ring(ctx) == [(KIND, 6, position, token, -1, prev_hash, to_signed(live_hash(ctx, 6)), 4)]
    assert stored != to_signed(live_hash(ctx, 6))
    np.testing.assert_array_equal(pack, ctx.canary_buf[[5, 6, 7], :32])  # the record leaves anyway


# --- scatter ------------------------------------------------------------------------------


def test_scatter_lands_each_row_and_checks_the_landed_kv(rng):
    a, b = make_pool(rng, 16, page_size=4), make_pool(rng, 16, page_size=4)
    src, dst = [3, 4, 5, 9], [14, 1, 8, 2]
    write_request(a, src, [10, 11, 12, 13])
    copy_kv(a, src, b, dst[:3])  # the last slot's KV never arrives
    pack = np.ascontiguousarray(a.canary_buf[src, :32])
    before = b.canary_buf.copy()
    scatter_canary_records(context=b, records=pack, slot_indices=i64(dst))
    np.testing.assert_array_equal(b.canary_buf[dst, :32], pack)
    untouched = np.setdiff1d(np.arange(16), dst)
    np.testing.assert_array_equal(b.canary_buf[untouched], before[untouched])
    token, position, prev_hash, _ = (int(v) for v in fields(b)[2])
    assert ring(b) == [(KIND, 2, position, token, -1, prev_hash, to_signed(live_hash(b, 2)), 4)]
    assert counters(b) == (1, 4)


def test_scatter_skips_padding_and_reports_slots_outside_the_buffer(rng):
    ctx = make_pool(rng, 8, mode=NONE, nsrc=0)
    before = ctx.canary_buf.copy()
    pack = np.full((3, 32), 0x5A, dtype=np.uint8)
    scatter_canary_records(context=ctx, records=pack, slot_indices=i64([0, 8, 2]))
    assert (ctx.canary_buf[2] == 0x5A).all()
    np.testing.assert_array_equal(np.delete(ctx.canary_buf, 2, axis=0), np.delete(before, 2, axis=0))
    assert ring(ctx) == [(KIND, 8, -1, -1, -1, 0, 8, 64)]


# --- move within a pool -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ([2, 3], [3, 2]),  # a swap
        ([2, 3, 4, 5], [3, 4, 5, 6]),  # a shift onto itself
        ([9, 10, 11], [1, 2, 3]),  # compaction into a hole
        ([5, 6, 7, 8], [8, 5, 6, 7]),  # a rotation
    ],
)
def test_move_reads_every_record_before_writing(rng, src, dst):
    ctx = make_pool(rng, 12, mode=NONE, nsrc=0)
    ctx.canary_buf[:] = rng.integers(0, 256, ctx.canary_buf.shape, dtype=np.uint8)
    want = ctx.canary_buf.copy()
    want[dst] = ctx.canary_buf[src]  # NumPy reads the whole right side first
    scratch = np.zeros((len(src), 32), dtype=np.uint8)
    move_canary_records(context=ctx, src_slot_indices=i64(src), dst_slot_indices=i64(dst), scratch_records=scratch)
    np.testing.assert_array_equal(ctx.canary_buf, want)
    assert ring(ctx) == [] and counters(ctx) == (1, len(src))


def test_move_skips_entries_whose_source_is_padding_or_outside(rng):
    ctx = make_pool(rng, 8, mode=NONE, nsrc=0)
    ctx.canary_buf[:] = rng.integers(0, 256, ctx.canary_buf.shape, dtype=np.uint8)
    before = ctx.canary_buf.copy()
    scratch = np.zeros((3, 32), dtype=np.uint8)
    src, dst = i64([0, 9, 4]), i64([5, 6, 7])
    move_canary_records(context=ctx, src_slot_indices=src, dst_slot_indices=dst, scratch_records=scratch)
    np.testing.assert_array_equal(ctx.canary_buf[[5, 6]], before[[5, 6]])
    np.testing.assert_array_equal(ctx.canary_buf[7], before[4])
    assert ring(ctx) == [(KIND, 9, -1, -1, -1, 0, 8, 64)]


def test_move_checks_the_kv_at_the_destination(rng):
    ctx = make_pool(rng, 10, mode=ALL)
    write_request(ctx, [6, 7], [1, 2])
    copy_kv(ctx, [6], ctx, [1])  # slot 7's KV is not moved to slot 2
    scratch = np.zeros((2, 32), dtype=np.uint8)
    move_canary_records(
        context=ctx, src_slot_indices=i64([6, 7]), dst_slot_indices=i64([1, 2]), scratch_records=scratch
    )
    assert [row[1] for row in ring(ctx)] == [2] and ring(ctx)[0][7] == 4


# --- the records check --------------------------------------------------------------------


def relocated(rng, mode, *, page_size=1, n=6):
    """A request written at some slots of pool ``a``, moved with its KV to shuffled slots of pool ``b``."""
    a, b = make_pool(rng, 32, mode=mode, page_size=page_size), make_pool(rng, 32, mode=mode, page_size=page_size)
    src = [int(s) for s in rng.choice(np.arange(1, 32), n, replace=False)]
    dst = [int(s) for s in rng.choice(np.arange(1, 32), n, replace=False)]
    write_request(a, src, [int(t) for t in rng.integers(0, 1000, n)])
    copy_kv(a, src, b, dst)
    pack = np.zeros((n, 32), dtype=np.uint8)
    gather_canary_records(context=a, slot_indices=i64(src), out_records=pack)
    scatter_canary_records(context=b, records=pack, slot_indices=i64(dst))
    return a, b, src, dst


@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_a_relocated_request_checks_clean_where_it_landed(rng, mode):
    a, b, src, dst = relocated(rng, mode, page_size=2)
    table = runs(dst[:2], dst[2:], starts=[0, 2], prevs=[-1, dst[1]])
    verify_canary_records(
        context=b, slot_indices=table[0], run_offsets=table[1], run_start_positions=table[2], run_prev_slots=table[3]
    )
    assert ring(a) == ring(b) == [] and counters(b) == (2, 12)  # the scatter and the check


def test_the_records_check_records_what_verify_records_for_the_same_entries(rng):
    _, b, _, dst = relocated(rng, ALL, n=8)
    b.real_kv_sources[0].bytes_view()[dst[3], 5] ^= 1  # KV
    b.canary_buf[dst[5], 8] ^= 2  # the position of one record
    b.canary_buf[dst[6], 0] ^= 4  # the token of the next: its successor's chain breaks
    table = runs(dst[:4], [dst[4], 0, *dst[6:], 40], starts=[0, 4], prevs=[-1, dst[3]])  # 0: padding, 40: outside
    verify_canary_records(
        context=b, slot_indices=table[0], run_offsets=table[1], run_start_positions=table[2], run_prev_slots=table[3]
    )
    want = scalar_verify_rows(b, plan_of_runs(*table), check=False)
    assert ring(b) == want
    # dst[5] is not listed (padding in its place), so its changed position is not seen and dst[6]'s link is
    # not checked (predecessor 0); dst[7]'s link to the changed token is.
    assert {row[1]: row[7] for row in want} == {dst[3]: 4, dst[7]: 1, 40: 64}


def test_the_records_check_reads_a_predecessor_outside_the_run(rng):
    ctx = make_pool(rng, 16, mode=NONE, nsrc=0)
    tail_hash = write_request(ctx, [3, 4], [1, 2])
    write_request(ctx, [9, 10], [3, 4], start=2, seed_hash=tail_hash)
    for prev, bits in ((4, 0), (3, 1), (0, 0), (20, 128), (-1, 1)):
        ctx.violation_write_index[0] = 0
        table = runs([9, 10], starts=[2], prevs=[prev])
        verify_canary_records(
            context=ctx,
            slot_indices=table[0],
            run_offsets=table[1],
            run_start_positions=table[2],
            run_prev_slots=table[3],
        )
        assert [row[7] for row in ring(ctx)] == ([bits] if bits else []), prev


def test_the_records_check_of_one_range_equals_the_check_in_two(rng):
    _, b, _, dst = relocated(rng, PARTIAL, n=10)
    b.canary_buf[dst[4], 16] ^= 1  # a prev_hash
    slots, offsets, starts, prevs = runs(dst[:7], dst[7:], starts=[0, 7], prevs=[-1, dst[6]])
    entries = reference_records.run_entries(slots, offsets, starts, prevs)
    whole = reference_records.entry_rows(b, slots, *entries, 0, 10)
    split = np.concatenate([reference_records.entry_rows(b, slots, *entries, lo, hi) for lo, hi in ((0, 5), (5, 10))])
    np.testing.assert_array_equal(whole, split)
    assert whole[:, 2].tolist() == [dst[4], dst[5]]  # its own link, and its successor's (across the split)


# --- the hand-off digest -------------------------------------------------------------------


@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_the_digest_is_the_defined_value_and_does_not_name_slots(rng, mode):
    a, b, src, dst = relocated(rng, mode, page_size=4)
    da, db = np.zeros(2, np.int64), np.zeros(2, np.int64)
    compute_handoff_digest(context=a, slot_indices=i64(src), run_offsets=i64([0, 2, 6]), out_digests=da)
    compute_handoff_digest(context=b, slot_indices=i64(dst), run_offsets=i64([0, 2, 6]), out_digests=db)
    assert list(da) == list(db) == [oracle_digest(a, src[:2]), oracle_digest(a, src[2:])]
    assert counters(a)[0] == 2 and ring(a) == []


def test_the_digest_pinned_value():
    ctx = make_pool(np.random.default_rng(7), 8, mode=ALL)
    ctx.real_kv_sources[0].tensor[...] = (np.arange(8 * 32).reshape(8, 32) * 7 % 251).astype(np.uint8)
    write_request(ctx, [5, 2, 7], [101, 202, 303])
    out = np.zeros(2, np.int64)
    compute_handoff_digest(context=ctx, slot_indices=i64([5, 2, 7]), run_offsets=i64([0, 3, 3]), out_digests=out)
    assert [hex(int(v) & (2**64 - 1)) for v in out] == [hex(oracle_digest(ctx, [5, 2, 7]) & (2**64 - 1)), "0x0"]
    assert hex(int(out[0]) & (2**64 - 1)) == PINNED_DIGEST


#: The digest of test_the_digest_pinned_value's request: a change of the definition changes it.
PINNED_DIGEST = "0xe110a2576117fd9a"


def test_the_digest_depends_on_order_records_and_kv(rng):
    a, _, src, _ = relocated(rng, ALL, n=5)

    def digest(slots):
        out = np.zeros(1, np.int64)
        compute_handoff_digest(context=a, slot_indices=i64(slots), run_offsets=i64([0, len(slots)]), out_digests=out)
        return int(out[0])

    base = digest(src)
    assert digest([src[1], src[0], *src[2:]]) != base  # two entries swapped
    assert digest(src[:4]) != base  # one missing
    assert digest([*src[:4], 0]) != base  # padding instead of the last
    a.canary_buf[src[2], 3] ^= 1
    assert digest(src) != base
    a.canary_buf[src[2], 3] ^= 1
    a.real_kv_sources[0].bytes_view()[src[2], 31] ^= 1
    assert digest(src) != base


#: What a call may change in a context.
STATE = ("canary_buf", "violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter")


@pytest.mark.parametrize("backend", ["numpy", "reference"])
@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_a_digest_with_out_records_is_a_gather_then_a_digest(rng, mode, backend):
    a, _, src, _ = relocated(rng, mode, n=6)
    a.real_kv_sources[0].bytes_view()[src[1], 0] ^= 1 if mode != NONE else 0  # one departing KV changed
    slots = i64([*src[:3], 0, 99, *src[3:]])  # padding, a slot outside the buffer
    offsets = i64([0, 4, 4, len(slots)])
    b = a.replace(**{name: getattr(a, name).copy() for name in STATE})
    before = counters(a)
    pack, out = np.full((len(slots), 32), 0xAB, np.uint8), np.full(3, 9, np.int64)
    if backend == "numpy":  # the public call (the fast wing's CPU path)
        compute_handoff_digest(context=a, slot_indices=slots, run_offsets=offsets, out_digests=out, out_records=pack)
    else:
        reference_digest.compute_handoff_digest(
            context=a, slot_indices=slots, run_offsets=offsets, out_digests=out, out_records=pack
        )
    expected_pack, expected_out = np.zeros_like(pack), np.zeros_like(out)
    gather_canary_records(context=b, slot_indices=slots, out_records=expected_pack)
    compute_handoff_digest(context=b, slot_indices=slots, run_offsets=offsets, out_digests=expected_out)
    np.testing.assert_array_equal(pack, expected_pack)
    assert list(out) == list(expected_out) == [oracle_digest(a, slots[:4]), 0, oracle_digest(a, slots[4:])]
    assert ring(a) == ring(b) and counters(a) == counters(b) == (before[0] + 2, before[1] + 2 * len(slots))
    bits = sorted(row[7] for row in ring(a))
    assert bits == ([4, 64, 64] if mode != NONE else [64, 64])  # the departure check; slot 99 by each half


def test_the_digest_reports_slots_outside_the_buffer_and_adds_nothing_for_them(rng):
    ctx = make_pool(rng, 8, mode=PARTIAL)
    write_request(ctx, [3, 4], [1, 2])
    out = np.zeros(1, np.int64)
    compute_handoff_digest(context=ctx, slot_indices=i64([3, 9, 4]), run_offsets=i64([0, 3]), out_digests=out)
    assert ring(ctx) == [(KIND, 9, -1, -1, -1, 0, 8, 64)]
    index = reference_digest.run_index(i64([3, 9, 4]), i64([0, 3]))
    assert list(index) == [0, 1, 2]


# --- signatures and the comparison -------------------------------------------------------


def test_the_signature_names_mode_sources_and_bytes_but_not_the_page_size(rng):
    a = make_pool(rng, 16, mode=PARTIAL, nsrc=2, page_size=1, nbytes=64, read_bytes=32)
    b = make_pool(rng, 16, mode=PARTIAL, nsrc=2, page_size=4, nbytes=64, read_bytes=48)
    assert HandoffSignature.of(a) == HandoffSignature.of(b)  # PARTIAL folds 16 bytes: read_bytes does not matter
    assert HandoffSignature.of(a).sources == ((64, 16), (64, 16))
    all_a, all_b = (ctx.replace(real_kv_hash_mode=ALL) for ctx in (a, b))
    assert HandoffSignature.of(all_a) != HandoffSignature.of(all_b)
    assert HandoffSignature.of(a.replace(real_kv_hash_mode=NONE)).sources == ()


def test_check_handoff_digest_compares_request_by_request(rng):
    sig = HandoffSignature.of(make_pool(rng, 4, mode=PARTIAL))
    sent = HandoffDigest(signature=sig, digests=i64([1, 2, 3]))
    assert check_handoff_digest(sent, HandoffDigest(signature=sig, digests=i64([1, 2, 3]))).tolist() == [True] * 3
    landed = HandoffDigest(signature=sig, digests=i64([1, 5, 3]))
    assert check_handoff_digest(sent, landed, on_mismatch="miss").tolist() == [True, False, True]
    with raises_code("KVC-K012") as caught:
        check_handoff_digest(sent, landed)
    assert "requests [1]" in str(caught.value)


def test_digests_of_other_layouts_are_not_compared(rng):
    sent = HandoffDigest(signature=HandoffSignature.of(make_pool(rng, 4, mode=PARTIAL)), digests=i64([1]))
    landed = HandoffDigest(signature=HandoffSignature.of(make_pool(rng, 4, mode=ALL)), digests=i64([2]))
    with pytest.warns(CanaryHandoffWarning, match="not compared"):
        assert check_handoff_digest(sent, landed) is None


def test_fail_bits_used_by_the_moves_are_the_documented_ones():
    assert (FailReason.VERIFY_REAL_KV_HASH_MISMATCH, FailReason.SLOT_OUT_OF_RANGE) == (4, 64)
    assert FailReason.WRITE_RANGE_OUT_OF_BOUNDS == 256  # a device run table that does not fit


# --- the CPU path of the public functions: blocks on two threads --------------------------


@pytest.mark.parametrize("block", [1, 7, 64])
def test_the_blocked_cpu_path_records_what_the_specification_records(rng, monkeypatch, block):
    from kvcanary_numba.fast import moves as cpu_moves
    from kvcanary_numba.reference import digest as spec_digest, records as spec_records

    monkeypatch.setattr(cpu_moves, "BLOCK_ENTRIES", block)
    _, b, _, dst = relocated(rng, PARTIAL, n=20)
    b.canary_buf[dst[6], 8] ^= 1  # a position (and its successor's link)
    b.real_kv_sources[0].bytes_view()[dst[13], 2] ^= 1
    table = runs(dst[:9], [dst[9], 0, 77, *dst[12:]], starts=[0, 9], prevs=[-1, dst[8]])
    args = dict(slot_indices=table[0], run_offsets=table[1], run_start_positions=table[2], run_prev_slots=table[3])
    spec = b.replace(violation_ring=b.violation_ring.copy(), violation_write_index=b.violation_write_index.copy())
    spec_records.verify_canary_records(context=spec, **args)
    verify_canary_records(context=b, **args)
    assert ring(b) == ring(spec) and len(ring(b)) == 5  # after slot 77, the next link reads past the buffer (128)
    out, want = np.zeros(2, np.int64), np.zeros(2, np.int64)
    compute_handoff_digest(context=b, slot_indices=table[0], run_offsets=table[1], out_digests=out)
    spec_digest.compute_handoff_digest(context=spec, slot_indices=table[0], run_offsets=table[1], out_digests=want)
    assert out.tolist() == want.tolist() and ring(b) == ring(spec)


def _twin(ctx):
    """A copy of ``ctx``'s buffer, ring and counters over the same sources (the specification's run)."""
    arrays = ("canary_buf", "violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter")
    return ctx.replace(**{name: getattr(ctx, name).copy() for name in arrays})


@pytest.mark.parametrize("block", [1, 3, 64])
def test_the_blocked_cpu_moves_do_what_the_specification_does(rng, monkeypatch, block):
    from kvcanary_numba.fast import moves as cpu_moves
    from kvcanary_numba.reference import move as spec_move

    monkeypatch.setattr(cpu_moves, "BLOCK_ENTRIES", block)
    ctx = make_pool(rng, 24, mode=ALL)
    write_request(ctx, list(range(1, 12)), [int(t) for t in rng.integers(0, 1000, 11)])
    ctx.real_kv_sources[0].bytes_view()[[4, 9], 3] ^= 1  # two slots' KV changed under their records
    spec = _twin(ctx)

    slots = i64([3, 4, 0, 30, 9, -2, 7])  # padding, past the buffer and negative among them
    pack, want = np.full((7, 32), 0xAA, np.uint8), np.full((7, 32), 0xAA, np.uint8)
    gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)
    spec_move.gather_canary_records(context=spec, slot_indices=slots, out_records=want)
    np.testing.assert_array_equal(pack, want)
    assert ring(ctx) == ring(spec) and {r[1] for r in ring(ctx)} == {4, 9, 30, -2}

    dst = i64([20, 21, 0, 22, 40, 23, 12])  # distinct destinations; one past the buffer
    scatter_canary_records(context=ctx, records=pack, slot_indices=dst)
    spec_move.scatter_canary_records(context=spec, records=want, slot_indices=dst)
    np.testing.assert_array_equal(ctx.canary_buf, spec.canary_buf)
    assert ring(ctx) == ring(spec) and counters(ctx) == counters(spec)

    src, to = i64([5, 6, 7, 8, 50]), i64([6, 7, 8, 13, 14])  # overlapping sets: every read before a write
    scratch, spec_scratch = np.zeros((5, 32), np.uint8), np.zeros((5, 32), np.uint8)
    before = ctx.canary_buf[[5, 6, 7, 8], :32].copy()
    move_canary_records(context=ctx, src_slot_indices=src, dst_slot_indices=to, scratch_records=scratch)
    spec_move.move_canary_records(context=spec, src_slot_indices=src, dst_slot_indices=to, scratch_records=spec_scratch)
    np.testing.assert_array_equal(ctx.canary_buf[[6, 7, 8, 13], :32], before)  # by NumPy indexing
    np.testing.assert_array_equal(ctx.canary_buf, spec.canary_buf)
    assert ring(ctx) == ring(spec) and counters(ctx) == counters(spec)
    assert {r[1] for r in ring(ctx)[-4:]} >= {50}  # the source past the buffer is reported, its pair skipped
