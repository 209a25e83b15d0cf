"""Plans: the offsets, the seeds, the + 1 rule and overflow (concepts/plans.md)."""

import numpy as np
from kvcanary_numba import (
    KvCanaryError,
    VerifyPlan,
    WritePlan,
    launch_canary_plan_kernels,
    launch_plan_offsets_kernel,
)

# --8<-- [start:batch]
req_to_token = np.zeros((4, 16), dtype=np.int32)
# Row r owns slots 16r .. 16r + 15.
req_to_token[1:] = 16 * np.arange(1, 4)[:, None] + np.arange(16)
batch = dict(
    req_pool_indices=np.array([1, 2, 3]),  # three requests ...
    prefix_lens=np.array([0, 4, 10]),  # ... a prefill, two holding 4 and 10 tokens
    extend_seq_lens=np.array([8, 1, 1]),  # new tokens this step
    req_to_token=req_to_token,
    swa_window_size=0,
    full_to_swa_index_mapping=None,
    req_to_verify_expected_tokens=None,
    req_to_verify_expected_tokens_valid_lens=None,
    kv_token_id_vs_position_offset=0,
)
# --8<-- [end:batch]

# --8<-- [start:plan]
vplan = VerifyPlan.allocate(verify_capacity=64)
wplan = WritePlan.allocate(write_req_capacity=4)
launch_canary_plan_kernels(
    verify_plan_out=vplan, write_plan_out=wplan, verify_capacity=64, **batch
)
# request r writes tokens [write_offsets[r], write_offsets[r + 1]) of the step:
print(wplan.write_offsets)  # [ 0  8  9 10  0]
# the slot holding each request's last cached token (-1: nothing cached):
print(wplan.write_seed_slot_indices)  # [-1 35 57 -1]
# 0 + 4 + 10 cached tokens to re-check:
print(vplan.verify_num_valid, vplan.enable)  # [14] [1]
# --8<-- [end:plan]
assert wplan.write_offsets.tolist() == [0, 8, 9, 10, 0]
assert wplan.write_seed_slot_indices.tolist() == [-1, 35, 57, -1]
assert int(wplan.write_num_valid_reqs[0]) == 3
assert int(vplan.verify_num_valid[0]) == 14 and int(vplan.enable[0]) == 1
assert vplan.verify_slot_indices[:4].tolist() == [32, 33, 34, 35]
assert vplan.verify_prev_slot_indices[:4].tolist() == [-1, 32, 33, 34]
assert vplan.verify_expected_positions[4:14].tolist() == list(range(10))

# --8<-- [start:overflow]
small = VerifyPlan.allocate(verify_capacity=10)
launch_canary_plan_kernels(
    verify_plan_out=small, write_plan_out=wplan, verify_capacity=10, **batch
)
# 14 entries do not fit: verify skips this step
print(small.verify_num_valid, small.enable)  # [10] [0]
# --8<-- [end:overflow]
assert int(small.verify_num_valid[0]) == 10 and int(small.enable[0]) == 0
assert wplan.write_offsets.tolist() == [
    0,
    8,
    9,
    10,
    0,
]  # the write plan is complete all the same

# --8<-- [start:plus_one]
bs, capacity = 3, 4
try:
    launch_plan_offsets_kernel(
        req_pool_indices=batch["req_pool_indices"],
        prefix_lens=batch["prefix_lens"],
        extend_seq_lens=batch["extend_seq_lens"],
        req_to_token=req_to_token,
        full_to_swa_index_mapping=None,
        swa_window_size=0,
        verify_capacity=64,
        out_verify_offsets_scratch=np.zeros(bs + 1, dtype=np.int64),
        out_write_offsets=np.zeros(capacity, dtype=np.int64),  # BUG: needs capacity + 1
        out_write_seed_slot_indices=np.zeros(capacity, dtype=np.int64),
        out_verify_num_valid=np.zeros(1, dtype=np.int32),
        out_verify_enable=np.zeros(1, dtype=np.int32),
        out_write_num_valid_reqs=np.zeros(1, dtype=np.int32),
    )
except KvCanaryError as exc:
    print(exc.code)  # KVC-P002
    print(exc.entry.title)  # write_offsets length is not write_req_capacity + 1
    caught = exc
# --8<-- [end:plus_one]
assert caught.code == "KVC-P002", caught
