"""Plan kernels (offsets + entries) through the launch glue, byte for byte against the NumPy reference.

Every case runs :mod:`kvcanary_numba.reference.plan` and the kernels on identical
inputs and identically pre-filled plans, then compares every array in full, so
stale or unwritten entries show up too. Cases: SGLang's plan hand tests
(reference notes §10.5) with some values pinned by hand, random and garbage
batches, and batch sizes around the tile size with tiny tiles so that the
multi-block look-back runs under the simulator. The ``gpu`` tests repeat the
comparison at scale (bs up to 65 536, about 1 M entries), replay the plan from a
CUDA graph and time one step.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import PLAN_WIDTH, linear_rtt
from kernel_pairs import KERNEL_DEVICE, to_device, to_host
from numba import cuda

from kvcanary_numba import OUT_OF_RANGE_SLOT, VerifyPlan, WritePlan
from kvcanary_numba import plan as public
from kvcanary_numba.kernels import ON_SIMULATOR
from kvcanary_numba.kernels import plan as kernels
from kvcanary_numba.launch import plan as glue
from kvcanary_numba.launch._common import SIM_BLOCK, SIM_MAX_BLOCKS
from kvcanary_numba.reference import plan as reference

OOR = OUT_OF_RANGE_SLOT
FILL = -7777


def to_kernel(x):
    """``x`` where the kernels run (a copy), scalars and None as they are."""
    return to_device(x, KERNEL_DEVICE)
WIDTH = PLAN_WIDTH
#: Threads of a simulated persistent grid (two blocks).
SIM_STRIDE = SIM_BLOCK * SIM_MAX_BLOCKS








def case(rpi, prefix, ext, *, rtt=None, window=0, lut=None, pool=None, lens=None, offset=0, vcap=4096, wcap=None):
    """One plan input; arrays as NumPy, plan capacities alongside."""
    rpi = np.asarray(rpi, dtype=np.int64)
    return dict(
        req_pool_indices=rpi, prefix_lens=np.asarray(prefix, dtype=np.int64),
        extend_seq_lens=np.asarray(ext, dtype=np.int64), req_to_token=linear_rtt() if rtt is None else rtt,
        swa_window_size=window, full_to_swa_index_mapping=lut, verify_capacity=vcap,
        req_to_verify_expected_tokens=pool, req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=offset, wcap=max(rpi.shape[0], 1) if wcap is None else wcap,
    )


def fresh_plans(inputs: dict, device: str):
    vplan = VerifyPlan.allocate(verify_capacity=inputs["verify_capacity"], device=device)
    wplan = WritePlan.allocate(write_req_capacity=inputs["wcap"], device=device)
    for arr in (*vplan.arrays().values(), *wplan.arrays().values()):
        arr[...] = FILL
    return vplan, wplan


def host_arrays(plan) -> dict:
    return {name: to_host(arr).copy() for name, arr in plan.arrays().items()}


def run_both(inputs: dict, *, via_public: bool = False, plans=None) -> tuple[dict, dict]:
    """Plan on the reference and the kernels, assert every array equal; return the kernels' plans."""
    kwargs = {k: v for k, v in inputs.items() if k != "wcap"}
    if plans is None:
        plans = fresh_plans(inputs, KERNEL_DEVICE)
    ref_v, ref_w = (type(p)(**host_arrays(p)) for p in plans)  # same starting contents
    reference.launch_canary_plan_kernels(verify_plan_out=ref_v, write_plan_out=ref_w, **kwargs)
    dev_kwargs = {k: to_kernel(v) for k, v in kwargs.items()}
    launch = public.launch_canary_plan_kernels if via_public else glue.launch_canary_plan_kernels
    extra = {"backend": "cuda"} if via_public else {}
    launch(verify_plan_out=plans[0], write_plan_out=plans[1], **dev_kwargs, **extra)
    got = host_arrays(plans[0]), host_arrays(plans[1])
    for want_plan, got_plan in zip((ref_v, ref_w), got):
        for name, want in want_plan.arrays().items():
            np.testing.assert_array_equal(got_plan[name], want, err_msg=name)
    return got


def entries(vplan: dict) -> dict:
    n = int(vplan["verify_num_valid"][0])
    names = ("slot_indices", "expected_tokens", "expected_positions", "prev_slot_indices")
    return {name: vplan[f"verify_{name}"][:n].tolist() for name in names}


def token_pool(rows=9, width=WIDTH):
    """Expected-token pool with pool[rp, pos] = rp * 1000 + pos."""
    return (np.arange(rows)[:, None] * 1000 + np.arange(width)[None, :]).astype(np.int32)


def _permuted_lut(n, seed=3):
    return np.random.default_rng(seed).permutation(n).astype(np.int64) + 1


