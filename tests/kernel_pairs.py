"""Differential runs for the kernel tests: the same launch on the NumPy reference
and on the Numba-CUDA kernels (simulator with NumPy arrays, or a GPU with CuPy
arrays), compared byte for byte.

Ring rows compare as multisets (the kernels append in atomic order). When a
launch overflows the ring part-way, which rows land is a race: the kernel's new
rows must then be a sub-multiset of what the reference records with an
unbounded ring.

Also the paired ``verify`` and ``write`` of the verify and write kernel tests,
and the plan inputs and differential plan runs of the plan kernel tests.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

import canary_helpers
import numpy as np
from helpers import FILL, PLAN_WIDTH, linear_rtt, padded_lut

from kvcanary_numba import (
    CanaryContext,
    RealKvSource,
    VerifyPlan,
    WritePlan,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    plan as public,
)
from kvcanary_numba.launch import plan as glue
from kvcanary_numba.reference import plan as reference

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
    copies.update(
        violation_ring=np.zeros((most_rows + 1, 8), dtype=np.int64), violation_write_index=np.zeros(1, np.int32)
    )
    unbounded = ctx.replace(**copies)
    LAUNCHES[launch](context=ctx, backend="numpy", **kwargs)
    LAUNCHES[launch](context=unbounded, backend="numpy", **kwargs)

    for name in ("canary_buf", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        np.testing.assert_array_equal(to_host(getattr(kernel_ctx, name)), getattr(ctx, name), err_msg=name)
    capacity = ctx.violation_ring.shape[0]
    index_after = int(ctx.violation_write_index[0])
    ring = to_host(kernel_ctx.violation_ring)
    assert not ring[min(max(index_after, 0), capacity) :].any(), "ring rows past the write index"
    # Tickets below 0 (a preset negative index) or past the capacity are not stored. Which rows
    # drew the stored tickets is then the kernel's race, so those rows are only rows the reference records.
    dropped = index_before < capacity and (index_before < 0 or index_after > capacity)
    if not dropped:
        assert _rows(kernel_ctx) == _rows(ctx), "ring rows differ"
    else:
        kept, stored = max(index_before, 0), min(max(index_after, 0), capacity)
        np.testing.assert_array_equal(ring[:kept], ctx.violation_ring[:kept], err_msg="old rows changed")
        new = Counter(tuple(int(v) for v in row) for row in ring[kept:stored])
        assert all(any(row) for row in new), "a stored ticket holds no row"
        assert not new - _rows(unbounded), f"rows the reference never records: {new - _rows(unbounded)}"
    return kernel_ctx


def _plan_size(kwargs: dict) -> int:
    plan = kwargs["plan"]
    return plan.verify_capacity if isinstance(plan, VerifyPlan) else plan.write_req_capacity


def ring_rows(ctx: CanaryContext) -> list[tuple[int, ...]]:
    """Stored rows of a (possibly device) context, sorted."""
    return sorted(_rows(ctx).elements())


# --- verify and write: kernels and reference on one context -------------------------------


def verify(ctx, plan, check=False):
    """Kernel and reference verify; returns the (agreeing) rows in ring order of the reference."""
    before = ctx.canary_buf.copy()
    kernel_ctx = run_pair(ctx, "verify", plan=plan, check_verify_expected_token=check)
    np.testing.assert_array_equal(to_host(kernel_ctx.canary_buf), before)  # verify never writes
    return canary_helpers.ring_rows(ctx)


def write(ctx, plan, tokens, positions, slots, expected_tokens=None, expected_positions=None):
    """Kernel and reference write (they must agree); returns the reference's rows in order."""
    kwargs = canary_helpers.write_args(plan, tokens, positions, slots, expected_tokens, expected_positions)
    run_pair(ctx, "write", **kwargs)
    return canary_helpers.ring_rows(ctx)


# --- plans: inputs, and the reference and the kernels on identically pre-filled plans ---


def to_kernel(x):
    """``x`` where the kernels run (a copy), scalars and None as they are."""
    return to_device(x, KERNEL_DEVICE)


def case(rpi, prefix, ext, *, rtt=None, window=0, lut=None, pool=None, lens=None, offset=0, vcap=4096, wcap=None):
    """One plan input; arrays as NumPy, plan capacities alongside."""
    rpi = np.asarray(rpi, dtype=np.int64)
    return dict(
        req_pool_indices=rpi,
        prefix_lens=np.asarray(prefix, dtype=np.int64),
        extend_seq_lens=np.asarray(ext, dtype=np.int64),
        req_to_token=linear_rtt() if rtt is None else rtt,
        swa_window_size=window,
        full_to_swa_index_mapping=lut,
        verify_capacity=vcap,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=offset,
        wcap=max(rpi.shape[0], 1) if wcap is None else wcap,
    )


