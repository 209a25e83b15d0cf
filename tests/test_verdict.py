"""The verdict word: the NumPy specification against hand-computed words, the kernel against the
specification byte for byte (simulator, or a GPU), the host merge, decoding and their errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kvcanary_numba import FailReason, KvCanaryError
from kvcanary_numba.constants import (
    ROW_FAIL_REASON,
    VERDICT_FAIL_BITS,
    VERDICT_FORMAT,
    VERDICT_LANES,
    VERDICT_MAGIC,
    VERDICT_NEW_ROWS,
    VERDICT_PLAN_OVERFLOW,
    VERDICT_RANK,
    VERDICT_RING_FULL,
    VERDICT_SEQ,
    VERDICT_STALLED,
)
from kvcanary_numba.monitor import Verdict, merge_verdicts
from kvcanary_numba.monitor.verdict import decode_verdict
from kvcanary_numba.reference import verdict as reference

KERNEL_DEVICE = "cpu" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "cuda"
FIRST_PLAN_LANE, STRIDE = 50, 4  # a status block as the monitor lays it out (monitor/status.py)


def _world(*, capacity=8, index=0, seen=0, seq=0, fail_reasons=(), enables=(1,), stalled=0):
    """Status lanes, ring, state and stalled flag of one monitor as int arrays."""
    lanes = np.zeros(2 * (25 + 2 * len(enables)), dtype=np.int32)
    lanes[0] = index
    for g, enable in enumerate(enables):
        lanes[FIRST_PLAN_LANE + STRIDE * g] = enable
    ring = np.zeros((capacity, 8), dtype=np.int64)
    ring[:, 1] = np.arange(capacity)  # other fields: anything but fail bits
    ring[: len(fail_reasons), ROW_FAIL_REASON] = fail_reasons
    state = np.array([seen, seq], dtype=np.int64)
    return dict(status_lanes=lanes, ring=ring, state=state, stalled=np.array([stalled], dtype=np.int32))


def _spec(world, *, rank=0, groups=None) -> np.ndarray:
    word = np.full(VERDICT_LANES, -7, dtype=np.int32)  # every lane must be written
    n = groups if groups is not None else (world["status_lanes"].shape[0] // 2 - 25) // 2
    reference.write_verdict(
        **world,
        word=word,
        first_plan_lane=FIRST_PLAN_LANE,
        plan_lane_stride=STRIDE,
        num_groups=n,
        rank=rank,
    )
    return word


def _expected(**lanes) -> np.ndarray:
    word = np.zeros(VERDICT_LANES, dtype=np.int32)
    word[VERDICT_FORMAT] = VERDICT_MAGIC
    for name, value in lanes.items():
        word[name if isinstance(name, int) else int(name.removeprefix("lane"))] = value
    return word


def test_a_clean_step_is_the_magic_and_its_sequence_number():
    world = _world(index=0, seen=0, seq=4)
    word = _spec(world)
    want = np.zeros(VERDICT_LANES, dtype=np.int32)
    want[VERDICT_FORMAT], want[VERDICT_SEQ] = VERDICT_MAGIC, 5
    assert word.tolist() == want.tolist()
    assert world["state"].tolist() == [0, 5]


def test_new_rows_name_the_rank_and_or_only_their_own_fail_bits():
    # Rows 0..1 were seen by the previous verdict; rows 2..4 are new.
    reasons = [int(FailReason.WRITE_TOKEN_MISMATCH), 64, 1, 4 | 32, 1]
    world = _world(index=5, seen=2, seq=1, fail_reasons=reasons)
    word = _spec(world, rank=3)
    want = np.zeros(VERDICT_LANES, dtype=np.int32)
    want[VERDICT_FORMAT], want[VERDICT_SEQ], want[VERDICT_NEW_ROWS], want[VERDICT_RANK] = VERDICT_MAGIC, 2, 3, 4
    for bit in (0, 2, 5):  # 1 | 4 | 32: not 8 or 64 (rows the previous verdict saw)
        want[VERDICT_FAIL_BITS + bit] = 1
    assert word.tolist() == want.tolist()
    assert world["state"].tolist() == [5, 2]


def test_rows_past_the_ring_count_but_add_no_bits_and_the_ring_is_full():
    world = _world(capacity=4, index=9, seen=3, fail_reasons=[1, 1, 1, 16])
    word = _spec(world)
    assert word[VERDICT_NEW_ROWS] == 6 and word[VERDICT_RING_FULL] == 1
    assert [int(b) for b in word[VERDICT_FAIL_BITS:]] == [0, 0, 0, 0, 1, 0, 0, 0, 0]  # row 3 only: 16
    assert world["state"][0] == 9


def test_a_disabled_plan_of_any_group_is_an_overflow_and_the_stall_flag_is_copied():
    assert _spec(_world(enables=(1, 0)))[VERDICT_PLAN_OVERFLOW] == 1
    assert _spec(_world(enables=(0, 1)))[VERDICT_PLAN_OVERFLOW] == 1
    assert _spec(_world(enables=(1, 1)))[VERDICT_PLAN_OVERFLOW] == 0
    assert _spec(_world(stalled=5))[VERDICT_STALLED] == 1
    assert _spec(_world(stalled=0))[VERDICT_STALLED] == 0


def test_counts_saturate_at_int32_max():
    world = _world(index=2**31 - 1, seen=-5, seq=2**40)  # a write index never goes below what was seen
    word = _spec(world)
    assert word[VERDICT_NEW_ROWS] == 2**31 - 1 and word[VERDICT_SEQ] == 2**31 - 1
    assert (word >= 0).all()


def _cases(rng, n):
    for i in range(n):
        capacity = int(rng.integers(1, 40))
        seen = int(rng.integers(0, capacity + 5))
        index = seen + int(rng.integers(0, 50)) if i % 5 else seen
        reasons = rng.integers(0, 512, size=capacity)
        enables = tuple(int(e) for e in rng.integers(0, 2, size=int(rng.integers(1, 3))))
        world = _world(
            capacity=capacity,
            index=index,
            seen=seen,
            seq=int(rng.integers(0, 1000)),
            fail_reasons=reasons,
            enables=enables,
            stalled=int(rng.integers(0, 2)),
        )
        yield world, int(rng.integers(0, 8))


@pytest.mark.simulator
def test_kernel_equals_the_specification_byte_for_byte():
    from kvcanary_numba.launch import verdict as glue

    xp = np if KERNEL_DEVICE == "cpu" else pytest.importorskip("cupy")
    rng = np.random.default_rng(38)
    for world, rank in _cases(rng, 24):
        groups = (world["status_lanes"].shape[0] // 2 - 25) // 2
        spec_world = {k: v.copy() for k, v in world.items()}
        want = _spec(spec_world, rank=rank)
        device = {k: xp.asarray(v) for k, v in world.items()}
        word = xp.full(VERDICT_LANES, -7, dtype=np.int32)
        glue.write_verdict(
            **device,
            word=word,
            first_plan_lane=FIRST_PLAN_LANE,
            plan_lane_stride=STRIDE,
            num_groups=groups,
            rank=rank,
        )
        got = np.asarray(word if xp is np else word.get())
        assert got.tobytes() == want.tobytes(), (world, rank)
        state = np.asarray(device["state"] if xp is np else device["state"].get())
        assert state.tobytes() == spec_world["state"].tobytes()
        for name in ("status_lanes", "ring", "stalled"):  # inputs stay as they were
            after = device[name] if xp is np else device[name].get()
            assert np.array_equal(after, world[name])


def test_merge_is_the_elementwise_max_and_decodes_as_any_rank():
    a = _spec(_world(index=0, seen=0, seq=6))
    b = _spec(_world(index=2, seen=0, seq=6, fail_reasons=[1, 4]), rank=1)
    c = _spec(_world(index=1, seen=0, seq=6, fail_reasons=[32], enables=(0,)), rank=2)
    merged = merge_verdicts([a, b, c])
    assert merged.dtype == np.int32 and merged.tolist() == np.maximum(np.maximum(a, b), c).tolist()
    verdict = decode_verdict("test", merged)
    assert verdict == Verdict(
        seq=7,
        new_rows=2,
        rank=2,
        ring_full=False,
        plan_overflow=True,
        stalled=False,
        fail_bits=FailReason(1 | 4 | 32),
    )
    assert verdict.stop
    assert "2 new violation row(s)" in verdict.summary() and "highest rank with rows: 2" in verdict.summary()
    clean = decode_verdict("test", merge_verdicts((a, a)))
    assert not clean.stop and clean.rank is None and clean.summary() == "verdict 7: clean"


def test_merge_refuses_no_words_other_shapes_and_words_that_are_no_verdict():
    word = _spec(_world())
    with pytest.raises(KvCanaryError) as caught:
        merge_verdicts([])
    assert caught.value.code == "KVC-M052"
    with pytest.raises(KvCanaryError) as caught:
        merge_verdicts(word)  # one word, not a list of them
    assert caught.value.code == "KVC-M052"
    with pytest.raises(KvCanaryError) as caught:
        merge_verdicts([word, word.astype(np.int64)])
    assert caught.value.code == "KVC-C002" and "words[1]" in str(caught.value)
    with pytest.raises(KvCanaryError) as caught:
        merge_verdicts([word[:8]])
    assert caught.value.code == "KVC-C004"
    summed = word + word  # what a sum all-reduce makes of the magic: negative
    with pytest.raises(KvCanaryError) as caught:
        merge_verdicts([word, summed])
    assert caught.value.code == "KVC-M051" and "words[1]" in str(caught.value)
    never_written = np.zeros(VERDICT_LANES, dtype=np.int32)
    with pytest.raises(KvCanaryError) as caught:
        decode_verdict("test", never_written)
    assert caught.value.code == "KVC-M051"
