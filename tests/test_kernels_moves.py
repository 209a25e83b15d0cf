"""The moved-records kernels against their NumPy specification, byte for byte (simulator, or a GPU).

Every call runs the public function with ``backend="numpy"`` on a NumPy context and with
``backend="cuda"`` on a copy (NumPy arrays under the simulator, CuPy arrays on a GPU); canary
buffer, packs, digests, write index and counters must be equal, ring rows equal as multisets
(the kernels append in atomic order). Grids stay tiny under the simulator (two blocks of one
warp); the GPU-marked tests at the end run a million slots.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import SIMULATOR
from hypothesis import given, settings, strategies as st
from kernel_pairs import to_device, to_host
from move_helpers import KERNEL_DEVICE, copy_kv, make_pool, oracle_digest, ring, runs, write_request

from kvcanary_numba import (
    RealKvHashMode,
    compute_handoff_digest,
    gather_canary_records,
    move_canary_records,
    scatter_canary_records,
    verify_canary_records,
)

pytestmark = pytest.mark.simulator

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL
OPS = {
    "gather": gather_canary_records,
    "scatter": scatter_canary_records,
    "move": move_canary_records,
    "records": verify_canary_records,
    "digest": compute_handoff_digest,
}
i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731


def rows(ctx) -> Counter:
    return Counter(ring(ctx))


def not_recorded(kernel_ctx, reference_ctx) -> int:
    """How many of the kernels' ring rows (a multiset) the reference's ring lacks; vectorised, since
    the reference's ring may hold millions of rows."""
    as_bytes = (
        lambda ctx: np.ascontiguousarray(  # noqa: E731
            np.asarray(ctx.violation_ring)[: min(int(ctx.violation_write_index[0]), ctx.violation_ring.shape[0])]
        ).view(np.dtype((np.void, 64)))[:, 0]
    )
    got, got_counts = np.unique(as_bytes(kernel_ctx), return_counts=True)
    have, have_counts = np.unique(as_bytes(reference_ctx), return_counts=True)
    if len(have) == 0:
        return int(got_counts.sum())
    at = np.minimum(np.searchsorted(have, got), len(have) - 1)
    present = have[at] == got
    return int(np.where(present, np.maximum(got_counts - have_counts[at], 0), got_counts).sum())


