"""The tiled write path of a long shared step (fast/kernels/chain.py ``chain_publish``,
fast/kernels/write_tiled.py): records byte-equal to the reference and to the core's plain
kernel (its own chain), whatever differs from the publisher; the reuse is real; decode-shaped
steps keep the serial kernel (``write_shared``)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from canary_helpers import HEAD, make_context, record, stamp, write_args, write_plan
from canary_oracles import random_source
from kernel_pairs import KERNEL_DEVICE, _rows, to_device, to_host, write

from kvcanary_numba import RealKvHashMode
from kvcanary_numba.fast import chain as chain_glue, write as write_glue
from kvcanary_numba.fast.chain import SharedChain, own_tiled, sharing
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.launch import _launch as _common

pytestmark = pytest.mark.simulator

LENGTHS = [70, 5, 25]  # request 0: two tiles of one warp (64 entries), the second partial
SEEDS = [80, -1, 81]
N = sum(LENGTHS)
SLOTS = 100


def _chain(tokens=N + 4, requests=4) -> SharedChain:
    chain = SharedChain(np, tokens=tokens, requests=requests)
    chain.published = to_device(chain.published, KERNEL_DEVICE)
    chain.published_seeds = to_device(chain.published_seeds, KERNEL_DEVICE)
    return chain


def _inputs():
    tokens = list(range(1000, 1000 + N))
    positions = list(range(5, 5 + LENGTHS[0])) + list(range(LENGTHS[1])) + list(range(5, 5 + LENGTHS[2]))
    return tokens, positions, _slots()


def _seeded(sources=(), mode=RealKvHashMode.NONE):
    ctx = make_context(SLOTS + 100, sources=sources, mode=mode, ring_capacity=256)
    stamp(ctx, 80, 77, 4, HEAD)
    stamp(ctx, 81, 78, 4, 0x99)
    return ctx


def _slots():
    # Entries 1..99 write slots 1..79 and 86..105 (seeds 80 and 81 are never written).
    return [s if s < 80 else s + 6 for s in range(1, N + 1)]


@contextlib.contextmanager
def _launched():
    """The names of the kernels launched inside the block (each launch runs as it would)."""
    names = []

    def take(spec):
        names.append(getattr(spec.kernel, "py_func", spec.kernel).__name__)
        _common.run(spec)

    with _common.sink(take):
        yield names


def _own_equals(ctx, chain, kwargs) -> None:
    """The consuming launch on a copy of ``ctx`` equals the core's plain kernel (no chain shared)."""
    shared, own = to_device(ctx, KERNEL_DEVICE), to_device(ctx, KERNEL_DEVICE)
    args = {k: to_device(v, KERNEL_DEVICE) for k, v in kwargs.items()}
    with sharing(chain, publish=False):
        write_glue.launch_canary_write_kernel(context=shared, **args)
    with pytest.MonkeyPatch.context() as patch:  # a long write would publish its own chain: serial here
        patch.setattr(chain_glue, "OWN_TILED_MIN_TOKENS", 1 << 62)
        write_glue.launch_canary_write_kernel(context=own, **args)
    for name in ("canary_buf", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        np.testing.assert_array_equal(to_host(getattr(shared, name)), to_host(getattr(own, name)), err_msg=name)
    assert _rows(shared) == _rows(own)


def test_paths_by_shape():
    chain = _chain()
    tokens, positions, _ = _inputs()
    plan = write_plan(LENGTHS, SEEDS)
    with _launched() as names:
        with sharing(chain, publish=True):
            write(_seeded(), plan, tokens, positions, _slots())
        with sharing(chain, publish=False):
            write(_seeded(), plan, tokens, positions, _slots())
        # The batch size decides: N tokens for N requests is decode-shaped, the serial kernel.
        with sharing(chain, publish=True, requests=N):
            write(_seeded(), plan, tokens, positions, _slots())
    assert names == [
        "chain_publish",
        "write_tiled_assert0_src0",
        "write_tiled_assert0_src0",
        "write_shared_assert0_src0",
    ]


def test_public_writes_by_length(monkeypatch):
    # Outside a monitor step a write whose requests average OWN_TILED_MIN_TOKENS tokens (the
    # plan's capacity counts them) publishes its own chain and stamps tiled; records and rows
    # equal the reference either way (``write`` compares).
    tokens, positions, _ = _inputs()
    plan = write_plan(LENGTHS, SEEDS)
    with _launched() as names:
        for per_request in (N // 3 + 1, N // 3):  # N = 100 tokens, capacity 3
            monkeypatch.setattr(chain_glue, "OWN_TILED_MIN_TOKENS", per_request)  # the GPU's threshold too
            write(_seeded(), plan, tokens, positions, _slots())
    assert names == ["write_assert0_src0", "chain_publish", "write_tiled_assert0_src0"]


def test_the_own_tiled_rule():
    per = chain_glue.OWN_TILED_MIN_TOKENS
    assert own_tiled(8 * per, 8) and not own_tiled(8 * per - 1, 8)
    assert own_tiled(per, 0) and not own_tiled(0, 0)  # an empty plan counts as one request
    assert not own_tiled(8 * per, 4096)  # capacity far above the batch: serial


def test_own_scratch_is_cached_per_power_of_two_class():
    from kvcanary_numba.fast.scratch import STREAM_SCRATCH

    first = chain_glue.own_scratch(70, 3, 0)
    assert [a.shape for a in first] == [(5, 128), (2, 4)]
    assert all(a is b for a, b in zip(first, chain_glue.own_scratch(128, 4, 0)))  # same class: same arrays
    bigger = chain_glue.own_scratch(129, 5, 0)
    assert [a.shape for a in bigger] == [(5, 256), (2, 8)]
    # The smaller class stays allocated: replayed calls and captured graphs keep its pointers.
    kept = STREAM_SCRATCH.arrays(0).values()
    assert any(a is first[0] for a in kept) and any(a is bigger[0] for a in kept)


def test_the_threshold_is_part_of_the_replay_key(monkeypatch):
    from kvcanary_numba.fast import replay as _kernel_launch

    before = _kernel_launch.launch_state()
    monkeypatch.setattr(chain_glue, "OWN_TILED_MIN_TOKENS", 7)
    assert _kernel_launch.launch_state() != before


def test_consumer_reuses_the_published_chain():
    # A planted prev_hash in the scratch shows up in the consumer's record (entry 40: slot 41).
    chain = _chain()
    tokens, positions, _ = _inputs()
    plan = write_plan(LENGTHS, SEEDS)
    with sharing(chain, publish=True):
        write(_seeded(), plan, tokens, positions, _slots())
    published = to_host(chain.published).copy()
    published[0, 40] = to_signed(0x1234)
    chain.published = to_device(published, KERNEL_DEVICE)
    ctx = to_device(_seeded(), KERNEL_DEVICE)
    args = {k: to_device(v, KERNEL_DEVICE) for k, v in write_args(plan, tokens, positions, _slots()).items()}
    with sharing(chain, publish=False):
        write_glue.launch_canary_write_kernel(context=ctx, **args)
    fields = to_host(ctx.canary_buf).view(np.int64)
    assert fields[41, 2] == 0x1234 and fields[40, 2] != 0x1234


CHANGES = [
    "none",
    "seed record",
    "seed of request 2",
    "token in tile 2",
    "position",
    "skipped",
    "unskipped",
    "request 2 token",
    "out of range",
    "duplicates",
    "duplicate across the difference",
    "input assert",
]


@pytest.mark.parametrize("warps", [1, 2])
@pytest.mark.parametrize("change", CHANGES)
def test_consumer_records_equal_the_reference_and_their_own_chain(change, warps):
    chain = _chain()
    tokens, positions, _ = _inputs()
    slots = _slots()
    pub_slots = list(slots)
    expected = None
    if change == "unskipped":
        pub_slots[10] = -1  # the publisher skipped entry 10, this launch stores it
    if change in ("duplicates", "duplicate across the difference"):
        for i in (3, 20, 66):  # within a tile and across tiles, as the reference's last-wins
            slots[i] = pub_slots[i] = 7
        slots[68] = slots[69] = pub_slots[68] = pub_slots[69] = 0  # padding landing in slot 0
        slots[80] = slots[95] = pub_slots[80] = pub_slots[95] = 90  # request 2, within its only tile
    if change == "out of range":
        slots[12] = pub_slots[12] = SLOTS + 500  # row, no store, the chain advances
    plan = write_plan(LENGTHS, SEEDS)
    with _common.simulated_shapes(write_warps=warps):
        with sharing(chain, publish=True):
            write(_seeded(), plan, tokens, positions, pub_slots)
        ctx = _seeded()
        if change == "seed record":
            stamp(ctx, 80, 79, 4, HEAD)  # request 0 runs its own chain from its start
        elif change == "seed of request 2":
            stamp(ctx, 81, 78, 4, 0x98)
        elif change == "token in tile 2":
            tokens[66] += 1
        elif change == "position":
            positions[3] += 3  # also a chain-position row
        elif change == "skipped":
            slots[10] = -1
        elif change == "request 2 token":
            tokens[90] += 1
        elif change == "duplicate across the difference":
            tokens[40] += 1  # entries 3 and 20 stamp in parallel, 66 (the last of slot 7) serially
        elif change == "input assert":
            expected = (list(tokens), list(positions))
            expected[0][5] += 1
            expected[1][77] += 2
        kwargs = write_args(plan, tokens, positions, slots, *(expected or ()))
        _own_equals(ctx, chain, kwargs)
        with sharing(chain, publish=False):
            write(ctx, plan, tokens, positions, slots, *(expected or ()))  # kernels == reference
    if change in ("duplicates", "duplicate across the difference"):
        assert record(ctx, 7)[0] == tokens[66] and record(ctx, 0)[0] == tokens[69] and record(ctx, 90)[0] == tokens[95]


@pytest.mark.parametrize(("count", "mode"), [(1, RealKvHashMode.PARTIAL), (2, RealKvHashMode.ALL)])
def test_real_kv_sources(rng, count, mode):
    sources = [random_source(rng, SLOTS + 100, page_size=p, nbytes=32) for p in (1, 4)[:count]]
    chain = _chain()
    tokens, positions, _ = _inputs()
    plan = write_plan(LENGTHS, SEEDS)
    with sharing(chain, publish=True):
        write(_seeded(sources, mode), plan, tokens, positions, _slots())
    ctx = _seeded(sources, mode)
    tokens[50] += 1
    _own_equals(ctx, chain, write_args(plan, tokens, positions, _slots()))
    with sharing(chain, publish=False):
        write(ctx, plan, tokens, positions, _slots())
    assert record(ctx, 5)[3] != 0


@pytest.mark.parametrize("path", ["serial", "tiled"])
def test_published_position_holds_for_an_asserting_consumer(path):
    # The publisher does not assert chain positions, the consumer does: the published expected
    # position must still be right (the consumer's rows are the reference's).
    chain = _chain()
    tokens, positions, _ = _inputs()
    positions[30] += 2
    plan = write_plan(LENGTHS, SEEDS)
    requests = N if path == "serial" else None
    publisher = _seeded()
    publisher.enable_chain_position_assert[0] = 0
    with sharing(chain, publish=True, requests=requests):
        write(publisher, plan, tokens, positions, _slots())
    with sharing(chain, publish=False, requests=requests):
        rows = write(_seeded(), plan, tokens, positions, _slots())
    assert len(rows) == 2  # entries 30 and 31 break the chain positions


def test_scratch_too_small_runs_own_chains():
    chain = _chain(tokens=8)
    tokens, positions, _ = _inputs()
    plan = write_plan(LENGTHS, SEEDS)
    with sharing(chain, publish=True):
        write(_seeded(), plan, tokens, positions, _slots())
    with sharing(chain, publish=False):
        write(_seeded(), plan, tokens, positions, _slots())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [RealKvHashMode.NONE, RealKvHashMode.PARTIAL])
@pytest.mark.parametrize("change", ["none", "token", "seed", "duplicates"])
def test_gpu_prefill_step_shape(mode, change):
    # 8 x 8k as in the monitor's prefill step: a publisher, then a consumer with one change.
    rng = np.random.default_rng(8)
    requests, length = 8, 8192
    total = requests * length
    sources = [random_source(rng, total + 2, page_size=16, nbytes=256)]

    def ctx_():
        ctx = make_context(total + 2, sources=sources, mode=mode, ring_capacity=1 << 14)
        stamp(ctx, 1, 1, 0, HEAD)
        return ctx

    slots = rng.permutation(np.arange(2, total + 2))
    slots[rng.random(total) < 0.01] = -1
    positions = np.tile(np.arange(1, length + 1), requests)
    tokens = rng.integers(0, 1 << 40, total)
    plan = write_plan([length] * requests, [1, -1] * (requests // 2))
    chain = SharedChain(__import__("cupy"), tokens=total, requests=requests)
    with sharing(chain, publish=True):
        write(ctx_(), plan, tokens, positions, slots)
    ctx = ctx_()
    if change == "token":
        tokens = tokens.copy()
        tokens[3 * length + 5000] += 1
    elif change == "seed":
        stamp(ctx, 1, 2, 0, HEAD)
    elif change == "duplicates":
        slots = slots.copy()
        slots[length + np.arange(0, length, 97)] = slots[length + 100]
        slots[5 * length + np.arange(4000, 4100)] = 0
    _own_equals(ctx, chain, write_args(plan, tokens, positions, slots))
    with sharing(chain, publish=False):
        write(ctx, plan, tokens, positions, slots)
