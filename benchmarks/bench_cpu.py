"""CPU comparisons (no GPU needed): the NumPy path of the public verify (the optimised CPU
path, ``kvcanary_numba.fast.cpu``) against a per-entry Python loop, and the host cost of
argument validation on the public path."""

from __future__ import annotations

import time
import timeit

import numpy as np

from kvcanary_numba import RealKvHashMode, launch_canary_verify_kernel
from kvcanary_numba._validate import check_array

from .baselines import cupy_verify, python_verify
from .timing import host_times
from .workloads import verify_case

__all__ = ["cpu_verify", "validation_cost"]


def cpu_verify(run) -> None:
    """Verify of 1 M entries (64 k with --quick): the public call on NumPy arrays vs the Python loop.

    The loop runs on a sample of entries and is extrapolated linearly (it is
    per-entry by construction); the sample size is recorded.
    """
    entries = 1 << 16 if run.quick else 1 << 20
    sample = 2000 if run.quick else 20000
    for name, mode in (("NONE", RealKvHashMode.NONE), ("PARTIAL", RealKvHashMode.PARTIAL)):
        if not run.deadline.allows(20):
            run.skip("cpu verify", name)
            continue
        ctx, plan, _ = verify_case(np, entries=entries, mode=mode, bytes_per_token=64)
        result = host_times(
            lambda _: launch_canary_verify_kernel(
                context=ctx, plan=plan, check_verify_expected_token=False, backend="numpy"
            ),
            iters=1 if run.quick else 3,
            warmup=1,
        )
        t0 = time.perf_counter()
        loop_bad = python_verify(ctx, plan, sample)
        per_entry_us = (time.perf_counter() - t0) * 1e6 / sample
        arrays_bad = int(cupy_verify(np, ctx, plan, entries).sum())  # the array-ops baseline, on NumPy
        clean = int(ctx.violation_write_index[0]) == 0 and loop_bad == 0 and arrays_bad == 0
        loop_us = per_entry_us * entries
        run.add({"op": "cpu verify", "variant": f"{name} NumPy path", "entries": entries, **result, "clean": clean})
        run.add(
            {
                "op": "cpu verify",
                "variant": f"{name} Python loop (extrapolated)",
                "entries": entries,
                "median_us": round(loop_us, 1),
                "sample_entries": sample,
                "per_entry_us": round(per_entry_us, 3),
                "speedup": round(loop_us / result["median_us"], 1),
                "clean": clean,
            }
        )


def validation_cost(run) -> None:
    """Host µs of ``check_array`` and of a whole public verify call on a 1-entry NumPy plan."""
    a = np.zeros(256, dtype=np.int64)
    n = 2000 if run.quick else 20000
    per = min(timeit.repeat(lambda: check_array("f", "a", a, dtype=np.int64, ndim=1), number=n, repeat=3)) / n
    run.add({"op": "validation", "variant": "check_array (NumPy)", "n": 1, "median_us": round(per * 1e6, 3)})
    ctx, plan, _ = verify_case(np, entries=1, mode=RealKvHashMode.PARTIAL, bytes_per_token=64)
    result = host_times(
        lambda _: launch_canary_verify_kernel(
            context=ctx, plan=plan, check_verify_expected_token=False, backend="numpy"
        ),
        iters=n // 20,
        warmup=10,
    )
    run.add({"op": "validation", "variant": "public verify call, 1 entry (NumPy)", "n": 1, **result})
