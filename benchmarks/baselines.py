"""Baselines measured in the same run: CuPy array operations, a naive Numba launch, a Python loop.

- :func:`cupy_verify`: the verify checks written with CuPy array operations
  (gathers and a vectorised splitmix64, one temporary per operation), the way
  one would write it without a custom kernel. Returns the failing-entry mask.
- :func:`naive_launch`: a recorded launch (the glue's kernel, grid and block)
  made through Numba's dispatcher, ``kernel[grid, block](cupy arrays...)``:
  typing, wrapping and ABI packing on every call.
- :func:`mix3_array`: the chain step on whole arrays (NumPy or CuPy), for inputs.
- :func:`python_verify`: a per-entry Python loop over the same records, the
  shape of SGLang's torch reference (one tensor read per field, Python ints
  for the hashes); the CPU path is compared against it.
"""

from __future__ import annotations

import numpy as np

from kvcanary_numba.constants import (
    CANARY_CHAIN_HEAD,
    PARTIAL_READ_BYTES,
    SPLITMIX64_MUL1,
    SPLITMIX64_MUL2,
    RealKvHashMode,
)
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed

__all__ = ["cupy_verify", "mix3_array", "naive_launch", "python_verify"]


def _splitmix(xp, x):
    x = x ^ (x >> xp.uint64(30))
    x = x * xp.uint64(SPLITMIX64_MUL1)
    x = x ^ (x >> xp.uint64(27))
    x = x * xp.uint64(SPLITMIX64_MUL2)
    return x ^ (x >> xp.uint64(31))


def mix3_array(xp, a, b, c):
    """``splitmix64_mix3`` of uint64 arrays ``a`` (prev hash), ``b`` (token bits), ``c`` (position), elementwise."""
    return _splitmix(xp, _splitmix(xp, _splitmix(xp, a) ^ b) ^ c)


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
    chain = mix3_array(xp, pred[:, 2], pred[:, 0], pred[:, 1])
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


def _plain(arg):
    """A launch argument as the caller's own array (CuPy, or NumPy under the simulator), without
    Numba's view of it: a :class:`~kvcanary_numba.launch._launch.View` description becomes the
    same view taken with the array library's own methods; tuples item by item."""
    from kvcanary_numba.launch._launch import View

    if isinstance(arg, tuple):
        return tuple(_plain(item) for item in arg)
    if not isinstance(arg, View):
        return arg
    x = arg.source
    if arg.builder == "array":
        return x
    dtype = np.dtype(arg.dtype)
    if arg.builder == "reinterpret":
        flat = x.reshape(-1).view(np.uint8).view(dtype)
        return flat if arg.new_shape is None else flat.reshape(tuple(arg.new_shape))
    return x.reshape(-1).view(dtype)  # byte_span of a contiguous source


def naive_launch(spec):
    """A callable launching ``spec``'s kernel (a recorded
    :class:`~kvcanary_numba.launch._launch.LaunchSpec`) through Numba's dispatcher with the
    caller's arrays (``kernel[grid, block](...)``): typing, wrapping and ABI packing on every call."""
    args = tuple(_plain(arg) for arg in spec.args)
    configured = spec.kernel[spec.grid, spec.block]

    def launch(_=None):
        configured(*args)

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