def pair(op: str, ctx, **kwargs):
    """Run ``op`` on the reference (``ctx``, NumPy) and the kernels (a copy); assert they agree; returns the
    kernels' arguments (host copies).

    When the rows overflow the ring, which of them land is a race on the kernels: those that did
    must be rows the reference records with a ring large enough for all.
    """
    kernel_ctx = to_device(ctx, KERNEL_DEVICE)
    kernel_kwargs = {k: to_device(v, KERNEL_DEVICE) for k, v in kwargs.items()}
    OPS[op](context=kernel_ctx, backend="cuda", **kernel_kwargs)
    before = int(ctx.violation_write_index[0])
    unbounded = ctx.replace(
        canary_buf=ctx.canary_buf.copy(),
        violation_ring=np.zeros((before + 2 * max(len(v) for v in kwargs.values()) + 8, 8), np.int64),
        violation_write_index=ctx.violation_write_index.copy(),
        slot_run_counter=ctx.slot_run_counter.copy(),
        kernel_run_counter=ctx.kernel_run_counter.copy(),
    )
    kept = min(before, ctx.ring_capacity)  # rows past the ring were counted, never stored
    unbounded.violation_ring[:kept] = ctx.violation_ring[:kept]
    OPS[op](context=unbounded, backend="numpy", **{k: v.copy() if hasattr(v, "copy") else v for k, v in kwargs.items()})
    OPS[op](context=ctx, backend="numpy", **kwargs)
    for name in ("canary_buf", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        np.testing.assert_array_equal(to_host(getattr(kernel_ctx, name)), getattr(ctx, name), err_msg=name)
    kernel_host = ctx.replace(violation_ring=to_host(kernel_ctx.violation_ring))
    if int(ctx.violation_write_index[0]) <= ctx.ring_capacity:
        assert rows(kernel_host) == rows(ctx), "ring rows differ"
    else:
        assert not_recorded(kernel_host, unbounded) == 0, "rows the reference never records"
    out = {k: to_host(v) for k, v in kernel_kwargs.items() if hasattr(v, "shape")}
    for name in ("out_records", "out_digests", "scratch_records"):
        if name in kwargs:
            np.testing.assert_array_equal(out[name], kwargs[name], err_msg=name)
    return out


def pool(rng, mode, nsrc=1, page_size=1, nbytes=32, **options):
    return make_pool(
        rng, 40, mode=mode, nsrc=nsrc if mode != NONE else 0, page_size=page_size, nbytes=nbytes, **options
    )


GEOMETRIES = [(NONE, 0, 1, 32), (PARTIAL, 1, 2, 32), (ALL, 2, 4, 16), (ALL, 4, 1, 48)]


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES)
@pytest.mark.parametrize("n", [0, 1, 33, 70])
def test_gather(rng, mode, nsrc, page_size, nbytes, n):
    ctx = pool(rng, mode, nsrc, page_size, nbytes, stride=40)
    written = [int(s) for s in rng.choice(np.arange(1, 40), 20, replace=False)]
    write_request(ctx, written, list(range(20)))
    if mode != NONE:
        ctx.real_kv_sources[0].bytes_view()[written[3] // page_size, 0] ^= 1  # one departing KV changed
    slots = rng.choice(np.r_[written, [0, 0, 40, -3, 99, *range(1, 40)]], n)
    pair("gather", ctx, slot_indices=i64(slots), out_records=np.full((n, 32), 0xAB, dtype=np.uint8))


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES)
@pytest.mark.parametrize("n", [1, 33, 42])
def test_scatter(rng, mode, nsrc, page_size, nbytes, n):
    ctx = pool(rng, mode, nsrc, page_size, nbytes)
    dst = rng.permutation(np.r_[0, 41, -1, np.arange(1, 40)])[:n]  # distinct destinations
    records = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    pair("scatter", ctx, records=records, slot_indices=i64(dst))


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES[:2])
def test_scatter_of_gathered_records_lands_clean(rng, mode, nsrc, page_size, nbytes):
    a, b = pool(rng, mode, nsrc, page_size, nbytes), pool(rng, mode, nsrc, page_size, nbytes)
    src, dst = list(range(3, 38)), [int(s) for s in rng.permutation(np.arange(1, 40))[:35]]
    write_request(a, src, list(range(35)))
    pack = pair("gather", a, slot_indices=i64(src), out_records=np.zeros((35, 32), dtype=np.uint8))["out_records"]
    copy_kv(a, src, b, dst)
    pair("scatter", b, records=pack, slot_indices=i64(dst))
    assert ring(a) == ring(b) == []


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (list(range(1, 36)), list(range(2, 37))),  # a shift onto itself, over two warps
        ([5, 6, 7, 8], [8, 5, 6, 7]),
        ([0, 45, 4, 9], [3, 2, 41, 10]),
    ],
)
@pytest.mark.parametrize("mode", [NONE, ALL])
def test_move(rng, src, dst, mode):
    ctx = pool(rng, mode, 2, 2)
    ctx.canary_buf[:] = rng.integers(0, 256, ctx.canary_buf.shape, dtype=np.uint8)
    pair(
        "move",
        ctx,
        src_slot_indices=i64(src),
        dst_slot_indices=i64(dst),
        scratch_records=np.full((len(src), 32), 7, dtype=np.uint8),
    )


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES)
def test_records_check(rng, mode, nsrc, page_size, nbytes):
    ctx = pool(rng, mode, nsrc, page_size, nbytes)
    first, second = list(range(1, 24)), [int(s) for s in rng.permutation(np.arange(24, 40))]
    tail = write_request(ctx, first, list(range(23)))
    write_request(ctx, second, list(range(16)), start=23, seed_hash=tail)
    ctx.canary_buf[first[5], 8] ^= 1  # a position
    ctx.canary_buf[second[2], 0] ^= 1  # a token: the next link breaks
    if mode != NONE:
        ctx.real_kv_sources[0].bytes_view()[second[7] // page_size, (second[7] % page_size) * nbytes] ^= 1
    table = runs(
        first, [*second[:10], 0, 44, *second[10:]], [first[3]], starts=[0, 23, 3], prevs=[-1, first[-1], first[2]]
    )
    pair(
        "records",
        ctx,
        slot_indices=table[0],
        run_offsets=table[1],
        run_start_positions=table[2],
        run_prev_slots=table[3],
    )
    assert len(ring(ctx)) >= 4


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), [GEOMETRIES[0], GEOMETRIES[2]])
def test_records_check_of_many_short_runs(rng, mode, nsrc, page_size, nbytes):
    # 150 entries in runs of 0 to 9 (several tiles per warp under the simulator's two warps), every
    # run a piece of one request (its start position and predecessor as the pieces say), two faults.
    ctx = make_pool(rng, 160, mode=mode, nsrc=nsrc if mode != NONE else 0, page_size=page_size, nbytes=nbytes)
    slots = [int(s) for s in rng.permutation(np.arange(1, 160))[:150]]
    write_request(ctx, slots, [int(t) for t in rng.integers(0, 1000, 150)])
    lengths = rng.integers(0, 10, 40)
    lengths = lengths[np.cumsum(lengths) <= 150]
    offsets = i64(np.r_[0, np.cumsum(lengths), 150])
    starts = offsets[:-1]
    prevs = i64([slots[k - 1] if k else -1 for k in starts])
    ctx.canary_buf[slots[37], 8] ^= 1  # a position: the next entry's link breaks too
    ctx.canary_buf[slots[101], 0] ^= 1  # a token: the next entry's link breaks
    pair("records", ctx, slot_indices=i64(slots), run_offsets=offsets, run_start_positions=starts, run_prev_slots=prevs)
    assert {row[1] for row in ring(ctx)} == {slots[37], slots[38], slots[102]}


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES)
@pytest.mark.parametrize(
    "lengths", [[70], [3, 0, 40, 1, 29], [0], [2, 0, 0, 1, 7, 0, 33, 1, 1, 1, 0, 20, 30, 3, 0, 12]]
)
def test_digest(rng, mode, nsrc, page_size, nbytes, lengths):
    ctx = pool(rng, mode, nsrc, page_size, nbytes)
    slots = rng.choice(np.r_[np.arange(40), [0, 55]], sum(lengths))
    write_request(ctx, list(range(1, 40)), list(range(39)))
    _assert_digests_match_the_oracle(ctx, slots, lengths)


