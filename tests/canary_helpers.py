"""Test helpers for canary buffers, plans, chains and rings (host side, NumPy).

Shared by the reference, kernel and pipeline tests. Hash values are Python
ints in ``[0, 2**64)`` unless a name says ``signed``. Real-KV sources and the
scalar oracles are in :mod:`canary_oracles`, the tiny serving loop and its
faults in :mod:`canary_pipeline`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence

import numpy as np

import kvcanary_numba.launch
from kvcanary_numba import (
    CANARY_CHAIN_HEAD,
    CanaryContext,
    CanaryLaunchTag,
    RealKvHashMode,
    RealKvSource,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)
from kvcanary_numba.hashing import splitmix64_mix3, to_signed, to_unsigned
from kvcanary_numba.plans import VerifyPlan, WritePlan

HEAD = CANARY_CHAIN_HEAD


# --- contexts and records ------------------------------------------------------


def make_context(
    num_slots: int = 16,
    *,
    stride: int = 32,
    ring_capacity: int = 64,
    kind: CanaryLaunchTag = CanaryLaunchTag.HEAD_K_FULL,
    sources: Sequence[RealKvSource] = (),
    mode: RealKvHashMode = RealKvHashMode.NONE,
    chain_assert: int = 1,
) -> CanaryContext:
    """A zeroed NumPy context (16 slots x 32 bytes by default, as SGLang's tests)."""
    ctx = CanaryContext.allocate(
        num_slots=num_slots,
        slot_stride_bytes=stride,
        ring_capacity=ring_capacity,
        kernel_kind=kind,
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=mode,
    )
    ctx.enable_chain_position_assert[0] = chain_assert
    return ctx


def fields(ctx: CanaryContext) -> np.ndarray:
    """The canary buffer as int64 [num_slots, stride // 8] (shares memory)."""
    return ctx.canary_buf.view(np.int64)


def stamp(ctx: CanaryContext, slot: int, token: int, position: int, prev_hash: int, real_kv_hash: int = 0) -> None:
    """Write one record; any int is stored as its 64-bit pattern."""
    fields(ctx)[slot, :4] = [to_signed(token), to_signed(position), to_signed(prev_hash), to_signed(real_kv_hash)]


def record(ctx: CanaryContext, slot: int) -> tuple[int, int, int, int]:
    """(token, position, prev_hash, real_kv_hash); token/position signed, hashes unsigned."""
    token, position, prev_hash, real_kv = (int(v) for v in fields(ctx)[slot, :4])
    return token, position, to_unsigned(prev_hash), to_unsigned(real_kv)


def slot_hash(ctx: CanaryContext, slot: int) -> int:
    """Chain hash of a slot's record (the chain head for a negative slot)."""
    if slot < 0:
        return HEAD
    token, position, prev_hash, _ = record(ctx, slot)
    return splitmix64_mix3(prev_hash, token, position)


def chain_prev_hashes(tokens: Sequence[int], positions: Sequence[int], seed_hash: int = HEAD) -> list[int]:
    """prev_hash each entry of a linear chain stores, computed entry by entry."""
    out, running = [], seed_hash
    for token, position in zip(tokens, positions):
        out.append(running)
        running = splitmix64_mix3(running, token, position)
    return out


def stamp_clean_chain(
    ctx: CanaryContext,
    slots: Sequence[int],
    tokens: Sequence[int],
    positions: Sequence[int] | None = None,
    *,
    seed_hash: int = HEAD,
    real_kv: Sequence[int] | None = None,
) -> list[int]:
    """Stamp a correct chain (positions default to 0, 1, ...); returns the stored prev hashes."""
    positions = list(range(len(slots))) if positions is None else list(positions)
    prevs = chain_prev_hashes(tokens, positions, seed_hash)
    for k, slot in enumerate(slots):
        stamp(ctx, slot, tokens[k], positions[k], prevs[k], 0 if real_kv is None else real_kv[k])
    return prevs


def seeded(chain_assert: int = 1) -> CanaryContext:
    """A context whose slot 9 holds a chain head (token 5, position 10), the seed of the write tests."""
    ctx = make_context(chain_assert=chain_assert)
    stamp(ctx, 9, 5, 10, HEAD)
    return ctx


# --- plans ---------------------------------------------------------------------


def verify_plan(
    slots: Sequence[int],
    positions: Sequence[int],
    prevs: Sequence[int],
    tokens: Sequence[int] | None = None,
    *,
    capacity: int | None = None,
    num_valid: int | None = None,
    enable: int = 1,
) -> VerifyPlan:
    """A VerifyPlan holding the given entries (expected tokens -1 unless given)."""
    n = len(slots)
    plan = VerifyPlan.allocate(verify_capacity=max(1, n) if capacity is None else capacity)
    plan.verify_slot_indices[:n] = slots
    plan.verify_expected_positions[:n] = positions
    plan.verify_prev_slot_indices[:n] = prevs
    if tokens is not None:
        plan.verify_expected_tokens[:n] = tokens
    plan.verify_num_valid[0] = n if num_valid is None else num_valid
    plan.enable[0] = enable
    return plan


def chain_plan(slots: Sequence[int], positions: Sequence[int] | None = None) -> VerifyPlan:
    """Verify plan of one linear chain: positions 0, 1, ... (unless given), prev = previous slot."""
    slots = list(slots)
    positions = list(range(len(slots))) if positions is None else list(positions)
    return verify_plan(slots, positions, [-1, *slots[:-1]])


def write_plan(
    lengths: Sequence[int], seeds: Sequence[int], *, capacity: int | None = None, num_valid: int | None = None
) -> WritePlan:
    """A WritePlan for requests with ``lengths`` entries each (offsets = exclusive sums)."""
    bs = len(lengths)
    plan = WritePlan.allocate(write_req_capacity=max(1, bs) if capacity is None else capacity)
    plan.write_offsets[: bs + 1] = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    plan.write_seed_slot_indices[:bs] = seeds
    plan.write_num_valid_reqs[0] = bs if num_valid is None else num_valid
    return plan


def i64(values: Sequence[int]) -> np.ndarray:
    """int64 array from ints of any sign (uint64 bit patterns allowed)."""
    array = np.asarray(values)
    if array.dtype.kind in "iu" and array.dtype.itemsize <= 8:
        return np.ascontiguousarray(array.astype(np.int64) if array.dtype != np.uint64 else array.view(np.int64))
    return np.array([to_signed(v) for v in values], dtype=np.int64)


# --- launches and rings ----------------------------------------------------------


def run_verify(ctx: CanaryContext, plan: VerifyPlan, check: bool = False, backend: str = "numpy") -> None:
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=check, backend=backend)