def _sparse_rtt(seed=4):
    rng = np.random.default_rng(seed)
    rtt = np.zeros((9, WIDTH), dtype=np.int32)
    rtt[1:4, :12] = rng.permutation(200)[: 3 * 12].reshape(3, 12) + 1
    return rtt


WIDE = linear_rtt(width=1024)
SCENARIOS = {
    "single_req_extend_basic": case([3], [0], [5]),
    "single_req_decode": case([2], [7], [1]),
    "multi_req_mixed_extend_decode": case([1, 2, 3], [0, 4, 10], [8, 1, 1]),
    "prev_slot_chain": case([2], [3], [1]),
    "seed_translated_through_permuted_lut": case([2], [5], [1], window=1000, lut=_permuted_lut(9 * WIDTH)),
    "swa_window_head_prev_is_real_predecessor": case([1], [200], [1], rtt=linear_rtt(width=256), window=128,
                                                     lut=_permuted_lut(9 * 256)),
    "padding_rows_contribute_zero": case([1, 0, 2], [5, 99, 3], [1, 1, 1]),
    "padding_row_with_garbage_prefix": case([1, 0, 2], [5, 99999, 3], [1, 7, 1]),
    "sparse_req_to_token": case([1, 2, 3], [12, 5, 9], [1, 2, 1], rtt=_sparse_rtt()),
    "swa_clip_prefix_less_than_window": case([1], [3], [1], rtt=linear_rtt(width=256), window=128,
                                             lut=np.arange(9 * 256, dtype=np.int64)),
    "swa_lut_identity_plus_100": case([1], [3], [1], window=128, lut=np.arange(1000, dtype=np.int64) + 100),
    "swa_covers_all_tokens_in_window": case([1, 2, 3, 4], [50, 128, 200, 1024], [1, 1, 1, 1], rtt=WIDE,
                                            window=128, lut=np.arange(9 * 1024, dtype=np.int64)),
    "zero_prefix_has_no_verify_entries": case([1], [0], [3]),
    "verify_capacity_just_fits": case([1, 2], [3, 4], [1, 1], vcap=7),
    "verify_capacity_undershoot_by_one": case([1, 2], [3, 4], [1, 1], vcap=6),
    "zero_extend_writes_empty_write_plan": case([1, 2], [4, 6], [0, 0]),
    "padding_rows_in_write_plan": case([1, 0, 2, 0], [1, 1, 1, 1], [1, 1, 0, 1], wcap=6),
    "lut_translates_slot_zero_passes_negatives_reports_misses": case(
        [1, 2], [4, 3], [1, 1], rtt=np.array([[0] * 4, [0, -1, 5, 9], [-7, 8, 0, 3]], dtype=np.int32), window=2,
        lut=np.array([77, 1, 2, 3, 4, 55, 6, 7], dtype=np.int64)),
    "empty_batch": case([], [], [], wcap=3),
    "all_padding": case([0, 0, 0], [4, 5, 6], [1, 1, 1]),
    "negative_lengths_count_as_zero": case([1, 2], [-3, 4], [2, -1]),
    "expected_tokens_offset_0": case([1, 2], [5, 3], [1, 1], pool=token_pool(), lens=np.array([5, 16])),
    "expected_tokens_offset_plus_1": case([1, 2], [5, 3], [1, 1], pool=token_pool(), lens=np.array([4, 16]),
                                          offset=1),
    "expected_tokens_beyond_bound": case([1, 2, 3], [8, 8, 8], [1, 1, 1], pool=token_pool(rows=3, width=6),
                                         lens=np.array([3, 99, -1]), offset=-1),
}


@pytest.mark.simulator
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_hand_scenario_equals_reference(name):
    run_both(SCENARIOS[name], via_public=name.startswith("expected"))


@pytest.mark.simulator
def test_pinned_multi_req_mixed_extend_decode():
    v, w = run_both(SCENARIOS["multi_req_mixed_extend_decode"], via_public=True)
    assert w["write_offsets"].tolist() == [0, 8, 9, 10]
    assert w["write_seed_slot_indices"].tolist() == [-1, 2 * 16 + 3, 3 * 16 + 9]
    assert (int(v["verify_num_valid"][0]), int(v["enable"][0]), int(w["write_num_valid_reqs"][0])) == (14, 1, 3)
    got = entries(v)
    assert got["slot_indices"] == [32, 33, 34, 35] + [48 + p for p in range(10)]
    assert got["prev_slot_indices"] == [-1, 32, 33, 34, -1] + [48 + p for p in range(9)]
    assert got["expected_positions"] == [0, 1, 2, 3] + list(range(10))
    assert got["expected_tokens"] == [-1] * 14


