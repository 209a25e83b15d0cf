"""Moved KV and its records: a host tier round trip, a monitor (concepts/moves.md)."""

import logging
import warnings

import numpy as np
from kvcanary_numba import (
    CanaryContext,
    CanaryMonitor,
    HandoffDigest,
    HandoffSignature,
    KvGroup,
    RealKvHashMode,
    RealKvSource,
    StepBatch,
    WritePlan,
    check_handoff_digest,
    compute_handoff_digest,
    gather_canary_records,
    launch_canary_write_kernel,
    scatter_canary_records,
    verify_canary_records,
)
from kvcanary_numba.engine import EngineConfig, EnginePair, ToyEngine
from kvcanary_numba.monitor import CanaryBlindSpotWarning

warnings.simplefilter("ignore", CanaryBlindSpotWarning)
rng = np.random.default_rng(0)
BYTES = 64  # KV bytes per token of the one layer the canary reads


def pool(num_slots):
    """A canary context over one KV layer (ALL mode): a pool, or a host copy."""
    kv = np.zeros((num_slots, BYTES), dtype=np.uint8)
    src = RealKvSource(
        tensor=kv, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES
    )
    ctx = CanaryContext.allocate(
        num_slots=num_slots,
        real_kv_sources=(src,),
        real_kv_hash_mode=RealKvHashMode.ALL,
    )
    return ctx, kv


def rows(ctx):
    """(slot, fail bits) of the violation rows recorded so far."""
    n = int(ctx.violation_write_index[0])
    return [(int(r[1]), int(r[7])) for r in ctx.violation_ring[:n]]


# A request of 6 tokens whose KV sits in device slots 3..8, its records stamped by the
# write kernel (a monitor does this every step: the last section).
device, device_kv = pool(32)
device_slots = np.arange(3, 9, dtype=np.int64)
device_kv[device_slots] = rng.integers(0, 256, (6, BYTES), dtype=np.uint8)
wplan = WritePlan.allocate(write_req_capacity=1)
wplan.write_offsets[:] = [0, 6]
wplan.write_seed_slot_indices[0] = -1
wplan.write_num_valid_reqs[0] = 1
launch_canary_write_kernel(
    context=device,
    plan=wplan,
    input_ids=np.array([11, 12, 13, 14, 15, 16]),
    positions=np.arange(6),
    out_cache_loc=device_slots,
    enable_write_input_assert=False,
    expected_input_tokens=None,
    expected_input_positions=None,
)

# --8<-- [start:offload]
host, host_kv = pool(64)  # the host tier: its canary rows are its KV slots
host_slots = np.arange(40, 46, dtype=np.int64)
one_run = np.array([0, 6], dtype=np.int64)  # one request: entries 0..6

# Departure: the records (checked against the KV as they go) and their digest, in one
# pass; then the KV, and the records into the host copy's canary buffer.
sent = np.zeros(1, dtype=np.int64)
pack = np.zeros((6, 32), dtype=np.uint8)
compute_handoff_digest(
    context=device,
    slot_indices=device_slots,
    run_offsets=one_run,
    out_digests=sent,
    out_records=pack,  # also the gather: gather_canary_records, then the digest
)
host_kv[host_slots] = device_kv[device_slots]
scatter_canary_records(context=host, records=pack, slot_indices=host_slots)
# --8<-- [end:offload]

# --8<-- [start:rest]
host_kv[42, 50] ^= 0x04  # a bit flips in host memory while the copy rests
verify_canary_records(
    context=host,
    slot_indices=host_slots,
    run_offsets=one_run,
    run_start_positions=np.array([0]),
    run_prev_slots=np.array([-1]),  # the run starts its chain
)
print(rows(host))  # [(42, 4)]: the KV of host slot 42 no longer matches its record
host_kv[42, 50] ^= 0x04
# --8<-- [end:rest]
assert rows(host) == [(42, 4)]

