"""Test helpers for canary buffers, plans, chains and rings (host side, NumPy).

Shared by the reference, kernel and pipeline tests. Hash values are Python
ints in ``[0, 2**64)`` unless a name says ``signed``. The scalar functions
here (``slot_hash``, ``scalar_fold``, ``scalar_verify_rows``) are an
independent per-entry re-statement of the contract, used as test oracles
and as the pure-Python baseline of the CPU speed test.
"""

from __future__ import annotations

import sys
import types
from typing import Sequence

import numpy as np

import kvcanary_numba.launch
from kvcanary_numba import CANARY_CHAIN_HEAD, CanaryContext, CanaryLaunchTag, RealKvHashMode, RealKvSource
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed, to_unsigned
from kvcanary_numba.plans import VerifyPlan, WritePlan
from kvcanary_numba.verify import launch_canary_verify_kernel
from kvcanary_numba.write import launch_canary_write_kernel

HEAD = CANARY_CHAIN_HEAD
TOKEN, POSITION, PREV_HASH, REAL_KV = range(4)


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


# --- real-KV sources -------------------------------------------------------------

#: The known-answer pattern of the reference notes §3.
KNOWN_PATTERN = bytes([0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0, 0xFF])
KNOWN_INNER_FOLD = 0xF036E30B6961C78D
KNOWN_REAL_KV_HASH = 0x6041580849E6407D