@pytest.mark.simulator
def test_pinned_swa_window_through_lut():
    v, w = run_both(SCENARIOS["swa_lut_identity_plus_100"])
    assert entries(v)["slot_indices"] == [116, 117, 118] and w["write_seed_slot_indices"][0] == 118
    v, _ = run_both(SCENARIOS["swa_clip_prefix_less_than_window"])
    assert entries(v)["expected_positions"] == [0, 1, 2]
    v, _ = run_both(SCENARIOS["swa_covers_all_tokens_in_window"])
    assert int(v["verify_num_valid"][0]) == 50 + 128 + 128 + 128


@pytest.mark.simulator
def test_pinned_overflow_leaves_entries_untouched():
    v, _ = run_both(SCENARIOS["verify_capacity_undershoot_by_one"])
    assert (int(v["verify_num_valid"][0]), int(v["enable"][0])) == (6, 0)
    assert (v["verify_slot_indices"] == FILL).all() and (v["verify_prev_slot_indices"] == FILL).all()


@pytest.mark.simulator
def test_pinned_expected_tokens():
    v, _ = run_both(SCENARIOS["expected_tokens_offset_plus_1"], via_public=True)
    assert entries(v)["expected_tokens"] == [1001, 1002, 1003, -1, -1, 2001, 2002, 2003]


@pytest.mark.simulator
def test_pinned_unresolvable_rows_and_positions():
    # Row 9 is past the 9-row table and row -1 is active too; positions >= 16 are past its width.
    v, w = run_both(case([9, -1, 2], [2, 1, 18], [1, 1, 1]))
    got = entries(v)
    assert got["slot_indices"] == [OOR] * 3 + [32 + p for p in range(16)] + [OOR, OOR]
    assert got["prev_slot_indices"][-3:] == [46, 47, OOR]
    assert w["write_seed_slot_indices"].tolist() == [OOR, OOR, OOR]


# --- random and garbage batches ----------------------------------------------


@pytest.mark.simulator
def test_huge_prefix_lengths_overflow_like_the_reference():
    huge = 2**62
    vplan, _ = run_both(case([1, 2, 3], [huge, huge, huge], [1, 1, 1], vcap=64))
    assert (int(vplan["enable"][0]), int(vplan["verify_num_valid"][0])) == (0, 64)


def random_batch(rng, bs=None, *, rows=9, width=WIDTH, wcap=None):
    """A plausible batch: padding rows, SWA or not, expected-token pool or not."""
    bs = int(rng.integers(1, 40)) if bs is None else bs
    window = int(rng.choice([0, 0, 3, 8]))
    pool = token_pool(rows, width) if rng.random() < 0.5 else None
    return case(
        rng.integers(0, rows, bs), rng.integers(0, width + 1, bs), rng.integers(0, 4, bs),
        rtt=rng.integers(1, 500, (rows, width)).astype(np.int32), window=window,
        lut=rng.integers(1, 10**6, 500).astype(np.int64) if window else None,
        pool=pool, lens=None if pool is None else rng.integers(0, width + 1, bs),
        offset=int(rng.integers(-1, 2)), vcap=int(rng.integers(1, bs * width + 2)), wcap=wcap or bs + 2,
    )


def garbage_batch(rng, bs=None):
    """Hostile values everywhere: rows and slots out of range, negative lengths, LUT misses."""
    bs = int(rng.integers(1, 40)) if bs is None else bs
    rows, width = 5, 12
    window = int(rng.choice([0, 4]))
    return case(
        rng.integers(-3, rows + 3, bs), rng.integers(-5, width + 6, bs), rng.integers(-3, 4, bs),
        rtt=rng.integers(-4, 90, (rows, width)).astype(np.int32), window=window,
        lut=rng.integers(-3, 10**6, 60).astype(np.int64) if window else None,
        pool=rng.integers(-9, 9, (rows - 1, width - 3)).astype(np.int32),
        lens=rng.integers(-3, width + 5, bs), offset=int(rng.integers(-3, 4)), vcap=int(rng.integers(1, 300)),
        wcap=bs + int(rng.integers(0, 5)),
    )


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(6))
def test_random_batch_equals_reference(seed):
    run_both(random_batch(np.random.default_rng(seed)), via_public=seed % 2 == 0)


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(6))
def test_garbage_batch_equals_reference(seed):
    run_both(garbage_batch(np.random.default_rng(100 + seed)), via_public=seed % 2 == 1)


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(4))
def test_entries_across_tiles_and_request_runs_equal_reference(seed):
    # The entries kernel searches once per tile of ENTRIES_PER_TILE consecutive entries, then
    # each lane follows request ends: more tiles than simulated warps, runs of one-entry
    # requests (a lane passes several ends per step) and padding or empty requests between
    # them (equal offsets), long requests spanning tiles.
    rng = np.random.default_rng(seed)
    bs = 120
    prefix = rng.choice([0, 1, 1, 1, 2, 3, 40, 150], size=bs)
    rows = rng.integers(0, 9, bs)  # 0: padding rows
    assert (prefix[rows != 0]).sum() > 3 * kernels.ENTRIES_PER_TILE > 2 * SIM_STRIDE
    run_both(case(rows, prefix, [1] * bs, rtt=linear_rtt(width=160), vcap=8192))


