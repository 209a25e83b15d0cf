"""Kernels under the GPU's launch shapes (simulator or GPU) against the NumPy reference.

Simulated launches default to one warp per block and one request per thread of
the plan offsets kernel; the GPU runs 2 requests per offsets thread and 8 warps
per write block. ``launch._common.simulated_shapes`` sets these shapes for the
simulator, so the index arithmetic that only several items per thread or several
warps per block exercise is compared with the reference here (on a GPU the
launches keep their own shapes and the same comparisons run there).
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import make_context, write_plan
from canary_oracles import random_source
from helpers import FILL
from kernel_pairs import case, random_batch, run_both, to_kernel, verify, write

from kvcanary_numba import RealKvHashMode, launch_plan_offsets_kernel
from kvcanary_numba.kernels import ON_SIMULATOR
from kvcanary_numba.launch import _launch as _common, plan as glue
from kvcanary_numba.plans import VerifyPlan

pytestmark = pytest.mark.simulator

#: (threads per block, requests per thread) of the offsets kernel: the GPU's 2 per thread, and 3.
OFFSET_SHAPES = [(4, 2), (3, 3), (2, 2)]


def _offsets_outputs(bs: int, capacity: int) -> dict:
    return dict(
        out_verify_offsets_scratch=np.full(bs + 3, FILL, dtype=np.int64),
        out_write_offsets=np.full(capacity + 1, FILL, dtype=np.int64),
        out_write_seed_slot_indices=np.full(capacity, FILL, dtype=np.int64),
        out_verify_num_valid=np.full(1, -5, dtype=np.int32),
        out_verify_enable=np.full(1, -5, dtype=np.int32),
        out_write_num_valid_reqs=np.full(1, -5, dtype=np.int32),
    )


def _offsets_both(inputs: dict) -> dict:
    """Offsets step on the reference and the kernel; every output (scratch included) must be equal."""
    keys = (
        "req_pool_indices",
        "prefix_lens",
        "extend_seq_lens",
        "req_to_token",
        "full_to_swa_index_mapping",
        "swa_window_size",
        "verify_capacity",
    )
    batch = {k: inputs[k] for k in keys}
    want = _offsets_outputs(batch["req_pool_indices"].shape[0], inputs["wcap"])
    got = {k: to_kernel(v) for k, v in want.items()}
    launch_plan_offsets_kernel(**batch, **want, backend="numpy")
    launch_plan_offsets_kernel(**{k: to_kernel(v) for k, v in batch.items()}, **got, backend="cuda")
    host = {k: np.asarray(v.get() if hasattr(v, "get") else v) for k, v in got.items()}
    for name, array in want.items():
        np.testing.assert_array_equal(host[name], array, err_msg=name)
    return host


@pytest.fixture(params=OFFSET_SHAPES, ids=lambda s: f"{s[0]}threads-x{s[1]}")
def offsets_shape(request):
    threads, items = request.param
    # block=64: the entries kernel (run_both runs it too) with two warps per block
    with _common.simulated_shapes(offsets_block=threads, offsets_items=items, block=64):
        if ON_SIMULATOR:
            assert glue.offsets_shape() == (threads, items)
        yield threads, items


def test_simulated_shapes_are_scoped_and_checked():
    before = glue.offsets_shape()
    with _common.simulated_shapes(offsets_items=3):
        with _common.simulated_shapes(offsets_items=2, block=64):
            inner = glue.offsets_shape()[1], _common.block_size(512)
        outer = glue.offsets_shape()[1]
    assert glue.offsets_shape() == before
    if ON_SIMULATOR:
        assert (inner, outer) == ((2, 64), 3)
    with pytest.raises(RuntimeError, match="unknown launch shape"):  # a test bug, not user input
        with _common.simulated_shapes(offset_items=2):
            pass
    with pytest.raises(RuntimeError, match=">= 1"):
        with _common.simulated_shapes(write_warps=0):
            pass


# --- plan offsets: several requests per thread -----------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_offsets_several_requests_per_thread_equal_reference(offsets_shape, seed):
    threads, items = offsets_shape
    rng = np.random.default_rng(seed)
    bs = threads * items * 2 + 1  # three tiles, the last one partial
    _offsets_both(random_batch(rng, bs=bs, wcap=bs + 2))
    run_both(random_batch(rng, bs=bs, wcap=bs + 1))


def test_offsets_cap_an_overlong_request_in_a_thread_with_others(offsets_shape):
    # A request longer than the capacity is capped at capacity + 1 in the scratch offsets; the
    # requests after it in the same thread start from that capped sum (the reference's rule).
    threads, items = offsets_shape
    vcap = 5
    bs = threads * items
    prefix = [vcap + 4 if k % items == 0 else 2 for k in range(bs)]
    got = _offsets_both(case(list(range(1, bs + 1)), prefix, [1] * bs, vcap=vcap))
    assert got["out_verify_offsets_scratch"][1] == vcap + 1
    assert (int(got["out_verify_enable"][0]), int(got["out_verify_num_valid"][0])) == (0, vcap)


@pytest.mark.parametrize("vcap", [1, 5, 17])
@pytest.mark.parametrize("extra", [0, 1, 2])
def test_one_request_around_the_capacity_equals_reference(offsets_shape, vcap, extra):
    # Exactly the capacity fits; one entry more overflows on its own (capped at capacity + 1, not capacity).
    v, _ = run_both(case([1], [vcap + extra], [1], vcap=vcap))
    assert int(v["enable"][0]) == (1 if extra == 0 else 0)
    assert int(v["verify_num_valid"][0]) == vcap


# --- write and verify: several warps per block -----------------------------------------


@pytest.fixture(params=[2, 3], ids=lambda w: f"{w}warps")
def warps(request):
    with _common.simulated_shapes(write_warps=request.param, block=32 * request.param):
        yield request.param


def _disjoint_requests(rng, bs, num_slots, longest=40):
    lengths = rng.integers(0, longest, bs)
    lengths[rng.random(bs) < 0.2] = 0  # empty requests between busy ones
    # One request per slot, and no slot is another request's seed (both would race on a GPU).
    slots = rng.permutation(np.arange(10, num_slots))[: int(lengths.sum())]
    return lengths, slots


@pytest.mark.parametrize("seed", range(3))
def test_write_several_warps_per_block_equals_reference(warps, seed):
    rng = np.random.default_rng(seed)
    bs = 4 * warps + 3  # more requests than warps of the simulated grid: warps stride
    num_slots = 1024
    lengths, slots = _disjoint_requests(rng, bs, num_slots)
    n = int(lengths.sum())
    sources = [random_source(rng, num_slots, nbytes=32)]
    ctx = make_context(num_slots, sources=sources, mode=RealKvHashMode.ALL, ring_capacity=256)
    seeds = rng.choice([-1, 0, 3, num_slots + 5], bs)
    tokens, positions = rng.integers(0, 1000, n), rng.integers(0, 100, n)
    plan = write_plan(lengths, seeds, capacity=bs + 2)
    rows = write(ctx, plan, tokens, positions, slots, tokens, positions + (rng.random(n) < 0.1))
    assert rows, "the planted position mismatches and out-of-range seeds record rows"
    assert (ctx.canary_buf.view(np.int64)[slots, 1] == positions).all()


def test_write_several_warps_per_block_reaches_every_request(warps):
    # Every request of a strided grid is walked exactly once: its one entry is stored and counted.
    bs = 2 * warps * _common.SIM_MAX_BLOCKS + 1
    ctx = make_context(64)
    write(ctx, write_plan([1] * bs, [-1] * bs), range(bs), range(bs), range(10, 10 + bs))
    assert ctx.canary_buf.view(np.int64)[10 : 10 + bs, 0].tolist() == list(range(bs))
    assert int(ctx.slot_run_counter[0]) == bs


@pytest.mark.parametrize("nsrc", [0, 1])
def test_verify_several_warps_per_block_equals_reference(rng, warps, nsrc):
    num_slots = 256
    sources = [random_source(rng, num_slots, nbytes=64)] if nsrc else []
    mode = RealKvHashMode.ALL if nsrc else RealKvHashMode.NONE
    ctx = make_context(num_slots, sources=sources, mode=mode, ring_capacity=512)
    n = 32 * warps * _common.SIM_MAX_BLOCKS + 9  # more tiles than warps: every warp strides
    slots = rng.integers(0, num_slots + 3, n)
    write(ctx, write_plan([n], [-1], capacity=1), rng.integers(0, 50, n), np.arange(n), np.arange(1, n + 1) % num_slots)
    plan = VerifyPlan.allocate(verify_capacity=n)
    plan.verify_slot_indices[:] = slots
    plan.verify_expected_tokens[:] = rng.integers(0, 50, n)
    plan.verify_expected_positions[:] = rng.integers(0, n, n)
    plan.verify_prev_slot_indices[:] = rng.integers(-1, num_slots, n)
    plan.verify_num_valid[0], plan.enable[0] = n, 1
    assert verify(ctx, plan, check=True)