def _assert_digests_match_the_oracle(ctx, slots, lengths, **extra):
    """Both backends' digests of runs of ``lengths`` over ``slots`` equal the oracle's, run by run."""
    offsets = i64(np.r_[0, np.cumsum(lengths)])
    out = pair(
        "digest",
        ctx,
        slot_indices=i64(slots),
        run_offsets=offsets,
        out_digests=np.full(len(lengths), 9, np.int64),
        **extra,
    )
    ends = offsets.tolist()
    assert out["out_digests"].tolist() == [oracle_digest(ctx, slots[a:b]) for a, b in zip(ends, ends[1:])]


@pytest.mark.parametrize("with_gather", [False, True])
@pytest.mark.parametrize("lengths", [[300], [150, 150], [40, 0, 200, 1, 59], [100, 0, 0, 2, 198]])
def test_digest_blocks_of_two_warps(rng, lengths, with_gather):
    """Blocks of two warps, each warp with its own chunk and flushes: runs that span warps, blocks
    and the grid stride, empty runs, a run inside one tile."""
    from kvcanary_numba.launch import _launch

    ctx = pool(rng, NONE)
    write_request(ctx, list(range(1, 40)), list(range(39)))
    slots = rng.choice(np.r_[np.arange(40), [0, 55]], sum(lengths))
    extra = {"out_records": np.zeros((len(slots), 32), np.uint8)} if with_gather else {}
    with _launch.simulated_shapes(block=64):
        _assert_digests_match_the_oracle(ctx, slots, lengths, **extra)


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES[:2])
@pytest.mark.parametrize("with_gather", [False, True])
def test_digest_of_tiles_numbered_past_a_warp(rng, mode, nsrc, page_size, nbytes, with_gather):
    """1,100 entries: the simulator's two warps take 17 and 18 tiles, so tile numbers pass 32 and
    a lane's loads of the next tile's slot (the builds with sources) run past a lane number."""
    ctx = pool(rng, mode, nsrc, page_size, nbytes)
    write_request(ctx, list(range(1, 40)), list(range(39)))
    lengths = [600, 1, 0, 499]
    slots = rng.choice(np.r_[np.arange(40), [0, 55]], sum(lengths))
    extra = {"out_records": np.zeros((len(slots), 32), np.uint8)} if with_gather else {}
    _assert_digests_match_the_oracle(ctx, slots, lengths, **extra)


