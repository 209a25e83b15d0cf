"""Plan kernels (offsets + entries) through the launch glue, byte for byte against the NumPy reference.

Every case runs :mod:`kvcanary_numba.reference.plan` and the kernels on identical
inputs and identically pre-filled plans (``kernel_pairs.run_both``), then compares
every array in full, so stale or unwritten entries show up too. Cases here:
SGLang's plan hand tests (SGLang's plan hand tests) with some values pinned by hand,
and random and garbage batches. Batch sizes around the tile size (the multi-block
look-back under the simulator) and the ``gpu`` runs at scale, from a CUDA graph,
are in test_kernels_plan_scale.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FILL, OOR, PLAN_WIDTH, linear_rtt, padded_lut
from kernel_pairs import KERNEL_DEVICE, case, fresh_plans, garbage_batch, random_batch, run_both, token_pool

from kvcanary_numba.kernels import plan as kernels
from kvcanary_numba.launch._launch import SIM_BLOCK, SIM_MAX_BLOCKS

WIDTH = PLAN_WIDTH
#: Threads of a simulated persistent grid (two blocks).
SIM_STRIDE = SIM_BLOCK * SIM_MAX_BLOCKS


def entries(vplan: dict) -> dict:
    n = int(vplan["verify_num_valid"][0])
    names = ("slot_indices", "expected_tokens", "expected_positions", "prev_slot_indices")
    return {name: vplan[f"verify_{name}"][:n].tolist() for name in names}


def _permuted_lut(n, seed=3):
    return padded_lut(np.random.default_rng(seed).permutation(n) + 1)


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
    "swa_window_head_prev_is_real_predecessor": case(
        [1], [200], [1], rtt=linear_rtt(width=256), window=128, lut=_permuted_lut(9 * 256)
    ),
    "padding_rows_contribute_zero": case([1, 0, 2], [5, 99, 3], [1, 1, 1]),
    "padding_row_with_garbage_prefix": case([1, 0, 2], [5, 99999, 3], [1, 7, 1]),
    "sparse_req_to_token": case([1, 2, 3], [12, 5, 9], [1, 2, 1], rtt=_sparse_rtt()),
    "swa_clip_prefix_less_than_window": case(
        [1], [3], [1], rtt=linear_rtt(width=256), window=128, lut=np.arange(9 * 256, dtype=np.int64)
    ),
    "swa_lut_identity_plus_100": case([1], [3], [1], window=128, lut=padded_lut(np.arange(1000) + 100)),
    "swa_covers_all_tokens_in_window": case(
        [1, 2, 3, 4], [50, 128, 200, 1024], [1, 1, 1, 1], rtt=WIDE, window=128, lut=np.arange(9 * 1024, dtype=np.int64)
    ),
    "zero_prefix_has_no_verify_entries": case([1], [0], [3]),
    "verify_capacity_just_fits": case([1, 2], [3, 4], [1, 1], vcap=7),
    "verify_capacity_undershoot_by_one": case([1, 2], [3, 4], [1, 1], vcap=6),
    "zero_extend_writes_empty_write_plan": case([1, 2], [4, 6], [0, 0]),
    "padding_rows_in_write_plan": case([1, 0, 2, 0], [1, 1, 1, 1], [1, 1, 0, 1], wcap=6),
    "lut_translates_slot_zero_passes_negatives_reports_misses": case(
        [1, 2],
        [4, 3],
        [1, 1],
        rtt=np.array([[0] * 4, [0, -1, 5, 9], [-7, 8, 0, 3]], dtype=np.int32),
        window=2,
        lut=np.array([77, 1, 2, 3, 4, 55, 6, 7], dtype=np.int64),
    ),  # the glue does not check lut[0]
    "empty_batch": case([], [], [], wcap=3),
    "all_padding": case([0, 0, 0], [4, 5, 6], [1, 1, 1]),
    "negative_lengths_count_as_zero": case([1, 2], [-3, 4], [2, -1]),
    "expected_tokens_offset_0": case([1, 2], [5, 3], [1, 1], pool=token_pool(), lens=np.array([5, 16])),
    "expected_tokens_offset_plus_1": case([1, 2], [5, 3], [1, 1], pool=token_pool(), lens=np.array([4, 16]), offset=1),
    "expected_tokens_beyond_bound": case(
        [1, 2, 3], [8, 8, 8], [1, 1, 1], pool=token_pool(rows=3, width=6), lens=np.array([3, 99, -1]), offset=-1
    ),
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
    small = dict(
        first,
        req_pool_indices=first["req_pool_indices"][:3],
        prefix_lens=first["prefix_lens"][:3],
        extend_seq_lens=first["extend_seq_lens"][:3],
    )
    if small["req_to_verify_expected_tokens_valid_lens"] is not None:
        small["req_to_verify_expected_tokens_valid_lens"] = small["req_to_verify_expected_tokens_valid_lens"][:3]
    _, w = run_both(small, plans=plans)
    assert (w["write_offsets"][4:] == 0).all() and (w["write_seed_slot_indices"][3:] == -1).all()
