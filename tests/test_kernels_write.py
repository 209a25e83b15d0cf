"""Write kernels (simulator or GPU) against the NumPy reference and pinned values.

Every launch goes through ``run_pair`` (``kernel_pairs.write``: kernels and
reference on identical inputs, byte-equal buffer / ring multiset / index /
counters); the tests then check the expected records and rows (SGLang's write hand tests,
docs/concepts/sglang.md and semantics.md). Each test runs on both kernel paths of the public write
(``write_path``: the serial kernel, and the tiled path that long writes take). Random garbage, the one-thread-per-request baseline, the
CPU pipeline scenarios and the GPU runs are in test_kernels_write_scenarios.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import (
    HEAD,
    chain_prev_hashes,
    counters,
    fields,
    make_context,
    record,
    slot_hash,
    stamp,
    write_plan,
)
from canary_oracles import KNOWN_REAL_KV_HASH, known_source, random_source
from kernel_pairs import KERNEL_DEVICE, to_device, to_host, write
from numba import cuda

from kvcanary_numba import OUT_OF_RANGE_SLOT, RealKvHashMode
from kvcanary_numba.constants import WARP_SIZE as CHUNK  # entries per chunk of a warp
from kvcanary_numba.hashing import splitmix64_mix3, to_signed
from kvcanary_numba.kernels.write_chunk import chunk_chain

pytestmark = [pytest.mark.simulator, pytest.mark.usefixtures("write_path")]  # every write on both paths

WTOKEN, WPOS, SLOT_RANGE, SEED_RANGE, RANGE = 8, 16, 64, 128, 256
PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


# --- chain and seeds --------------------------------------------------------------


def test_negative_seed_anchors_the_chain():
    ctx = make_context()
    assert write(ctx, write_plan([1], [-1]), [42], [0], [3]) == []
    assert record(ctx, 3) == (42, 0, HEAD, 0) and counters(ctx) == (1, 1)


def test_seed_resume_five_steps_hardcoded():
    ctx = make_context(64)
    stamp(ctx, 42, 7, 10, HEAD)
    slots = [1, 2, 3, 4, 5]
    assert write(ctx, write_plan([5], [42]), [101, 202, 303, 404, 505], range(11, 16), slots) == []
    want = chain_prev_hashes([101, 202, 303, 404, 505], range(11, 16), splitmix64_mix3(HEAD, 7, 10))
    assert [record(ctx, s) for s in slots] == [(101 * (k + 1), 11 + k, want[k], 0) for k in range(5)]


def test_seed_slot_zero_is_used_as_is():
    ctx = make_context()
    stamp(ctx, 0, 9, 4, 0x55)
    write(ctx, write_plan([1], [0]), [1], [5], [6])
    assert record(ctx, 6)[2] == splitmix64_mix3(0x55, 9, 4)


def test_requests_are_independent_chains():
    ctx = make_context(32)
    stamp(ctx, 20, 1, 3, HEAD)
    plan = write_plan([2, 0, 3, 1], [-1, 5, 20, 20], capacity=6)
    write(ctx, plan, [1, 2, 3, 4, 5, 6], [0, 1, 4, 5, 6, 4], [1, 2, 3, 4, 5, 6])
    assert [record(ctx, s)[2] for s in (1, 3, 6)] == [HEAD, slot_hash(ctx, 20), slot_hash(ctx, 20)]
    assert record(ctx, 4)[2] == splitmix64_mix3(slot_hash(ctx, 20), 3, 4)


def test_chain_ignores_real_kv_hash(rng):
    sources = [random_source(rng, 16, nbytes=64), random_source(rng, 16, page_size=4, nbytes=32)]
    ctx = make_context(sources=sources, mode=ALL)
    write(ctx, write_plan([3], [-1]), [10, 20, 30], [0, 1, 2], [4, 5, 6])
    assert [record(ctx, s)[2] for s in (4, 5, 6)] == chain_prev_hashes([10, 20, 30], [0, 1, 2])
    assert all(record(ctx, s)[3] != 0 for s in (4, 5, 6))


# --- write-input and chain-position asserts ------------------------------------------


def test_input_assert_rows():
    ctx = make_context()
    assert write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [3, 4], [1, 2], [0, 1]) == []
    rows = write(ctx, write_plan([3], [-1]), [42, 7, 5], [0, 7, 2], [3, 4, 5], [99, 7, 6], [0, 0, 3])
    prevs = [to_signed(h) for h in chain_prev_hashes([42, 7, 5], [0, 7, 2])]
    # The seed is -1, so the chain-position assert is inactive: only input-assert rows.
    assert rows == [
        (0, 3, 0, 42, 99, prevs[0], 0, WTOKEN),
        (0, 4, 7, 7, 7, prevs[1], 0, WPOS),
        (0, 5, 2, 5, 6, prevs[2], 3, WTOKEN | WPOS),
    ]


def test_input_assert_off_never_reads_expected_arrays():
    ctx = make_context()
    assert write(ctx, write_plan([2], [-1]), [1, 2], [0, 1], [3, 4]) == []


def test_chain_position_assert():
    ctx = make_context()
    stamp(ctx, 9, 1, 4, HEAD)
    # seed position 4: expects 5, 6, ...; a skipped entry does not advance it.
    rows = write(ctx, write_plan([5], [9]), [1, 2, 3, 4, 5], [5, 6, 9, 8, 9], [1, 2, -1, 3, 4])
    assert [(r[1], r[2], r[6], r[7]) for r in rows] == [(3, 8, 7, WPOS)]
    assert counters(ctx)[0] == 4


@pytest.mark.parametrize(("chain_assert", "seed"), [(0, 9), (1, -1), (1, 16)])
def test_chain_position_assert_inactive(chain_assert, seed):
    ctx = make_context(chain_assert=chain_assert)
    stamp(ctx, 9, 1, 4, HEAD)
    rows = write(ctx, write_plan([2], [seed]), [1, 2], [50, 70], [1, 2])
    assert all(r[7] != WPOS for r in rows)


def test_both_asserts_fire_as_two_rows():
    ctx = make_context()
    stamp(ctx, 9, 1, 4, HEAD)
    rows = write(ctx, write_plan([1], [9]), [1], [7], [2], [1], [5])
    assert sorted(r[7] for r in rows) == [WPOS, WPOS] and {r[6] for r in rows} == {5}


# --- slots, requests, counters --------------------------------------------------------


def test_negative_slots_are_skipped_entirely():
    ctx = make_context()
    write(ctx, write_plan([3], [-1]), [5, 6, 7], [0, 1, 1], [5, -1, 7])
    assert record(ctx, 7)[2] == splitmix64_mix3(HEAD, 5, 0) and counters(ctx) == (2, 1)
    assert not fields(ctx)[[s for s in range(16) if s not in (5, 7)]].any()


@pytest.mark.parametrize("num_valid", [-3, 0, 1, 99])
def test_requests_walked_are_clamped(num_valid):
    ctx = make_context()
    write(ctx, write_plan([1, 1], [-1, -1], capacity=2, num_valid=num_valid), [1, 2], [0, 0], [3, 4])
    walked = min(max(num_valid, 0), 2)
    assert counters(ctx) == (walked, 1) and bool(record(ctx, 4)[0]) == (walked == 2)


def test_empty_token_arrays():
    ctx = make_context()
    assert write(ctx, write_plan([0, 0], [-1, -1]), [], [], []) == [] and counters(ctx) == (0, 1)


def test_more_requests_than_blocks_and_entries_than_threads(rng):
    lengths = [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3, 0, 1, 5]
    total = sum(lengths)
    ctx = make_context(total + 1, ring_capacity=256)
    slots = rng.permutation(np.arange(1, total + 1))
    tokens, positions = rng.integers(0, 1000, total), rng.integers(0, 3, total)
    write(
        ctx,
        write_plan(lengths, [-1] * len(lengths)),
        tokens,
        positions,
        slots,
        tokens,
        positions + (rng.random(total) < 0.05),
    )
    assert counters(ctx) == (total, 1)


def test_duplicate_slots_in_one_request_last_entry_wins():
    n = 2 * CHUNK + 5
    ctx = make_context(n + 1)
    slots = np.arange(1, n + 1)
    slots[[3, 9, CHUNK + 2, 2 * CHUNK + 1]] = 7  # within a chunk and across chunks
    slots[[1, 2]] = 0  # padding entries all landing in slot 0
    write(ctx, write_plan([n], [-1]), np.arange(n) + 100, np.arange(n), slots)
    assert record(ctx, 7)[0] == 100 + 2 * CHUNK + 1 and record(ctx, 0)[0] == 102


@cuda.jit
def _last_entry_probe(slots, n, num_slots, last, w):
    t = cuda.threadIdx.x
    shared = cuda.shared.array(CHUNK, np.int64)
    zeros = cuda.shared.array(CHUNK, np.int64)
    shared[t] = slots[t]
    zeros[t] = 0
    cuda.syncthreads()
    out = chunk_chain(np.int64(t), n, slots[t], shared, zeros, zeros, w[0], np.int64(0), num_slots)
    last[t] = 1 if out[5] else 0


def _is_last(slots, num_slots=9) -> list[int]:
    n = len(slots)
    padded = np.full(CHUNK, -1, dtype=np.int64)
    padded[:n] = slots
    last = np.zeros(CHUNK, dtype=np.int32)
    dev = [to_device(a, KERNEL_DEVICE) for a in (padded, last, np.zeros(2, dtype=np.uint64))]
    _last_entry_probe[1, CHUNK](dev[0], n, num_slots, dev[1], dev[2])
    return to_host(dev[1])[:n].tolist()


def _last_oracle(slots) -> list[int]:
    return [int(s not in slots[t + 1 :]) for t, s in enumerate(slots)]


@pytest.mark.parametrize(
    "slots",
    [
        [5, 3, 5, 7, 3, 0, 9],  # 9: out of range (never stored, so never compared)
        [5, 3, 7, 3],  # the only later duplicate of lane 1 is the chunk's last entry
        [4] + list(range(100, 100 + CHUNK - 2)) + [4],  # a full chunk: lane 0's duplicate is lane 31
    ],
    ids=["mixed", "dup-is-last-of-partial-chunk", "dup-is-last-of-full-chunk"],
)
@pytest.mark.parametrize("write_path", ["serial"], indirect=True)  # a device function of the serial kernel
def test_only_the_last_entry_of_a_chunk_stores_its_slot(slots):
    # White box: under the simulator threads happen to store in index order, so
    # the "last one wins" rule is checked on the device function itself.
    assert _is_last(slots, num_slots=9 if max(slots) < 100 else 200) == _last_oracle(slots)


@pytest.mark.parametrize("write_path", ["serial"], indirect=True)  # the serial kernel's stores
def test_a_duplicate_slot_is_stored_once_per_chunk(monkeypatch):
    # End to end, simulator only: every lane whose slot a later lane of its chunk rewrites
    # must not store (on a GPU both stores would race); the simulator's in-order lanes
    # would hide an extra store in the final buffer, so the stores themselves are recorded.
    if KERNEL_DEVICE != "cpu":
        pytest.skip("records the simulated kernel's stores (simulator only)")
    # The serial path's kernel module: its chunk walk stores.
    from kvcanary_numba.kernels import write as kernels

    stores = []
    real_store = kernels.store_record

    def recording_store(buf, slot, token, position, chain_hash, real):
        stores.append((int(slot), int(token)))
        real_store(buf, slot, token, position, chain_hash, real)

    monkeypatch.setattr(kernels, "store_record", recording_store)
    # Chunk 0: slot 4 at lanes 0 and 31 (the chunk's last entry); chunk 1 (5 entries): slot 6 at its lanes 1 and 4.
    slots = [4] + list(range(20, 50)) + [4] + [7, 6, 8, 9, 6]
    n = len(slots)
    ctx = make_context(64)
    write(ctx, write_plan([n], [-1]), range(1000, 1000 + n), range(n), slots)
    assert sorted(stores) == sorted(
        (s, 1000 + t) for t, s in enumerate(slots) if s not in slots[t + 1 : (t // CHUNK + 1) * CHUNK]
    )
    assert record(ctx, 4)[0] == 1000 + 31 and record(ctx, 6)[0] == 1000 + n - 1


# --- real-KV fingerprints ------------------------------------------------------------


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_known_answer_stored_at_slot_zero(mode):
    src = known_source(0, nbytes=32)
    ctx = make_context(sources=(src,), mode=mode)
    write(ctx, write_plan([1], [-1]), [1], [0], [0])
    assert record(ctx, 0)[3] == KNOWN_REAL_KV_HASH


@pytest.mark.parametrize("mode", [RealKvHashMode.NONE, PARTIAL, ALL])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_fingerprints_match_the_reference(rng, mode, count):
    # (page size, bytes per token, read bytes, hole); 272 and 400 read bytes are several
    # rounds of the fold's four-vector prefetch, the last one partial.
    geometry = [(1, 32, 32, 16), (4, 272, 272, 0), (16, 64, 48, 0), (2, 400, 400, 32)][:count]
    sources = [random_source(rng, 32, page_size=p, nbytes=n, read_bytes=r, hole=h) for p, n, r, h in geometry]
    ctx = make_context(32, sources=sources, mode=mode)
    write(ctx, write_plan([4, 3], [-1, -1]), range(7), [0, 1, 2, 3, 0, 1, 2], [3, 15, 16, 31, 1, 2, 17])
    assert all((record(ctx, s)[3] != 0) == (mode != RealKvHashMode.NONE) for s in (3, 15, 16, 31, 1, 2, 17))


def test_fold_order_matters(rng):
    a, b = random_source(rng, 16), random_source(rng, 16)
    forward, backward = make_context(sources=(a, b), mode=ALL), make_context(sources=(b, a), mode=ALL)
    write(forward, write_plan([1], [-1]), [1], [0], [5])
    write(backward, write_plan([1], [-1]), [1], [0], [5])
    assert record(forward, 5)[3] != record(backward, 5)[3]


# --- extensions: out-of-range ranges, seeds and slots -----------------------------------


@pytest.mark.parametrize(
    ("offsets", "rows"),
    [
        ([3, 1], []),
        ([6, 9], [(0, -1, -1, 6, 9, 0, 4, RANGE)]),
        ([-2, 2], [(0, -1, -1, -2, 2, 0, 4, RANGE)]),
        # empty ranges record nothing, even with bounds outside the 4 tokens (semantics.md, bit 256)
        ([6, 6], []),
        ([-3, -3], []),
        ([9, 5], []),
        ([2, -1], []),
    ],
)
def test_ranges_outside_the_tokens(offsets, rows):
    ctx = make_context()
    plan = write_plan([0], [-1])
    plan.write_offsets[:] = offsets
    assert write(ctx, plan, [1, 2, 3, 4], [0, 1, 2, 3], [1, 2, 3, 4]) == rows


@pytest.mark.parametrize("seed", [16, 2**40, OUT_OF_RANGE_SLOT])
def test_out_of_range_seed(seed):
    ctx = make_context()
    rows = write(ctx, write_plan([2], [seed]), [1, 2], [40, 90], [3, 4])
    assert rows == [(0, seed, -1, -1, -1, 0, 16, SEED_RANGE)] and record(ctx, 3)[2] == HEAD


@pytest.mark.parametrize("slot", [16, 2**40, OUT_OF_RANGE_SLOT])
def test_out_of_range_slot_is_reported_and_chain_advances(slot):
    ctx = make_context()
    rows = write(ctx, write_plan([3], [-1]), [1, 2, 3], [0, 1, 2], [3, slot, 4])
    prevs = chain_prev_hashes([1, 2, 3], [0, 1, 2])
    assert rows == [(0, slot, 1, 2, 2, to_signed(prevs[1]), 16, SLOT_RANGE)]
    assert record(ctx, 4)[2] == prevs[2] and counters(ctx) == (2, 1)
