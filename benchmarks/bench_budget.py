"""Budgeted verification against full verification: per-step device time of decode steps (GPU).

A decode step of ``bs`` requests with ``prefix`` tokens each verifies ``bs x prefix``
entries in full mode. In budget mode (:mod:`kvcanary_numba.monitor.budget`) the
step first compacts the entries due at this step (one selection launch per group),
then verifies those (about ``1 / K`` of them, at most ``bs x ceil(prefix / K)``).
Both are timed as the TAIL K launch of one FULL group (ALL and NONE fingerprint
modes); the selection cost is paid once per group and step, shared by the group's
HEAD and TAIL, K and V verifies, so ``select`` is also reported on its own.
"""

from __future__ import annotations

import numpy as np

from kvcanary_numba import VerifyPlan, launch_canary_verify_kernel

# Monitor internals (the budget's selection): re-check after the monitor composition merge.
from kvcanary_numba.monitor.budget import seeded_affine, select_verify_entries

from .bench_kernels import KV_BYTES, MODES, _free, verify_bytes
from .timing import device_times
from .workloads import verify_case

__all__ = ["SIZES", "PERIODS", "budget_sweep", "budget_entries"]

#: Decode shapes (requests, prefix tokens per request).
SIZES = {"quick": [(16, 4096)], "full": [(256, 4096), (256, 32768)]}
#: Periods K compared against full verification.
PERIODS = {"quick": [4], "full": [2, 8, 32, 128]}


def budget_entries(requests: int, prefix: int, period: int) -> int:
    """Upper bound of the entries one budgeted step verifies: ``ceil(prefix / K)`` per request."""
    return requests * -(-prefix // period)


def budget_sweep(run) -> None:
    for requests, prefix in SIZES[run.mode]:
        for name in ("ALL", "NONE"):
            run.case(
                "budget",
                f"{name} {requests}x{prefix}",
                lambda: _budget(run, name, requests, prefix),
                reserve=60,
                cleanup=_free,
            )


def _budget(run, name: str, requests: int, prefix: int) -> None:
    import cupy

    mode, entries = MODES[name], requests * prefix
    ctx, plan, _ = verify_case(cupy, entries=entries, mode=mode, bytes_per_token=KV_BYTES, chain_len=prefix)
    shape = {"entries": entries, "requests": requests, "prefix": prefix}

    def full(_):
        launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)

    result = device_times(full, iters=run.iters, host_us=150)
    run.add(
        {
            "op": "budget",
            "variant": f"{name} full verify",
            **shape,
            **result,
            "bytes": verify_bytes(entries, mode),
            "period": 1,
        }
    )
    out = VerifyPlan.allocate(verify_capacity=entries, device="cuda")
    step, scratch = cupy.zeros(1, dtype=np.int64), cupy.zeros(2, dtype=np.int64)
    for period in PERIODS[run.mode]:
        a, c = seeded_affine(period, 0)

        def select(_):
            select_verify_entries(
                plan=plan, out_plan=out, step=step, scratch=scratch, period=period, multiplier=a, offset=c
            )
            cupy.add(step, 1, out=step)  # the monitor's end_step advance

        def budgeted(i):
            select(i)
            launch_canary_verify_kernel(context=ctx, plan=out, check_verify_expected_token=False)

        sel = device_times(select, iters=run.iters, host_us=100)
        both = device_times(budgeted, iters=run.iters, host_us=200)
        selected = int(out.verify_num_valid.get()[0])
        bound = budget_entries(requests, prefix, period)
        assert selected <= bound, f"selection of {selected} entries exceeds the bound {bound}"
        common = {**shape, "period": period, "selected": selected, "bound": bound}
        run.add({"op": "budget", "variant": f"{name} K={period} select", **common, **sel})
        run.add(
            {
                "op": "budget",
                "variant": f"{name} K={period} select + verify",
                **common,
                **both,
                "bytes": verify_bytes(selected, mode),
                "vs_full": round(both["median_us"] / result["median_us"], 3),
            }
        )
    rows = int(ctx.violation_write_index.get()[0])
    assert rows == 0, f"clean budget benchmark recorded {rows} violation rows"
