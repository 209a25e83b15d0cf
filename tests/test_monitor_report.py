"""Decoding violation-ring rows into readable records (kvcanary_numba.monitor.report)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvcanary_numba.constants import CANARY_CHAIN_HEAD, CanaryLaunchTag, FailReason
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.monitor import BIT_EXPLANATIONS, Violation, decode_rows
from kvcanary_numba.monitor.report import reason_labels, tag_name

F = FailReason


def _row(
    tag=CanaryLaunchTag.TAIL_K_SWA,
    slot=53504,
    position=512,
    stored=7,
    expected=7,
    chain=to_signed(CANARY_CHAIN_HEAD),
    aux=0x2100,
    bits=F.WRITE_POSITION_MISMATCH,
):
    return [int(tag), slot, position, stored, expected, chain, aux, int(bits)]


def test_summary_line_is_sglangs_frozen_format():
    # SGLang issue #33656 logged this shape: launch_tag=TAIL_K_SWA fail_reason=write_position ...
    v = decode_rows(np.array([_row()], dtype=np.int64))[0]
    assert v.summary() == (
        "kv_canary violation: launch_tag=TAIL_K_SWA fail_reason=write_position slot_idx=53504 position=512 "
        "stored_token=7 expected_token=7 stored_chain_hash=0xde7fae23a9a1b716 expected_aux=0x0000000000002100"
    )


def test_negative_fields_print_as_64_bit_hex():
    v = Violation(*_row(chain=-1, aux=-2, expected=-1))
    assert "stored_chain_hash=0xffffffffffffffff expected_aux=0xfffffffffffffffe" in v.summary()
    assert "expected_token=-1" in v.summary()


@pytest.mark.parametrize(
    ("bits", "labels"),
    [
        (F.VERIFY_CHAIN_HASH_MISMATCH, ("verify_chain_hash",)),
        (F.VERIFY_POSITION_MISMATCH | F.VERIFY_CHAIN_HASH_MISMATCH, ("verify_chain_hash", "verify_position")),
        (F.VERIFY_REAL_KV_HASH_MISMATCH, ("verify_real_kv_hash",)),
        (F.WRITE_TOKEN_MISMATCH | F.WRITE_POSITION_MISMATCH, ("write_token", "write_position")),
        (F.VERIFY_TOKEN_MISMATCH, ("verify_token",)),
        (F.SLOT_OUT_OF_RANGE, ("slot_out_of_range",)),
        (F.PREV_SLOT_OUT_OF_RANGE | F.VERIFY_POSITION_MISMATCH, ("verify_position", "prev_slot_out_of_range")),
        (F.WRITE_RANGE_OUT_OF_BOUNDS, ("write_range_out_of_bounds",)),
        (1024 | 1, ("verify_chain_hash", "bit_1024")),
        (0, ()),
    ],
)
def test_reason_labels_in_bit_order(bits, labels):
    assert reason_labels(int(bits)) == labels


def test_fail_reason_joined_with_plus_and_none_for_zero():
    both = Violation(*_row(bits=F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_TOKEN_MISMATCH))
    assert " fail_reason=verify_chain_hash+verify_token " in both.summary()
    assert " fail_reason=none " in Violation(*_row(bits=0)).summary()


@pytest.mark.parametrize("tag", list(CanaryLaunchTag))
def test_tag_names_stage_group_and_canary_kind(tag):
    v = Violation(*_row(tag=tag))
    assert v.tag == tag.name
    stage, half, group = tag.name.split("_")
    assert (v.stage, v.group) == (stage, group)
    want = tag.name.lower() if stage == "SWEEP" else f"per_forward_{tag.name.lower()}"
    assert v.canary_kind == want


def test_unknown_tag_is_named_not_rejected():
    assert tag_name(12) == "UNKNOWN_12"
    assert tag_name(-3) == "UNKNOWN_-3"
    assert Violation(*_row(tag=99)).tag == "UNKNOWN_99"


def test_every_bit_has_an_explanation():
    assert set(BIT_EXPLANATIONS) == set(FailReason)
    v = Violation(*_row(bits=sum(b.value for b in FailReason) | 4096))
    texts = v.explanations()
    assert len(texts) == len(FailReason) + 1
    assert texts[0].startswith("verify_chain_hash: ")
    assert texts[-1] == "bit_4096: not a bit this version knows"


@pytest.mark.parametrize(
    ("bits", "is_write"),
    [(F.WRITE_TOKEN_MISMATCH, True), (F.WRITE_POSITION_MISMATCH, True), (F.VERIFY_POSITION_MISMATCH, False)],
)
def test_describe_names_actual_for_writes_and_stored_for_verifies(bits, is_write):
    v = Violation(*_row(bits=bits))
    text = v.describe()
    assert v.is_write is is_write
    assert text.splitlines()[0] == v.summary()
    assert "KV cache canary violation detected (kernel_kind=TAIL_K_SWA, slot_idx=53504, position=512)" in text
    assert ("  actual: token=7" in text) is is_write
    assert ("  stored: token=7" in text) is not is_write
    assert ("position=0x0000000000002100" in text) is is_write


def test_decode_rows_range_clips_to_capacity_and_stamps_step():
    ring = np.zeros((4, 8), dtype=np.int64)
    ring[:, 1] = [10, 11, 12, 13]
    rows = decode_rows(ring, 1, 9, step=5)
    assert [v.slot_idx for v in rows] == [11, 12, 13]
    assert {v.step for v in rows} == {5}
    assert decode_rows(ring, 4) == []


def test_to_dict_is_json_ready():
    import json

    d = Violation(*_row(), step=3).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["tag"] == "TAIL_K_SWA" and d["reasons"] == ["write_position"] and d["step"] == 3
    assert d["stored_chain_hash"] == "0xde7fae23a9a1b716"


def test_repr_names_the_tag_and_bits_and_prints_hashes_in_hex():
    v = Violation(*_row(tag=CanaryLaunchTag.HEAD_K_FULL, chain=-1, bits=F.VERIFY_CHAIN_HASH_MISMATCH | 4), step=3)
    assert repr(v) == (
        "Violation(HEAD_K_FULL, slot_idx=53504, position=512, reasons=verify_chain_hash+verify_real_kv_hash, "
        "stored_token=7, expected_token=7, stored_chain_hash=0xffffffffffffffff, "
        "expected_aux=0x0000000000002100, step=3, pending)"
    )
    assert "kernel_kind" not in repr(v) and "-1" not in repr(v)
    assert repr(dataclasses.replace(v, persistence="persistent", rewritten=True)).endswith("persistent, rewritten)")
