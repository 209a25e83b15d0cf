"""Plan on the NumPy backend: the expected-token pool, the extension rules for undefined values, the offsets step."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FILL, OOR, entries, i64, linear_rtt, loop_plan, padded_lut, run_plan

from kvcanary_numba import launch_plan_offsets_kernel

# --- expected-token pool (TestExpectedTokenPool) ---


def _pool(rows=9, cols=32):
    return (np.arange(rows)[:, None] * 1000 + np.arange(cols)[None, :]).astype(np.int32)


def test_no_pool_means_every_token_unchecked():
    vplan, _ = run_plan([1, 2], [3, 2], [1, 1])
    assert entries(vplan)["tokens"] == [-1] * 5


@pytest.mark.parametrize(
    ("offset", "want"),
    [
        (0, [3000, 3001, 3002, 3003, -1, -1]),  # valid_lens 4 bounds the column
        (1, [3001, 3002, 3003, -1, -1, -1]),  # EAGLE draft: token of position p + 1
        (-1, [-1, 3000, 3001, 3002, 3003, -1]),
    ],
)
def test_expected_tokens_gather_with_offset(offset, want):
    vplan, _ = run_plan([3], [6], [1], pool=_pool(), lens=i64([4]), offset=offset)
    assert entries(vplan)["tokens"] == want


def test_expected_tokens_bounded_by_pool_shape():
    pool = _pool(rows=3, cols=4)  # rp 5 has no pool row; valid_lens exceeds the width
    vplan, _ = run_plan([2, 5], [6, 2], [1, 1], pool=pool, lens=i64([100, 100]))
    assert entries(vplan)["tokens"] == [2000, 2001, 2002, 2003, -1, -1, -1, -1]


def test_expected_tokens_negative_valid_lens():
    vplan, _ = run_plan([2], [3], [1], pool=_pool(), lens=i64([-5]))
    assert entries(vplan)["tokens"] == [-1, -1, -1]


# --- extension rules for values SGLang leaves undefined (docs/concepts/semantics.md) ---


def test_request_row_outside_table_is_out_of_range():
    rtt = linear_rtt(rows=4)
    vplan, wplan = run_plan([7, -2, 1], [2, 2, 1], [1, 1, 1], rtt)
    assert entries(vplan)["slots"] == [OOR, OOR, OOR, OOR, 16]
    assert entries(vplan)["prevs"] == [-1, OOR, -1, OOR, -1]
    assert wplan.write_seed_slot_indices.tolist() == [OOR, OOR, 16]
    assert wplan.write_offsets.tolist() == [0, 1, 2, 3]  # negative rows are still requests


def test_prefix_beyond_table_width_is_out_of_range():
    rtt = linear_rtt(rows=3, width=4)
    vplan, wplan = run_plan([2], [6], [1], rtt)
    got = entries(vplan)
    assert got["slots"] == [8, 9, 10, 11, OOR, OOR]
    assert got["prevs"] == [-1, 8, 9, 10, 11, OOR]
    assert got["positions"] == list(range(6))
    assert wplan.write_seed_slot_indices.tolist() == [OOR]


def test_lut_too_short_and_negative_values():
    rtt = np.array([[0, 0, 0, 0], [3, -1, 9, 2]], dtype=np.int32)
    lut = np.array([0, 50, 60, 70, 80], dtype=np.int64)  # covers slots 0..4 only
    vplan, wplan = run_plan([1], [4], [1], rtt, window=8, lut=lut)
    assert entries(vplan)["slots"] == [70, -1, OOR, 60]
    assert entries(vplan)["prevs"] == [-1, 70, -1, OOR]
    assert wplan.write_seed_slot_indices.tolist() == [60]


def test_negative_lengths_count_as_zero():
    vplan, wplan = run_plan([1, 2], [-3, 2], [4, -9])
    assert entries(vplan)["slots"] == [32, 33]
    assert wplan.write_offsets.tolist() == [0, 4, 4]
    assert wplan.write_seed_slot_indices.tolist() == [-1, -1]


# --- the offsets step alone ---


@pytest.mark.parametrize("seed", range(8))
def test_offsets_step_matches_full_plan(seed):
    rng = np.random.default_rng(100 + seed)
    bs = int(rng.integers(0, 20))
    rtt = linear_rtt(rows=6, width=12)
    rpi, prefix, ext = rng.integers(0, 6, size=bs), rng.integers(-1, 14, size=bs), rng.integers(-1, 4, size=bs)
    window, lut = (3, padded_lut(np.arange(80)[::-1])) if seed % 2 else (0, None)
    vcap, cap = int(rng.integers(1, 40)), bs + 2
    vplan, wplan = run_plan(rpi, prefix, ext, rtt, window=window, lut=lut, vcap=vcap, wcap=cap)
    scratch = np.full(bs + 5, FILL, dtype=np.int64)
    outs = dict(
        out_write_offsets=np.full(cap + 1, FILL),
        out_write_seed_slot_indices=np.full(cap, FILL),
        out_verify_num_valid=np.full(1, 9, np.int32),
        out_verify_enable=np.full(1, 9, np.int32),
        out_write_num_valid_reqs=np.full(1, 9, np.int32),
    )
    launch_plan_offsets_kernel(
        req_pool_indices=i64(rpi),
        prefix_lens=i64(prefix),
        extend_seq_lens=i64(ext),
        req_to_token=rtt,
        full_to_swa_index_mapping=lut,
        out_verify_offsets_scratch=scratch,
        swa_window_size=window,
        verify_capacity=vcap,
        backend="numpy",
        **outs,
    )
    np.testing.assert_array_equal(outs["out_write_offsets"], wplan.write_offsets)
    np.testing.assert_array_equal(outs["out_write_seed_slot_indices"], wplan.write_seed_slot_indices)
    for name, arr in [
        ("out_verify_num_valid", vplan.verify_num_valid),
        ("out_verify_enable", vplan.enable),
        ("out_write_num_valid_reqs", wplan.write_num_valid_reqs),
    ]:
        np.testing.assert_array_equal(outs[name], arr, err_msg=name)
    want = loop_plan(rpi, prefix, ext, rtt, window=window, lut=lut)
    # Each request's count is capped at verify_capacity + 1 (enough to overflow on its own).
    counts = [min(_verify_count(r, p, window), vcap + 1) for r, p in zip(rpi, prefix)]
    per_request = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    assert per_request[-1] == len(want["slots"]) or per_request[-1] > vcap
    np.testing.assert_array_equal(scratch[: bs + 1], per_request)
    assert (scratch[bs + 1 :] == FILL).all()  # only [0, bs] is scratch output


def _verify_count(rp, prefix, window):
    prefix = max(int(prefix), 0)
    return 0 if rp == 0 else prefix - (max(prefix - window, 0) if window else 0)
