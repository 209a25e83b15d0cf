"""Hypothesis properties of moved records: any relocation checks clean where it lands, any changed
byte of moved KV is caught in ALL mode, and PARTIAL's blind region is what the docs say it is.

A *relocation* takes every written slot of a pool to a slot drawn by a random permutation, in
another pool (gather, copy the KV, scatter) or in the same one (the KV permuted in place, then
``move_canary_records``, whose sources and destinations overlap). The page size, the bytes per
token, the sources and the requests are drawn too.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from hypothesis import HealthCheck, given, settings, strategies as st
from kernel_pairs import to_device, to_host
from move_helpers import KERNEL_DEVICE, copy_kv, make_pool, ring, runs, write_request

from kvcanary_numba import (
    RealKvHashMode,
    compute_handoff_digest,
    gather_canary_records,
    move_canary_records,
    scatter_canary_records,
    verify_canary_records,
)
from kvcanary_numba.constants import PARTIAL_READ_BYTES

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SIMULATED = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NUM_SLOTS = 48
i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731


@st.composite
def layouts(draw, modes=(RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL)):
    """(mode, nsrc, page_size, nbytes, lengths of the requests, seed)."""
    mode = draw(st.sampled_from(modes))
    nsrc = 0 if mode == RealKvHashMode.NONE else draw(st.integers(1, 3))
    page_size = draw(st.sampled_from([1, 2, 4, 8]))
    nbytes = draw(st.sampled_from([16, 32, 64]))
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))
    return mode, nsrc, page_size, nbytes, lengths, draw(st.integers(0, 2**32 - 1))


def written_pool(layout):
    """A pool with the layout's requests written at random slots; (pool, rng, requests' slots)."""
    mode, nsrc, page_size, nbytes, lengths, seed = layout
    rng = np.random.default_rng(seed)
    ctx = make_pool(rng, NUM_SLOTS, mode=mode, nsrc=nsrc, page_size=page_size, nbytes=nbytes)
    slots = rng.permutation(np.arange(1, NUM_SLOTS))[: sum(lengths)]
    requests = np.split(slots, np.cumsum(lengths)[:-1])
    for request in requests:
        write_request(ctx, request, rng.integers(0, 2**31, len(request)))
    return ctx, rng, [list(map(int, r)) for r in requests]


def relocate_elsewhere(layout, backend="numpy"):
    """Every request moved to permuted slots of a second pool; returns (source, destination, old, new requests)."""
    a, rng, old = written_pool(layout)
    mode, nsrc, page_size, nbytes, _, _ = layout
    b = make_pool(rng, NUM_SLOTS, mode=mode, nsrc=nsrc, page_size=page_size, nbytes=nbytes)
    mapping = dict(zip(range(1, NUM_SLOTS), map(int, rng.permutation(np.arange(1, NUM_SLOTS)))))
    new = [[mapping[s] for s in request] for request in old]
    src, dst = i64([s for r in old for s in r]), i64([s for r in new for s in r])
    copy_kv(a, src, b, dst)
    xa, xb = (a, b) if backend == "numpy" else (to_device(a, KERNEL_DEVICE), to_device(b, KERNEL_DEVICE))
    device = (lambda x: to_device(x, KERNEL_DEVICE)) if backend == "cuda" else (lambda x: x)
    pack = device(np.zeros((src.shape[0], 32), np.uint8))
    gather_canary_records(context=xa, slot_indices=device(src), out_records=pack, backend=backend)
    scatter_canary_records(context=xb, records=pack, slot_indices=device(dst), backend=backend)
    return xa, xb, old, new


def check(ctx, requests, backend="numpy"):
    """The records check and the digests of ``requests`` (each a run from position 0) in ``ctx``."""
    device = (lambda x: to_device(x, KERNEL_DEVICE)) if backend == "cuda" else (lambda x: x)
    slots, offsets, starts, prevs = runs(*requests)
    before = int(to_host(ctx.violation_write_index)[0])
    verify_canary_records(
        context=ctx,
        slot_indices=device(slots),
        run_offsets=device(offsets),
        run_start_positions=device(starts),
        run_prev_slots=device(prevs),
        backend=backend,
    )
    digests = device(np.zeros(len(requests), np.int64))
    compute_handoff_digest(
        context=ctx, slot_indices=device(slots), run_offsets=device(offsets), out_digests=digests, backend=backend
    )
    host = ctx.replace(
        violation_ring=to_host(ctx.violation_ring), violation_write_index=to_host(ctx.violation_write_index)
    )
    return ring(host)[before:], to_host(digests).tolist()


@FAST
@given(layouts())
def test_any_relocation_to_another_pool_checks_clean_with_the_same_digests(layout):
    a, b, old, new = relocate_elsewhere(layout)
    rows_a, digests_a = check(a, old)
    rows_b, digests_b = check(b, new)
    assert rows_a == rows_b == [] and digests_a == digests_b


@FAST
@given(layouts())
def test_any_relocation_within_the_pool_checks_clean(layout):
    ctx, rng, old = written_pool(layout)
    _, digests = check(ctx, old)
    occupied = [s for r in old for s in r]
    targets = [int(s) for s in rng.permutation(np.arange(1, NUM_SLOTS))[: len(occupied)]]  # overlaps the sources
    tables = [src.bytes_view().copy() for src in ctx.real_kv_sources]
    for src, table in zip(ctx.real_kv_sources, tables):  # the engine moves the KV: every read before any write
        dst_view = src.bytes_view()
        for s, d in zip(occupied, targets):
            cs, cd = (s % src.page_size) * src.num_bytes_per_token, (d % src.page_size) * src.num_bytes_per_token
            dst_view[d // src.page_size, cd : cd + src.num_bytes_per_token] = table[
                s // src.page_size, cs : cs + src.num_bytes_per_token
            ]
    move_canary_records(
        context=ctx,
        src_slot_indices=i64(occupied),
        dst_slot_indices=i64(targets),
        scratch_records=np.zeros((len(occupied), 32), np.uint8),
    )
    mapping = dict(zip(occupied, targets))
    rows, moved_digests = check(ctx, [[mapping[s] for s in r] for r in old])
    assert rows == [] and moved_digests == digests


@FAST
@given(layouts(modes=(RealKvHashMode.ALL,)), st.data())
def test_any_changed_byte_of_moved_kv_is_caught_in_all_mode(layout, data):
    _, b, _, new = relocate_elsewhere(layout)
    _, digests = check(b, new)
    slot = data.draw(st.sampled_from([s for r in new for s in r]))
    src = b.real_kv_sources[data.draw(st.integers(0, len(b.real_kv_sources) - 1))]
    byte = data.draw(st.integers(0, src.read_bytes - 1))  # every byte ALL mode folds (read_bytes = bytes per token)
    src.bytes_view()[slot // src.page_size, (slot % src.page_size) * src.num_bytes_per_token + byte] ^= data.draw(
        st.integers(1, 255)
    )
    rows, changed = check(b, new)
    assert [(row[1], row[7]) for row in rows] == [(slot, 4)]
    request = next(i for i, r in enumerate(new) if slot in r)
    assert [d != e for d, e in zip(digests, changed)] == [i == request for i in range(len(new))]


@FAST
@given(layouts(modes=(RealKvHashMode.PARTIAL,)), st.data())
def test_partial_mode_sees_the_first_16_bytes_of_each_source_and_nothing_after(layout, data):
    _, b, _, new = relocate_elsewhere(layout)
    rows, digests = check(b, new)
    slot = data.draw(st.sampled_from([s for r in new for s in r]))
    src = b.real_kv_sources[0]
    byte = data.draw(st.integers(0, src.num_bytes_per_token - 1))
    view = src.bytes_view()
    view[slot // src.page_size, (slot % src.page_size) * src.num_bytes_per_token + byte] ^= 0x5A
    after, changed = check(b, new)
    if byte < PARTIAL_READ_BYTES:
        assert [(row[1], row[7]) for row in after] == [(slot, 4)] and changed != digests
    else:  # PARTIAL's blind region: bytes 16 .. num_bytes_per_token of every slot and source
        assert after == [] and changed == digests


@FAST
@given(layouts(), st.data())
def test_any_changed_byte_of_a_moved_record_changes_the_digest(layout, data):
    _, b, _, new = relocate_elsewhere(layout)
    _, digests = check(b, new)
    slot = data.draw(st.sampled_from([s for r in new for s in r]))
    b.canary_buf[slot, data.draw(st.integers(0, 31))] ^= data.draw(st.integers(1, 255))
    _, changed = check(b, new)
    request = next(i for i, r in enumerate(new) if slot in r)
    assert [d != e for d, e in zip(digests, changed)] == [i == request for i in range(len(new))]


@pytest.mark.simulator
@SIMULATED
@given(layouts())
def test_relocation_by_the_kernels_checks_clean(layout):
    a, b, old, new = relocate_elsewhere(layout, backend="cuda")
    rows_a, digests_a = check(a, old, backend="cuda")
    rows_b, digests_b = check(b, new, backend="cuda")
    assert rows_a == rows_b == [] and digests_a == digests_b
