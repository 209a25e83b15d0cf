"""Ranks of one job combining their verdict words (concepts/ranks.md); runs on the CPU path.

Three monitors in one process stand for three ranks; the merge a collective would do is
merge_verdicts (the element-wise max). A KV byte flipped on rank 1 stops every rank at the
same call.
"""

import numpy as np
from kvcanary_numba import RealKvHashMode, RealKvSource
from kvcanary_numba.monitor import (
    CanaryMonitor,
    CanaryVerdictError,
    KvGroup,
    StepBatch,
    merge_verdicts,
)

NUM_SLOTS, BYTES, ROWS, WIDTH, RANKS = 32, 32, 4, 16, 3


def i64(values):
    return np.asarray(values, dtype=np.int64)


class Rank:
    """One rank's KV (layer 0's K) and its monitor; every rank runs the same batch."""

    def __init__(self, rank):
        self.k = np.zeros((NUM_SLOTS, BYTES), dtype=np.uint8)
        self.req_to_token = np.zeros((ROWS, WIDTH), dtype=np.int32)
        source = RealKvSource(
            tensor=self.k, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES
        )
        full = KvGroup(
            kind="full", num_slots=NUM_SLOTS, has_v=False, k_sources=(source,)
        )
        # --8<-- [start:build]
        self.monitor = CanaryMonitor(
            full=full,
            device="cpu",
            mode="raise",  # with verdict=True: raised by apply_verdict, on every rank
            write_req_capacity=ROWS - 1,
            real_kv_hash_mode=RealKvHashMode.ALL,
            health_interval=0,
            rank=rank,  # named in reports, errors and bundles
            verdict=True,  # write the step's verdict word at the end of each TAIL phase
        )
        # --8<-- [end:build]

    def step(self, prefix, tokens, slots):
        self.req_to_token[1, prefix : prefix + len(slots)] = slots
        batch = StepBatch(
            req_pool_indices=i64([1]),
            prefix_lens=i64([prefix]),
            extend_seq_lens=i64([len(tokens)]),
            req_to_token=self.req_to_token,
            input_ids=i64(tokens),
            positions=i64(range(prefix, prefix + len(tokens))),
            out_cache_loc=i64(slots),
        )
        with self.monitor.forward(batch):
            for token, slot in zip(tokens, slots):
                self.k[slot] = (np.arange(BYTES) + token * 31) % 251
        self.monitor.end_step()


ranks = [Rank(r) for r in range(RANKS)]
steps = [(0, [101, 102, 103, 104], [5, 6, 7, 8]), (4, [105], [9]), (5, [106], [10])]
stopped = []
for t, (prefix, tokens, slots) in enumerate(steps):
    if t == 1:
        ranks[1].k[6, 0] ^= 1  # rank 1's KV: a flipped byte in a cached slot
    for r in ranks:
        r.step(prefix, tokens, slots)
    # --8<-- [start:merge]
    # The engine's collective: one element-wise max of the ranks' words (int32 [16]
    # each); on GPUs, an all-reduce with op=MAX of every rank's monitor.verdict.word.
    merged = merge_verdicts([r.monitor.verdict.word for r in ranks])
    for r in ranks:  # every rank hands the same merged word back ...
        try:
            r.monitor.apply_verdict(merged)
        except CanaryVerdictError as exc:  # ... and every rank stops at the same call
            stopped.append((t, exc.rank, exc.verdict.rank, len(exc.violations)))
    # --8<-- [end:merge]
    if stopped:
        break

# (loop step, this rank, the highest rank with rows, rows this rank found)
assert stopped == [(1, 0, 1, 0), (1, 1, 1, 1), (1, 2, 1, 0)], stopped


# --8<-- [start:nccl]
def allreduce_max(comm, word, merged):
    """NCCL (CuPy's binding): the merged word of all ranks, written in stream order."""
    import cupy
    from cupy.cuda import nccl

    stream = cupy.cuda.get_current_stream().ptr
    comm.allReduce(
        word.data.ptr, merged.data.ptr, 16, nccl.NCCL_INT32, nccl.NCCL_MAX, stream
    )
    return merged  # monitor.apply_verdict(merged) reads it one call later


# --8<-- [end:nccl]
