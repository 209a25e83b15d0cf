"""Real-KV fingerprint: known answers, layout, fold order, and compute_real_kv_hash checks (CPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from canary_helpers import make_context
from canary_oracles import (
    KNOWN_INNER_FOLD,
    KNOWN_PATTERN,
    KNOWN_REAL_KV_HASH,
    known_source,
    random_source,
    scalar_fold,
    scalar_real_kv_hash,
)
from helpers import raises_code

from kvcanary_numba import RealKvHashMode, RealKvSource, compute_real_kv_hash
from kvcanary_numba.hashing import splitmix64, to_unsigned

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def hashes(sources, mode, slots) -> list[int]:
    out = np.full(len(slots), -5, dtype=np.int64)
    compute_real_kv_hash(
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=mode,
        slot_indices=np.array(slots, dtype=np.int64),
        out=out,
        backend="numpy",
    )
    return [to_unsigned(v) for v in out]


def test_known_answer_inner_fold_is_pinned():
    assert scalar_fold(KNOWN_PATTERN) == KNOWN_INNER_FOLD
    assert splitmix64(KNOWN_INNER_FOLD) == KNOWN_REAL_KV_HASH


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_known_answer_single_source(mode):
    assert hashes([known_source(rows=4)], mode, [1]) == [KNOWN_REAL_KV_HASH]


def test_none_mode_and_no_sources_give_zero():
    assert hashes([known_source(rows=4)], NONE, [1, 2]) == [0, 0]
    assert hashes([], ALL, [1, 2]) == [0, 0]


class _Untouchable(np.ndarray):
    """An array whose bytes may not be viewed (every read path goes through view)."""

    def view(self, *args, **kwargs):
        raise AssertionError("real-KV bytes were read")


def test_none_mode_reads_no_bytes():
    tensor = np.full((8, 16), 0xDE, dtype=np.uint8).view(_Untouchable)
    src = RealKvSource(tensor=tensor, page_size=1, num_bytes_per_token=16, read_bytes=16)
    assert hashes([src], NONE, [1, 7]) == [0, 0]
    with pytest.raises(AssertionError, match="were read"):
        hashes([src], PARTIAL, [1])


def test_words_are_little_endian():
    tensor = np.zeros((2, 16), dtype=np.uint8)
    tensor[1, 0] = 1  # word 0 == 1 only if byte 0 is the least significant
    src = RealKvSource(tensor=tensor, page_size=1, num_bytes_per_token=16, read_bytes=16)
    inner = splitmix64(splitmix64(0 ^ 1) ^ 0)
    assert hashes([src], ALL, [1]) == [splitmix64(inner)]


def test_partial_reads_16_bytes_all_reads_read_bytes():
    rng = np.random.default_rng(1)
    src = random_source(rng, 4, nbytes=64, read_bytes=48)
    base_partial, base_all = hashes([src], PARTIAL, [2])[0], hashes([src], ALL, [2])[0]
    src.tensor[2, 16] ^= 0xFF  # inside read_bytes, outside the PARTIAL strip
    assert hashes([src], PARTIAL, [2])[0] == base_partial
    assert hashes([src], ALL, [2])[0] != base_all
    all_now = hashes([src], ALL, [2])[0]
    src.tensor[2, 48] ^= 0xFF  # past read_bytes: never read
    assert hashes([src], ALL, [2])[0] == all_now


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_paged_layout_matches_byte_addressing(page_size, mode):
    rng = np.random.default_rng(page_size)
    src = random_source(rng, 40, page_size=page_size, nbytes=32, hole=16)
    slots = [0, 1, 3, page_size - 1, page_size, 15, 16, 39]
    assert hashes([src], mode, slots) == [scalar_real_kv_hash([src], mode, s) for s in slots]


def test_holes_are_never_read():
    rng = np.random.default_rng(2)
    src = random_source(rng, 32, page_size=4, nbytes=32, hole=16)
    before = hashes([src], ALL, list(range(32)))
    src.tensor[:, 4 * 32 :] = 0xAA
    assert hashes([src], ALL, list(range(32))) == before


def test_distinct_slots_differ_on_one_page():
    rng = np.random.default_rng(3)
    src = random_source(rng, 32, page_size=16, nbytes=128)
    h3, h7 = hashes([src], ALL, [3, 7])
    assert h3 != h7 and h3 == scalar_real_kv_hash([src], ALL, 3)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_multi_source_fold_in_order(count):
    rng = np.random.default_rng(count)
    sources = [random_source(rng, 8, page_size=p, nbytes=n) for p, n in [(1, 16), (4, 32), (2, 64), (1, 32)][:count]]
    acc = 0
    for src in sources:
        row = src.tensor[5 // src.page_size].tobytes()
        col = (5 % src.page_size) * src.num_bytes_per_token
        acc = splitmix64(acc ^ scalar_fold(row[col : col + src.read_bytes]))
    assert hashes(sources, ALL, [5]) == [acc]


def test_fold_order_matters():
    rng = np.random.default_rng(4)
    a, b = random_source(rng, 8), random_source(rng, 8)
    forward, backward = hashes([a, b], ALL, [3])[0], hashes([b, a], ALL, [3])[0]
    assert forward != backward and forward != 0 and backward != 0


def test_strided_rows_and_wider_dtype():
    rng = np.random.default_rng(5)
    wide = rng.integers(-(2**15), 2**15, size=(8, 48), dtype=np.int16)  # 96-byte rows
    view = wide[:, :32]  # 64 contiguous bytes per row, row stride 96
    src = RealKvSource(tensor=view, page_size=2, num_bytes_per_token=32, read_bytes=32)
    slots = list(range(16))
    want = [splitmix64(scalar_fold(wide[s // 2].tobytes()[(s % 2) * 32 : (s % 2) * 32 + 32])) for s in slots]
    assert hashes([src], ALL, slots) == want


def test_uncovered_and_negative_slots_give_zero():
    rng = np.random.default_rng(6)
    src = random_source(rng, 8, page_size=4)
    small = random_source(rng, 4)
    assert hashes([src], ALL, [-1, 8, 2**62])[:3] == [0, 0, 0]
    assert hashes([src, small], ALL, [3, 4])[1] == 0  # slot 4 not covered by every source
    assert hashes([src, small], ALL, [3])[0] != 0


def test_single_row_source_with_odd_row_length():
    tensor = np.random.default_rng(7).integers(0, 256, size=(1, 70), dtype=np.uint8)  # 4 slots + 6 spare bytes
    src = RealKvSource(tensor=tensor, page_size=4, num_bytes_per_token=16, read_bytes=16)
    assert hashes([src], ALL, [0, 3, 4]) == [scalar_real_kv_hash([src], ALL, 0), scalar_real_kv_hash([src], ALL, 3), 0]


def test_empty_slot_list():
    assert hashes([known_source(rows=4)], ALL, []) == []


# --- validation ------------------------------------------------------------------


def call(**overrides):
    kwargs = dict(
        real_kv_sources=(known_source(rows=4),),
        real_kv_hash_mode=ALL,
        slot_indices=np.arange(3, dtype=np.int64),
        out=np.zeros(3, dtype=np.int64),
        backend="numpy",
    )
    kwargs.update(overrides)
    compute_real_kv_hash(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        (dict(real_kv_sources=(known_source(rows=4),) * 5), "KVC-R008"),
        (dict(real_kv_sources=known_source(rows=4)), "KVC-R009"),
        (dict(real_kv_sources=None), "KVC-R009"),
        (dict(real_kv_sources=(np.zeros((4, 16), np.uint8),)), "KVC-R009"),
        (dict(real_kv_hash_mode=3), "KVC-C011"),
        (dict(real_kv_hash_mode=1.0), "KVC-C011"),
        (dict(slot_indices=[0, 1, 2]), "KVC-C001"),
        (dict(slot_indices=np.arange(3, dtype=np.int32)), "KVC-C002"),
        (dict(slot_indices=np.zeros((3, 1), dtype=np.int64)), "KVC-C003"),
        (dict(out=np.zeros(4, dtype=np.int64)), "KVC-C004"),
        (dict(out=np.zeros(6, dtype=np.int64)[::2]), "KVC-C006"),
        (dict(out=np.broadcast_to(np.zeros(1, dtype=np.int64), (3,))), "KVC-C006"),
        (dict(backend="gpu"), "KVC-C009"),
    ],
)
def test_rejects_bad_arguments(overrides, code):
    with raises_code(code):
        call(**overrides)


def test_rejects_read_only_out():
    out = np.zeros(3, dtype=np.int64)
    out.flags.writeable = False
    with raises_code("KVC-C013"):
        call(out=out)


def test_more_than_four_sources_rejected_even_in_none_mode():
    with raises_code("KVC-R008"):
        call(real_kv_sources=(known_source(rows=4),) * 5, real_kv_hash_mode=NONE)


def test_context_sources_must_cover_every_slot():
    from canary_helpers import run_verify, verify_plan

    with raises_code("KVC-R007") as excinfo:  # refused when the context is allocated ...
        make_context(16, sources=(known_source(rows=15),), mode=PARTIAL)
    assert excinfo.value.fields["needed"] == 16 and excinfo.value.fields["got"] == 15
    assert "fewer than num_slots = 16" in str(excinfo.value)  # allocate has no canary_buf yet
    # ... and by verify, for a context whose sources were swapped after allocation
    ctx = dataclasses.replace(
        make_context(16, sources=(known_source(rows=16),), mode=PARTIAL), real_kv_sources=(known_source(rows=15),)
    )
    with raises_code("KVC-R007") as excinfo:
        run_verify(ctx, verify_plan([1], [0], [-1]))
    assert excinfo.value.fields["needed"] == 16 and excinfo.value.fields["got"] == 15
    assert "fewer than context.canary_buf.shape[0] = 16" in str(excinfo.value)


# --- RealKvSource construction (geometry checked once, when the source is built) ------------


def _source(tensor=None, page_size=1, nbytes=16, read_bytes=16):
    tensor = np.zeros((4, 64), dtype=np.uint8) if tensor is None else tensor
    return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=nbytes, read_bytes=read_bytes)


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        (dict(page_size=0), "KVC-R001"),
        (dict(page_size=16.0), "KVC-R001"),
        (dict(nbytes=24, read_bytes=16), "KVC-R002"),
        (dict(nbytes=0), "KVC-R002"),
        (dict(read_bytes=0), "KVC-R003"),
        (dict(read_bytes=32), "KVC-R003"),
        (dict(nbytes=32, read_bytes=24), "KVC-R003"),
        (dict(tensor=np.zeros(64, np.uint8)), "KVC-R004"),
        (dict(tensor=np.zeros((2, 4, 16), np.uint8)), "KVC-R004"),
        (dict(tensor=np.zeros((64, 4), np.uint8).T), "KVC-R005"),
        (dict(tensor=np.zeros((4, 24), np.uint8)[:, :16]), "KVC-R005"),
        (dict(tensor=np.zeros((4, 32), np.uint8), page_size=4, nbytes=16), "KVC-R006"),
        (dict(tensor=[[0] * 16] * 4), "KVC-C001"),
    ],
)
def test_source_geometry_is_checked_at_construction(kwargs, code):
    with raises_code(code):
        _source(**kwargs)


def test_source_must_be_16_byte_aligned():
    raw = np.zeros(4 * 16 + 32, dtype=np.uint8)
    offset = next(k for k in range(1, 16) if (raw.ctypes.data + k) % 16)
    with raises_code("KVC-C014"):
        _source(tensor=raw[offset : offset + 64].reshape(4, 16))
