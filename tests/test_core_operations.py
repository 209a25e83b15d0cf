"""The core operations on their own: the functions of ``kvcanary_numba.verify`` and its siblings,
with no fast wing (no validation memo, no raw launches, no optimised CPU path).

The rest of the suite runs the package's top-level names (the fast wing's wrappers). Here the
golden vectors replay through the core functions on every backend (the NumPy specification, the
kernels under the simulator and on a GPU), and the core and the fast wing give the same bytes
for the same calls, so the core is complete on its own.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from canary_helpers import make_context, verify_plan, write_args, write_plan
from helpers import raises_code
from vectors import Ops, replay, scenario_paths, vectors_folder

import kvcanary_numba
from kvcanary_numba import fingerprint, plan, scatter, verify, write
from kvcanary_numba.fast import calls

SCENARIOS = [path.name for path in scenario_paths(vectors_folder())]


def _core_ops(name: str, backend: str, **extra) -> Ops:
    return Ops(
        name=name,
        plan=functools.partial(plan.launch_canary_plan_kernels, backend=backend),
        verify=functools.partial(verify.launch_canary_verify_kernel, backend=backend),
        write=functools.partial(write.launch_canary_write_kernel, backend=backend),
        **extra,
    )


CORE_SPEC = _core_ops("core numpy", "numpy")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("numpy", id="specification"),
        pytest.param("simulator", id="simulator", marks=pytest.mark.simulator),
        pytest.param("gpu", id="gpu", marks=pytest.mark.gpu),
    ],
)
def test_golden_vectors_replay_through_the_core_operations(vectors_dir, backend, scenario):
    if backend == "numpy":
        ops, oracle = CORE_SPEC, None
    elif backend == "simulator":
        if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            pytest.skip("the kernels on NumPy arrays run only under NUMBA_ENABLE_CUDASIM=1")
        ops, oracle = _core_ops("core simulator", "cuda", sequential=False), CORE_SPEC
    else:
        import cupy

        ops = _core_ops(
            "core gpu", "auto", device="cuda", to_device=cupy.asarray, to_host=cupy.asnumpy, sequential=False
        )
        oracle = CORE_SPEC
    assert replay(vectors_dir / scenario, ops, oracle) >= 1


def test_the_facade_exports_the_fast_wing_and_the_core_keeps_its_own():
    for name in (
        "launch_canary_plan_kernels",
        "launch_plan_offsets_kernel",
        "launch_canary_verify_kernel",
        "launch_canary_write_kernel",
        "scatter_req_token_ids",
        "compute_real_kv_hash",
    ):
        public = getattr(kvcanary_numba, name)
        assert public is getattr(calls, name)
        core = public.__wrapped__  # functools.wraps: the core function, whose docstring and signature it shows
        assert core.__module__.startswith("kvcanary_numba.") and core is not public
        assert public.__doc__ == core.__doc__


def _random_step(rng, num_slots=64):
    lengths = [int(n) for n in rng.integers(1, 6, 3)]
    seeds = [-1, int(rng.integers(1, num_slots)), -1]
    slots = rng.permutation(np.arange(1, num_slots))[: sum(lengths)]
    tokens, positions = rng.integers(0, 1000, sum(lengths)), np.arange(sum(lengths))
    return write_plan(lengths, seeds), tokens, positions, slots


@pytest.mark.parametrize("seed", range(3))
def test_core_and_fast_write_then_verify_the_same_bytes(seed):
    rng = np.random.default_rng(seed)
    wplan, tokens, positions, slots = _random_step(rng)
    args = write_args(wplan, tokens, positions, slots)
    contexts = {"core": make_context(64), "fast": make_context(64)}
    for name, ctx in contexts.items():
        run = write.launch_canary_write_kernel if name == "core" else kvcanary_numba.launch_canary_write_kernel
        run(context=ctx, **args)
        vplan = verify_plan(list(slots[:5]), list(positions[:5]), [-1, *slots[:4]], capacity=8)
        check = verify.launch_canary_verify_kernel if name == "core" else kvcanary_numba.launch_canary_verify_kernel
        check(context=ctx, plan=vplan, check_verify_expected_token=False)
    core, fast = contexts["core"], contexts["fast"]
    for field in ("canary_buf", "violation_ring", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        np.testing.assert_array_equal(getattr(core, field), getattr(fast, field), err_msg=field)


def test_core_operations_raise_the_same_codes():
    ctx, vplan = make_context(8), verify_plan([1], [0], [-1], capacity=4)
    for function in (verify.launch_canary_verify_kernel, kvcanary_numba.launch_canary_verify_kernel):
        with raises_code("KVC-C010"):
            function(context=ctx, plan=vplan, check_verify_expected_token=1)
        with raises_code("KVC-C016"):
            function(context=ctx, plan=vplan, check_verify_expected_token=False, stream=-3)
    out = np.zeros(2, np.int64)
    for function in (fingerprint.compute_real_kv_hash, kvcanary_numba.compute_real_kv_hash):
        with raises_code("KVC-C017"):  # ``out`` is the slots themselves
            function(real_kv_sources=(), real_kv_hash_mode=0, slot_indices=out, out=out)
    pool = np.zeros((2, 4), np.int32)
    for function in (scatter.scatter_req_token_ids, kvcanary_numba.scatter_req_token_ids):
        with raises_code("KVC-S001"):
            function(
                flat_in=np.zeros(3, np.int64),
                offsets=np.zeros(3, np.int64),
                req_pool_indices=np.zeros(1, np.int64),
                pool_out=pool,
            )
