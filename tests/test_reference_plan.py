"""Plan semantics through the public wrappers on the NumPy backend.

Expectations come from hand-computed values (SGLang's plan hand tests, reference
notes §10.5), from an independent per-entry Python loop written below, and
from SGLang's golden vectors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import PLAN_WIDTH, i64, linear_rtt
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcanary_numba import OUT_OF_RANGE_SLOT, VerifyPlan, WritePlan
from kvcanary_numba.plan import launch_canary_plan_kernels, launch_plan_offsets_kernel

OOR = OUT_OF_RANGE_SLOT
WIDTH = PLAN_WIDTH  # columns of the "linear" req_to_token: entry [rp, pos] = rp * WIDTH + pos
FILL = -7777


def run_plan(rpi, prefix, ext, rtt=None, *, window=0, lut=None, vcap=256, wcap=None, pool=None, lens=None,
             offset=0, vplan=None, wplan=None):
    """Plan through the public wrapper; fresh plans are pre-filled with FILL to expose unwritten entries."""
    rpi, prefix, ext = i64(rpi), i64(prefix), i64(ext)
    if vplan is None:
        vplan = VerifyPlan.allocate(verify_capacity=vcap)
        for arr in vplan.arrays().values():
            arr[...] = FILL
    if wplan is None:
        wplan = WritePlan.allocate(write_req_capacity=wcap or max(len(rpi), 1))
        for arr in wplan.arrays().values():
            arr[...] = FILL
    launch_canary_plan_kernels(
        verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=rpi, prefix_lens=prefix,
        extend_seq_lens=ext, req_to_token=linear_rtt() if rtt is None else rtt, swa_window_size=window,
        full_to_swa_index_mapping=lut, verify_capacity=vplan.verify_capacity,
        req_to_verify_expected_tokens=pool, req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=offset, backend="numpy",
    )
    return vplan, wplan


def entries(vplan):
    n = int(vplan.verify_num_valid[0])
    return {
        "slots": vplan.verify_slot_indices[:n].tolist(),
        "tokens": vplan.verify_expected_tokens[:n].tolist(),
        "positions": vplan.verify_expected_positions[:n].tolist(),
        "prevs": vplan.verify_prev_slot_indices[:n].tolist(),
    }


# --- an independent, entry-by-entry implementation of the documented semantics ---


def loop_plan(rpi, prefix, ext, rtt, *, window=0, lut=None, pool=None, lens=None, offset=0):
    rows, cols = rtt.shape
    table, lut_list = rtt.tolist(), None if lut is None else lut.tolist()

    def slot(rp, p):
        if not (0 <= rp < rows and 0 <= p < cols):
            return OOR
        v = table[rp][p]
        if lut_list is None or v < 0:
            return v
        return lut_list[v] if v < len(lut_list) else OOR

    out = {"slots": [], "tokens": [], "positions": [], "prevs": [], "offsets": [0], "seeds": []}
    for r, rp in enumerate(int(x) for x in rpi):
        pre, e = max(int(prefix[r]), 0), max(int(ext[r]), 0)
        if rp == 0:
            out["offsets"].append(out["offsets"][-1])
            out["seeds"].append(-1)
            continue
        for p in range(max(pre - window, 0) if window > 0 else 0, pre):
            out["slots"].append(slot(rp, p))
            out["positions"].append(p)
            out["prevs"].append(slot(rp, p - 1) if p > 0 else -1)
            token, c = -1, p + offset
            if pool is not None and 0 <= rp < pool.shape[0] and 0 <= c < min(int(lens[r]), pool.shape[1]):
                token = int(pool[rp, c])
            out["tokens"].append(token)
        out["offsets"].append(out["offsets"][-1] + e)
        out["seeds"].append(slot(rp, pre - 1) if e > 0 and pre > 0 else -1)
    return out


def assert_matches_loop(vplan, wplan, want):
    bs = len(want["seeds"])
    total = len(want["slots"])
    if total <= vplan.verify_capacity:
        assert (int(vplan.verify_num_valid[0]), int(vplan.enable[0])) == (total, 1)
        got = entries(vplan)
        for key in ("slots", "tokens", "positions", "prevs"):
            assert got[key] == want[key], key
    else:
        assert (int(vplan.verify_num_valid[0]), int(vplan.enable[0])) == (vplan.verify_capacity, 0)
    assert wplan.write_offsets[: bs + 1].tolist() == want["offsets"]
    assert not wplan.write_offsets[bs + 1 :].any()
    assert wplan.write_seed_slot_indices[:bs].tolist() == want["seeds"]
    assert (wplan.write_seed_slot_indices[bs:] == -1).all()
    assert int(wplan.write_num_valid_reqs[0]) == bs


# --- SGLang's plan hand tests (reference notes §10.5) ---


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
    return rng.permutation(size).astype(np.int64)


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
    lut = np.arange(9 * WIDTH + 1, dtype=np.int64) + 100
    vplan, wplan = run_plan([1], [3], [1], window=64, lut=lut)
    assert entries(vplan)["slots"] == [116, 117, 118]
    assert entries(vplan)["prevs"] == [-1, 116, 117]
    assert wplan.write_seed_slot_indices.tolist() == [118]


def test_verify_covers_all_tokens_in_swa_window():
    rtt = linear_rtt(rows=5, width=1024)
    vplan, _ = run_plan([1, 2, 3, 4], [50, 128, 200, 1024], [1] * 4, rtt, window=128, vcap=1024,
                        lut=np.arange(5 * 1024 + 1, dtype=np.int64))
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
        for arr in (vplan.verify_slot_indices, vplan.verify_expected_tokens,
                    vplan.verify_expected_positions, vplan.verify_prev_slot_indices):
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


# --- expected-token pool (TestExpectedTokenPool) ---


def _pool(rows=9, cols=32):
    return (np.arange(rows)[:, None] * 1000 + np.arange(cols)[None, :]).astype(np.int32)


def test_no_pool_means_every_token_unchecked():
    vplan, _ = run_plan([1, 2], [3, 2], [1, 1])
    assert entries(vplan)["tokens"] == [-1] * 5


@pytest.mark.parametrize(("offset", "want"), [
    (0, [3000, 3001, 3002, 3003, -1, -1]),  # valid_lens 4 bounds the column
    (1, [3001, 3002, 3003, -1, -1, -1]),  # EAGLE draft: token of position p + 1
    (-1, [-1, 3000, 3001, 3002, 3003, -1]),
])
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


@pytest.mark.parametrize("bs", [4097, 65536])
def test_large_batches_have_no_cap(bs, rng):
    rtt = rng.integers(1, 10**6, size=(bs + 1, 8), dtype=np.int32)
    rpi = rng.permutation(np.arange(bs + 1))[:bs]  # includes the padding row once (or not)
    prefix, ext = rng.integers(-1, 6, size=bs), rng.integers(-1, 3, size=bs)
    vplan, wplan = run_plan(rpi, prefix, ext, rtt, vcap=8 * bs)
    assert_matches_loop(vplan, wplan, loop_plan(rpi, prefix, ext, rtt))


@pytest.mark.parametrize("seed", range(40))
def test_random_plans_match_loop(seed):
    rng = np.random.default_rng(seed)
    bs, rows, cols = int(rng.integers(0, 12)), int(rng.integers(1, 8)), int(rng.integers(1, 24))
    rtt = rng.integers(-3, 60, size=(rows, cols), dtype=np.int32)
    rpi = rng.integers(-1, rows + 2, size=bs)
    prefix, ext = rng.integers(-2, cols + 4, size=bs), rng.integers(-2, 5, size=bs)
    window = int(rng.choice([0, 0, 1, 3, 50]))
    lut = rng.integers(-2, 90, size=int(rng.integers(1, 70)), dtype=np.int64) if window else None
    pool, lens, offset = None, None, 0
    if rng.random() < 0.6:
        pool = rng.integers(-5, 10**6, size=(int(rng.integers(1, rows + 2)), int(rng.integers(1, 30))), dtype=np.int32)
        lens, offset = rng.integers(-2, 35, size=bs), int(rng.integers(-2, 3))
    vcap, wcap = int(rng.integers(1, 60)), bs + int(rng.integers(1, 4))
    vplan, wplan = run_plan(rpi, prefix, ext, rtt, window=window, lut=lut, vcap=vcap, wcap=wcap,
                            pool=pool, lens=lens, offset=offset)
    want = loop_plan(rpi, prefix, ext, rtt, window=window, lut=lut, pool=pool, lens=lens, offset=offset)
    assert_matches_loop(vplan, wplan, want)
    # Plan invariants (SGLang's _invariants.py).
    offsets = wplan.write_offsets[: bs + 1]
    assert (np.diff(offsets) >= 0).all()
    assert offsets[-1] == sum(max(int(e), 0) for r, e in zip(rpi, ext) if r != 0)
    assert all(s == -1 for r, s in zip(rpi, wplan.write_seed_slot_indices) if r == 0)
    if int(vplan.enable[0]):
        got = entries(vplan)
        assert all(q == -1 for p, q in zip(got["positions"], got["prevs"]) if p == 0)


@st.composite
def batches(draw):
    """A batch with padding rows, rows and positions outside the table, an optional LUT and pool."""
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    bs = draw(st.integers(0, 8))
    ints = lambda lo, hi, n: np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), np.int64)  # noqa: E731
    rtt = ints(-2, 40, rows * cols).astype(np.int32).reshape(rows, cols)
    batch = dict(rpi=ints(-1, rows + 1, bs), prefix=ints(-2, cols + 3, bs), ext=ints(-1, 4, bs), rtt=rtt)
    window = draw(st.sampled_from([0, 1, 4]))
    lut = ints(-2, 60, draw(st.integers(1, 50))) if window else None
    pool = lens = None
    if draw(st.booleans()):
        pool = ints(-1, 99, (rows + 1) * 6).astype(np.int32).reshape(rows + 1, 6)
        lens = ints(-1, 8, bs)
    extra = dict(window=window, lut=lut, pool=pool, lens=lens, offset=draw(st.integers(-1, 1)))
    return batch, extra, draw(st.integers(1, 40))


@settings(max_examples=60, deadline=None)
@given(batches())
def test_plan_property_matches_loop(case):
    batch, extra, vcap = case
    vplan, wplan = run_plan(batch["rpi"], batch["prefix"], batch["ext"], batch["rtt"], vcap=vcap,
                            wcap=len(batch["rpi"]) + 1, **extra)
    assert_matches_loop(vplan, wplan, loop_plan(batch["rpi"], batch["prefix"], batch["ext"], batch["rtt"], **extra))
    if not int(vplan.enable[0]):  # overflow leaves every entry as it was
        assert (vplan.verify_slot_indices == FILL).all() and (vplan.verify_prev_slot_indices == FILL).all()


# --- golden vectors: SGLang's own plan outputs, bit for bit ---


def test_plan_matches_golden_vectors(vectors_dir):
    paths = sorted(vectors_dir.glob("scenario_*.npz"))
    assert paths
    for path in paths:
        data = np.load(path)
        meta = json.loads(str(data["meta"]))
        for step in range(int(data["steps"])):
            p = f"s{step}_"
            check = bool(meta["check_tok"])
            vplan, wplan = run_plan(
                data[p + "rpi"], data[p + "prefix"], data[p + "ext"], data[p + "req_to_token"],
                window=int(meta["W"]), lut=data["lut"] if meta["swa"] else None, vcap=meta["verify_cap"],
                wcap=meta["write_cap"], pool=data[p + "pool"] if check else None,
                lens=data[p + "valid_lens"] if check else None, offset=int(meta["offset"]),
            )
            label = f"{path.name} step {step}"
            n, bs = int(data[p + "verify_num_valid"]), data[p + "rpi"].shape[0]
            assert int(vplan.verify_num_valid[0]) == n, label
            assert int(vplan.enable[0]) == int(data[p + "enable"]), label
            for ours, theirs in [(vplan.verify_slot_indices, "v_slots"), (vplan.verify_expected_tokens, "v_tokens"),
                                 (vplan.verify_expected_positions, "v_positions"),
                                 (vplan.verify_prev_slot_indices, "v_prev")]:
                np.testing.assert_array_equal(ours[:n], data[p + theirs], err_msg=f"{label}: {theirs}")
            np.testing.assert_array_equal(wplan.write_offsets[: bs + 1], data[p + "w_offsets"], err_msg=label)
            np.testing.assert_array_equal(wplan.write_seed_slot_indices[:bs], data[p + "w_seeds"], err_msg=label)
            assert int(wplan.write_num_valid_reqs[0]) == int(data[p + "w_num_valid"]), label


# --- the offsets step alone ---


@pytest.mark.parametrize("seed", range(8))
def test_offsets_step_matches_full_plan(seed):
    rng = np.random.default_rng(100 + seed)
    bs = int(rng.integers(0, 20))
    rtt = linear_rtt(rows=6, width=12)
    rpi, prefix, ext = rng.integers(0, 6, size=bs), rng.integers(-1, 14, size=bs), rng.integers(-1, 4, size=bs)
    window, lut = (3, np.arange(80, dtype=np.int64)[::-1].copy()) if seed % 2 else (0, None)
    vcap, cap = int(rng.integers(1, 40)), bs + 2
    vplan, wplan = run_plan(rpi, prefix, ext, rtt, window=window, lut=lut, vcap=vcap, wcap=cap)
    scratch = np.full(bs + 5, FILL, dtype=np.int64)
    outs = dict(out_write_offsets=np.full(cap + 1, FILL), out_write_seed_slot_indices=np.full(cap, FILL),
                out_verify_num_valid=np.full(1, 9, np.int32), out_verify_enable=np.full(1, 9, np.int32),
                out_write_num_valid_reqs=np.full(1, 9, np.int32))
    launch_plan_offsets_kernel(req_pool_indices=i64(rpi), prefix_lens=i64(prefix), extend_seq_lens=i64(ext),
                               req_to_token=rtt, full_to_swa_index_mapping=lut, out_verify_offsets_scratch=scratch,
                               swa_window_size=window, verify_capacity=vcap, backend="numpy", **outs)
    np.testing.assert_array_equal(outs["out_write_offsets"], wplan.write_offsets)
    np.testing.assert_array_equal(outs["out_write_seed_slot_indices"], wplan.write_seed_slot_indices)
    for name, arr in [("out_verify_num_valid", vplan.verify_num_valid), ("out_verify_enable", vplan.enable),
                      ("out_write_num_valid_reqs", wplan.write_num_valid_reqs)]:
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
