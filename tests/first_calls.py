"""Small valid calls of every public operation and of one monitor step, for the thread tests.

Each call builds its own inputs from a seed and returns every array it may write, so that a
call made in a thread can be compared with the same call made by the NumPy specification
(:mod:`kvcanary_numba.reference`) on inputs built from the same seed. Importing this module
imports only :mod:`kvcanary_numba` and NumPy: no kernel, glue or ``numba.cuda`` module is
loaded before a test's first call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    WritePlan,
    compute_real_kv_hash,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_plan_offsets_kernel,
    scatter_req_token_ids,
)
from kvcanary_numba.reference import fingerprint, plan, scatter, verify, write

SLOTS, ROWS, WIDTH = 12, 3, 6


def _source(rng) -> RealKvSource:
    kv = rng.integers(0, 256, size=(SLOTS, 32)).astype(np.uint8)
    return RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=32, read_bytes=32)


def _context(rng, *, chain_flag: bool) -> CanaryContext:
    buf = rng.integers(0, 256, size=(SLOTS, 32)).astype(np.uint8)
    return CanaryContext(
        canary_buf=buf,
        kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
        violation_ring=np.zeros((16, 8), np.int64),
        violation_write_index=np.zeros(1, np.int32),
        slot_run_counter=np.zeros(1, np.int64),
        kernel_run_counter=np.zeros(1, np.int64),
        real_kv_sources=(_source(rng),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        enable_chain_position_assert=np.ones(1, np.int32) if chain_flag else None,
    )


#: What a verify or write may change: its context's buffer, ring and counters.
CONTEXT_OUTPUTS = [
    f"context.{name}"
    for name in ("canary_buf", "violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter")
]


def _batch(rng) -> dict:
    # Lengths differ from seed to seed, so that two calls sharing launch scratch would show it.
    rtt = rng.integers(1, SLOTS, size=(ROWS, WIDTH)).astype(np.int32)
    prefix, extend = rng.integers(0, 4, size=2), rng.integers(0, 3, size=2)
    return dict(
        req_pool_indices=np.array([1, 2], np.int64), prefix_lens=prefix, extend_seq_lens=extend, req_to_token=rtt
    )


def _scatter(rng) -> tuple[dict, dict]:
    kw = dict(
        flat_in=rng.integers(0, 100, size=6).astype(np.int64),
        offsets=np.array([0, 4, 6], np.int64),
        req_pool_indices=np.array([2, 0], np.int64),
        pool_out=np.full((ROWS, WIDTH), -1, np.int32),
    )
    return kw, ["pool_out"]


def _fingerprint(rng) -> tuple[dict, dict]:
    kw = dict(
        real_kv_sources=(_source(rng),),
        real_kv_hash_mode=RealKvHashMode.ALL,
        slot_indices=np.array([-1, 0, 3, SLOTS - 1, SLOTS], np.int64),
        out=np.full(5, -7, np.int64),
    )
    return kw, ["out"]


def _offsets(rng) -> tuple[dict, dict]:
    outs = dict(
        out_verify_offsets_scratch=np.full(3, -7, np.int64),
        out_write_offsets=np.full(3, -7, np.int64),
        out_write_seed_slot_indices=np.full(2, -7, np.int64),
        out_verify_num_valid=np.full(1, -7, np.int32),
        out_verify_enable=np.full(1, -7, np.int32),
        out_write_num_valid_reqs=np.full(1, -7, np.int32),
    )
    kw = dict(**_batch(rng), **outs, full_to_swa_index_mapping=None, swa_window_size=0, verify_capacity=8)
    return kw, list(outs)


def _plan(rng) -> tuple[dict, dict]:
    vplan, wplan = VerifyPlan.allocate(verify_capacity=8), WritePlan.allocate(write_req_capacity=2)
    for array in (*vplan.arrays().values(), *wplan.arrays().values()):
        array[...] = -7
    kw = dict(
        verify_plan_out=vplan,
        write_plan_out=wplan,
        **_batch(rng),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=8,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    return kw, [f"verify_plan_out.{k}" for k in vplan.arrays()] + [f"write_plan_out.{k}" for k in wplan.arrays()]


def _verify(rng) -> tuple[dict, dict]:
    ctx = _context(rng, chain_flag=False)
    i64 = lambda values: np.array(values, np.int64)  # noqa: E731
    vplan = VerifyPlan(
        verify_slot_indices=i64([1, 2, 3, 5]),
        verify_expected_tokens=i64([-1, 4, -1, 9]),
        verify_expected_positions=i64([0, 1, 2, 0]),
        verify_prev_slot_indices=i64([-1, 1, 0, -1]),
        verify_num_valid=np.array([4], np.int32),
        enable=np.array([1], np.int32),
    )
    return dict(context=ctx, plan=vplan, check_verify_expected_token=True), CONTEXT_OUTPUTS


def _write(rng) -> tuple[dict, dict]:
    ctx = _context(rng, chain_flag=True)
    i64 = lambda values: np.array(values, np.int64)  # noqa: E731
    wplan = WritePlan(
        write_offsets=i64([0, 1, 3]), write_seed_slot_indices=i64([-1, 2]), write_num_valid_reqs=np.array([2], np.int32)
    )
    kw = dict(
        context=ctx,
        plan=wplan,
        input_ids=i64([7, 8, 9]),
        positions=i64([0, 1, 2]),
        out_cache_loc=i64([6, 7, 8]),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    return kw, CONTEXT_OUTPUTS


#: name -> (inputs builder, public call, the NumPy specification of the call).
CALLS: dict[str, tuple[Callable, Callable, Callable]] = {
    "scatter": (_scatter, scatter_req_token_ids, scatter.scatter_req_token_ids),
    "fingerprint": (_fingerprint, compute_real_kv_hash, fingerprint.compute_real_kv_hash),
    "plan_offsets": (_offsets, launch_plan_offsets_kernel, plan.launch_plan_offsets_kernel),
    "plan": (_plan, launch_canary_plan_kernels, plan.launch_canary_plan_kernels),
    "verify": (_verify, launch_canary_verify_kernel, verify.launch_canary_verify_kernel),
    "write": (_write, launch_canary_write_kernel, write.launch_canary_write_kernel),
}


def _resolve(kw: dict, path: str):
    first, *rest = path.split(".")
    value = kw[first]
    for name in rest:
        value = getattr(value, name)
    return value


def on_device(value, device: str = "cuda"):
    """``value`` with every NumPy array in it (dataclass fields, tuple items) copied to the GPU: CuPy
    arrays (``device`` "cuda") or Numba device arrays ("numba")."""
    if isinstance(value, np.ndarray):
        if device == "numba":
            from numba import cuda

            return cuda.to_device(value)
        import cupy

        return cupy.asarray(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value, **{f.name: on_device(getattr(value, f.name), device) for f in dataclasses.fields(value)}
        )
    if isinstance(value, tuple):
        return tuple(on_device(item, device) for item in value)
    return value


def public_call(name: str, seed: int, backend: str, *, device: str = "cpu") -> dict:
    """Make the public call ``name`` on inputs of ``seed`` (GPU copies with ``device`` "cuda" or
    "numba": :func:`on_device`); returns the arrays it may write, by path."""
    build, call, _ = CALLS[name]
    kw, paths = build(np.random.default_rng(seed))
    if device != "cpu":
        kw = {key: on_device(value, device) for key, value in kw.items()}
    call(**kw, backend=backend)
    return {path: _resolve(kw, path) for path in paths}


def specified(name: str, seed: int) -> dict:
    """What the NumPy specification writes for the same inputs."""
    build, _, spec = CALLS[name]
    kw, paths = build(np.random.default_rng(seed))
    spec(**kw)
    return {path: _resolve(kw, path) for path in paths}


def differences(got: dict, want: dict) -> list[str]:
    """Paths of the arrays that differ (ring rows compared as a multiset: kernels append in any order)."""
    bad = []
    for key, array in got.items():
        host = array.copy_to_host() if hasattr(array, "copy_to_host") else array
        a, b = np.asarray(host.get() if hasattr(host, "get") else host), np.asarray(want[key])
        if key.endswith("violation_ring"):
            same = sorted(map(tuple, a.tolist())) == sorted(map(tuple, b.tolist()))
        else:
            same = a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
        if not same:
            bad.append(key)
    return bad
