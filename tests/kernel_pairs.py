"""Differential runs for the kernel tests: the same launch on the NumPy reference
and on the Numba-CUDA kernels (simulator with NumPy arrays, or a GPU with CuPy
arrays), compared byte for byte.

Ring rows compare as multisets (the kernels append in atomic order). When a
launch overflows the ring part-way, which rows land is a race: the kernel's new
rows must then be a sub-multiset of what the reference records with an
unbounded ring.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

import numpy as np

from kvcanary_numba import CanaryContext, RealKvSource, VerifyPlan, WritePlan
from kvcanary_numba.verify import launch_canary_verify_kernel
from kvcanary_numba.write import launch_canary_write_kernel

#: Where the kernels run: the simulator on NumPy arrays, else the GPU on CuPy arrays.
KERNEL_DEVICE = "cpu" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "cuda"
LAUNCHES = {"verify": launch_canary_verify_kernel, "write": launch_canary_write_kernel}
_CONTEXT_ARRAYS = (
    "canary_buf",
    "violation_ring",
    "violation_write_index",
    "slot_run_counter",
    "kernel_run_counter",
    "enable_chain_position_assert",
)


def _xp(device: str):
    if device == "cpu":
        return np
    import cupy

    return cupy


def to_device(value: Any, device: str) -> Any:
    """Copy a NumPy array, plan, source or context (or pass a scalar) to ``device``."""
    xp = _xp(device)
    if isinstance(value, np.ndarray):
        return xp.array(value, copy=True)
    if isinstance(value, (VerifyPlan, WritePlan)):
        return type(value)(**{k: to_device(v, device) for k, v in value.arrays().items()})
    if isinstance(value, RealKvSource):
        return dataclasses.replace(value, tensor=_copy_layout(value.tensor, xp))
    if isinstance(value, CanaryContext):
        changes = {name: to_device(getattr(value, name), device) for name in _CONTEXT_ARRAYS}
        sources = tuple(to_device(s, device) for s in value.real_kv_sources)
        return value.replace(real_kv_sources=sources, **changes)
    return value


def _copy_layout(array: np.ndarray, xp) -> Any:
    """Copy of a 2-D array with the same strides (rows of a KV source may be strided)."""
    rows, cols = array.shape
    span = (rows - 1) * array.strides[0] + cols * array.itemsize if rows and cols else 0
    raw = np.lib.stride_tricks.as_strided(array.view(np.uint8), shape=(span,), strides=(1,))
    flat = xp.array(raw, copy=True).view(array.dtype)
    return xp.lib.stride_tricks.as_strided(flat, shape=array.shape, strides=array.strides)


def to_host(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "copy_to_host"):  # a Numba device array (e.g. cached launch scratch)
        return value.copy_to_host()
    return value.get()


def _rows(ctx: CanaryContext) -> Counter:
    stored = min(max(int(to_host(ctx.violation_write_index)[0]), 0), ctx.violation_ring.shape[0])
    return Counter(tuple(int(v) for v in row) for row in to_host(ctx.violation_ring)[:stored])


def run_pair(ctx: CanaryContext, launch: str, *, device: str = KERNEL_DEVICE, **kwargs) -> CanaryContext:
    """Run ``launch`` on ``ctx`` (NumPy) with the reference, and on a copy with the kernels.

    ``device="cpu"`` runs the kernels under the simulator on NumPy copies,
    ``"cuda"`` on CuPy copies. Asserts that buffer, ring, write index and
    counters agree; updates ``ctx`` to the reference's result and returns the
    kernels' context (arrays on ``device``).
    """
    kernel_ctx = to_device(ctx, device)
    kernel_kwargs = {k: to_device(v, device) for k, v in kwargs.items()}
    index_before = int(ctx.violation_write_index[0])
    LAUNCHES[launch](context=kernel_ctx, backend="cuda", **kernel_kwargs)

    copies = {name: getattr(ctx, name).copy() for name in _CONTEXT_ARRAYS}
    most_rows = 3 * sum(int(np.size(v)) for v in kwargs.values() if isinstance(v, np.ndarray)) + 2 * _plan_size(kwargs)
    copies.update(violation_ring=np.zeros((most_rows + 1, 8), dtype=np.int64), violation_write_index=np.zeros(1, np.int32))
    unbounded = ctx.replace(**copies)
    LAUNCHES[launch](context=ctx, backend="numpy", **kwargs)
    LAUNCHES[launch](context=unbounded, backend="numpy", **kwargs)

    for name in ("canary_buf", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        np.testing.assert_array_equal(to_host(getattr(kernel_ctx, name)), getattr(ctx, name), err_msg=name)
    capacity = ctx.violation_ring.shape[0]
    index_after = int(ctx.violation_write_index[0])
    ring = to_host(kernel_ctx.violation_ring)
    assert not ring[min(max(index_after, 0), capacity) :].any(), "ring rows past the write index"
    if not (0 <= index_before < capacity < index_after):
        assert _rows(kernel_ctx) == _rows(ctx), "ring rows differ"
    else:
        kept = index_before
        np.testing.assert_array_equal(ring[:kept], ctx.violation_ring[:kept], err_msg="old rows changed")
        new = Counter(tuple(int(v) for v in row) for row in ring[kept:capacity])
        assert not new - _rows(unbounded), f"rows the reference never records: {new - _rows(unbounded)}"
    return kernel_ctx


def _plan_size(kwargs: dict) -> int:
    plan = kwargs["plan"]
    return plan.verify_capacity if isinstance(plan, VerifyPlan) else plan.write_req_capacity


def ring_rows(ctx: CanaryContext) -> list[tuple[int, ...]]:
    """Stored rows of a (possibly device) context, sorted."""
    return sorted(_rows(ctx).elements())
