"""Plan kernels across tiles and at scale: the multi-block look-back with tiny tiles, the offsets launch, GPU runs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FILL, padded_lut
from kernel_pairs import (
    KERNEL_DEVICE,
    case,
    fresh_plans,
    garbage_batch,
    host_arrays,
    random_batch,
    run_both,
    to_host,
    to_kernel,
)
from numba import cuda

from kvcanary_numba import plan as public
from kvcanary_numba.fast.scratch import STREAM_SCRATCH
from kvcanary_numba.kernels import ON_SIMULATOR, plan as kernels
from kvcanary_numba.launch import plan as glue
from kvcanary_numba.reference import plan as reference

# --- batch sizes around the tile: the multi-block look-back -------------------


def set_tile(monkeypatch, threads: int, items: int) -> int:
    """Shrink the offsets tile to ``threads x items`` requests (simulator or GPU); returns its size."""
    prefix = "SIM_OFFSETS_" if ON_SIMULATOR else "OFFSETS_"
    monkeypatch.setattr(glue, prefix + "BLOCK", threads)
    monkeypatch.setattr(glue, prefix + "ITEMS", items)
    return threads * items


@pytest.fixture(params=[(1, 1), (4, 2), (5, 3)], ids=lambda s: f"tile{s[0]}x{s[1]}")
def small_tiles(request, monkeypatch):
    return set_tile(monkeypatch, *request.param)


def _lookback_clear() -> bool:
    """Every look-back state cached for the default stream is back to zero (tickets, done count, tile flags)."""
    states = [to_host(arr) for key, arr in STREAM_SCRATCH.arrays(0).items() if key[0] == "lookback"]
    return bool(states) and all(
        not s[: kernels.LOOKBACK_HEADER].any() and not s[kernels.LOOKBACK_HEADER :: kernels.LOOKBACK_STRIDE].any()
        for s in states
    )


@pytest.mark.simulator
@pytest.mark.parametrize("offset_from_tile", ["zero", "one", "tile-1", "tile", "tile+1", "3tiles+2"])
def test_bs_around_tile_size_equals_reference(small_tiles, offset_from_tile):
    tile = small_tiles
    bs = {"zero": 0, "one": 1, "tile-1": tile - 1, "tile": tile, "tile+1": tile + 1, "3tiles+2": 3 * tile + 2}[
        offset_from_tile
    ]
    rng = np.random.default_rng(bs)
    run_both(random_batch(rng, bs=bs) if bs else case([], [], [], wcap=2), scratch=STREAM_SCRATCH)
    if bs > tile:
        assert _lookback_clear()


@pytest.mark.simulator
def test_lookback_state_resets_between_different_batches(monkeypatch):
    set_tile(monkeypatch, 2, 1)
    rng = np.random.default_rng(11)
    first = random_batch(rng, bs=9, wcap=9)
    plans = fresh_plans(first, KERNEL_DEVICE)
    for batch in (first, random_batch(rng, bs=9, wcap=9), case([1] * 9, [1] * 9, [2] * 9, wcap=9)):
        # Stale tile sums from the previous launch would shift every offset after tile 0.
        batch["wcap"] = 9
        run_both(dict(batch, verify_capacity=first["verify_capacity"]), plans=plans, scratch=STREAM_SCRATCH)
        assert _lookback_clear()


@cuda.jit
def _look_back_probe(lookback, tile, agg_v, agg_w, out):
    if cuda.threadIdx.x == 0:
        out[0], out[1] = kernels.look_back(lookback, tile, agg_v, agg_w)


@pytest.mark.simulator
def test_look_back_sums_aggregates_until_an_inclusive_prefix():
    # Tiles 1 and 2 have only published their own sums; tile 0 its inclusive prefix. Blocks run
    # one after another under the simulator, so a real launch never shows this state there.
    head, stride = kernels.LOOKBACK_HEADER, kernels.LOOKBACK_STRIDE
    state = np.zeros(head + stride * 5, dtype=np.int64)
    for tile, row in enumerate([(2, 0, 0, 5, 50), (1, 3, 30, 0, 0), (1, 2, 20, 0, 0)]):
        state[head + tile * stride : head + (tile + 1) * stride] = row
    state_dev, out = to_kernel(state), to_kernel(np.zeros(2, dtype=np.int64))
    _look_back_probe[1, 1](state_dev, 3, 7, 70, out)
    assert to_host(out).tolist() == [10, 100]
    assert to_host(state_dev)[head + 3 * stride : head + 4 * stride].tolist() == [2, 7, 70, 17, 170]


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(3))
def test_offsets_launch_equals_reference(seed):
    inputs = garbage_batch(np.random.default_rng(200 + seed))
    bs, cap = inputs["req_pool_indices"].shape[0], inputs["wcap"]
    outs = dict(
        out_verify_offsets_scratch=np.full(bs + 3, FILL, dtype=np.int64),
        out_write_offsets=np.full(cap + 1, FILL, dtype=np.int64),
        out_write_seed_slot_indices=np.full(cap, FILL, dtype=np.int64),
        out_verify_num_valid=np.full(1, FILL, dtype=np.int32),
        out_verify_enable=np.full(1, FILL, dtype=np.int32),
        out_write_num_valid_reqs=np.full(1, FILL, dtype=np.int32),
    )
    names = (
        "req_pool_indices",
        "prefix_lens",
        "extend_seq_lens",
        "req_to_token",
        "full_to_swa_index_mapping",
        "swa_window_size",
        "verify_capacity",
    )
    args = {name: inputs[name] for name in names}
    want = {k: v.copy() for k, v in outs.items()}
    reference.launch_plan_offsets_kernel(**args, **want)
    got = {k: to_kernel(v) for k, v in outs.items()}
    launch = public.launch_plan_offsets_kernel if seed else glue.launch_plan_offsets_kernel
    launch(**{k: to_kernel(v) for k, v in args.items()}, **got, **({"backend": "cuda"} if seed else {}))
    for name in outs:
        np.testing.assert_array_equal(to_host(got[name]), want[name], err_msg=name)


# --- GPU: scale, CUDA graphs, time --------------------------------------------


def scale_batch(rng, bs, *, window=0, pool=False):
    """bs requests with about 1 M verify entries in total."""
    width = max(16, min(1 << 20, (1 << 21) // max(bs, 1)))
    rows = min(bs + 1, 2048)
    lut_len = 1 << 22
    return case(
        rng.integers(0 if bs > 1 else 1, rows, bs),
        rng.integers(0, width + 1, bs),
        rng.integers(0, 5, bs),
        rtt=rng.integers(1, lut_len, (rows, width)).astype(np.int32),
        window=window,
        lut=padded_lut(rng.permutation(lut_len)) if window else None,
        pool=rng.integers(0, 1 << 30, (rows, width)).astype(np.int32) if pool else None,
        lens=rng.integers(0, width + 1, bs) if pool else None,
        vcap=1 << 21,
        wcap=bs + 7,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 4095, 4096, 4097, 65536])
def test_gpu_bs_at_scale_equals_reference(bs):
    pytest.importorskip("cupy")
    v, _ = run_both(scale_batch(np.random.default_rng(bs), bs))
    assert int(v["enable"][0]) == 1 and int(v["verify_num_valid"][0]) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [4097, 65536])
def test_gpu_swa_pool_at_scale_equals_reference(bs):
    pytest.importorskip("cupy")
    run_both(scale_batch(np.random.default_rng(bs + 1), bs, window=48, pool=True))


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_gpu_garbage_at_scale_equals_reference(seed):
    pytest.importorskip("cupy")
    run_both(garbage_batch(np.random.default_rng(300 + seed), bs=70000 + seed), scratch=STREAM_SCRATCH)
    assert _lookback_clear()


def _captured_plan(inputs):
    """Warm up eagerly, then capture one plan step on a private stream; returns (graph, stream, dev args)."""
    cupy = pytest.importorskip("cupy")
    stream = cupy.cuda.Stream(non_blocking=True)
    plans = fresh_plans(inputs, "cuda")
    args = {k: to_kernel(v) for k, v in inputs.items() if k != "wcap"}
    with stream:  # the fast wing's scratch: allocated by the eager call, none during the capture
        glue.launch_canary_plan_kernels(
            verify_plan_out=plans[0], write_plan_out=plans[1], **args, scratch=STREAM_SCRATCH
        )
        stream.synchronize()
        stream.begin_capture()
        glue.launch_canary_plan_kernels(
            verify_plan_out=plans[0], write_plan_out=plans[1], **args, scratch=STREAM_SCRATCH
        )
        graph = stream.end_capture()
    return graph, stream, plans, args


@pytest.mark.gpu
def test_gpu_graph_replay_follows_new_inputs():
    rng = np.random.default_rng(5)
    first, second = scale_batch(rng, 8192), scale_batch(rng, 8192)
    second.update(req_to_token=first["req_to_token"])  # the captured table pointer stays
    graph, stream, plans, args = _captured_plan(first)
    before = [host_arrays(p) for p in plans]
    with stream:
        for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens"):
            args[name][...] = to_kernel(second[name])
        graph.launch(stream)
        stream.synchronize()
    ref = [type(p)(**b) for p, b in zip(plans, before)]
    kwargs = {k: v for k, v in second.items() if k != "wcap"}
    reference.launch_canary_plan_kernels(verify_plan_out=ref[0], write_plan_out=ref[1], **kwargs)
    for want, got in zip(ref, plans):
        for name, arr in want.arrays().items():
            np.testing.assert_array_equal(to_host(getattr(got, name)), arr, err_msg=name)
