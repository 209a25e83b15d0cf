"""plan -> verify -> write on the CPU (SGLang's pipeline tests), with planted faults."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import counters, fields, record, write_index
from canary_pipeline import Pipeline, plant_fault

from kvcanary_numba import CanaryLaunchTag, RealKvHashMode

CHAIN, POSITION, REAL_KV, WTOKEN, TOKEN = 1, 2, 4, 8, 32
NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def fill(pipe: Pipeline, rp: int, slots, tokens=None) -> None:
    n = len(slots)
    pipe.req_to_token[rp, :n] = slots
    pipe.tokens[rp, :n] = np.arange(n) + 100 * rp if tokens is None else tokens


def decode(pipe: Pipeline, rpi, start: int, steps: int, **kwargs) -> list:
    """Decode steps from prefix ``start``; returns every row they record."""
    rows = []
    for k in range(steps):
        verify_rows, write_rows = pipe.step(rpi, [start + k] * len(rpi), [1] * len(rpi), **kwargs)
        rows += verify_rows + write_rows
    return rows


def test_basic_single_request():
    pipe = Pipeline()
    fill(pipe, 1, range(1, 9))
    assert pipe.step([1], [0], [5]) == ([], [])
    assert decode(pipe, [1], 5, 3) == []
    assert counters(pipe.ctx) == ((0 + 5) + (5 + 1) + (6 + 1) + (7 + 1), 8)
    assert [record(pipe.ctx, s)[1] for s in range(1, 9)] == list(range(8))


def test_mixed_extend_and_decode_with_padding_row():
    pipe = Pipeline()
    fill(pipe, 1, [3, 9, 4, 20, 21, 22, 5, 6, 7, 8, 10, 11])
    fill(pipe, 2, [30, 31, 32, 33, 34])
    assert pipe.step([1, 0, 2], [0, 0, 0], [8, 99, 1]) == ([], [])
    assert pipe.step([1, 0, 2], [8, 7, 1], [1, 5, 4]) == ([], [])
    assert int(pipe.vplan.verify_num_valid[0]) == 8 + 1
    assert pipe.wplan.write_offsets[:4].tolist() == [0, 1, 1, 5]
    assert pipe.step([2, 1], [5, 9], [1, 1]) == ([], [])


def test_swa_window_verifies_the_window_only():
    pipe = Pipeline(window=4)
    fill(pipe, 1, range(11, 19))
    assert pipe.step([1], [0], [6]) == ([], [])
    assert pipe.step([1], [6], [1]) == ([], [])
    plan = pipe.vplan
    assert int(plan.verify_num_valid[0]) == 4
    assert plan.verify_expected_positions[:4].tolist() == [2, 3, 4, 5]
    assert plan.verify_prev_slot_indices[0] == 12  # the window head keeps its real predecessor


def test_sweep_without_writes():
    pipe = Pipeline()
    fill(pipe, 1, range(1, 7))
    pipe.step([1], [0], [6])
    snapshot, (slot_count, _) = pipe.ctx.canary_buf.copy(), counters(pipe.ctx)
    assert pipe.step([1], [6], [0]) == ([], [])
    np.testing.assert_array_equal(pipe.ctx.canary_buf, snapshot)
    assert int(pipe.vplan.verify_num_valid[0]) == 6 and int(pipe.wplan.write_offsets[1]) == 0
    assert counters(pipe.ctx)[0] == slot_count + 6


@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_real_kv_modes(mode):
    pipe = Pipeline(mode=mode, kv_bytes=48)
    fill(pipe, 1, range(1, 9))
    pipe.step([1], [0], [4])
    assert decode(pipe, [1], 4, 2) == []
    pipe.kv[2, 5] ^= 0x40  # inside the 16 PARTIAL bytes
    pipe.kv[3, 40] ^= 0x40  # only ALL mode reads byte 40
    verify_rows, _ = pipe.step([1], [6], [1])
    want = {NONE: [], PARTIAL: [(2, REAL_KV)], ALL: [(2, REAL_KV), (3, REAL_KV)]}[mode]
    assert [(r[1], r[7]) for r in verify_rows] == want


def test_write_input_assert_match_and_mismatch():
    pipe = Pipeline()
    fill(pipe, 1, range(1, 9))
    ids, pos, _ = pipe.batch_inputs([1], [0], [5])
    assert pipe.step([1], [0], [5], expected=(ids, pos)) == ([], [])
    ids, pos, _ = pipe.batch_inputs([1], [5], [3])
    wrong = ids.copy()
    wrong[:] += 1
    _, write_rows = pipe.step([1], [5], [3], expected=(wrong, pos))
    assert [(r[1], r[3], r[4], r[7]) for r in write_rows] == [(6 + k, ids[k], wrong[k], WTOKEN) for k in range(3)]
    assert pipe.step([1], [8], [0]) == ([], [])  # the chain advanced on the actual tokens


def test_padding_only_batch():
    pipe = Pipeline()
    assert pipe.step([0, 0], [3, 7], [1, 1]) == ([], [])
    assert counters(pipe.ctx) == (0, 2) and write_index(pipe.ctx) == 0


def test_negative_out_cache_loc_entries_are_skipped():
    pipe = Pipeline(window=2)
    fill(pipe, 1, range(1, 9))
    pipe.step([1], [0], [4], loc_map=lambda loc: np.where(loc == 2, -1, loc))
    assert not fields(pipe.ctx)[2].any() and record(pipe.ctx, 3)[1] == 2
    assert counters(pipe.ctx) == (3, 2)


def test_ring_overflow_through_a_real_plan():
    pipe = Pipeline(ring_capacity=4)
    fill(pipe, 1, range(1, 10))
    pipe.step([1], [0], [9])
    fields(pipe.ctx)[1:9, 2] ^= 1
    verify_rows, _ = pipe.step([1], [8], [0])
    assert write_index(pipe.ctx) == 8 and [r[1] for r in verify_rows] == [1, 2, 3, 4]


@pytest.mark.parametrize("kind", [CanaryLaunchTag.HEAD_K_FULL, CanaryLaunchTag.SWEEP_V_SWA])
def test_kernel_kind_propagates(kind):
    pipe = Pipeline(kind=kind)
    fill(pipe, 1, range(1, 6))
    pipe.step([1], [0], [5])
    fields(pipe.ctx)[5, 1] = 99  # the last prefix slot: no successor in the plan
    verify_rows, _ = pipe.step([1], [5], [0])
    assert [(r[0], r[1], r[7]) for r in verify_rows] == [(int(kind), 5, POSITION)]


def test_token_mismatch_detected_through_the_pool():
    pipe = Pipeline()
    fill(pipe, 1, range(1, 6))
    pipe.step([1], [0], [4])
    pool = pipe.tokens - 1
    verify_rows, _ = pipe.step([1], [4], [1], check_tokens=True, pool=pool)
    assert [(r[1], r[3] - r[4], r[7]) for r in verify_rows] == [(s, 1, TOKEN) for s in (1, 2, 3, 4)]


def test_eagle_offset_plus_one():
    pipe = Pipeline()
    fill(pipe, 1, range(1, 8), tokens=np.arange(7) + 501)  # the draft slot at p holds the token at p + 1
    pipe.step([1], [0], [5])
    pool = np.zeros_like(pipe.tokens)
    pool[1, 1:8] = pipe.tokens[1, :7]
    assert pipe.step([1], [5], [1], check_tokens=True, offset=1, pool=pool) == ([], [])
    verify_rows, _ = pipe.step([1], [6], [0], check_tokens=True, offset=0, pool=pool)
    assert {r[7] for r in verify_rows} == {TOKEN}


# --- planted faults ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["token", "position", "prev_hash", "real_kv", "req_to_token_swap"])
@pytest.mark.parametrize("position", [0, 2, 4])
def test_planted_fault_is_reported(fault, position):
    pipe = Pipeline(mode=PARTIAL)
    fill(pipe, 1, [5, 9, 2, 7, 11, 3, 4, 13, 14])
    fill(pipe, 2, [20, 21, 22])
    assert pipe.step([1, 2], [0, 0], [7, 3]) == ([], [])
    slot, bit = plant_fault(pipe, fault, 1, position)
    verify_rows, _ = pipe.step([2, 1], [3, 7], [0, 1])
    assert any(r[1] == slot and r[7] & bit for r in verify_rows), verify_rows
    assert all(r[1] in pipe.req_to_token[1, :7] for r in verify_rows)  # request 2 stays clean