# --8<-- [start:reload]
page_table = np.array([20, 21, 22, 23, 24, 25], dtype=np.int64)  # new device slots
device_kv[page_table] = host_kv[host_slots]
gather_canary_records(context=host, slot_indices=host_slots, out_records=pack)
scatter_canary_records(context=device, records=pack, slot_indices=page_table)
verify_canary_records(  # at once, on the slots the page table lists
    context=device,
    slot_indices=page_table,
    run_offsets=one_run,
    run_start_positions=np.array([0]),
    run_prev_slots=np.array([-1]),
)
landed = np.zeros(1, dtype=np.int64)
compute_handoff_digest(
    context=device, slot_indices=page_table, run_offsets=one_run, out_digests=landed
)
signature = HandoffSignature.of(device)
intact = check_handoff_digest(
    HandoffDigest(signature=signature, digests=sent),
    HandoffDigest(signature=signature, digests=landed),
    on_mismatch="miss",
)
print(rows(device), intact)  # [] [ True]: landed where the page table says, unchanged
# --8<-- [end:reload]
assert rows(device) == [] and intact.tolist() == [True]

# --8<-- [start:monitor]
k = np.zeros((16, BYTES), dtype=np.uint8)
k_src = RealKvSource(tensor=k, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES)
group = KvGroup(kind="full", num_slots=16, has_v=False, k_sources=(k_src,))
monitor = CanaryMonitor(
    full=group, write_req_capacity=1, mode="raise", health_interval=0
)
req_to_token = np.zeros((2, 8), dtype=np.int32)
req_to_token[1, :4] = [3, 4, 5, 6]
step = StepBatch(
    req_pool_indices=np.array([1]),
    prefix_lens=np.array([0]),
    extend_seq_lens=np.array([4]),
    req_to_token=req_to_token,
    input_ids=np.array([7, 8, 9, 10]),
    positions=np.arange(4),
    out_cache_loc=np.array([3, 4, 5, 6]),
)
with monitor.forward(step):
    k[3:7] = rng.integers(0, 256, (4, BYTES), dtype=np.uint8)  # the forward writes KV
monitor.end_step()

# Between steps: the request moves to slots 10..13 (KV first, then its records).
old, new = np.array([3, 4, 5, 6]), np.array([10, 11, 12, 13])
moved = monitor.take_records(
    old
)  # every canary buffer's records, checked as they leave
k[new] = k[old]
monitor.put_records(moved, new)  # checked against the KV where they land
req_to_token[1, :4] = new
monitor.verify_records(new, np.array([0, 4]), np.array([0]), np.array([-1]))
monitor.end_step()  # rows of the move come back here, as SWEEP rows
print(monitor.violations)  # []
# --8<-- [end:monitor]
assert monitor.violations == []

# The rows are counted below; the monitor's log line per row stays quiet.
logging.getLogger("kvcanary_numba.monitor").setLevel(logging.ERROR)

# --8<-- [start:toy-engine]
# A host tier (on with a transit fault): two pages swapped on a reload, step 4 or later.
engine = ToyEngine(EngineConfig(seed=1), faults={"pages_swapped": 4})
engine.attach_monitor(mode="log")
engine.run(12)
first = engine.catches()["pages_swapped"][0]
print(engine.host_tier.reloads, first.step, first.tag)  # 2 4 SWEEP_K_FULL

# A prefill -> decode pair, a byte of one hand-off's KV changed on the way.
pair = EnginePair(EngineConfig(seed=1), fault="host_bit_flip", mode="log")
pair.run(16)
print(len(pair.handoffs), len(pair.misses))  # 15 1: its digest differed, a cache miss
# --8<-- [end:toy-engine]
assert (engine.host_tier.reloads, first.step, first.tag) == (2, 4, "SWEEP_K_FULL")
assert (len(pair.handoffs), len(pair.misses)) == (15, 1)
assert pair.faults[0].caught_by(pair.monitors[1].violations[0])
