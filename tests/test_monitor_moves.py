"""CanaryMonitor's record moves between steps: take, put, move, the landed check and the hand-off digest.

A request of ``monitor_helpers.Driver`` is written by real steps, then its KV and records move to
other slots and later steps must stay silent; the faults of a move are reported as SWEEP rows
at the next ``end_step``. Every buffer moves (HEAD and TAIL, K and V, FULL and SWA through the
LUT), and the health check counts the move launches.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from canary_helpers import FakeCudaArray
from helpers import raises_code
from monitor_helpers import DECODE, PREFILL, Driver, monitor_records
from move_helpers import runs

from kvcanary_numba import CanaryViolationError, HandoffSignature, MovedRecords, check_handoff_digest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
OLD, NEW = [3, 4, 5, 6], [10, 11, 12, 13]
i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731


def driver(swa: int = 0, **options) -> Driver:
    d = Driver(swa_window=swa, health_interval=1, health_warmup_steps=0, mode="raise", **options)
    d.step(PREFILL)
    d.step(DECODE)
    return d


def move_kv(d: Driver, old, new) -> None:
    """The engine's part: KV to the new slots (every half, SWA through its LUT) and the page table."""
    old, new = i64(old), i64(new)
    for kv in (d.k, d.v):
        kv[new] = kv[old]
    if hasattr(d, "swa_k"):
        d.swa_k[d.lut[new]] = d.swa_k[d.lut[old]]
    d.req_to_token[1, : len(new)] = new
    d.requests[1] = [(token, int(slot)) for (token, _), slot in zip(d.requests[1], new)]


def landed_check(d: Driver, slots) -> None:
    table = runs(list(slots))
    d.monitor.verify_records(*table)


@pytest.mark.parametrize("swa", [0, 8])
def test_a_request_moved_with_its_records_stays_silent(swa):
    d = driver(swa)
    moved = d.monitor.take_records(i64(OLD))
    move_kv(d, OLD, NEW)
    d.monitor.put_records(moved, i64(NEW))
    landed_check(d, NEW)
    d.monitor.end_step()
    d.step({1: [(105, 14)]})
    d.monitor.flush()
    assert d.rows() == [] and d.monitor.health.last is not None and d.monitor.health.last.ok


def test_every_buffer_moves(rng):
    d = driver(8)
    moved = d.monitor.take_records(i64(OLD))
    assert isinstance(moved, MovedRecords) and moved.num_slots == 4
    names = {"HEAD_K_FULL", "HEAD_V_FULL", "TAIL_K_FULL", "TAIL_V_FULL", "HEAD_K_SWA", "TAIL_K_SWA"}
    assert set(moved.records) == names
    for g in d.monitor.groups:
        slots = i64(OLD) if g.lut is None else d.lut[OLD]
        for (stage, half), buffer in g.buffers.items():
            pack = moved.records[f"{stage}_{half}_{g.kind.upper()}"]
            np.testing.assert_array_equal(pack, buffer[slots])
            assert (monitor_records(pack)[:, 3] == 0).all() == (stage == "HEAD")  # HEAD records carry no fingerprint


def test_records_left_behind_are_reported_at_once():
    d = driver()
    move_kv(d, OLD, NEW)  # the KV moves, the records do not
    landed_check(d, NEW)
    with pytest.raises(CanaryViolationError) as caught:
        d.monitor.end_step()
    tags = {v.tag for v in caught.value.violations}
    assert tags == {"SWEEP_K_FULL", "SWEEP_V_FULL"}
    assert {v.slot_idx for v in caught.value.violations} == set(NEW)


def test_kv_changed_on_the_way_is_reported_where_it_lands():
    d = driver()
    moved = d.monitor.take_records(i64(OLD))
    move_kv(d, OLD, NEW)
    d.v[12, 3] ^= 1
    d.monitor.put_records(moved, i64(NEW))
    with pytest.raises(CanaryViolationError) as caught:
        d.monitor.end_step()
    assert [(v.tag, v.slot_idx, v.reasons) for v in caught.value.violations] == [
        ("SWEEP_V_FULL", 12, ("verify_real_kv_hash",))
    ]


