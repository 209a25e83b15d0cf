"""The specification (``kvcanary_numba.reference``) against the optimised CPU path, byte for byte.

Every operation runs twice on copies of one input, once per implementation,
and every output array must come out with the same bytes: canary buffers,
rings (row for row: both record in order), write indices, counters, plans.
The inputs are hostile on purpose (out-of-range slots, seeds and request rows,
negative and wrapping offsets, rings that overflow or whose int32 index wraps,
-1 expected tokens, padding slot 0, strided and broadcast real-KV sources), as
``docs/concepts/semantics.md`` defines results for all of them.

A few tests at the end check documented behaviour against values written out
here, independently of both implementations.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvcanary_numba.constants import (
    CANARY_CHAIN_HEAD,
    OUT_OF_RANGE_SLOT,
    VIOLATION_INDEX_SATURATED,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
)
from kvcanary_numba.context import CanaryContext, RealKvSource
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed
from kvcanary_numba.plans import VerifyPlan, WritePlan
from kvcanary_numba.reference import (
    fingerprint as spec_fingerprint,
    plan as spec_plan,
    ring as spec_ring,
    verify as spec_verify,
    write as spec_write,
)

#: The optimised CPU implementation the specification is compared with: the one line to
#: change when it moves (to ``kvcanary_numba.fast.cpu``).
FAST_CPU = "kvcanary_numba.fast.cpu"


def fast(op: str) -> ModuleType:
    """Module ``op`` of the optimised CPU implementation (the ring helpers live in its ``verify``)."""
    return importlib.import_module(f"{FAST_CPU}.{op}")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
SATURATED = VIOLATION_INDEX_SATURATED
MODES = list(RealKvHashMode)
#: Sizes around a warp (31, 32, 33), the CPU path's chunk of 2048 entries and its
#: serial-fold threshold of 1024 slots, and several chunks.
EDGE_SIZES = [0, 1, 31, 32, 33, 1025, 2048, 2049, 5000]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- byte comparison -------------------------------------------------------------


def assert_same_bytes(name: str, ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal dtype, shape and bytes (NaN patterns and -0.0 included)."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (
        f"{name}: {ours.dtype}{ours.shape} vs {theirs.dtype}{theirs.shape}"
    )
    a = np.ascontiguousarray(ours).view(np.uint8).reshape(-1)
    b = np.ascontiguousarray(theirs).view(np.uint8).reshape(-1)
    if not np.array_equal(a, b):
        first = int(np.flatnonzero(a != b)[0]) // ours.itemsize
        at = np.unravel_index(first, ours.shape) if ours.ndim else ()
        raise AssertionError(f"{name} differs first at {at}: spec {ours[at]!r}, cpu {theirs[at]!r}")


CONTEXT_ARRAYS = (
    "canary_buf",
    "violation_ring",
    "violation_write_index",
    "slot_run_counter",
    "kernel_run_counter",
    "enable_chain_position_assert",
)


def assert_same_context(ours: CanaryContext, theirs: CanaryContext) -> None:
    for name in CONTEXT_ARRAYS:
        assert_same_bytes(f"context.{name}", getattr(ours, name), getattr(theirs, name))


def assert_same_plan(ours, theirs) -> None:
    for name, array in ours.arrays().items():
        assert_same_bytes(name, array, getattr(theirs, name))


def copy_plan(plan):
    return type(plan)(**{name: array.copy() for name, array in plan.arrays().items()})


# --- real-KV sources ---------------------------------------------------------------

LAYOUTS = ["contiguous", "strided", "every_other_row", "broadcast"]
SOURCE_DTYPES = [np.uint8, np.int16, np.float32, np.int64]


def aligned_empty(shape: tuple[int, ...], dtype, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``align``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


def make_source(rng: np.random.Generator, slots: int, layout: str) -> RealKvSource:
    """A source covering at least ``slots`` slots (fewer for ``slots`` < 0: -slots short of covering)."""
    page = int(rng.choice([1, 2, 3, 4]))
    nbt = int(rng.choice([16, 32, 64]))
    read = 16 * int(rng.integers(1, nbt // 16 + 1))
    dtype = np.dtype(rng.choice(SOURCE_DTYPES))
    rows = max(-(-abs(slots) // page) + int(rng.integers(0, 3)), 1) if slots >= 0 else max(-slots // page, 1)
    row_bytes = page * nbt + 16 * int(rng.integers(0, 3))  # a hole past the last slot of a row, or none
    cols = row_bytes // dtype.itemsize
    if layout == "broadcast":  # every row is the same memory (row stride 0)
        one = aligned_empty((1, cols), dtype)
        one.view(np.uint8)[...] = rng.integers(0, 256, one.nbytes, dtype=np.uint8).reshape(1, -1)
        tensor = np.broadcast_to(one, (rows, cols))
    else:
        pad = 16 * int(rng.integers(1, 3)) // dtype.itemsize if layout == "strided" else 0
        step = 2 if layout == "every_other_row" else 1
        base = aligned_empty((rows * step, cols + pad), dtype)
        base.view(np.uint8)[...] = rng.integers(0, 256, base.nbytes, dtype=np.uint8).reshape(base.shape[0], -1)
        tensor = base[::step, :cols]
    return RealKvSource(tensor=tensor, page_size=page, num_bytes_per_token=nbt, read_bytes=read)


def make_sources(rng, slots: int, count: int) -> tuple[RealKvSource, ...]:
    return tuple(make_source(rng, slots, str(rng.choice(LAYOUTS))) for _ in range(count))


# --- contexts ------------------------------------------------------------------


def make_context(
    rng,
    *,
    num_slots: int,
    mode=RealKvHashMode.NONE,
    sources=(),
    ring_capacity: int = 16,
    write_index: int = 0,
    chain_assert: int = 1,
    stride: int = 32,
) -> CanaryContext:
    """A context with garbage everywhere the launches must not look (ring rows, stride padding)."""
    buf = aligned_empty((num_slots, stride), np.uint8)
    buf[...] = rng.integers(0, 256, buf.shape, dtype=np.uint8)
    return CanaryContext(
        canary_buf=buf,
        kernel_kind=CanaryLaunchTag(int(rng.integers(0, len(CanaryLaunchTag)))),
        violation_ring=rng.integers(INT64_MIN, INT64_MAX, (ring_capacity, 8), dtype=np.int64, endpoint=True),
        violation_write_index=np.array([write_index], dtype=np.int32),
        slot_run_counter=np.array([rng.choice([0, 7, INT64_MAX - 3])], dtype=np.int64),
        kernel_run_counter=np.array([rng.choice([0, 7, INT64_MAX])], dtype=np.int64),
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=RealKvHashMode(mode),
        enable_chain_position_assert=np.array([chain_assert], dtype=np.int32),
    )


def copy_context(ctx: CanaryContext) -> CanaryContext:
    """Fresh copies of every array a launch may write; the sources are shared (only read)."""
    return ctx.replace(**{name: getattr(ctx, name).copy() for name in CONTEXT_ARRAYS})


def ring_setup(rng) -> tuple[int, int]:
    """(ring capacity, starting write index): empty, part full, overflowing, full, near or past the
    saturation value, near the int32 limit, or negative."""
    capacity = int(rng.choice([1, 3, 16, 64]))
    near = [SATURATED - 3, SATURATED - 1, SATURATED, INT32_MAX - 2, INT32_MAX, -(2**31)]
    start = int(rng.choice([0, 0, 0, capacity - 1, capacity, capacity + 5, *near]))
    return capacity, start


def records(ctx: CanaryContext) -> np.ndarray:
    return ctx.canary_buf.view(np.int64)


def chain_hash(record) -> int:
    """Signed chain hash of one record (int64 fields token, position, prev_hash)."""
    return to_signed(splitmix64_mix3(int(record[2]), int(record[0]), int(record[1])))


def stamp_chains(rng, ctx: CanaryContext, fingerprint) -> list[list[int]]:
    """Give the slots 1.. consistent chains (prev hashes, real-KV hashes); returns the chains.

    Fields keep some garbage values (slots left out of every chain); ``fingerprint`` is the
    CPU fold used to make most real-KV fields right.
    """
    fields = records(ctx)
    num_slots = fields.shape[0]
    order = rng.permutation(np.arange(1, num_slots))
    chains, i = [], 0
    while i < order.shape[0]:
        n = int(rng.integers(1, 40))
        chains.append([int(s) for s in order[i : i + n]])
        i += n
    for chain in chains:
        position = int(rng.choice([0, 0, 5, INT64_MAX - 2]))  # near INT64_MAX: positions wrap
        prev = None
        for slot in chain:
            fields[slot, 0] = int(rng.integers(0, 4))
            fields[slot, 1] = position
            fields[slot, 2] = to_signed(CANARY_CHAIN_HEAD) if prev is None else chain_hash(fields[prev])
            position = to_signed(position + 1)
            prev = slot
    if num_slots:
        real = fingerprint(ctx.real_kv_sources, ctx.real_kv_hash_mode, np.arange(num_slots)).view(np.int64)
        keep = rng.random(num_slots) < 0.9
        fields[keep, 3] = real[keep]
    return chains


# --- ring, counters ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("start", [0, 5, -1, "max", "min"])
@pytest.mark.parametrize("amount", [0, 1, 3, -2, 2**31, 2**63 - 1, -(2**63)])
def test_bump_matches(dtype, start, amount):
    info = np.iinfo(dtype)
    value = {"max": info.max, "min": info.min}.get(start, start)
    ours, theirs = np.array([value], dtype=dtype), np.array([value], dtype=dtype)
    spec_ring.bump(ours, amount)
    fast("verify").bump(theirs, amount)
    assert_same_bytes("counter", ours, theirs)
    bits = 8 * np.dtype(dtype).itemsize
    assert int(ours[0]) == to_signed_width(value + amount, bits)


def to_signed_width(value: int, bits: int) -> int:
    value %= 1 << bits
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([0, 1, 2, 5, 17, 40]))
def test_append_violation_rows_matches(seed, k):
    rng = np.random.default_rng(seed)
    capacity, start = ring_setup(rng)
    ctx = make_context(rng, num_slots=1, ring_capacity=capacity, write_index=start)
    rows = rng.integers(INT64_MIN, INT64_MAX, (k, 8), dtype=np.int64, endpoint=True)
    ours, theirs = copy_context(ctx), copy_context(ctx)
    spec_ring.append_violation_rows(ours, rows)
    fast("verify").append_violation_rows(theirs, rows)
    assert_same_context(ours, theirs)


def test_canary_fields_matches():
    buf = aligned_empty((5, 48), np.uint8)
    buf[...] = np.arange(buf.size, dtype=np.uint8).reshape(buf.shape)
    ours, theirs = spec_ring.canary_fields(buf), fast("verify").canary_fields(buf)
    assert_same_bytes("fields", ours, theirs)
    assert ours.shape == (5, 6) and np.shares_memory(ours, buf)


# --- fingerprint ----------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(MODES),
    nsrc=st.integers(0, 4),
    n=st.sampled_from(EDGE_SIZES[:6]),
    short=st.booleans(),
)
def test_fingerprint_matches(seed, mode, nsrc, n, short):
    rng = np.random.default_rng(seed)
    covered = int(rng.integers(1, 200))
    # ``short``: the last source covers fewer slots, so the covered prefix ends earlier.
    sources = make_sources(rng, covered, nsrc)
    if short and nsrc:
        sources = (*sources[:-1], make_source(rng, -max(covered // 2, 1), str(rng.choice(LAYOUTS))))
    slots = rng.choice(np.array([0, -1, -5, covered - 1, covered, covered + 3, OUT_OF_RANGE_SLOT, INT64_MIN]), n)
    inside = rng.random(n) < 0.7
    slots[inside] = rng.integers(0, covered, int(inside.sum()))
    ours = rng.integers(INT64_MIN, INT64_MAX, n, dtype=np.int64, endpoint=True)
    theirs = ours.copy()
    spec_fingerprint.compute_real_kv_hash(real_kv_sources=sources, real_kv_hash_mode=mode, slot_indices=slots, out=ours)
    fast("fingerprint").compute_real_kv_hash(
        real_kv_sources=sources, real_kv_hash_mode=mode, slot_indices=slots, out=theirs
    )
    assert_same_bytes("out", ours, theirs)
    assert_same_bytes(
        "fold_slots",
        spec_fingerprint.fold_slots(sources, mode, slots),
        fast("fingerprint").fold_slots(sources, mode, slots),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nsrc", [1, 2, 3, 4])
def test_fingerprint_matches_every_layout(layout, mode, nsrc):
    rng = np.random.default_rng(nsrc * 100 + int(mode) * 10 + LAYOUTS.index(layout))
    sources = tuple(make_source(rng, 300, layout) for _ in range(nsrc))
    slots = np.concatenate([np.arange(-2, 303), rng.integers(0, 300, 2000)])
    ours = spec_fingerprint.fold_slots(sources, mode, slots)
    assert_same_bytes("fold_slots", ours, fast("fingerprint").fold_slots(sources, mode, slots))
    if mode != RealKvHashMode.NONE:
        assert np.count_nonzero(ours[2:302]) >= 295  # hashes of random bytes, not zeros


def test_fingerprint_rejects_an_unknown_mode():
    source = make_source(np.random.default_rng(0), 4, "contiguous")
    for implementation in (spec_fingerprint, fast("fingerprint")):
        with pytest.raises(ValueError):
            implementation.fold_slots((source,), 7, np.arange(3))


# --- verify ---------------------------------------------------------------------


def make_verify_case(rng, n: int, mode, nsrc: int):
    """(context, plan, check_token) with chains that mostly verify and hostile entries mixed in."""
    num_slots = int(rng.integers(1, 300))
    capacity, start = ring_setup(rng)
    sources = make_sources(rng, num_slots, nsrc)
    ctx = make_context(
        rng,
        num_slots=num_slots,
        mode=mode,
        sources=sources,
        ring_capacity=capacity,
        write_index=start,
        stride=int(rng.choice([32, 40, 64])),
    )
    chains = stamp_chains(rng, ctx, fast("fingerprint").fold_slots)
    fields = records(ctx)
    entries = []  # the entries a plan lists: slot, expected token, position, prev
    while len(entries) < n and chains:
        chain = chains[int(rng.integers(0, len(chains)))]
        cut = int(rng.integers(0, len(chain)))  # a window start: the first entry's prev is the slot before
        for j in range(cut, len(chain)):
            slot = chain[j]
            prev = chain[j - 1] if j else -1
            entries.append([slot, int(fields[slot, 0]), int(fields[slot, 1]), prev])
    entries = (entries + [[0, 0, 0, -1]] * n)[:n]  # one-slot buffers have no chain: padding entries
    table = np.array(entries, dtype=np.int64).reshape(n, 4)
    hostile = {
        0: [0, -1, -3, num_slots, num_slots + 1, OUT_OF_RANGE_SLOT, INT64_MIN],
        1: [-1, -1, 0, 1, 2, INT64_MAX],
        2: [0, 1, -1, INT64_MAX, INT64_MIN],
        3: [0, 0, -1, -9, num_slots, OUT_OF_RANGE_SLOT, INT64_MIN, int(rng.integers(0, num_slots))],
    }
    for column, values in hostile.items():
        bad = rng.random(n) < 0.08
        table[bad, column] = rng.choice(np.array(values, dtype=np.int64), int(bad.sum()))
    for field in range(4):  # corrupt a few records after the plan was taken from them
        bad = rng.random(num_slots) < 0.04
        fields[bad, field] ^= rng.integers(1, 1 << 40, int(bad.sum()))
    extra = int(rng.integers(0, 4))
    plan = VerifyPlan(
        verify_slot_indices=np.concatenate([table[:, 0], rng.integers(-2, num_slots + 2, extra)]),
        verify_expected_tokens=np.concatenate([table[:, 1], rng.integers(-1, 4, extra)]),
        verify_expected_positions=np.concatenate([table[:, 2], rng.integers(0, 9, extra)]),
        verify_prev_slot_indices=np.concatenate([table[:, 3], rng.integers(-2, num_slots + 2, extra)]),
        verify_num_valid=np.array([rng.choice([n, n, n, -4, n + extra, n + extra + 9])], dtype=np.int32),
        enable=np.array([rng.choice([1, 1, 1, 1, 0, -3])], dtype=np.int32),
    )
    return ctx, plan, bool(rng.random() < 0.7)


def run_verify(ctx, plan, check_token):
    ours, theirs = copy_context(ctx), copy_context(ctx)
    spec_verify.launch_canary_verify_kernel(context=ours, plan=plan, check_verify_expected_token=check_token)
    fast("verify").launch_canary_verify_kernel(context=theirs, plan=plan, check_verify_expected_token=check_token)
    return ours, theirs


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 80),
    mode=st.sampled_from(MODES),
    nsrc=st.integers(0, 4),
)
def test_verify_matches(seed, n, mode, nsrc):
    rng = np.random.default_rng(seed)
    ctx, plan, check_token = make_verify_case(rng, n, mode, nsrc)
    before = copy_plan(plan)
    ours, theirs = run_verify(ctx, plan, check_token)
    assert_same_context(ours, theirs)
    assert_same_bytes("canary_buf (verify only reads it)", ours.canary_buf, ctx.canary_buf)
    assert_same_plan(plan, before)


@pytest.mark.parametrize("n", EDGE_SIZES)
@pytest.mark.parametrize("mode", MODES)
def test_verify_matches_edge_sizes(n, mode):
    rng = np.random.default_rng(1000 + n + int(mode))
    ctx, plan, _ = make_verify_case(rng, n, mode, 1 + n % 4)
    plan.verify_num_valid[0], plan.enable[0] = n, 1
    ctx = ctx.replace(violation_ring=np.zeros((n + 8, 8), np.int64), violation_write_index=np.zeros(1, np.int32))
    for check_token in (False, True):
        ours, theirs = run_verify(ctx, plan, check_token)
        assert_same_context(ours, theirs)
        rows = int(ours.violation_write_index[0])
        if n >= 1025:  # hostile entries and corrupt records at the usual rates: rows of every kind
            bits = np.bitwise_or.reduce(ours.violation_ring[:rows, 7])
            assert bits & (1 | 2 | 64 | 128) == 1 | 2 | 64 | 128, bits
            assert rows < 3 * n // 4  # many entries verify: the chains are real


# --- write ----------------------------------------------------------------------


def make_write_case(rng, num_tokens: int, num_reqs: int, mode, nsrc: int):
    """(context, kwargs) of a write with plausible chains and hostile requests and entries."""
    num_slots = int(rng.integers(1, 120))
    capacity, start = ring_setup(rng)
    sources = make_sources(rng, num_slots, nsrc)
    ctx = make_context(
        rng,
        num_slots=num_slots,
        mode=mode,
        sources=sources,
        ring_capacity=capacity,
        write_index=start,
        chain_assert=int(rng.choice([1, 1, 0, 5])),
        stride=int(rng.choice([32, 48])),
    )
    stamp_chains(rng, ctx, fast("fingerprint").fold_slots)
    fields = records(ctx)
    # Requests split the tokens at sorted cut points; seeds continue a stored slot or anchor.
    cuts = np.sort(rng.integers(0, num_tokens + 1, max(num_reqs - 1, 0)))
    offsets = np.concatenate([[0], cuts, [num_tokens]]).astype(np.int64)[: num_reqs + 1]
    seeds = rng.choice(np.array([-1, -1, -4, num_slots, OUT_OF_RANGE_SLOT, 0], dtype=np.int64), num_reqs)
    real_seed = rng.random(num_reqs) < 0.6
    seeds[real_seed] = rng.integers(0, num_slots, int(real_seed.sum()))
    input_ids = rng.integers(0, 4, num_tokens)
    positions = np.zeros(num_tokens, dtype=np.int64)
    for r in range(num_reqs):  # each request counts on from its seed's position
        lo, hi = offsets[r], offsets[r + 1]
        first = int(fields[seeds[r], 1]) + 1 if 0 <= seeds[r] < num_slots else int(rng.integers(0, 3))
        positions[lo:hi] = (np.arange(hi - lo, dtype=np.uint64) + np.uint64(first % 2**64)).view(np.int64)
    out_cache_loc = rng.integers(0, num_slots, num_tokens)  # duplicates: num_slots is small
    for array, values in (
        (out_cache_loc, [-1, -1, -7, 0, num_slots, OUT_OF_RANGE_SLOT]),
        (positions, [0, INT64_MAX, INT64_MIN, -1]),
        (input_ids, [-1, INT64_MIN, 99]),
    ):
        bad = rng.random(num_tokens) < 0.07
        array[bad] = rng.choice(np.array(values, dtype=np.int64), int(bad.sum()))
    hostile = rng.random(num_reqs + 1) < 0.1  # ranges out of the arrays, reversed, or wrapping
    offsets[hostile] = rng.choice(
        np.array([-3, num_tokens + 2, INT64_MIN, INT64_MAX, 2**62], dtype=np.int64), int(hostile.sum())
    )
    assert_inputs = bool(rng.random() < 0.6)
    expected_tokens = expected_positions = None
    if assert_inputs:
        expected_tokens, expected_positions = input_ids.copy(), positions.copy()
        for array in (expected_tokens, expected_positions):
            bad = rng.random(num_tokens) < 0.05
            array[bad] ^= 1
    extra = int(rng.integers(0, 3))  # plan capacity past the valid requests: stale values
    plan = WritePlan(
        write_offsets=np.concatenate([offsets, rng.integers(-5, num_tokens + 5, extra)]),
        write_seed_slot_indices=np.concatenate([seeds, rng.integers(-2, num_slots + 2, extra)]),
        write_num_valid_reqs=np.array([rng.choice([num_reqs] * 4 + [-2, num_reqs + extra, 2**31 - 1])], np.int32),
    )
    if plan.write_seed_slot_indices.shape[0] == 0:  # a plan holds at least one request
        plan = WritePlan(
            write_offsets=np.zeros(2, np.int64),
            write_seed_slot_indices=np.full(1, -1, np.int64),
            write_num_valid_reqs=plan.write_num_valid_reqs,
        )
    kwargs = {
        "plan": plan,
        "input_ids": input_ids,
        "positions": positions,
        "out_cache_loc": out_cache_loc,
        "enable_write_input_assert": assert_inputs,
        "expected_input_tokens": expected_tokens,
        "expected_input_positions": expected_positions,
    }
    return ctx, kwargs


def run_write(ctx, kwargs):
    inputs = {name: value.copy() for name, value in kwargs.items() if isinstance(value, np.ndarray)}
    before = copy_plan(kwargs["plan"])
    ours, theirs = copy_context(ctx), copy_context(ctx)
    spec_write.launch_canary_write_kernel(context=ours, **kwargs)
    fast("write").launch_canary_write_kernel(context=theirs, **kwargs)
    for name, value in inputs.items():
        assert_same_bytes(f"{name} (only read)", kwargs[name], value)
    assert_same_plan(kwargs["plan"], before)
    return ours, theirs


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    num_tokens=st.integers(0, 100),
    num_reqs=st.integers(0, 8),
    mode=st.sampled_from(MODES),
    nsrc=st.integers(0, 4),
)
def test_write_matches(seed, num_tokens, num_reqs, mode, nsrc):
    rng = np.random.default_rng(seed)
    ctx, kwargs = make_write_case(rng, num_tokens, num_reqs, mode, nsrc)
    ours, theirs = run_write(ctx, kwargs)
    assert_same_context(ours, theirs)


@pytest.mark.parametrize("num_tokens", EDGE_SIZES)
@pytest.mark.parametrize("num_reqs", [1, 3, 40])
def test_write_matches_edge_sizes(num_tokens, num_reqs):
    rng = np.random.default_rng(num_tokens * 7 + num_reqs)
    mode = MODES[(num_tokens + num_reqs) % 3]
    ctx, kwargs = make_write_case(rng, num_tokens, num_reqs, mode, 1 + num_tokens % 4)
    kwargs["plan"].write_num_valid_reqs[0] = num_reqs
    ctx = ctx.replace(
        violation_ring=np.zeros((3 * num_tokens + 2 * num_reqs + 1, 8), np.int64),
        violation_write_index=np.zeros(1, np.int32),
    )
    ours, theirs = run_write(ctx, kwargs)
    assert_same_context(ours, theirs)


# --- plan -----------------------------------------------------------------------


def make_plan_case(rng, bs: int):
    """Keyword arguments of a full plan with hostile rows, lengths, table values and LUT."""
    rows, cols = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    full_slots = int(rng.integers(1, 500))
    rpi = rng.integers(1, rows + 1, bs)  # rows == rows: one past the table
    rpi[rng.random(bs) < 0.15] = 0
    rpi[rng.random(bs) < 0.05] = rng.choice([-1, rows + 3, INT64_MAX, INT64_MIN])
    prefix = rng.integers(0, cols + 3, bs)
    prefix[rng.random(bs) < 0.05] = rng.choice([-1, -9, 2**62, INT64_MAX, INT64_MIN])
    extend = rng.integers(0, 6, bs)
    extend[rng.random(bs) < 0.05] = rng.choice([-1, 2**62, INT64_MAX, INT64_MIN])
    req_to_token = rng.integers(-2, full_slots, (rows, cols)).astype(np.int32)
    window = int(rng.choice([0, 0, 1, 3, 17, INT64_MAX]))
    lut = None
    if window:
        lut = rng.integers(-3, 200, int(rng.integers(1, full_slots + 3))).astype(np.int64)
        lut[0] = 0
    pool = lens = None
    if rng.random() < 0.6:
        pool = rng.integers(-2, 1000, (int(rng.integers(1, rows + 3)), int(rng.integers(1, cols + 4)))).astype(np.int32)
        lens = rng.integers(-2, cols + 6, bs)
    return {
        "req_pool_indices": rpi,
        "prefix_lens": prefix,
        "extend_seq_lens": extend,
        "req_to_token": req_to_token,
        "swa_window_size": window,
        "full_to_swa_index_mapping": lut,
        "req_to_verify_expected_tokens": pool,
        "req_to_verify_expected_tokens_valid_lens": lens,
        "kv_token_id_vs_position_offset": int(rng.choice([0, 0, 1, -1, 3, INT64_MAX, INT64_MIN])),
    }


def stale_plans(rng, bs: int, verify_capacity: int) -> tuple[VerifyPlan, WritePlan]:
    """Plans holding the values of an earlier step, which the plan must overwrite or keep as specified."""
    write_capacity = bs + int(rng.integers(0 if bs else 1, 5))

    def stale(n):
        return rng.integers(-7777, 7777, n)

    vplan = VerifyPlan(
        verify_slot_indices=stale(verify_capacity),
        verify_expected_tokens=stale(verify_capacity),
        verify_expected_positions=stale(verify_capacity),
        verify_prev_slot_indices=stale(verify_capacity),
        verify_num_valid=np.array([-5], np.int32),
        enable=np.array([9], np.int32),
    )
    wplan = WritePlan(
        write_offsets=stale(write_capacity + 1),
        write_seed_slot_indices=stale(write_capacity),
        write_num_valid_reqs=np.array([-5], np.int32),
    )
    return vplan, wplan


def run_plan(rng, bs: int):
    case = make_plan_case(rng, bs)
    verify_capacity = int(rng.integers(1, 3 + bs * 6))  # about the batch's need: enough or overflowing
    vplan, wplan = stale_plans(rng, bs, verify_capacity)
    inputs = {name: value.copy() for name, value in case.items() if isinstance(value, np.ndarray)}
    results = []
    for implementation in (spec_plan, fast("plan")):
        ours_v, ours_w = copy_plan(vplan), copy_plan(wplan)
        implementation.launch_canary_plan_kernels(
            verify_plan_out=ours_v, write_plan_out=ours_w, verify_capacity=verify_capacity, **case
        )
        results.append((ours_v, ours_w))
    for name, value in inputs.items():
        assert_same_bytes(f"{name} (only read)", case[name], value)
    (spec_v, spec_w), (cpu_v, cpu_w) = results
    assert_same_plan(spec_v, cpu_v)
    assert_same_plan(spec_w, cpu_w)
    return spec_v, spec_w


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), bs=st.integers(0, 70))
def test_plan_matches(seed, bs):
    run_plan(np.random.default_rng(seed), bs)


@pytest.mark.parametrize("bs", [0, 1, 31, 32, 33, 256, 257, 1000])
@pytest.mark.parametrize("seed", range(3))
def test_plan_matches_edge_sizes(bs, seed):
    # 256 / 257: the CPU path's compiled small-batch loop and its vectorised plan.
    rng = np.random.default_rng(bs * 10 + seed)
    for _ in range(2):
        run_plan(rng, bs)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), bs=st.sampled_from([0, 1, 2, 31, 32, 33, 257]), tail=st.integers(0, 4))
def test_plan_offsets_matches(seed, bs, tail):
    rng = np.random.default_rng(seed)
    case = make_plan_case(rng, bs)
    verify_capacity = int(rng.choice([0, 1, 5, 40, INT32_MAX]))
    _, wplan = stale_plans(rng, bs, 1)
    outputs = {
        "out_verify_offsets_scratch": rng.integers(-7777, 7777, bs + 1 + tail),
        "out_write_offsets": wplan.write_offsets,
        "out_write_seed_slot_indices": wplan.write_seed_slot_indices,
        "out_verify_num_valid": np.array([-5], np.int32),
        "out_verify_enable": np.array([9], np.int32),
        "out_write_num_valid_reqs": np.array([-5], np.int32),
    }
    inputs = {
        name: case[name]
        for name in (
            "req_pool_indices",
            "prefix_lens",
            "extend_seq_lens",
            "req_to_token",
            "full_to_swa_index_mapping",
            "swa_window_size",
        )
    }
    results = []
    for implementation in (spec_plan, fast("plan")):
        out = {name: array.copy() for name, array in outputs.items()}
        implementation.launch_plan_offsets_kernel(verify_capacity=verify_capacity, **inputs, **out)
        results.append(out)
    for name in outputs:
        assert_same_bytes(name, results[0][name], results[1][name])
    assert_same_bytes(
        "scratch tail (untouched)",
        results[0]["out_verify_offsets_scratch"][bs + 1 :],
        outputs["out_verify_offsets_scratch"][bs + 1 :],
    )


def test_plan_output_sharing_an_input_reads_the_inputs_first():
    """An output aliasing an input (rejected by the public wrappers) still gives the plan of the inputs
    as they were at the call: neither implementation writes before it has read everything."""
    rng = np.random.default_rng(5)
    bs = 6
    case = make_plan_case(rng, bs)
    case.update(
        req_pool_indices=np.arange(bs, dtype=np.int64) % 3 + 1,
        prefix_lens=np.full(bs, 4, np.int64),
        extend_seq_lens=np.ones(bs, np.int64),
    )
    stale_v, stale_w = stale_plans(rng, bs, 64)
    clean_v, clean_w = copy_plan(stale_v), copy_plan(stale_w)
    spec_plan.launch_canary_plan_kernels(verify_plan_out=clean_v, write_plan_out=clean_w, verify_capacity=64, **case)
    for implementation in (spec_plan, fast("plan")):
        v = copy_plan(stale_v)
        # The write offsets' first bs values are the prefix lengths' memory.
        w = WritePlan(
            write_offsets=np.concatenate([case["prefix_lens"], [0]]),
            write_seed_slot_indices=stale_w.write_seed_slot_indices[:bs].copy(),
            write_num_valid_reqs=stale_w.write_num_valid_reqs.copy(),
        )
        aliased = dict(case, prefix_lens=w.write_offsets[:bs])
        implementation.launch_canary_plan_kernels(verify_plan_out=v, write_plan_out=w, verify_capacity=64, **aliased)
        assert int(v.verify_num_valid[0]) > 0
        assert_same_plan(v, clean_v)
        assert_same_bytes("write_offsets", w.write_offsets, clean_w.write_offsets[: bs + 1])
        assert_same_bytes("write_seed_slot_indices", w.write_seed_slot_indices, clean_w.write_seed_slot_indices[:bs])


# --- documented behaviour, checked independently ------------------------------------


def scalar_fold(source: RealKvSource, read_bytes: int, slot: int) -> int:
    """One source's fold of one slot, from the bytes as Python sees them."""
    table = source.tensor.view(np.uint8)
    row, column = divmod(slot, source.page_size)
    data = bytes(table[row, column * source.num_bytes_per_token :][:read_bytes])
    h = 0
    for k in range(0, read_bytes, 8):
        h = splitmix64(h ^ int.from_bytes(data[k : k + 8], "little"))
    return h


