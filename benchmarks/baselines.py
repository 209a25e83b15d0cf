"""Baselines measured in the same run: CuPy array operations, a naive Numba launch, a Python loop.

- :func:`cupy_verify`: the verify checks written with CuPy array operations
  (gathers and a vectorised splitmix64, one temporary per operation), the way
  one would write it without a custom kernel. Returns the failing-entry mask.
- :func:`naive_verify_launch`: the verify kernel launched through Numba's
  dispatcher, ``kernel[grid, block](cupy arrays...)``: typing, wrapping and
  ABI packing on every call.
- :func:`python_verify`: a per-entry Python loop over the same records, the
  shape of SGLang's torch reference (one tensor read per field, Python ints
  for the hashes); the CPU path is compared against it.
"""

from __future__ import annotations

import numpy as np

from kvcanary_numba.constants import CANARY_CHAIN_HEAD, PARTIAL_READ_BYTES, SPLITMIX64_MUL1, SPLITMIX64_MUL2
from kvcanary_numba.constants import RealKvHashMode
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed

__all__ = ["cupy_verify", "naive_verify_launch", "python_verify"]


def _splitmix(xp, x):
    x = x ^ (x >> xp.uint64(30))
    x = x * xp.uint64(SPLITMIX64_MUL1)
    x = x ^ (x >> xp.uint64(27))
    x = x * xp.uint64(SPLITMIX64_MUL2)
    return x ^ (x >> xp.uint64(31))


def _read_bytes(context) -> int:
    mode = RealKvHashMode(context.real_kv_hash_mode)
    if mode == RealKvHashMode.NONE or not context.real_kv_sources:
        return 0
    return PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(context.real_kv_sources[0].read_bytes)


def cupy_verify(xp, context, plan, entries: int):
    """Failing-entry mask of a verify (chain, position, real-KV; page_size 1 sources) with array ops."""
    words = context.canary_buf.view(np.int64).view(np.uint64)
    slots = plan.verify_slot_indices[:entries]
    prev = plan.verify_prev_slot_indices[:entries]
    record = words[slots]  # [n, 4]
    pred = words[xp.maximum(prev, 0)]
    chain = _splitmix(xp, _splitmix(xp, _splitmix(xp, pred[:, 2]) ^ pred[:, 0]) ^ pred[:, 1])
    expected = xp.where(prev < 0, xp.uint64(CANARY_CHAIN_HEAD), xp.where(prev == 0, record[:, 2], chain))
    bad = (record[:, 2] != expected) | (record[:, 1].view(np.int64) != plan.verify_expected_positions[:entries])
    nwords = _read_bytes(context) // 8
    if nwords:
        real = xp.zeros(entries, dtype=np.uint64)
        for source in context.real_kv_sources:
            kv = source.tensor.view(np.uint64)[slots, :nwords]  # one gathered row per entry
            acc = xp.zeros(entries, dtype=np.uint64)
            for k in range(nwords):
                acc = _splitmix(xp, acc ^ kv[:, k])
            real = _splitmix(xp, real ^ acc)
        bad |= record[:, 3] != real
    return bad & (slots != 0)


def naive_verify_launch(context, plan, *, check_token: bool = False):
    """A callable launching the verify kernel through Numba's dispatcher with CuPy arguments."""
    from kvcanary_numba.constants import VERIFY_BLOCK_SIZE
    from kvcanary_numba.kernels import verify as kernels
    from kvcanary_numba.launch import _common
    from kvcanary_numba.launch.fingerprint import source_args

    fallback = plan.verify_slot_indices.view(np.uint64)
    nsrc, _, params, _ = source_args(context.real_kv_sources, context.real_kv_hash_mode, fallback)
    spans = [s.tensor.view(np.uint64).reshape(-1) for s in context.real_kv_sources[:nsrc]]
    spans += [fallback] * (4 - nsrc)
    kernel = kernels.KERNELS[kernels.kernel_name(check_token, nsrc)]
    block = VERIFY_BLOCK_SIZE
    grid = _common.persistent_grid(plan.verify_slot_indices.shape[0], block)
    buf = context.canary_buf.view(np.int64)
    args = (buf, plan.verify_slot_indices, plan.verify_expected_tokens, plan.verify_expected_positions,
            plan.verify_prev_slot_indices, plan.verify_num_valid, plan.enable, context.violation_ring,
            context.violation_write_index, context.slot_run_counter, context.kernel_run_counter,
            int(context.kernel_kind), *spans, params)  # fmt: skip

    def launch(_=None):
        kernel[grid, block](*args)

    return launch


def _python_fold(tensor: np.ndarray, slot: int, nbytes: int) -> int:
    acc = 0
    row = tensor[slot]
    for k in range(0, nbytes, 8):
        acc = splitmix64(acc ^ int.from_bytes(row[k : k + 8].tobytes(), "little"))
    return acc


def python_verify(context, plan, entries: int) -> int:
    """Failing entries of a verify, one entry at a time in Python (chain, position, real-KV)."""
    words = context.canary_buf.view(np.int64)
    slots, prevs = plan.verify_slot_indices, plan.verify_prev_slot_indices
    positions = plan.verify_expected_positions
    nbytes = _read_bytes(context)
    bad = 0
    for i in range(entries):
        slot = int(slots[i])
        if slot == 0:
            continue
        position, prev_hash, stored_real = int(words[slot, 1]), int(words[slot, 2]), int(words[slot, 3])
        prev = int(prevs[i])
        if prev < 0:
            expected = to_signed(CANARY_CHAIN_HEAD)
        elif prev == 0:
            expected = prev_hash
        else:
            expected = to_signed(splitmix64_mix3(int(words[prev, 2]), int(words[prev, 0]), int(words[prev, 1])))
        real = 0
        if nbytes:
            for source in context.real_kv_sources:
                real = splitmix64(real ^ _python_fold(source.tensor, slot, nbytes))
        bad += prev_hash != expected or position != int(positions[i]) or stored_real != to_signed(real)
    return bad
