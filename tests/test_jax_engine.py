"""The JAX example engine (examples/jax_engine) with the canary attached, on JAX's CPU backend.

Planted faults must be caught at the slots they hit with the bits that report them,
clean runs must stay silent, and the canary must watch the buffers the model reads: the
pool is a new buffer (functional updates) or a donated one every step, and the canary
re-points its sources with ``CanaryMonitor.rebind_sources`` after every forward.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest

# Before JAX starts a GPU backend (on a GPU machine): leave the GPU's memory to CuPy and other tests.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # examples/ is not part of the installed package
    sys.path.insert(0, str(ROOT))

from examples.jax_engine import (  # noqa: E402
    FAULT_CLASSES,
    REAL_KV_FAULTS,
    TINY_ENGINE,
    JaxEngine,
    bench,  # noqa: E402
)
from examples.jax_engine.batches import BatchArrays  # noqa: E402
from examples.jax_engine.canary import alias, rebind  # noqa: E402
from examples.jax_engine.scheduler import HostBatch  # noqa: E402
from kvcanary_numba import FailReason  # noqa: E402

F = FailReason
CPU = jax.devices("cpu")[0]  # the CPU backend even where a GPU is the default (the GPU tests are elsewhere)

#: What each planted fault must show at one of its slots: stated here, not taken from the engine's table.
MUST_SHOW = {
    "table_slip": F.VERIFY_CHAIN_HASH_MISMATCH,  # the slot the entry now names chains from another request
    "slot_reuse": F.VERIFY_POSITION_MISMATCH | F.VERIFY_CHAIN_HASH_MISMATCH,  # another request's record there
    "token_flip": F.WRITE_TOKEN_MISMATCH,  # fed token != the scheduler's token
    "position_flip": F.WRITE_POSITION_MISMATCH,  # fed position != the scheduler's position
    "kv_flip": F.VERIFY_REAL_KV_HASH_MISMATCH,  # live bytes != the fingerprint stamped at write time
}


def _engine(faults=None, *, donate=True, real_kv=False, **options) -> JaxEngine:
    engine = JaxEngine(config=TINY_ENGINE.with_(donate=donate), faults=faults, device=CPU)
    engine.attach_canary(real_kv=real_kv, health_interval=0, **options)
    return engine


def _clean_run(steps: int, **kwargs) -> None:
    """``steps`` fault-free steps: no violation, and the canary checked every token of every step."""
    engine = _engine(**kwargs)
    cached = new = 0
    for _ in range(steps):
        hb = engine.step()
        cached, new = cached + int(hb.prefix_lens.sum()), new + int(hb.extend_seq_lens.sum())
    engine.canary.flush()
    assert engine.canary.violations == []
    stats = engine.canary.monitor.stats()
    # HEAD and TAIL, K and V: every cached token verified and every new token stamped, four times a step.
    assert stats["step"] == steps and stats["protected_tokens"] == 4 * (cached + new)
    # The workload recycles slots: freed pages were handed to new requests over and over.
    assert new > 2 * TINY_ENGINE.num_slots and engine.sched.finished > steps // 10


def test_a_thousand_clean_steps_report_nothing():
    _clean_run(1000)


def test_clean_steps_with_functional_updates_report_nothing():
    _clean_run(300, donate=False)


@pytest.mark.parametrize("donate", [True, False], ids=["donated", "functional"])
@pytest.mark.parametrize("fault", sorted(set(FAULT_CLASSES) - REAL_KV_FAULTS))
def test_planted_fault_is_caught(fault, donate):
    engine = _engine({fault: 10}, donate=donate)
    engine.run(40)
    (record,) = engine.faults
    assert record.kind == fault and record.step >= 10
    found = engine.canary.violations
    assert any(v.slot_idx in record.slots and v.bits & MUST_SHOW[fault] for v in found), (record, found[:4])
    # Nothing before the fault fired: every row is the fault's doing.
    assert min(v.step for v in found) >= record.step


def test_the_canary_follows_the_pool_it_is_rebound_to():
    """With donation the pool stays put and the monitor keeps its launches; with functional updates
    every step's pool is a new buffer, and the monitor's sources name it (and no earlier one)."""
    for donate in (True, False):
        engine = _engine(donate=donate, real_kv=True)
        engine.run(5)
        sources = engine.canary.monitor.groups[0].sources
        pointers = [s[0].tensor.ctypes.data for s in (sources["K"], sources["V"])]
        assert pointers == [engine.k_pool[0].unsafe_buffer_pointer(), engine.v_pool[0].unsafe_buffer_pointer()]
        assert engine.canary.monitor.sources.unchanged()
    monitor = engine.canary.monitor
    rebind(monitor, tuple(engine.k_pool[:1]), tuple(engine.v_pool[:1]))  # between steps: allowed
    with pytest.raises(Exception, match="KVC-M023"):  # two K sources where the monitor was built with one
        rebind(monitor, tuple(engine.k_pool[:2]), tuple(engine.v_pool[:1]))


@pytest.mark.parametrize("donate", [True, False], ids=["donated", "functional"])
def test_kv_byte_flip_is_caught(donate):
    engine = _engine({"kv_flip": 10}, donate=donate, real_kv=True)
    first = engine.k_pool[0]
    engine.run(40)
    (record,) = engine.faults
    found = engine.canary.violations
    assert any(v.slot_idx in record.slots and v.bits & MUST_SHOW["kv_flip"] for v in found), (record, found[:4])
    assert min(v.step for v in found) >= record.step
    assert first.is_deleted() == donate  # donated: the first array is gone and the canary followed along


def test_corruption_after_functional_updates_is_caught_in_the_current_buffer():
    """Fails if the canary fingerprints a stale buffer: with functional updates the pool moves every
    step, and the flipped byte is only in the buffer the model reads now."""
    engine = _engine(donate=False, real_kv=True)
    first = engine.k_pool[0]  # kept alive, stale bytes and all: its memory cannot come back as a later buffer
    engine.run(12)
    assert engine.k_pool[0].unsafe_buffer_pointer() != first.unsafe_buffer_pointer()  # the pool really moved
    victim = next(r for r in engine.sched.running if r.kv_len >= 2 and r.max_new - (len(r.tokens) - r.prompt_len) >= 3)
    slot = victim.slots[0]
    k0 = engine.k_pool[0]
    # Byte 5 of the slot's K: inside the 16 bytes the default (PARTIAL) fingerprint reads.
    engine.k_pool[0] = k0.at[slot, 0, 1].set(k0[slot, 0, 1] ^ np.array(0x0100, k0.dtype))
    engine.run(2)
    hits = [v for v in engine.canary.violations if v.slot_idx == slot]
    assert hits and all(v.bits & F.VERIFY_REAL_KV_HASH_MISMATCH for v in hits)


def test_a_thousand_clean_steps_with_real_kv_report_nothing():
    _clean_run(1000, real_kv=True)
    _clean_run(300, real_kv=True, donate=False)


def test_the_canary_does_not_pin_the_donated_pool():
    """With the canary attached, donation still writes in place: one address for the pool and the
    table over the whole run (a view holding XLA's buffer would make every step copy them)."""
    engine = _engine()
    seen = set()
    for _ in range(100):
        engine.step()
        seen.add(
            (
                engine.k_pool[0].unsafe_buffer_pointer(),
                engine.v_pool[0].unsafe_buffer_pointer(),
                engine.req_to_token.unsafe_buffer_pointer(),
            )
        )
    assert len(seen) == 1 and engine.canary.violations == []


def test_alias_shares_memory_and_leaves_donation_possible():
    x = jax.device_put(jnp.arange(64, dtype=jnp.uint16).reshape(8, 8), CPU)
    a = alias(x.block_until_ready(), gpu=False)
    assert a.ctypes.data == x.unsafe_buffer_pointer() and not a.flags.writeable
    np.testing.assert_array_equal(a, np.arange(64).reshape(8, 8))
    y = jax.jit(lambda k: k.at[0, 0].set(7), donate_argnums=0)(x).block_until_ready()
    assert x.is_deleted() and y.unsafe_buffer_pointer() == a.ctypes.data  # donated: written in place
    assert a[0, 0] == 7


def test_numpy_view_of_a_cpu_array_blocks_donation():
    """What the README says of ``np.asarray`` on JAX's CPU backend: a zero-copy, read-only view that
    holds the buffer, so a donating call silently copies and the view goes stale."""
    x = jax.device_put(jnp.zeros((8, 8), jnp.uint16), CPU).block_until_ready()
    v = np.asarray(x)
    assert v.ctypes.data == x.unsafe_buffer_pointer() and not v.flags.writeable
    y = jax.jit(lambda k: k.at[0, 0].set(7), donate_argnums=0)(x).block_until_ready()
    assert not x.is_deleted() and y.unsafe_buffer_pointer() != v.ctypes.data
    assert v[0, 0] == 0 and np.asarray(y)[0, 0] == 7


def test_staged_batches_are_views_of_one_buffer_reused_per_shape():
    engine = JaxEngine(device=CPU)
    arrays = BatchArrays(xp=np, capacity=4096, staged=True)
    table = np.zeros((5, 128), np.int32)
    first = engine.sched.schedule()
    batch = arrays.batch(first, table)
    np.testing.assert_array_equal(batch.input_ids, first.input_ids)
    np.testing.assert_array_equal(batch.token_ids_flat, first.token_ids_flat)
    assert all(np.shares_memory(getattr(batch, f), arrays.device) for f in ("prefix_lens", "token_offsets"))
    first.input_ids[:] += 1  # same shape, new contents: the same object, refilled
    assert arrays.batch(first, table) is batch and batch.input_ids[0] == first.input_ids[0]


def test_the_staged_buffer_holds_the_largest_step_and_no_more():
    requests, tokens, max_context = 3, 12, 16
    largest = HostBatch(
        requests=[None] * requests,
        req_pool_indices=np.arange(requests, dtype=np.int64),
        prefix_lens=np.full(requests, max_context - tokens // requests, np.int64),
        extend_seq_lens=np.full(requests, tokens // requests, np.int64),
        **{f: np.zeros(tokens, np.int64) for f in ("input_ids", "positions", "out_cache_loc")},
        **{f: np.zeros(tokens, np.int64) for f in ("expected_tokens", "expected_positions")},
        token_ids_flat=np.zeros(requests * max_context, np.int64),
        token_offsets=np.arange(0, (requests + 1) * max_context, max_context, dtype=np.int64),
    )
    table = np.zeros((requests, max_context), np.int32)
    words = BatchArrays.words(requests, tokens, max_context)
    batch = BatchArrays(xp=np, capacity=words, staged=True).batch(largest, table)
    assert len(batch.token_offsets) == requests + 1 and len(batch.token_ids_flat) == requests * max_context
    with pytest.raises(ValueError, match="int64 words"):
        BatchArrays(xp=np, capacity=words - 1, staged=True).batch(largest, table)


def test_staged_batches_run_clean_and_catch_a_fault():
    engine = _engine(staged=True)
    engine.run(200)
    assert engine.canary.violations == []
    engine = _engine({"table_slip": 5}, staged=True)
    engine.run(20)
    (record,) = engine.faults
    assert any(v.slot_idx in record.slots and v.bits & MUST_SHOW["table_slip"] for v in engine.canary.violations)


def test_paging_does_not_change_what_the_model_generates():
    """The same requests on pages of 4 and of 8 slots land in other slots and yield the same tokens."""
    runs = []
    for page_size, pages in ((4, 160), (8, 80)):
        engine = JaxEngine(config=TINY_ENGINE.with_(page_size=page_size, num_pages=pages), device=CPU)
        seen = {}
        for _ in range(60):
            seen.update({r.rid: r for r in engine.step().requests})
        runs.append(seen)
    assert runs[0].keys() == runs[1].keys()
    assert all(runs[0][rid].tokens == runs[1][rid].tokens for rid in runs[0])
    assert any(runs[0][rid].slots != runs[1][rid].slots for rid in runs[0])


def test_bench_runs_quick_on_the_cpu(tmp_path):
    assert bench.main(["--tiny", "--quick", "--cpu", "--steps", "2", "--rounds", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "jax_engine_bench.json").read_text())
    rows = result["rows"]
    assert {(r["kind"], r["bs"]) for r in rows} == {(k, b) for k, b, _ in bench.QUICK_SHAPES}
    assert {(r["verification"], r["arm"]) for r in rows} == {("-", "off"), ("full", "on"), ("budgeted", "on")}
    assert all(r["violations"] == 0 and r["median_ms"] > 0 and r["samples"] == 2 for r in rows)
    table = (tmp_path / "jax_engine_bench.md").read_text()
    assert table.count("| decode 4 x 32 |") == 6  # three arms: the cost table and the host-time table
    for r in rows:  # every arm's step in parts; a canary's hooks all before the wait for the model
        parts = list(r["phases_us"])
        want = ["forward dispatch", "model wait"]
        if r["arm"] != "off":
            want = ["forward dispatch", "pre_forward", "post_forward", "end_step", "fence", "model wait"]
        assert parts == want and all(v > 0 for v in r["phases_us"].values()), r