def test_moves_fold_the_sources_a_rebind_gave_and_follow_one_moved_in_place():
    from monitor_helpers import source

    d = driver()
    k2 = d.k.copy()  # the pool's next K buffer (a functional update)
    d.monitor.rebind_sources(k_sources=(source(k2),), v_sources=(source(d.v),))
    d.k[OLD[0], 1] ^= 1  # the old buffer: no longer the KV, never read again
    k2[OLD[1], 1] ^= 1  # the new one: read by the take
    d.monitor.take_records(i64(OLD))
    with pytest.raises(CanaryViolationError) as caught:
        d.monitor.end_step()
    assert [(v.tag, v.slot_idx) for v in caught.value.violations] == [("SWEEP_K_FULL", OLD[1])]

    d = driver()
    with warnings.catch_warnings():  # NumPy 2.5 deprecates setting .shape; engines still do it
        warnings.simplefilter("ignore", DeprecationWarning)
        d.k.shape = (d.k.shape[0] * 2, d.k.shape[1] // 2)  # reshaped in place: breaks its source's rules
    with raises_code("KVC-R011"):
        d.monitor.take_records(i64(OLD))


def test_compaction_within_the_pool(rng):
    d = driver()
    src, dst = [3, 4, 5, 6], [4, 5, 6, 7]  # onto itself, shifted
    for kv in (d.k, d.v):
        kv[dst] = kv[src].copy()
    d.monitor.move_records(i64(src), i64(dst))
    d.req_to_token[1, :4] = dst
    d.requests[1] = [(t, s) for (t, _), s in zip(d.requests[1], dst)]
    landed_check(d, dst)
    d.monitor.end_step()
    d.step({1: [(105, 9)]})
    d.monitor.flush()
    assert d.rows() == []


def test_prefill_to_decode_digests_match_and_catch_a_changed_byte():
    prefill, decode = driver(), Driver(health_interval=0)
    sent = prefill.monitor.handoff_digest(*runs(OLD)[:2])
    moved = prefill.monitor.take_records(i64(OLD)).to_host()
    for a, b in ((prefill.k, decode.k), (prefill.v, decode.v)):
        b[NEW] = a[OLD]
    decode.monitor.put_records(moved.to_device(np), i64(NEW))
    landed = decode.monitor.handoff_digest(*runs(NEW)[:2])
    assert (
        sent.signature == landed.signature == HandoffSignature.of(*(e.context for e in prefill.monitor.groups[0].tail))
    )
    assert check_handoff_digest(sent, landed).tolist() == [True]
    decode.k[11, 30] ^= 8
    changed = decode.monitor.handoff_digest(*runs(NEW)[:2])
    assert check_handoff_digest(sent, changed, on_mismatch="miss").tolist() == [False]


@pytest.mark.parametrize("swa", [0, 8])
def test_records_taken_with_their_digest_are_both_calls_in_one(swa):
    d, twin = driver(swa), driver(swa)
    slots, offsets = runs(OLD[:1], OLD[1:])[:2]
    moved = d.monitor.take_records(slots, offsets)
    expected = twin.monitor.handoff_digest(slots, offsets), twin.monitor.take_records(slots)
    assert moved.digest.signature == expected[0].signature
    assert moved.digest.host().tolist() == expected[0].host().tolist() and len(set(moved.digest.host())) == 2
    assert moved.records.keys() == expected[1].records.keys()
    assert all(np.array_equal(moved.records[k], expected[1].records[k]) for k in moved.records)
    assert moved.to_host().to_device(np).digest.host().tolist() == moved.digest.host().tolist()
    assert twin.monitor.take_records(slots).digest is None
    for m in (d, twin):
        m.monitor.end_step()  # the health check counts each fused launch as the gather and digest it replaces
        m.step({1: [(105, 14)]})
        m.monitor.flush()
    assert d.rows() == twin.rows() == [] and d.monitor.health.last.ok and twin.monitor.health.last.ok
    with raises_code("KVC-K006"):  # found before the first launch
        d.monitor.take_records(slots, i64([0, 3, 2]))


def test_moves_keep_the_step_order():
    d = driver()
    d.monitor.pre_forward(d.batch({1: [(105, 7)]}))
    for call in (
        lambda: d.monitor.take_records(i64(OLD)),
        lambda: d.monitor.move_records(i64(OLD), i64(NEW)),
        lambda: d.monitor.verify_records(*runs(OLD)),
        lambda: d.monitor.handoff_digest(*runs(OLD)[:2]),
    ):
        with raises_code("KVC-M005"):
            call()
    d.monitor.post_forward()
    d.monitor.take_records(i64(OLD))  # after post_forward, before end_step: allowed


def test_bad_arguments_change_nothing():
    d = driver()
    before = [b.copy() for g in d.monitor.groups for b in g.buffers.values()]
    with raises_code("KVC-K013"):
        d.monitor.put_records(np.zeros((4, 32), np.uint8), i64(NEW))
    other = Driver(swa_window=8).monitor.take_records(i64(OLD))
    with raises_code("KVC-K013"):
        d.monitor.put_records(other, i64(NEW))
    moved = d.monitor.take_records(i64(OLD))
    with raises_code("KVC-K001"):
        d.monitor.put_records(moved, i64(NEW[:3]))
    packs = dict(moved.records)
    packs["TAIL_V_FULL"] = d.monitor.groups[0].buffers["TAIL", "V"][4:8]  # a pack inside its own buffer
    with raises_code("KVC-C017"):  # found before the first buffer is written
        d.monitor.put_records(MovedRecords(packs, 4), i64(NEW))
    with raises_code("KVC-K014"):
        d.monitor.move_records(i64(OLD), i64(NEW), group="swa")
    with raises_code("KVC-K003"):
        d.monitor.move_records(i64(OLD), i64(NEW[:2]))
    with raises_code("KVC-C007"):
        d.monitor.take_records(FakeCudaArray(i64(OLD)))
    with raises_code("KVC-C002"):
        d.monitor.take_records(np.asarray(OLD, dtype=np.int32))
    after = [b.copy() for g in d.monitor.groups for b in g.buffers.values()]
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATOR, reason="simulator only (NumPy buffers, kernels)")
@pytest.mark.parametrize("swa", [0, 8])
@pytest.mark.parametrize("with_digest", [False, True])
def test_the_kernels_move_what_the_reference_moves(swa, with_digest):
    results = []
    for backend in ("numpy", "cuda"):
        d = driver(swa, backend=backend, prepared=False)
        d.k[OLD[2], 0] ^= 1 if with_digest else 0  # a departure mismatch: a row from the fused kernel
        moved = d.monitor.take_records(i64(OLD), *([runs(OLD)[1]] if with_digest else []))
        if with_digest:
            d.k[OLD[2], 0] ^= 1
        move_kv(d, OLD, NEW)
        d.v[11, 0] ^= 1  # one landing mismatch, so that rows are compared too
        d.monitor.put_records(moved, i64(NEW))
        landed_check(d, NEW)
        digest = d.monitor.handoff_digest(*runs(NEW)[:2]).host().tolist()
        digest += moved.digest.host().tolist() if with_digest else []
        rows = sorted(tuple(map(int, r)) for r in d.monitor.ring[: int(d.monitor.status.words[0] & 0xFFFFFFFF)])
        buffers = [b.copy() for g in d.monitor.groups for b in g.buffers.values()]
        results.append((digest, rows, buffers, d.monitor.status.words.copy()))
    (da, ra, ba, wa), (db, rb, bb, wb) = results
    assert da == db and ra == rb and len(ra) >= 1
    assert all(np.array_equal(x, y) for x, y in zip(ba, bb)) and np.array_equal(wa, wb)


