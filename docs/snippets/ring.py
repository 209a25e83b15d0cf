"""The violation ring: fill-once overflow and decoding rows (concepts/violation-ring.md)."""

from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    FailReason,
    VerifyPlan,
    launch_canary_verify_kernel,
)
from kvcanary_numba.constants import VIOLATION_FIELD_NAMES

# --8<-- [start:overflow]
ctx = CanaryContext.allocate(
    num_slots=16, ring_capacity=2, kernel_kind=CanaryLaunchTag.SWEEP_K_FULL
)
plan = VerifyPlan.allocate(verify_capacity=5)
plan.verify_slot_indices[:] = [1, 2, 3, 4, 5]  # never written: all-zero records
plan.verify_expected_positions[:] = 7
plan.verify_prev_slot_indices[:] = -1  # each one claims to be a chain head
plan.verify_num_valid[0] = 5
launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
print(ctx.violation_write_index[0])  # 5: every violation is counted ...
print(ctx.ring_capacity)  # 2: ... but only the first two rows are kept
# --8<-- [end:overflow]
assert int(ctx.violation_write_index[0]) == 5
assert int(ctx.kernel_run_counter[0]) == 1 and int(ctx.slot_run_counter[0]) == 5

# --8<-- [start:decode]
count = int(ctx.violation_write_index[0])
for row in ctx.violation_ring[: min(count, ctx.ring_capacity)]:
    fields = dict(zip(VIOLATION_FIELD_NAMES, (int(v) for v in row)))
    fields["kernel_kind"] = CanaryLaunchTag(fields["kernel_kind"]).name
    fields["fail_reason"] = FailReason(fields["fail_reason"]).name
    print(fields)
    # --8<-- [end:decode]
    assert fields["kernel_kind"] == "SWEEP_K_FULL"
    assert (
        fields["fail_reason"] == "VERIFY_CHAIN_HASH_MISMATCH|VERIFY_POSITION_MISMATCH"
    )
    assert (
        fields["position"] == 0 and fields["expected_token"] == -1
    )  # stored position; token unchecked
assert sorted(ctx.violation_ring[:, 1].tolist()) == [
    1,
    2,
]  # the CPU path records in entry order