@pytest.mark.parametrize(("mode", "nsrc", "page_size", "nbytes"), GEOMETRIES)
@pytest.mark.parametrize("lengths", [[70], [3, 0, 40, 1, 29]])
def test_digest_with_a_gather(rng, mode, nsrc, page_size, nbytes, lengths):
    ctx = pool(rng, mode, nsrc, page_size, nbytes)
    write_request(ctx, list(range(1, 40)), list(range(39)))
    if mode != NONE:
        ctx.real_kv_sources[0].bytes_view()[7 // page_size, 0] ^= 1  # the KV of slot 7 changed before it left
    slots = rng.choice(np.r_[np.arange(40), [0, 55, -2]], sum(lengths))
    n, offsets = len(slots), i64(np.r_[0, np.cumsum(lengths)])
    pair(
        "digest",
        ctx,
        slot_indices=i64(slots),
        run_offsets=offsets,
        out_digests=np.full(len(lengths), 9, np.int64),
        out_records=np.full((n, 32), 0xAB, np.uint8),
    )


def test_rows_past_the_ring_are_counted_and_some_land(rng):
    ctx = pool(rng, ALL, 1, ring_capacity=4)
    ctx.canary_buf[:] = rng.integers(0, 256, ctx.canary_buf.shape, dtype=np.uint8)  # no fingerprint matches
    pair("gather", ctx, slot_indices=i64(range(1, 40)), out_records=np.zeros((39, 32), np.uint8))
    assert int(ctx.violation_write_index[0]) == 39


# --- device run tables are data: read safely, reported --------------------------------------


@pytest.mark.parametrize("offsets", [[0, 5, 3, 8], [2, 4, 8], [0, 4, 12], [-3, 8]])
def test_a_bad_device_run_table_is_reported_not_read_past(rng, offsets):
    from kvcanary_numba.launch import digest as digest_glue, records as records_glue

    ctx = to_device(pool(rng, ALL, 1), KERNEL_DEVICE)
    slots = to_device(i64(range(1, 9)), KERNEL_DEVICE)
    table = to_device(i64(offsets), KERNEL_DEVICE)
    runs_ = len(offsets) - 1
    per_run = to_device(np.zeros(runs_, np.int64), KERNEL_DEVICE)
    records_glue.verify_canary_records(
        context=ctx, slot_indices=slots, run_offsets=table, run_start_positions=per_run, run_prev_slots=per_run
    )
    out = to_device(np.zeros(runs_, np.int64), KERNEL_DEVICE)
    digest_glue.compute_handoff_digest(context=ctx, slot_indices=slots, run_offsets=table, out_digests=out)
    host = ctx.replace(
        violation_ring=to_host(ctx.violation_ring), violation_write_index=to_host(ctx.violation_write_index)
    )
    bad_runs = [row for row in ring(host) if row[7] == 256]
    assert bad_runs and all(row[1] == -1 and row[6] == 8 for row in bad_runs)
    assert len(bad_runs) % 2 == 0  # the same runs, once by each kernel
    # With a gather, every entry is taken, in a run or not.
    pack = to_device(np.full((8, 32), 0xAB, np.uint8), KERNEL_DEVICE)
    digest_glue.compute_handoff_digest(
        context=ctx, slot_indices=slots, run_offsets=table, out_digests=out, out_records=pack
    )
    np.testing.assert_array_equal(to_host(pack), to_host(ctx.canary_buf)[1:9, :32])


# --- the run of an entry, searched from the run of an earlier one ----------------------------


class _Bounded:
    """A run table that fails the test on a read outside ``[0, runs]``."""

    def __init__(self, values):
        self.values = i64(values)

    def __getitem__(self, k):
        assert 0 <= k < len(self.values), f"offsets[{k}] read, the table has {len(self.values)} entries"
        return self.values[k]


@pytest.mark.skipif(not SIMULATOR, reason="calls the device functions as Python (the simulator's form)")
@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=40), data=st.data())
def test_a_run_searched_from_an_earlier_entrys_run_is_the_binary_searchs(lengths, data):
    from kvcanary_numba.kernels.records import run_of, run_span

    offsets = np.r_[0, np.cumsum(lengths)]
    table, runs_, n = _Bounded(offsets), np.int64(len(lengths)), np.int64(offsets[-1])
    kept = (np.int64(-1), np.int64(0), np.int64(0))  # a lane's span, carried from entry to entry
    for i in range(int(n) + 2):
        if i >= n:  # past the entries: no run, the span untouched
            assert tuple(map(int, run_of(table, runs_, np.int64(i), n, *kept))) == (-1, 0, *map(int, kept))
            continue
        truth = int(np.searchsorted(offsets, i, side="right")) - 1
        hint = data.draw(st.integers(-1, truth), label=f"hint of entry {i}")  # any earlier entry's run
        span = (truth, int(offsets[truth]), int(offsets[truth + 1]))
        assert tuple(map(int, run_span(table, runs_, np.int64(i), np.int64(hint)))) == span
        r, e, *kept = run_of(table, runs_, np.int64(i), n, *kept)
        assert (int(r), int(e), *map(int, kept)) == (truth, i - span[1], *span)