@pytest.mark.simulator
def test_replan_on_same_plans_shrinks_batch_and_repeats_byte_equal():
    first = random_batch(np.random.default_rng(7), bs=8, wcap=10)
    plans = fresh_plans(first, KERNEL_DEVICE)
    got_first = run_both(first, plans=plans)
    assert run_both(first, plans=plans)[1]["write_offsets"].tolist() == got_first[1]["write_offsets"].tolist()
    small = dict(first, req_pool_indices=first["req_pool_indices"][:3], prefix_lens=first["prefix_lens"][:3],
                 extend_seq_lens=first["extend_seq_lens"][:3])
    if small["req_to_verify_expected_tokens_valid_lens"] is not None:
        small["req_to_verify_expected_tokens_valid_lens"] = small["req_to_verify_expected_tokens_valid_lens"][:3]
    _, w = run_both(small, plans=plans)
    assert (w["write_offsets"][4:] == 0).all() and (w["write_seed_slot_indices"][3:] == -1).all()


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
    """Every cached look-back state is back to zero (tickets, done count, tile flags)."""
    states = [to_host(arr) for pool in glue._scratch.values() for key, arr in pool.items() if key[0] == "lookback"]
    return bool(states) and all(
        not s[:kernels.LOOKBACK_HEADER].any() and not s[kernels.LOOKBACK_HEADER::kernels.LOOKBACK_STRIDE].any()
        for s in states
    )


@pytest.mark.simulator
@pytest.mark.parametrize("offset_from_tile", ["zero", "one", "tile-1", "tile", "tile+1", "3tiles+2"])
def test_bs_around_tile_size_equals_reference(small_tiles, offset_from_tile):
    tile = small_tiles
    bs = {"zero": 0, "one": 1, "tile-1": tile - 1, "tile": tile, "tile+1": tile + 1,
          "3tiles+2": 3 * tile + 2}[offset_from_tile]
    rng = np.random.default_rng(bs)
    run_both(random_batch(rng, bs=bs) if bs else case([], [], [], wcap=2))
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
        run_both(dict(batch, verify_capacity=first["verify_capacity"]), plans=plans)
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
        state[head + tile * stride: head + (tile + 1) * stride] = row
    state_dev, out = to_kernel(state), to_kernel(np.zeros(2, dtype=np.int64))
    _look_back_probe[1, 1](state_dev, 3, 7, 70, out)
    assert to_host(out).tolist() == [10, 100]
    assert to_host(state_dev)[head + 3 * stride: head + 4 * stride].tolist() == [2, 7, 70, 17, 170]


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
    names = ("req_pool_indices", "prefix_lens", "extend_seq_lens", "req_to_token", "full_to_swa_index_mapping",
             "swa_window_size", "verify_capacity")
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
        rng.integers(0 if bs > 1 else 1, rows, bs), rng.integers(0, width + 1, bs), rng.integers(0, 5, bs),
        rtt=rng.integers(1, lut_len, (rows, width)).astype(np.int32), window=window,
        lut=rng.permutation(lut_len).astype(np.int64) if window else None,
        pool=rng.integers(0, 1 << 30, (rows, width)).astype(np.int32) if pool else None,
        lens=rng.integers(0, width + 1, bs) if pool else None, vcap=1 << 21, wcap=bs + 7,
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
    run_both(garbage_batch(np.random.default_rng(300 + seed), bs=70000 + seed))
    assert _lookback_clear()


def _captured_plan(inputs):
    """Warm up eagerly, then capture one plan step on a private stream; returns (graph, stream, dev args)."""
    cupy = pytest.importorskip("cupy")
    stream = cupy.cuda.Stream(non_blocking=True)
    plans = fresh_plans(inputs, "cuda")
    args = {k: to_kernel(v) for k, v in inputs.items() if k != "wcap"}
    with stream:
        glue.launch_canary_plan_kernels(verify_plan_out=plans[0], write_plan_out=plans[1], **args)
        stream.synchronize()
        stream.begin_capture()
        glue.launch_canary_plan_kernels(verify_plan_out=plans[0], write_plan_out=plans[1], **args)
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

