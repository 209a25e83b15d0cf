"""Allocating plans and a launch context (concepts/plans.md)."""

from kvcanary_numba import CanaryContext, VerifyPlan, WritePlan

# --8<-- [start:allocate]
NUM_KV_SLOTS = 4096  # rows of the KV pool, slot 0 included
MAX_BATCH = 256  # most requests one forward step can carry

context = CanaryContext.allocate(num_slots=NUM_KV_SLOTS)  # device="cuda" for CuPy
# 3 x the pool: SGLang's sizing rule (shared prefixes can sum past the pool)
verify_plan = VerifyPlan.allocate(verify_capacity=3 * NUM_KV_SLOTS)
write_plan = WritePlan.allocate(write_req_capacity=MAX_BATCH)

print(write_plan.write_offsets.shape)  # (257,): one more than requests
print(write_plan.write_seed_slot_indices.shape)  # (256,)
# --8<-- [end:allocate]
assert write_plan.write_offsets.shape == (MAX_BATCH + 1,)
assert write_plan.write_seed_slot_indices.shape == (MAX_BATCH,)
assert verify_plan.verify_capacity == 3 * NUM_KV_SLOTS
assert context.canary_buf.shape == (NUM_KV_SLOTS, 32)
assert context.violation_ring.shape == (1024, 8)
