"""A tiny paged-KV engine that drives the canary in SGLang's per-step order.

Used by concepts/step-order.md and concepts/faults.md; run it to see a clean run.
"""

from __future__ import annotations

import numpy as np
from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    WritePlan,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)

NUM_SLOTS, BYTES_PER_TOKEN, MAX_REQS, MAX_LEN = 64, 32, 4, 32


def fake_kv(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Deterministic stand-in for the K bytes a forward pass computes: uint8 [n, BYTES_PER_TOKEN]."""
    lanes = np.arange(BYTES_PER_TOKEN)
    return ((tokens[:, None] * 31 + positions[:, None] * 7 + lanes) % 251).astype(
        np.uint8
    )


class TinyEngine:
    """One KV layer, a page table, and the four canary launches of each step."""

    def __init__(self) -> None:
        # --8<-- [start:setup]
        # K of layer 0, page_size 1: one row of BYTES_PER_TOKEN bytes per slot
        self.kv = np.zeros((NUM_SLOTS, BYTES_PER_TOKEN), dtype=np.uint8)
        self.req_to_token = np.zeros((MAX_REQS, MAX_LEN), dtype=np.int32)
        self.head = CanaryContext.allocate(
            num_slots=NUM_SLOTS, kernel_kind=CanaryLaunchTag.HEAD_K_FULL
        )
        source = RealKvSource(
            tensor=self.kv,
            page_size=1,
            num_bytes_per_token=BYTES_PER_TOKEN,
            read_bytes=BYTES_PER_TOKEN,
        )
        self.tail = self.head.replace(  # its own canary buffer; same ring and counters
            canary_buf=np.zeros_like(self.head.canary_buf),
            kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
            real_kv_sources=(source,),
            real_kv_hash_mode=RealKvHashMode.ALL,
        )
        self.vplan = VerifyPlan.allocate(verify_capacity=3 * NUM_SLOTS)
        self.wplan = WritePlan.allocate(write_req_capacity=MAX_REQS)
        # --8<-- [end:setup]
        self.seen = 0

    def step(self, batch, corrupt=None, check_inputs=False):
        """Run one step. ``batch`` holds (req_row, prefix_len, new_tokens, new_slots) per request.

        ``corrupt(write_args)`` may alter the write inputs after the expected values were taken,
        as a buggy engine would; ``check_inputs`` turns on the write-input assert.
        """
        # --8<-- [start:step]
        rows = np.array([b[0] for b in batch], dtype=np.int64)
        prefix = np.array([b[1] for b in batch], dtype=np.int64)
        extend = np.array([len(b[2]) for b in batch], dtype=np.int64)
        for row, start, tokens, slots in batch:  # the allocator records the new slots
            self.req_to_token[row, start : start + len(tokens)] = slots
        positions = np.concatenate([np.arange(p, p + len(t)) for _, p, t, _ in batch])
        positions = positions.astype(np.int64)
        write = dict(
            plan=self.wplan,
            input_ids=np.concatenate([np.asarray(b[2]) for b in batch]).astype(
                np.int64
            ),
            positions=positions,
            out_cache_loc=np.concatenate([np.asarray(b[3]) for b in batch]).astype(
                np.int64
            ),
            enable_write_input_assert=check_inputs,
            expected_input_tokens=None,
            expected_input_positions=None,
        )
        if check_inputs:  # what the tokens and positions should be (a token oracle)
            write["expected_input_tokens"] = write["input_ids"].copy()
            write["expected_input_positions"] = positions.copy()
        if corrupt is not None:
            corrupt(write)
        # 1. plan: flat verify entries for every prefix, write ranges and seeds per request
        launch_canary_plan_kernels(
            verify_plan_out=self.vplan,
            write_plan_out=self.wplan,
            req_pool_indices=rows,
            prefix_lens=prefix,
            extend_seq_lens=extend,
            req_to_token=self.req_to_token,
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=self.vplan.verify_capacity,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )
        # 2. HEAD: verify the prefixes, then stamp the new slots (no real KV exists yet)
        launch_canary_verify_kernel(
            context=self.head, plan=self.vplan, check_verify_expected_token=False
        )
        launch_canary_write_kernel(context=self.head, **write)
        # 3. the forward pass writes the real KV of the new tokens
        self.kv[write["out_cache_loc"]] = fake_kv(
            write["input_ids"], write["positions"]
        )
        # 4. TAIL: verify again, now with fingerprints of the live KV, then stamp with them
        launch_canary_verify_kernel(
            context=self.tail, plan=self.vplan, check_verify_expected_token=False
        )
        launch_canary_write_kernel(context=self.tail, **write)
        # --8<-- [end:step]
        return self.new_violations()

    def new_violations(self) -> list[tuple[str, int, int, FailReason]]:
        """Rows recorded since the last call as (launch tag, slot, position, reasons)."""
        # --8<-- [start:report]
        count = int(self.head.violation_write_index[0])  # counts past the ring capacity
        stored = min(count, self.head.ring_capacity)
        rows = self.head.violation_ring[self.seen : stored]
        self.seen = stored
        return [
            (
                CanaryLaunchTag(int(r[0])).name,
                int(r[1]),
                int(r[2]),
                FailReason(int(r[7])),
            )
            for r in rows
        ]
        # --8<-- [end:report]


if __name__ == "__main__":
    engine = TinyEngine()
    # --8<-- [start:clean]
    # (request row, prefix length, new tokens, their slots) per request of a step
    report = engine.step([(1, 0, [101, 102, 103, 104, 105, 106], list(range(10, 16)))])
    report += engine.step([(1, 6, [107], [16])])  # decode one token
    report += engine.step([(1, 7, [108], [17]), (2, 0, [201, 202], [20, 21])])  # + one
    print(report)  # []: a correct engine never fires
    # --8<-- [end:clean]
    assert report == []
    assert (
        int(engine.head.kernel_run_counter[0]) == 12
    )  # 3 steps x (HEAD + TAIL) x (verify + write)
