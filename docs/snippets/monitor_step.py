"""The per-step order through CanaryMonitor (concepts/step-order.md); runs on the CPU path."""

import numpy as np
from kvcanary_numba import RealKvHashMode, RealKvSource
from kvcanary_numba.monitor import CanaryMonitor, KvGroup, StepBatch

NUM_SLOTS, BYTES, ROWS, WIDTH = 32, 32, 4, 16

# --8<-- [start:setup]
k = np.zeros((NUM_SLOTS, BYTES), dtype=np.uint8)  # K of layer 0, page_size 1
req_to_token = np.zeros((ROWS, WIDTH), dtype=np.int32)
k_source = RealKvSource(
    tensor=k, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES
)
full = KvGroup(kind="full", num_slots=NUM_SLOTS, has_v=False, k_sources=(k_source,))
monitor = CanaryMonitor(
    full=full,
    device="cpu",
    write_req_capacity=ROWS - 1,
    real_kv_hash_mode=RealKvHashMode.ALL,
    health_interval=0,
)
# --8<-- [end:setup]


def i64(values):
    return np.asarray(values, dtype=np.int64)


def forward(batch):
    """Stand-in for the attention layers: the K bytes of each new token land in its slot."""
    for token, position, slot in zip(
        batch.input_ids, batch.positions, batch.out_cache_loc
    ):
        k[slot] = (np.arange(BYTES) + token * 31 + position * 7) % 251


def step(row, prefix, tokens, slots):
    # --8<-- [start:step]
    req_to_token[row, prefix : prefix + len(slots)] = slots
    batch = StepBatch(
        req_pool_indices=i64([row]),
        prefix_lens=i64([prefix]),
        extend_seq_lens=i64([len(tokens)]),
        req_to_token=req_to_token,
        input_ids=i64(tokens),
        positions=i64(range(prefix, prefix + len(tokens))),
        out_cache_loc=i64(slots),
    )
    with monitor.forward(batch):  # pre_forward(batch): plan, HEAD verify + write
        forward(batch)  # the engine writes the new tokens' KV
    # leaving the block ran post_forward(): TAIL verify + write against the live KV
    monitor.end_step()  # readback: new violation rows are decoded (and logged)
    # --8<-- [end:step]


step(1, 0, [101, 102, 103, 104], [5, 6, 7, 8])  # prefill
step(1, 4, [105], [9])  # decode
assert monitor.violations == []

# --8<-- [start:fault]
k[6, 0] ^= 0xFF  # a stray write flips a cached K byte
step(1, 5, [106], [10])
print([(v.tag, v.slot_idx, v.position, v.reasons) for v in monitor.violations])
# [('TAIL_K_FULL', 6, 1, ('verify_real_kv_hash',))]
# --8<-- [end:fault]
assert [(v.tag, v.slot_idx, v.position) for v in monitor.violations] == [
    ("TAIL_K_FULL", 6, 1)
]
