"""The toy paged KV engine: configuration, allocators, KV layout, scheduling invariants, clean runs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_code

from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.engine.memory import FreeList, KvPool, kv_bytes
from kvcanary_numba.engine.scheduler import CACHE_OWNER


@pytest.mark.parametrize(
    ("options", "code"),
    [
        (dict(num_pages=8), "KVC-E002"),
        (dict(shared_prefix_len=3), "KVC-E003"),  # not a multiple of page_size 2
        (dict(shared_prefix_len=6, min_prompt_len=6), "KVC-E003"),  # no room for the request's own tokens
        (dict(bytes_per_token=24), "KVC-C011"),
        (dict(max_prompt_len=3), "KVC-C011"),  # below min_prompt_len
        (dict(page_size=0), "KVC-C011"),
        (dict(swa_window=-1), "KVC-C011"),
    ],
)
def test_config_rejects_workloads_it_cannot_run(options, code):
    with raises_code(code):
        EngineConfig(**options)


def test_min_pages_is_exactly_enough():
    c = EngineConfig()
    # 1 padding page + 4 requests x ceil(20 / 2) pages + 2 prefixes x 2 pages
    assert c.min_pages == 1 + 4 * 10 + 2 * 2 == 45
    EngineConfig(num_pages=45)
    with raises_code("KVC-E002"):
        EngineConfig(num_pages=44)


def test_free_list_is_lifo_skips_unit_zero_and_ignores_frees_by_non_owners():
    fl = FreeList(5)
    assert [fl.alloc(owner=7) for _ in range(4)] == [1, 2, 3, 4]
    fl.free(2, owner=8)  # not the owner: ignored
    assert fl.available == 0
    fl.free(2, owner=7)
    fl.free(3, owner=7)
    assert fl.alloc(owner=9) == 3 and fl.alloc(owner=9) == 2  # last freed, first reused
    fl.free(1, owner=7)
    fl.forced = (4, 7)  # the fault hook: hand unit 4 (owner 7) to the next other owner
    assert fl.alloc(owner=7) == 1 and fl.forced == (4, 7)  # never forced onto its own owner
    assert fl.alloc(owner=5) == 4 and fl.owner[4] == 5 and fl.forced is None


def test_kv_bytes_are_a_function_of_token_position_and_lane():
    t, p = np.array([5, 5, 6]), np.array([0, 1, 0])
    a = kv_bytes(t, p, lane=0, bytes_per_token=32)
    assert a.shape == (3, 32) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, kv_bytes(t, p, lane=0, bytes_per_token=32))
    assert len({row.tobytes() for row in a}) == 3
    assert not np.array_equal(a, kv_bytes(t, p, lane=1, bytes_per_token=32))


def test_kv_pool_pages_store_slot_s_at_row_s_div_page():
    pool = KvPool(num_slots=8, page_size=4, bytes_per_token=16, num_layers=2, xp=np)
    pool.write(np.array([6]), np.array([42]), np.array([3]))
    assert pool.k[0].shape == (2, 64)
    np.testing.assert_array_equal(pool.k[1][1, 32:48], kv_bytes(np.array([42]), np.array([3]), 2, 16)[0])
    np.testing.assert_array_equal(pool.v[0][1, 32:48], kv_bytes(np.array([42]), np.array([3]), 1, 16)[0])
    assert not pool.k[0][0].any() and not pool.k[0][1, :32].any()
    pool.flip_byte(6, byte=2)
    assert pool.k[0][1, 34] == kv_bytes(np.array([42]), np.array([3]), 0, 16)[0, 2] ^ 0xFF


@pytest.mark.parametrize("swa_window", [0, 3])
def test_scheduler_invariants_hold_over_a_long_run(swa_window):
    engine = ToyEngine(EngineConfig(seed=3, swa_window=swa_window))  # no monitor: bookkeeping only
    s, c = engine.sched, engine.config
    for _ in range(300):
        batch = engine.step()
        assert batch.extend_seq_lens.sum() == len(batch.out_cache_loc) <= c.max_batch_tokens
        assert (batch.out_cache_loc > 0).all() and (batch.out_cache_loc >= c.page_size).all()  # page 0 reserved
        owned = [slot for r in s.running for slot in r.slots[r.cached_len :]]
        cached = [slot for e in s.entries.values() for slot in e.slots]
        assert len(set(owned)) == len(owned) and not set(owned) & set(cached)  # no slot held twice
        for r in s.running:
            np.testing.assert_array_equal(s.req_to_token[r.row, : r.kv_len], r.slots[: r.kv_len])
            if swa_window:
                window = range(max(0, r.kv_len - swa_window), r.kv_len)
                assert all(s.lut[r.slots[p]] for p in window)  # the verified window is resident
        if swa_window:
            live = s.lut[s.lut > 0]
            assert len(set(live.tolist())) == len(live)  # SWA slots unique
            assert (s.swa.owner[live] != 0).all()
    assert s.finished > 100 and s.prefix_hits > 20
    assert (s.pages.owner[1:] == 0).sum() + sum(len(r.pages) for r in s.running) + sum(
        len(e.pages) for e in s.entries.values()
    ) == c.num_pages - 1  # every page is free, owned by a request or cached
    assert all(s.pages.owner[p] == CACHE_OWNER for e in s.entries.values() for p in e.pages)


def test_same_seed_same_run():
    a, b = ToyEngine(EngineConfig(seed=11)), ToyEngine(EngineConfig(seed=11))
    for _ in range(25):
        x, y = a.step(), b.step()
        np.testing.assert_array_equal(x.input_ids, y.input_ids)
        np.testing.assert_array_equal(x.out_cache_loc, y.out_cache_loc)
    assert not np.array_equal(
        ToyEngine(EngineConfig(seed=12)).step().input_ids, ToyEngine(EngineConfig(seed=11)).step().input_ids
    )


def test_clean_run_of_1000_steps_reports_nothing():
    engine = ToyEngine(EngineConfig(max_running=3))
    monitor = engine.attach_monitor(mode="raise", sweep_interval=50, health_interval=100, health_warmup_steps=10)
    engine.run(1000)
    assert monitor.violations == []
    assert monitor.health.last is not None and monitor.health.last.ok and monitor.health.last.step == 999
    stats = monitor.stats()
    assert stats["step"] == 1000 and stats["sweep_passes"] == 20 and stats["protected_tokens"] > 10_000


@pytest.mark.parametrize("page_size", [1, 4])
def test_clean_swa_run_with_v_half_and_sweeps_reports_nothing(page_size):
    config = EngineConfig(
        page_size=page_size, shared_prefix_len=page_size, min_prompt_len=5, swa_window=3, num_pages=200 // page_size
    )
    engine = ToyEngine(config)
    monitor = engine.attach_monitor(mode="raise", v_half=True, sweep_interval=5, warmup_steps=3)
    engine.run(120)
    assert monitor.violations == []
    assert monitor.stats()["kernel_runs"] == 120 * 16 + 24 * 4  # 2 groups x 2 halves x HEAD/TAIL x 2 launches


def test_unknown_fault_and_bad_options_are_rejected():
    with raises_code("KVC-E001"):
        ToyEngine(faults=["bit_rot"])
    with raises_code("KVC-C011"):
        ToyEngine(faults={"token_flip": -1})
    with raises_code("KVC-C009"):
        ToyEngine(device="tpu")
    with raises_code("KVC-C010"):
        ToyEngine().attach_monitor(v_half=1)


@pytest.mark.gpu
def test_engine_on_gpu_catches_a_kv_flip_and_stays_clean_otherwise():
    clean = ToyEngine(device="cuda")
    clean.attach_monitor(sweep_interval=4)
    clean.run(60)
    assert clean.monitor.violations == []
    faulty = ToyEngine(device="cuda", faults={"kv_byte_flip": 5, "cached_kv_flip": 5})
    faulty.attach_monitor(sweep_interval=4)
    faulty.run(30)
    assert all(faulty.catches().values()) and len(faulty.faults) == 2