def random_source(
    rng: np.random.Generator, slots: int, *, page_size: int = 1, nbytes: int = 32, read_bytes: int | None = None, hole: int = 0
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


# --- a tiny serving loop: plan -> verify -> write -------------------------------------


class Pipeline:
    """One KV pool served step by step through the public launches (NumPy backend).

    ``req_to_token[rp, p]`` is the KV slot of request row ``rp`` at position ``p``
    and ``tokens[rp, p]`` the token there; tests fill both, then call
    :meth:`step` with the batch of the step. Slot 0 and request row 0 are padding.
    ``kv`` (uint8 [num_slots, kv_bytes]) is the live "KV" the real-KV sources view;
    :meth:`step` fills the new slots' KV bytes before stamping them, as a forward pass would.
    """

    def __init__(
        self,
        num_slots: int = 64,
        *,
        max_reqs: int = 8,
        max_seq: int = 32,
        verify_capacity: int = 256,
        write_capacity: int = 8,
        ring_capacity: int = 256,
        mode: RealKvHashMode = RealKvHashMode.NONE,
        kv_bytes: int = 32,
        window: int = 0,
        kind: CanaryLaunchTag = CanaryLaunchTag.TAIL_K_FULL,
        seed: int = 0,
    ):
        self.rng = np.random.default_rng(seed)
        self.kv = np.zeros((num_slots, kv_bytes), dtype=np.uint8)
        sources = (RealKvSource(tensor=self.kv, page_size=1, num_bytes_per_token=kv_bytes, read_bytes=kv_bytes),)
        self.ctx = make_context(num_slots, ring_capacity=ring_capacity, kind=kind, sources=sources, mode=mode)
        self.req_to_token = np.zeros((max_reqs, max_seq), dtype=np.int32)
        self.tokens = np.zeros((max_reqs, max_seq), dtype=np.int64)
        self.window = window
        # Identity LUT: the SWA group shares the full group's slots (window clipping only).
        self.lut = np.arange(num_slots, dtype=np.int64) if window else None
        self.vplan = VerifyPlan.allocate(verify_capacity=verify_capacity)
        self.wplan = WritePlan.allocate(write_req_capacity=write_capacity)

    def step(
        self,
        rpi: Sequence[int],
        prefix: Sequence[int],
        extend: Sequence[int],
        *,
        check_tokens: bool = False,
        offset: int = 0,
        pool: np.ndarray | None = None,
        expected: tuple[np.ndarray, np.ndarray] | None = None,
        loc_map=None,
    ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Plan, verify (returns its new rows), fill KV, write (returns its new rows).

        ``pool`` (default ``tokens``) is the expected-token pool when ``check_tokens``;
        ``expected`` the write-input assert's (tokens, positions); ``loc_map`` rewrites
        out_cache_loc before the write (e.g. an SWA translation to -1).
        """
        from kvcanary_numba.plan import launch_canary_plan_kernels

        rpi, prefix, extend = (np.asarray(a, dtype=np.int64) for a in (rpi, prefix, extend))
        launch_canary_plan_kernels(
            verify_plan_out=self.vplan,
            write_plan_out=self.wplan,
            req_pool_indices=rpi,
            prefix_lens=prefix,
            extend_seq_lens=extend,
            req_to_token=self.req_to_token,
            swa_window_size=self.window,
            full_to_swa_index_mapping=self.lut,
            verify_capacity=self.vplan.verify_capacity,
            req_to_verify_expected_tokens=(self.tokens if pool is None else pool).astype(np.int32) if check_tokens else None,
            req_to_verify_expected_tokens_valid_lens=(prefix + extend + offset) if check_tokens else None,
            kv_token_id_vs_position_offset=offset,
            backend="numpy",
        )
        before = write_index(self.ctx)
        run_verify(self.ctx, self.vplan, check_tokens)
        verify_rows = ring_rows(self.ctx)[before:]
        ids, pos, loc = self.batch_inputs(rpi, prefix, extend)
        loc = loc if loc_map is None else i64(loc_map(loc))
        for slot in loc[loc > 0]:
            self.kv[slot] = self.rng.integers(0, 256, self.kv.shape[1], dtype=np.uint8)
        before = write_index(self.ctx)
        exp_ids, exp_pos = expected if expected is not None else (None, None)
        run_write(self.ctx, self.wplan, ids, pos, loc, exp_ids, exp_pos)
        return verify_rows, ring_rows(self.ctx)[before:]

    def batch_inputs(self, rpi, prefix, extend) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """input_ids, positions, out_cache_loc of the new tokens, request-major (padding rows add none)."""
        ids, pos, loc = [], [], []
        for rp, start, n in zip(rpi, prefix, extend):
            if rp == 0 or n <= 0:
                continue
            ids.extend(self.tokens[rp, start : start + n])
            pos.extend(range(start, start + n))
            loc.extend(self.req_to_token[rp, start : start + n])
        return i64(ids), i64(pos), i64(loc)


#: Faults :func:`plant_fault` can plant, as in the golden vectors.
FAULTS = ("token", "position", "prev_hash", "real_kv", "req_to_token_swap")


def plant_fault(pipe: Pipeline, fault: str, rp: int, position: int) -> tuple[int, int]:
    """Corrupt what verify will read for ``position`` of request row ``rp``.

    Returns the (slot, FailReason bit) a verify of the prefix must report.
    ``token`` needs ``position + 1`` in the prefix (the successor's chain sees
    it), ``req_to_token_swap`` needs ``position + 2``; ``real_kv`` needs a
    real-KV mode.
    """
    slot = int(pipe.req_to_token[rp, position])
    if fault == "token":
        fields(pipe.ctx)[slot, TOKEN] += 7
        return int(pipe.req_to_token[rp, position + 1]), 1
    if fault == "position":
        fields(pipe.ctx)[slot, POSITION] += 1
        return slot, 2
    if fault == "prev_hash":
        fields(pipe.ctx)[slot, PREV_HASH] ^= 1 << 40
        return slot, 1
    if fault == "real_kv":
        pipe.kv[slot, 0] ^= 0x80
        return slot, 4
    if fault == "req_to_token_swap":
        other = int(pipe.req_to_token[rp, position + 2])
        pipe.req_to_token[rp, position], pipe.req_to_token[rp, position + 2] = other, slot
        return other, 2  # the slot now listed at `position` holds position + 2
    raise ValueError(f"unknown fault {fault!r}")


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