@pytest.mark.parametrize("mode", [RealKvHashMode.PARTIAL, RealKvHashMode.ALL])
def test_fingerprint_is_the_documented_fold(mode):
    rng = np.random.default_rng(int(mode))
    sources = tuple(make_source(rng, 20, layout) for layout in LAYOUTS)
    slots = np.array([0, 1, 7, 19, -1, 10**6])
    got = spec_fingerprint.fold_slots(sources, mode, slots)
    for i, slot in enumerate(slots[:4]):
        acc = 0
        for src in sources:
            read = 16 if mode == RealKvHashMode.PARTIAL else src.read_bytes
            acc = splitmix64(acc ^ scalar_fold(src, read, int(slot)))
        assert int(got[i]) == acc
    assert got[4] == 0 and got[5] == 0  # no bytes to read: 0
    assert not spec_fingerprint.fold_slots(sources, RealKvHashMode.NONE, slots).any()
    assert not spec_fingerprint.fold_slots((), mode, slots).any()


def small_context(num_slots=8, ring_capacity=8) -> CanaryContext:
    ctx = make_context(np.random.default_rng(0), num_slots=num_slots, ring_capacity=ring_capacity)
    ctx.canary_buf[...] = 0
    ctx.violation_ring[...] = 0
    ctx.slot_run_counter[0] = ctx.kernel_run_counter[0] = 0
    return ctx