@pytest.mark.skipif(not SIMULATOR, reason="calls the device functions as Python (the simulator's form)")
@settings(max_examples=80, deadline=None)
@given(
    offsets=st.lists(st.integers(-5, 60), min_size=1, max_size=12),
    i=st.integers(0, 50),
    hint=st.integers(-3, 15),
)
def test_any_device_run_table_is_searched_within_its_bounds(offsets, i, hint):
    # A device table is data nobody checked: any values, any hint; the search reads offsets[0 .. runs]
    # only and names a run only if that run's range holds the entry.
    from kvcanary_numba.kernels.records import run_span

    table = _Bounded(offsets)
    r, start, end = map(int, run_span(table, np.int64(len(offsets) - 1), np.int64(i), np.int64(hint)))
    if r >= 0:
        assert (start, end) == (offsets[r], offsets[r + 1]) and start <= i < end
    else:
        assert (r, start, end) == (-1, 0, 0)


# --- GPU: a million slots ------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_a_million_slots_move_and_digest_as_the_reference_says(mode):
    rng = np.random.default_rng(3)
    n = 1 << 20
    ctx = make_pool(rng, n + 1, mode=mode, nsrc=1 if mode != NONE else 0, nbytes=64)
    ctx.canary_buf[:] = rng.integers(0, 256, ctx.canary_buf.shape, dtype=np.uint8)
    slots = i64(rng.permutation(np.arange(1, n + 1)))
    pack = pair("gather", ctx, slot_indices=slots, out_records=np.zeros((n, 32), np.uint8))["out_records"]
    pair("scatter", ctx, records=pack[::-1].copy(), slot_indices=slots)
    lengths = rng.integers(1, 5000, 400)
    lengths[-1] += n - lengths.sum() if lengths.sum() < n else 0
    offsets = i64(np.minimum(np.r_[0, np.cumsum(lengths)], n))
    offsets[-1] = n
    pair("digest", ctx, slot_indices=slots, run_offsets=offsets, out_digests=np.zeros(400, np.int64))
    pack = np.zeros((n, 32), np.uint8)
    pair("digest", ctx, slot_indices=slots, run_offsets=offsets, out_digests=np.zeros(400, np.int64), out_records=pack)
    pair(
        "records",
        ctx,
        slot_indices=slots,
        run_offsets=offsets,
        run_start_positions=np.zeros(400, np.int64),
        run_prev_slots=np.full(400, -1, np.int64),
    )
    pages = i64(np.arange(0, n + 1, 64))  # a run per page: every lane leaves its run every other tile
    pair(
        "records",
        ctx,
        slot_indices=slots,
        run_offsets=pages,
        run_start_positions=i64(rng.integers(0, 1 << 20, pages.shape[0] - 1)),
        run_prev_slots=i64(rng.integers(-1, n + 1, pages.shape[0] - 1)),
    )