def write_args(
    plan: WritePlan,
    tokens: Sequence[int],
    positions: Sequence[int],
    slots: Sequence[int],
    expected_tokens: Sequence[int] | None = None,
    expected_positions: Sequence[int] | None = None,
) -> dict:
    """Keyword arguments of a write launch (without context and backend); the write-input
    assert is on exactly when expected arrays are given."""
    asserted = expected_tokens is not None
    return dict(
        plan=plan,
        input_ids=i64(tokens),
        positions=i64(positions),
        out_cache_loc=i64(slots),
        enable_write_input_assert=asserted,
        expected_input_tokens=i64(expected_tokens) if asserted else None,
        expected_input_positions=i64(expected_positions) if asserted else None,
    )


def run_write(ctx: CanaryContext, plan: WritePlan, *entries, backend: str = "numpy") -> None:
    """Write launch through the public wrapper; ``entries`` as :func:`write_args` takes them
    (tokens, positions, slots and, for the write-input assert, expected tokens and positions)."""
    launch_canary_write_kernel(context=ctx, backend=backend, **write_args(plan, *entries))


def write_index(ctx: CanaryContext) -> int:
    return int(ctx.violation_write_index[0])


def ring_rows(ctx: CanaryContext) -> list[tuple[int, ...]]:
    """Stored ring rows as tuples of 8 signed ints, in ring order."""
    stored = min(max(write_index(ctx), 0), ctx.violation_ring.shape[0])
    return [tuple(int(v) for v in row) for row in ctx.violation_ring[:stored]]


def row_bits(ctx: CanaryContext) -> list[int]:
    return [row[7] for row in ring_rows(ctx)]


def counters(ctx: CanaryContext) -> tuple[int, int]:
    """(slot_run_counter, kernel_run_counter)."""
    return int(ctx.slot_run_counter[0]), int(ctx.kernel_run_counter[0])


def verify(ctx: CanaryContext, plan: VerifyPlan, check: bool = False) -> list[tuple[int, ...]]:
    """Run verify (NumPy) and assert the invariant that it never writes the canary buffer; returns the ring rows."""
    before = ctx.canary_buf.copy()
    run_verify(ctx, plan, check)
    np.testing.assert_array_equal(ctx.canary_buf, before)
    return ring_rows(ctx)


# --- dispatch fakes ----------------------------------------------------------------


class FakeCudaArray:
    """A host array posing as a CUDA array (``__cuda_array_interface__`` only), for dispatch checks.

    Never hand it to a kernel: its pointer is host memory.
    """

    def __init__(self, array: np.ndarray):
        self._array = array
        self.shape, self.dtype = array.shape, array.dtype
        self.__cuda_array_interface__ = {
            "shape": array.shape,
            "typestr": array.dtype.str,
            "data": (array.ctypes.data, False),
            "strides": None,
            "version": 3,
        }


def fake_launch_module(monkeypatch, op, *names):
    """Install a stand-in ``kvcanary_numba.launch.<op>`` recording (function, kwargs) calls."""
    calls = []
    module = types.ModuleType(f"kvcanary_numba.launch.{op}")
    for name in names:
        setattr(module, name, lambda _name=name, **kwargs: calls.append((_name, kwargs)))
    monkeypatch.setattr(kvcanary_numba.launch, op, module, raising=False)
    monkeypatch.setitem(sys.modules, f"kvcanary_numba.launch.{op}", module)
    return calls
