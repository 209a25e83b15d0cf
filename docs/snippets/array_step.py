"""The quickstart's two steps written once for any array library (concepts/array-libraries.md).

Imported by the array_<library>.py snippets, which only say how their library holds the arrays.
"""

# --8<-- [start:step]
import numpy as np
from kvcanary_numba import (
    CanaryContext,
    FailReason,
    VerifyPlan,
    WritePlan,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)


def canary_state(to_lib):
    """Context and plans whose arrays are ``to_lib(numpy_array)``: your library's."""
    ctx = CanaryContext.allocate(num_slots=64)
    arrays = (
        "canary_buf",
        "violation_ring",
        "violation_write_index",
        "slot_run_counter",
        "kernel_run_counter",
        "enable_chain_position_assert",
    )
    ctx = ctx.replace(**{name: to_lib(getattr(ctx, name)) for name in arrays})
    vplan = VerifyPlan.allocate(verify_capacity=64).arrays()
    wplan = WritePlan.allocate(write_req_capacity=1).arrays()
    vplan = VerifyPlan(**{k: to_lib(v) for k, v in vplan.items()})
    wplan = WritePlan(**{k: to_lib(v) for k, v in wplan.items()})
    return ctx, vplan, wplan


def two_steps(to_lib, *, inputs=None, stream=None):
    """Prefill 7 tokens, corrupt the page table, decode 1; returns the context.

    ``inputs`` converts the per-step arrays (default ``to_lib``); ``stream`` is
    passed on to every launch.
    """
    inputs = inputs or to_lib
    ctx, vplan, wplan = canary_state(to_lib)
    table = np.zeros((2, 16), dtype=np.int32)
    table[1, :8] = np.arange(10, 18)  # request row 1 owns KV slots 10..17
    for prefix, extend in ((0, 7), (7, 1)):
        if prefix:
            table[1, 3] = 40  # the planted bug
        pos = np.arange(prefix, prefix + extend)
        launch_canary_plan_kernels(
            verify_plan_out=vplan,
            write_plan_out=wplan,
            req_pool_indices=inputs(np.array([1])),
            prefix_lens=inputs(np.array([prefix])),
            extend_seq_lens=inputs(np.array([extend])),
            req_to_token=inputs(table),
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=64,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
            stream=stream,
        )
        launch_canary_verify_kernel(
            context=ctx, plan=vplan, check_verify_expected_token=False, stream=stream
        )
        launch_canary_write_kernel(
            context=ctx,
            plan=wplan,
            input_ids=inputs(100 + pos),
            positions=inputs(pos),
            out_cache_loc=inputs(table[1, pos].astype(np.int64)),
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
            stream=stream,
        )
    return ctx


def ring(ctx, to_numpy) -> dict:
    """{slot: FailReason} of the rows recorded, read back with ``to_numpy``."""
    rows = to_numpy(ctx.violation_ring)[: int(to_numpy(ctx.violation_write_index)[0])]
    return {int(r[1]): FailReason(int(r[7])) for r in rows}


# --8<-- [end:step]


#: What every library's two steps must report (as the quickstart: the planted bug and its successor).
EXPECTED = {
    40: FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH,
    14: FailReason.VERIFY_CHAIN_HASH_MISMATCH,
}


def skip_without_gpu() -> None:
    """Exit cleanly (a skipped snippet) when no CUDA GPU is usable from CuPy."""
    import sys

    import kvcanary_numba

    if not kvcanary_numba.gpu_available():
        print("skipped: needs a CUDA GPU")
        sys.exit(0)
