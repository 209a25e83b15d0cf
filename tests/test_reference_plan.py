"""Plan semantics through the public wrappers on the NumPy backend: SGLang's plan hand tests.

Expectations come from hand-computed values (SGLang's plan hand tests, SGLang's tests) and from the independent per-entry Python loop of ``helpers.loop_plan``.
The expected-token pool, the extension rules and the offsets step are in
test_reference_plan_rules.py; random and property batches and SGLang's golden
vectors in test_reference_plan_oracles.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FILL, OOR, PLAN_WIDTH, assert_matches_loop, entries, linear_rtt, loop_plan, padded_lut, run_plan

WIDTH = PLAN_WIDTH  # columns of the "linear" req_to_token: entry [rp, pos] = rp * WIDTH + pos


# --- SGLang's plan hand tests (SGLang's plan hand tests) ---


def test_single_req_extend_basic():
    vplan, wplan = run_plan([3], [0], [5])
    assert int(vplan.verify_num_valid[0]) == 0 and int(vplan.enable[0]) == 1
    assert int(wplan.write_num_valid_reqs[0]) == 1
    assert wplan.write_offsets.tolist() == [0, 5]
    assert wplan.write_seed_slot_indices.tolist() == [-1]
    assert (vplan.verify_slot_indices == FILL).all()  # nothing to write, nothing written


def test_single_req_decode():
    vplan, wplan = run_plan([2], [7], [1])
    assert entries(vplan) == {
        "slots": [32, 33, 34, 35, 36, 37, 38],
        "tokens": [-1] * 7,
        "positions": list(range(7)),
        "prevs": [-1, 32, 33, 34, 35, 36, 37],
    }
    assert wplan.write_seed_slot_indices.tolist() == [2 * 16 + 6]


def test_multi_req_mixed_extend_decode():
    vplan, wplan = run_plan([1, 2, 3], [0, 4, 10], [8, 1, 1])
    assert wplan.write_offsets.tolist() == [0, 8, 9, 10]
    assert int(vplan.verify_num_valid[0]) == 14
    assert wplan.write_seed_slot_indices.tolist() == [-1, 2 * 16 + 3, 3 * 16 + 9]


def test_chain_heads_and_predecessors():
    vplan, wplan = run_plan([2, 5], [3, 0], [1, 4])
    assert wplan.write_seed_slot_indices.tolist() == [34, -1]  # prefix 0 -> no seed
    assert entries(vplan)["prevs"] == [-1, 32, 33]  # head -1, then the slot before


def _permuted_lut(rng, size):
    return padded_lut(rng.permutation(size))


def test_seed_translated_through_permuted_lut(rng):
    lut = _permuted_lut(rng, 9 * WIDTH + 1)
    _, wplan = run_plan([2], [5], [1], window=1024, lut=lut)
    assert wplan.write_seed_slot_indices.tolist() == [lut[2 * 16 + 4]]


def test_swa_window_head_prev_slot_is_real_predecessor(rng):
    rtt = linear_rtt(rows=3, width=256)
    lut = _permuted_lut(rng, 3 * 256 + 1)
    vplan, _ = run_plan([1], [200], [1], rtt, window=128, lut=lut)
    got = entries(vplan)
    assert got["positions"] == list(range(72, 200))
    assert got["prevs"][0] == lut[rtt[1, 71]] != -1
    assert got["slots"] == [int(lut[v]) for v in rtt[1, 72:200]]


def test_padding_rows_contribute_zero():
    vplan, wplan = run_plan([1, 0, 2], [5, 99, 3], [1, 1, 1])
    assert int(vplan.verify_num_valid[0]) == 8
    assert wplan.write_offsets.tolist() == [0, 1, 1, 2]
    assert wplan.write_seed_slot_indices[1] == -1


def test_slots_come_from_a_sparse_table(rng):
    rtt = np.zeros((9, WIDTH), dtype=np.int32)
    rtt[4, :6] = rng.choice(np.arange(1000, 2000), size=6, replace=False)
    vplan, wplan = run_plan([4], [6], [1], rtt)
    assert entries(vplan)["slots"] == rtt[4, :6].tolist()
    assert entries(vplan)["prevs"] == [-1, *rtt[4, :5].tolist()]
    assert wplan.write_seed_slot_indices.tolist() == [rtt[4, 5]]


def test_padding_row_with_garbage_prefix_does_not_read_the_table():
    vplan, wplan = run_plan([1, 0, 2], [5, 99999, 3], [1, 7, 1])
    assert int(vplan.verify_num_valid[0]) == 8
    assert OOR not in entries(vplan)["slots"]
    assert wplan.write_offsets.tolist() == [0, 1, 1, 2]


@pytest.mark.parametrize(("prefix", "count", "first"), [(3, 3, 0), (128, 128, 0), (129, 128, 1), (200, 128, 72)])
def test_swa_window_clips_the_prefix(prefix, count, first):
    rtt = linear_rtt(rows=2, width=256)
    vplan, _ = run_plan([1], [prefix], [1], rtt, window=128, lut=np.arange(512, dtype=np.int64))
    got = entries(vplan)
    assert got["positions"] == list(range(first, prefix)) and len(got["positions"]) == count


def test_swa_lut_translates_verify_slots_and_seed():
    lut = padded_lut(np.arange(9 * WIDTH + 1) + 100)
    vplan, wplan = run_plan([1], [3], [1], window=64, lut=lut)
    assert entries(vplan)["slots"] == [116, 117, 118]
    assert entries(vplan)["prevs"] == [-1, 116, 117]
    assert wplan.write_seed_slot_indices.tolist() == [118]


def test_verify_covers_all_tokens_in_swa_window():
    rtt = linear_rtt(rows=5, width=1024)
    vplan, _ = run_plan(
        [1, 2, 3, 4],
        [50, 128, 200, 1024],
        [1] * 4,
        rtt,
        window=128,
        vcap=1024,
        lut=np.arange(5 * 1024 + 1, dtype=np.int64),
    )
    assert int(vplan.verify_num_valid[0]) == 50 + 128 + 128 + 128


@pytest.mark.parametrize(("prefix", "want"), [([3], 3), ([0], 0), ([0, 0, 0], 0), ([3, 0, 8], 11)])
def test_num_valid_counts_prefix_entries(prefix, want):
    vplan, _ = run_plan(list(range(1, len(prefix) + 1)), prefix, [1] * len(prefix))
    assert int(vplan.verify_num_valid[0]) == want
    assert entries(vplan)["positions"] == [p for n in prefix for p in range(n)]  # no skip, strictly +1


@pytest.mark.parametrize(("slack", "enable"), [(0, 1), (1, 1), (-1, 0)])
def test_verify_capacity_fits_or_overflows(slack, enable):
    total = 4 + 7
    vplan, wplan = run_plan([1, 2], [4, 7], [2, 3], vcap=total + slack)
    assert int(vplan.enable[0]) == enable
    assert int(vplan.verify_num_valid[0]) == min(total, total + slack)
    if enable:
        assert entries(vplan)["slots"] == [16, 17, 18, 19, *range(32, 39)]
    else:  # overflow: entries untouched, write plan still complete
        for arr in (
            vplan.verify_slot_indices,
            vplan.verify_expected_tokens,
            vplan.verify_expected_positions,
            vplan.verify_prev_slot_indices,
        ):
            assert (arr == FILL).all()
    assert wplan.write_offsets.tolist() == [0, 2, 5]
    assert wplan.write_seed_slot_indices.tolist() == [19, 38]


def test_huge_prefix_lengths_overflow_instead_of_wrapping():
    # Three prefixes near 2**62 sum past 2**63: the plan must report an overflow, not a wrapped total.
    huge = 2**62
    vplan, _ = run_plan([1, 2, 3], [huge, huge, huge], [1, 1, 1], vcap=64)
    assert int(vplan.enable[0]) == 0
    assert int(vplan.verify_num_valid[0]) == 64
    assert (vplan.verify_slot_indices == FILL).all()


def test_zero_extend_writes_empty_write_plan():
    vplan, wplan = run_plan([1, 2], [4, 6], [0, 0], wcap=4)
    assert wplan.write_offsets.tolist() == [0] * 5
    assert wplan.write_seed_slot_indices.tolist() == [-1] * 4
    assert int(vplan.verify_num_valid[0]) == 10


def test_replay_same_inputs_yields_same_outputs():
    args = ([1, 0, 3], [5, 2, 7], [1, 1, 2])
    first = [a.copy() for p in run_plan(*args) for a in p.arrays().values()]
    second = [a.copy() for p in run_plan(*args) for a in p.arrays().values()]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_shrinking_batch_leaves_no_stale_tail():
    vplan, wplan = run_plan(list(range(1, 9)), [3] * 8, [2] * 8, vcap=64)
    written = vplan.verify_slot_indices.copy()
    run_plan([5, 6, 7], [1, 1, 1], [1, 1, 1], vplan=vplan, wplan=wplan)
    assert wplan.write_offsets.tolist() == [0, 1, 2, 3] + [0] * 5
    assert wplan.write_seed_slot_indices.tolist() == [80, 96, 112] + [-1] * 5
    assert int(wplan.write_num_valid_reqs[0]) == 3
    # Entries past num_valid are never read by verify and are left as they were.
    np.testing.assert_array_equal(vplan.verify_slot_indices[3:], written[3:])


def test_write_num_valid_reqs_counts_padding_rows():
    _, wplan = run_plan([1, 2, 0, 0], [0, 0, 5, 0], [1, 1, 1, 1])
    assert wplan.write_offsets.tolist() == [0, 1, 2, 2, 2]
    assert int(wplan.write_num_valid_reqs[0]) == 4


def test_hardcoded_plan():
    vplan, wplan = run_plan([1, 2, 3], [0, 4, 7], [3, 1, 1])
    assert wplan.write_offsets.tolist() == [0, 3, 4, 5]
    assert wplan.write_seed_slot_indices.tolist() == [-1, 2 * 16 + 3, 3 * 16 + 6]
    assert entries(vplan)["slots"] == [32, 33, 34, 35, 48, 49, 50, 51, 52, 53, 54]


@pytest.mark.parametrize("prefix", [0, 1, 127, 128, 129, 4096])
@pytest.mark.parametrize("bs", [1, 31, 32, 33, 128])
def test_boundary_sweep_matches_loop(bs, prefix, rng):
    rtt = rng.integers(1, 2**31 - 1, size=(bs + 1, prefix + 4096), dtype=np.int32)
    rpi = rng.permutation(np.arange(1, bs + 1))
    vcap = max(bs * prefix, 1)
    want = None
    for extend in (1, 128, 4096):
        ext = np.full(bs, extend)
        vplan, wplan = run_plan(rpi, np.full(bs, prefix), ext, rtt, vcap=vcap)
        if want is None:
            want = loop_plan(rpi, np.full(bs, prefix), ext, rtt)
        want["offsets"] = [extend * r for r in range(bs + 1)]
        assert_matches_loop(vplan, wplan, want)
    # FULL group over a table without negative slots: position 0 <=> chain head.
    got = entries(vplan)
    assert [p == 0 for p in got["positions"]] == [q == -1 for q in got["prevs"]]