def verify_plan(entries, num_valid=None) -> VerifyPlan:
    table = np.array(entries, dtype=np.int64).reshape(-1, 4)
    return VerifyPlan(
        verify_slot_indices=table[:, 0].copy(),
        verify_expected_tokens=table[:, 1].copy(),
        verify_expected_positions=table[:, 2].copy(),
        verify_prev_slot_indices=table[:, 3].copy(),
        verify_num_valid=np.array([len(table) if num_valid is None else num_valid], np.int32),
        enable=np.ones(1, np.int32),
    )


def test_write_then_verify_documented_rows():
    """A chain written by the spec verifies clean; each documented fault gives its documented row."""
    ctx = small_context()
    kind = int(ctx.kernel_kind)
    plan = WritePlan(
        write_offsets=np.array([0, 3], np.int64),
        write_seed_slot_indices=np.array([-1], np.int64),
        write_num_valid_reqs=np.ones(1, np.int32),
    )
    spec_write.launch_canary_write_kernel(
        context=ctx,
        plan=plan,
        input_ids=np.array([11, 12, 13]),
        positions=np.array([0, 1, 2]),
        out_cache_loc=np.array([3, 5, 2]),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    fields = records(ctx)
    head = to_signed(CANARY_CHAIN_HEAD)
    assert fields[3, :4].tolist() == [11, 0, head, 0]
    assert fields[5, 2] == to_signed(splitmix64_mix3(CANARY_CHAIN_HEAD, 11, 0))
    assert ctx.violation_write_index[0] == 0 and ctx.slot_run_counter[0] == 3 and ctx.kernel_run_counter[0] == 1

    entries = [[3, 11, 0, -1], [5, 12, 1, 3], [2, 13, 2, 5], [0, 99, 99, 99]]  # slot 0: padding, never checked
    spec_verify.launch_canary_verify_kernel(context=ctx, plan=verify_plan(entries), check_verify_expected_token=True)
    assert ctx.violation_write_index[0] == 0 and ctx.slot_run_counter[0] == 7

    bad = [[5, 77, 1, 3], [9, 12, 4, 3], [2, 13, 2, 8], [2, -1, 2, 0]]
    spec_verify.launch_canary_verify_kernel(context=ctx, plan=verify_plan(bad), check_verify_expected_token=True)
    assert ctx.violation_write_index[0] == 3
    stored_hash_2 = int(fields[2, 2])
    assert ctx.violation_ring[:3].tolist() == [
        [kind, 5, 1, 12, 77, int(fields[5, 2]), int(fields[5, 2]), int(FailReason.VERIFY_TOKEN_MISMATCH)],
        [kind, 9, 4, -1, 12, 0, 8, int(FailReason.SLOT_OUT_OF_RANGE)],  # out of range: the plan's position
        [kind, 2, 2, 13, 13, stored_hash_2, 8, int(FailReason.PREV_SLOT_OUT_OF_RANGE)],
    ]  # the last entry (prev 0: chain unchecked, token -1: unchecked) verifies


def test_write_documented_extension_rows():
    ctx = small_context(num_slots=4)
    kind = int(ctx.kernel_kind)
    plan = WritePlan(
        write_offsets=np.array([-1, 2, 2, 9], np.int64),
        write_seed_slot_indices=np.array([6, -1, 1], np.int64),
        write_num_valid_reqs=np.array([3], np.int32),
    )
    spec_write.launch_canary_write_kernel(
        context=ctx,
        plan=plan,
        input_ids=np.array([1, 2, 3]),
        positions=np.array([0, 1, 7]),
        out_cache_loc=np.array([1, 4, -1]),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    running = splitmix64_mix3(CANARY_CHAIN_HEAD, 1, 0)
    rows = ctx.violation_ring[: int(ctx.violation_write_index[0])].tolist()
    assert rows == [
        [kind, -1, -1, -1, 2, 0, 3, int(FailReason.WRITE_RANGE_OUT_OF_BOUNDS)],  # [-1, 2) clipped to [0, 2)
        [kind, 6, -1, -1, -1, 0, 4, int(FailReason.PREV_SLOT_OUT_OF_RANGE)],  # seed past the buffer
        [kind, 4, 1, 2, 2, to_signed(running), 4, int(FailReason.SLOT_OUT_OF_RANGE)],
        [kind, -1, -1, 2, 9, 0, 3, int(FailReason.WRITE_RANGE_OUT_OF_BOUNDS)],  # [2, 9) clipped to [2, 3)
    ]  # request 1, [2, 2), is empty: no row; entry 2 has a negative slot: skipped
    assert ctx.slot_run_counter[0] == 1  # only slot 1 was stored