def relocate_workload(xp, *, requests: int, prefix: int, seed: int = 0) -> list:
    """A MonitorWorkload pool whose every slot moves (KV and records) by one random permutation:
    compaction in place, then the landed check and the digests; returns the violations after two
    more steps."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from benchmarks.workloads import MonitorWorkload

    w = MonitorWorkload(
        xp, requests=requests, prefix=prefix, max_steps=2, mode=2, health_interval=1, health_warmup_steps=0
    )
    w.prefill()
    m, table = w.monitor, w.table[1:, :prefix]
    flat = table.reshape(-1).astype(np.int64)
    offsets = np.arange(0, flat.shape[0] + 1, prefix, dtype=np.int64)
    before = m.handoff_digest(xp.asarray(flat), xp.asarray(offsets))
    perm = np.random.default_rng(seed).permutation(w.k.shape[0] - 1) + 1
    new_of = np.zeros(w.k.shape[0], dtype=np.int64)
    new_of[1:] = perm
    src, dst = xp.asarray(np.arange(1, w.k.shape[0], dtype=np.int64)), xp.asarray(perm.astype(np.int64))
    for kv in (w.k, w.v):
        kv[dst] = kv[src].copy()
    m.move_records(src, dst)
    w.table[1:] = new_of[w.table[1:]]
    w.req_to_token[...] = xp.asarray(w.table)
    moved = new_of[flat]
    m.verify_records(
        xp.asarray(moved),
        xp.asarray(offsets),
        xp.zeros(requests, dtype=np.int64),
        xp.full(requests, -1, dtype=np.int64),
    )
    after = m.handoff_digest(xp.asarray(moved), xp.asarray(offsets))
    assert check_handoff_digest(before, after).all()
    m.end_step()
    w.step()
    w.step()
    m.flush()
    assert m.health.last is not None and m.health.last.ok
    return m.violations


def test_a_whole_pool_compacted_by_a_permutation_stays_silent():
    assert relocate_workload(np, requests=3, prefix=20) == []


@pytest.mark.gpu
def test_a_whole_pool_compacted_on_the_gpu_stays_silent():
    import cupy

    assert relocate_workload(cupy, requests=64, prefix=4096) == []
