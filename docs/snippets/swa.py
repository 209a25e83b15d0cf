"""A sliding-window (SWA) plan: window, LUT translation, window-head predecessor (concepts/swa.md)."""

import numpy as np
from kvcanary_numba import VerifyPlan, WritePlan, launch_canary_plan_kernels

# --8<-- [start:swa]
W = 4  # attention window of the SWA layers
req_to_token = np.zeros((2, 16), dtype=np.int32)
req_to_token[1, :11] = np.arange(1, 12)  # full-pool slots of positions 0..10
lut = np.zeros(16, dtype=np.int64)  # full slot -> SWA slot; 0 = evicted / padding
lut[6:12] = [5, 3, 4, 1, 2, 6]  # positions 0..4 were evicted from the SWA pool

vplan = VerifyPlan.allocate(verify_capacity=16)
wplan = WritePlan.allocate(write_req_capacity=1)
launch_canary_plan_kernels(
    verify_plan_out=vplan,
    write_plan_out=wplan,
    req_pool_indices=np.array([1]),
    prefix_lens=np.array([10]),
    extend_seq_lens=np.array([1]),
    req_to_token=req_to_token,
    swa_window_size=W,
    full_to_swa_index_mapping=lut,
    verify_capacity=16,
    req_to_verify_expected_tokens=None,
    req_to_verify_expected_tokens_valid_lens=None,
    kv_token_id_vs_position_offset=0,
)
n = int(vplan.verify_num_valid[0])
print(vplan.verify_expected_positions[:n])  # [6 7 8 9]  the last W positions only
print(vplan.verify_slot_indices[:n])  # [3 4 1 2]  already SWA slots
print(vplan.verify_prev_slot_indices[:n])  # [5 3 4 1]: the head links to its real prev
print(wplan.write_seed_slot_indices[:1])  # [2]        SWA slot of position 9
# --8<-- [end:swa]
assert n == W
assert vplan.verify_expected_positions[:n].tolist() == [6, 7, 8, 9]
assert vplan.verify_slot_indices[:n].tolist() == [3, 4, 1, 2]
assert vplan.verify_prev_slot_indices[:n].tolist() == [5, 3, 4, 1]
assert wplan.write_seed_slot_indices[:1].tolist() == [2]
