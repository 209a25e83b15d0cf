"""Catch a planted corruption: one request, two steps (index.md, tutorials/01-quickstart)."""

# --8<-- [start:quickstart]
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

ctx = CanaryContext.allocate(num_slots=64)  # NumPy arrays: the CPU path
vplan = VerifyPlan.allocate(verify_capacity=64)
wplan = WritePlan.allocate(write_req_capacity=1)
req_to_token = np.zeros((2, 16), dtype=np.int32)  # the engine's page table
req_to_token[1, :8] = np.arange(10, 18)  # request row 1 owns KV slots 10..17


def step(prefix: int, extend: int) -> None:
    """One forward step of request row 1: plan, verify its prefix, stamp new tokens."""
    launch_canary_plan_kernels(
        verify_plan_out=vplan,
        write_plan_out=wplan,
        req_pool_indices=np.array([1]),
        prefix_lens=np.array([prefix]),
        extend_seq_lens=np.array([extend]),
        req_to_token=req_to_token,
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=vplan.verify_capacity,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    launch_canary_verify_kernel(
        context=ctx, plan=vplan, check_verify_expected_token=False
    )
    pos = np.arange(prefix, prefix + extend)
    launch_canary_write_kernel(
        context=ctx,
        plan=wplan,
        input_ids=100 + pos,
        positions=pos,
        out_cache_loc=req_to_token[1, pos].astype(np.int64),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )


step(prefix=0, extend=7)  # prefill: 7 tokens stamped into slots 10..16
req_to_token[1, 3] = 40  # the bug: position 3 now points at slot 40, never written
step(prefix=7, extend=1)  # decode: verify re-checks the 7-token prefix first
for row in ctx.violation_ring[: ctx.violation_write_index[0]]:
    print(f"slot {row[1]}: {FailReason(int(row[7])).name}")
# --8<-- [end:quickstart]
# slot 40: VERIFY_CHAIN_HASH_MISMATCH|VERIFY_POSITION_MISMATCH   (wrong record, wrong position)
# slot 14: VERIFY_CHAIN_HASH_MISMATCH                            (its predecessor link is broken)
rows = {
    int(r[1]): int(r[7]) for r in ctx.violation_ring[: ctx.violation_write_index[0]]
}
assert rows == {
    40: FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH,
    14: FailReason.VERIFY_CHAIN_HASH_MISMATCH,
}, rows
