"""Real-KV test sources with known answers, and scalar per-entry oracles of the canary contract (tests only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from canary_helpers import record, slot_hash

from kvcanary_numba import CanaryContext, RealKvHashMode, RealKvSource
from kvcanary_numba.hashing import splitmix64, to_signed
from kvcanary_numba.plans import VerifyPlan

# --- real-KV sources -------------------------------------------------------------

#: The known-answer pattern of SGLang's pinned values.
KNOWN_PATTERN = bytes([0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0, 0xFF])
KNOWN_INNER_FOLD = 0xF036E30B6961C78D
KNOWN_REAL_KV_HASH = 0x6041580849E6407D


def random_source(
    rng: np.random.Generator,
    slots: int,
    *,
    page_size: int = 1,
    nbytes: int = 32,
    read_bytes: int | None = None,
    hole: int = 0,
) -> RealKvSource:
    """A random uint8 source covering ``slots`` slots, with ``hole`` spare bytes per row."""
    rows = -(-slots // page_size)
    tensor = rng.integers(0, 256, size=(rows, page_size * nbytes + hole), dtype=np.uint8)
    return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=nbytes, read_bytes=read_bytes or nbytes)


def known_source(
    slot: int = 1, *, rows: int = 16, nbytes: int = 16, page_size: int = 1, read_bytes: int = 16
) -> RealKvSource:
    """A zeroed uint8 source ``[rows, page_size * nbytes]`` whose ``slot`` starts with
    :data:`KNOWN_PATTERN`: its real-KV hash over 16 bytes is :data:`KNOWN_REAL_KV_HASH`."""
    tensor = np.zeros((rows, page_size * nbytes), dtype=np.uint8)
    col = (slot % page_size) * nbytes
    tensor[slot // page_size, col : col + 16] = np.frombuffer(KNOWN_PATTERN, dtype=np.uint8)
    return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=nbytes, read_bytes=read_bytes)


def scalar_fold(data: bytes) -> int:
    """Fold bytes as little-endian u64 words: ``acc = S(acc ^ w)`` from 0."""
    acc = 0
    for k in range(0, len(data), 8):
        acc = splitmix64(acc ^ int.from_bytes(data[k : k + 8], "little"))
    return acc


def scalar_real_kv_hash(sources: Sequence[RealKvSource], mode: RealKvHashMode, slot: int) -> int:
    """Real-KV hash of one slot, byte by byte from the tensors (independent of the reference)."""
    if mode == RealKvHashMode.NONE or not sources:
        return 0
    acc = 0
    for src in sources:
        row_bytes = np.ascontiguousarray(src.tensor[slot // src.page_size]).tobytes()
        col = (slot % src.page_size) * src.num_bytes_per_token
        n = 16 if mode == RealKvHashMode.PARTIAL else src.read_bytes
        acc = splitmix64(acc ^ scalar_fold(row_bytes[col : col + n]))
    return acc


def scalar_verify_rows(ctx: CanaryContext, plan: VerifyPlan, check: bool) -> list[tuple[int, ...]]:
    """Rows one verify launch records, entry by entry in Python (no counters, no ring)."""
    if int(plan.enable[0]) == 0:
        return []
    rows = []
    num_slots = ctx.canary_buf.shape[0]
    active = min(max(int(plan.verify_num_valid[0]), 0), plan.verify_slot_indices.shape[0])
    kind = int(ctx.kernel_kind)
    for i in range(active):
        slot = int(plan.verify_slot_indices[i])
        position = int(plan.verify_expected_positions[i])
        prev = int(plan.verify_prev_slot_indices[i])
        token = int(plan.verify_expected_tokens[i]) if check else -1
        if slot == 0:
            continue
        if not 0 <= slot < num_slots:
            rows.append((kind, slot, position, -1, token, 0, num_slots, 64))
            continue
        s_token, s_position, s_prev, s_real = record(ctx, slot)
        bits = 0
        expected = s_prev
        if prev < 0 or 0 < prev < num_slots:
            expected = slot_hash(ctx, prev)
            bits |= 1 if expected != s_prev else 0
        if s_position != position:
            bits |= 2
        if s_real != scalar_real_kv_hash(ctx.real_kv_sources, ctx.real_kv_hash_mode, slot):
            bits |= 4
        if token != -1 and s_token != token:
            bits |= 32
        aux = to_signed(expected)
        if prev >= num_slots:
            bits |= 128
            aux = prev
        if bits:
            rows.append((kind, slot, s_position, s_token, token, to_signed(s_prev), aux, bits))
    return rows


def explicit_mix3(a, b, c):
    """``splitmix64_mix3`` spelled out, ``b`` and ``c`` taken as 64-bit patterns."""
    return splitmix64(splitmix64(splitmix64(a) ^ (b & (2**64 - 1))) ^ (c & (2**64 - 1)))
