"""Garbage in, no out-of-bounds access: every kernel on corrupted device values (GPU).

Run under ``compute-sanitizer --tool memcheck`` (``benchmarks/gpu_session.sh``
does); expect "ERROR SUMMARY: 0 errors". Values inside device arrays are never
validated on the host (docs/concepts/semantics.md): the kernels must turn
out-of-range slots, predecessors, seeds, ranges, counts, request rows and LUT
entries into violation rows or sentinels. This script feeds them exactly that,
through the public functions, through a monitor step, and through prepared
(raw ``cuLaunchKernel``) launches, which also checks their packed parameters.
Sizes are small: memcheck slows kernels down a hundredfold.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from kvcanary_numba import (  # noqa: E402
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
    scatter_req_token_ids,
)
from kvcanary_numba.fast.prepared import PreparedLaunch  # noqa: E402
from kvcanary_numba.fast.recording import recording  # noqa: E402

try:  # a GPU with CuPy; else NumPy arrays through the kernels under NUMBA_ENABLE_CUDASIM=1 (a dry run)
    import cupy as cp

    cp.cuda.runtime.getDeviceCount()
    BACKEND = "auto"
except Exception:  # noqa: BLE001 - no GPU here
    cp, BACKEND = np, "cuda"

DEVICE = "cpu" if cp is np else "cuda"
SLOTS, ROWS, WIDTH, CAPACITY, BS, TOKENS = (257, 9, 40, 512, 8, 64) if cp is not np else (67, 5, 12, 48, 4, 16)
rng = np.random.default_rng(7)


def host(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


def sync() -> None:
    if cp is not np:
        cp.cuda.get_current_stream().synchronize()


I64 = np.iinfo(np.int64)


def garbage(n: int, *, low: int = -(1 << 40), high: int = 1 << 40, dtype=np.int64):
    """Mostly wild values, some in range, some at the int64 extremes."""
    values = rng.integers(low, high, n, dtype=np.int64)
    values[::5] = rng.integers(0, SLOTS, values[::5].shape[0])
    values[1::7] = I64.max
    values[2::11] = I64.min
    return cp.asarray(values.astype(dtype))


def context(mode: RealKvHashMode) -> CanaryContext:
    source = RealKvSource(
        tensor=cp.asarray(rng.integers(0, 256, (SLOTS, 64), dtype=np.uint8)),
        page_size=1,
        num_bytes_per_token=64,
        read_bytes=64,
    )
    buf = cp.asarray(rng.integers(0, 256, (SLOTS, 32), dtype=np.uint8))  # garbage records too
    return CanaryContext(
        canary_buf=buf,
        kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
        violation_ring=cp.zeros((16, 8), dtype=np.int64),
        violation_write_index=cp.zeros(1, dtype=np.int32),
        slot_run_counter=cp.zeros(1, dtype=np.int64),
        kernel_run_counter=cp.zeros(1, dtype=np.int64),
        real_kv_sources=(source,) if mode else (),
        real_kv_hash_mode=mode,
        enable_chain_position_assert=cp.ones(1, dtype=np.int32),
    )


def garbage_plans():
    vplan = VerifyPlan(
        verify_slot_indices=garbage(CAPACITY),
        verify_expected_tokens=garbage(CAPACITY),
        verify_expected_positions=garbage(CAPACITY),
        verify_prev_slot_indices=garbage(CAPACITY),
        verify_num_valid=cp.asarray([1 << 30], dtype=np.int32),
        enable=cp.ones(1, dtype=np.int32),
    )
    wplan = WritePlan(
        write_offsets=garbage(BS + 1, low=-100, high=2 * TOKENS),
        write_seed_slot_indices=garbage(BS),
        write_num_valid_reqs=cp.asarray([1 << 30], dtype=np.int32),
    )
    return vplan, wplan


def run_ops(mode: RealKvHashMode, counts: dict) -> None:
    ctx = context(mode)
    vplan, wplan = garbage_plans()
    tokens = dict(input_ids=garbage(TOKENS), positions=garbage(TOKENS), out_cache_loc=garbage(TOKENS))
    for check in (False, True):
        launch_canary_verify_kernel(context=ctx, plan=vplan, check_verify_expected_token=check, backend=BACKEND)
    for asserted in (False, True):
        expected = (
            dict(expected_input_tokens=garbage(TOKENS), expected_input_positions=garbage(TOKENS))
            if asserted
            else dict(expected_input_tokens=None, expected_input_positions=None)
        )
        launch_canary_write_kernel(
            context=ctx, plan=wplan, enable_write_input_assert=asserted, **tokens, **expected, backend=BACKEND
        )
    out = cp.zeros(TOKENS, dtype=np.int64)
    compute_real_kv_hash(
        real_kv_sources=ctx.real_kv_sources,
        real_kv_hash_mode=mode,
        slot_indices=garbage(TOKENS),
        out=out,
        backend=BACKEND,
    )
    # The same verify and write again as prepared launches (raw cuLaunchKernel, packed parameters).
    with recording() as rec:
        launch_canary_verify_kernel(context=ctx, plan=vplan, check_verify_expected_token=True, backend=BACKEND)
        launch_canary_write_kernel(
            context=ctx,
            plan=wplan,
            enable_write_input_assert=False,
            **tokens,
            expected_input_tokens=None,
            expected_input_positions=None,
            backend=BACKEND,
        )
    for spec in rec.launches:
        PreparedLaunch.from_spec(spec).launch()
    sync()
    counts[f"rows mode={int(mode)}"] = int(host(ctx.violation_write_index)[0])


def run_plan(counts: dict, lut: bool) -> None:
    table = garbage(ROWS * WIDTH, low=-(1 << 31), high=1 << 31).astype(np.int32).reshape(ROWS, WIDTH)
    vplan = VerifyPlan.allocate(verify_capacity=CAPACITY, device=DEVICE)
    wplan = WritePlan.allocate(write_req_capacity=BS, device=DEVICE)
    mapping = garbage(SLOTS + 1) if lut else None
    if mapping is not None:
        mapping[0] = 0  # padding slot 0 maps to 0 (KVC-P008 on host LUTs); the rest stays garbage
    for prefix in (garbage(BS, low=-50, high=3 * WIDTH), cp.full(BS, 1 << 40, dtype=np.int64)):
        launch_canary_plan_kernels(
            verify_plan_out=vplan,
            write_plan_out=wplan,
            req_pool_indices=garbage(BS, low=-3, high=ROWS + 3),
            prefix_lens=prefix,
            extend_seq_lens=garbage(BS, low=-5, high=WIDTH),
            req_to_token=table,
            swa_window_size=4 if lut else 0,
            full_to_swa_index_mapping=mapping,
            verify_capacity=CAPACITY,
            req_to_verify_expected_tokens=cp.zeros((ROWS, WIDTH), dtype=np.int32),
            req_to_verify_expected_tokens_valid_lens=garbage(BS, low=-10, high=4 * WIDTH),
            kv_token_id_vs_position_offset=1,
            backend=BACKEND,
        )
        # Verify and write whatever the garbage plan says (sentinels included).
        ctx = context(RealKvHashMode.ALL)
        launch_canary_verify_kernel(context=ctx, plan=vplan, check_verify_expected_token=True, backend=BACKEND)
        launch_canary_write_kernel(
            context=ctx,
            plan=wplan,
            input_ids=garbage(TOKENS),
            positions=garbage(TOKENS),
            out_cache_loc=garbage(TOKENS),
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
            backend=BACKEND,
        )
    sync()
    counts[f"plan lut={lut} num_valid"] = int(host(vplan.verify_num_valid)[0])


def run_scatter(counts: dict) -> None:
    pool = cp.zeros((ROWS, WIDTH), dtype=np.int32)
    scatter_req_token_ids(
        flat_in=garbage(TOKENS),
        offsets=garbage(BS + 1, low=-20, high=2 * TOKENS),
        req_pool_indices=garbage(BS, low=-3, high=ROWS + 3),
        pool_out=pool,
        backend=BACKEND,
    )
    sync()
    counts["scatter nonzero"] = int(np.count_nonzero(host(pool)))


def main() -> int:
    counts: dict = {}
    for mode in (RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL):
        run_ops(mode, counts)
    run_plan(counts, lut=False)
    run_plan(counts, lut=True)
    run_scatter(counts)
    for key, value in counts.items():
        print(f"{key}: {value}")
    print("sanitizer_check: all launches completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
