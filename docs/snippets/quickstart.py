"""Catch a planted corruption: one request, two steps.

Shown in the README, index.md and tutorials/01-quickstart. The section between the markers
is the README's quickstart, line for line (at most 15 lines, tests/test_docs.py); it keeps
SGLang's keywords and leaves out what is off or derivable.
"""

# fmt: off
# isort: off
# --8<-- [start:quickstart]
import kvcanary_numba as kc
import numpy as np
ctx = kc.CanaryContext.allocate(num_slots=64)  # slot 0: padding, never verified
vplan = kc.VerifyPlan.allocate(verify_capacity=64)  # NumPy arrays: the CPU path
wplan = kc.WritePlan.allocate(write_req_capacity=1)
req_to_token = np.array([[0] * 16, range(10, 26)], np.int32)  # row 1: KV slots 10..25
for prefix, pos in [(0, np.arange(7)), (7, np.arange(7, 8))]:  # prefill 7, decode 1
    kc.launch_canary_plan_kernels(verify_plan_out=vplan, write_plan_out=wplan,
        req_pool_indices=np.array([1]), prefix_lens=np.array([prefix]),
        extend_seq_lens=np.array([pos.size]), req_to_token=req_to_token)
    kc.launch_canary_verify_kernel(context=ctx, plan=vplan)  # checks the prefix
    kc.launch_canary_write_kernel(context=ctx, plan=wplan, input_ids=100 + pos,
        positions=pos, out_cache_loc=req_to_token[1, pos])  # stamps the new tokens
    req_to_token[1, 3] = 40  # the bug: position 3 now points at slot 40, never written
print(ctx.violation_ring[: ctx.violation_write_index[0], [1, 7]])  # slot, fail bits
# --8<-- [end:quickstart]
# isort: on
# fmt: on
# [[40  3]    slot 40: chain hash + position (1 + 2): the wrong record at the wrong place
#  [14  1]]   slot 14, the next token: its link to its predecessor is broken
F = kc.FailReason
rows = {
    int(r[1]): int(r[7]) for r in ctx.violation_ring[: ctx.violation_write_index[0]]
}
assert rows == {
    40: F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH,
    14: F.VERIFY_CHAIN_HASH_MISMATCH,
}, rows