def fresh_plans(inputs: dict, device: str):
    vplan = VerifyPlan.allocate(verify_capacity=inputs["verify_capacity"], device=device)
    wplan = WritePlan.allocate(write_req_capacity=inputs["wcap"], device=device)
    for arr in (*vplan.arrays().values(), *wplan.arrays().values()):
        arr[...] = FILL
    return vplan, wplan


def host_arrays(plan) -> dict:
    return {name: to_host(arr).copy() for name, arr in plan.arrays().items()}


def run_both(inputs: dict, *, via_public: bool = False, plans=None, scratch=None) -> tuple[dict, dict]:
    """Plan on the reference and the kernels, assert every array equal; return the kernels' plans.

    ``scratch``: the launch glue's scratch (None: the core's, fresh per call; the fast wing's
    ``STREAM_SCRATCH`` keeps the look-back state for a test to inspect). Ignored ``via_public``."""
    kwargs = {k: v for k, v in inputs.items() if k != "wcap"}
    if plans is None:
        plans = fresh_plans(inputs, KERNEL_DEVICE)
    ref_v, ref_w = (type(p)(**host_arrays(p)) for p in plans)  # same starting contents
    reference.launch_canary_plan_kernels(verify_plan_out=ref_v, write_plan_out=ref_w, **kwargs)
    dev_kwargs = {k: to_kernel(v) for k, v in kwargs.items()}
    launch = public.launch_canary_plan_kernels if via_public else glue.launch_canary_plan_kernels
    extra = {"backend": "cuda"} if via_public else {} if scratch is None else {"scratch": scratch}
    launch(verify_plan_out=plans[0], write_plan_out=plans[1], **dev_kwargs, **extra)
    got = host_arrays(plans[0]), host_arrays(plans[1])
    for want_plan, got_plan in zip((ref_v, ref_w), got):
        for name, want in want_plan.arrays().items():
            np.testing.assert_array_equal(got_plan[name], want, err_msg=name)
    return got


def token_pool(rows=9, width=PLAN_WIDTH):
    """Expected-token pool with pool[rp, pos] = rp * 1000 + pos."""
    return (np.arange(rows)[:, None] * 1000 + np.arange(width)[None, :]).astype(np.int32)


def random_batch(rng, bs=None, *, rows=9, width=PLAN_WIDTH, wcap=None):
    """A plausible batch: padding rows, SWA or not, expected-token pool or not."""
    bs = int(rng.integers(1, 40)) if bs is None else bs
    window = int(rng.choice([0, 0, 3, 8]))
    pool = token_pool(rows, width) if rng.random() < 0.5 else None
    return case(
        rng.integers(0, rows, bs),
        rng.integers(0, width + 1, bs),
        rng.integers(0, 4, bs),
        rtt=rng.integers(1, 500, (rows, width)).astype(np.int32),
        window=window,
        lut=padded_lut(rng.integers(1, 10**6, 500)) if window else None,
        pool=pool,
        lens=None if pool is None else rng.integers(0, width + 1, bs),
        offset=int(rng.integers(-1, 2)),
        vcap=int(rng.integers(1, bs * width + 2)),
        wcap=wcap or bs + 2,
    )


def garbage_batch(rng, bs=None):
    """Hostile values everywhere: rows and slots out of range, negative lengths, LUT misses."""
    bs = int(rng.integers(1, 40)) if bs is None else bs
    rows, width = 5, 12
    window = int(rng.choice([0, 4]))
    return case(
        rng.integers(-3, rows + 3, bs),
        rng.integers(-5, width + 6, bs),
        rng.integers(-3, 4, bs),
        rtt=rng.integers(-4, 90, (rows, width)).astype(np.int32),
        window=window,
        lut=padded_lut(rng.integers(-3, 10**6, 60)) if window else None,
        pool=rng.integers(-9, 9, (rows - 1, width - 3)).astype(np.int32),
        lens=rng.integers(-3, width + 5, bs),
        offset=int(rng.integers(-3, 4)),
        vcap=int(rng.integers(1, 300)),
        wcap=bs + int(rng.integers(0, 5)),
    )
