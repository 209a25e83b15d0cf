"""A tiny serving loop for tests (plan -> verify -> write on the NumPy backend) and the faults it can plant."""

from __future__ import annotations

from collections.abc import Sequence

import canary_helpers
import numpy as np
from canary_helpers import fields, i64, make_context, ring_rows, write_index

from kvcanary_numba import CanaryLaunchTag, RealKvHashMode, RealKvSource
from kvcanary_numba.plans import VerifyPlan, WritePlan

#: Columns of a canary record.
TOKEN, POSITION, PREV_HASH, REAL_KV = range(4)


# --- a tiny serving loop: plan -> verify -> write -------------------------------------


class Pipeline:
    """One KV pool served step by step through the public launches (NumPy backend).

    ``req_to_token[rp, p]`` is the KV slot of request row ``rp`` at position ``p``
    and ``tokens[rp, p]`` the token there; tests fill both, then call
    :meth:`step` with the batch of the step. Slot 0 and request row 0 are padding.
    ``kv`` (uint8 [num_slots, kv_bytes]) is the live "KV" the real-KV sources view;
    :meth:`step` fills the new slots' KV bytes before stamping them, as a forward pass would.
    """

    def __init__(
        self,
        num_slots: int = 64,
        *,
        max_reqs: int = 8,
        max_seq: int = 32,
        verify_capacity: int = 256,
        write_capacity: int = 8,
        ring_capacity: int = 256,
        mode: RealKvHashMode = RealKvHashMode.NONE,
        kv_bytes: int = 32,
        window: int = 0,
        kind: CanaryLaunchTag = CanaryLaunchTag.TAIL_K_FULL,
        seed: int = 0,
    ):
        self.rng = np.random.default_rng(seed)
        self.kv = np.zeros((num_slots, kv_bytes), dtype=np.uint8)
        sources = (RealKvSource(tensor=self.kv, page_size=1, num_bytes_per_token=kv_bytes, read_bytes=kv_bytes),)
        self.ctx = make_context(num_slots, ring_capacity=ring_capacity, kind=kind, sources=sources, mode=mode)
        self.req_to_token = np.zeros((max_reqs, max_seq), dtype=np.int32)
        self.tokens = np.zeros((max_reqs, max_seq), dtype=np.int64)
        self.window = window
        # Identity LUT: the SWA group shares the full group's slots (window clipping only).
        self.lut = np.arange(num_slots, dtype=np.int64) if window else None
        self.vplan = VerifyPlan.allocate(verify_capacity=verify_capacity)
        self.wplan = WritePlan.allocate(write_req_capacity=write_capacity)

    def step(
        self,
        rpi: Sequence[int],
        prefix: Sequence[int],
        extend: Sequence[int],
        *,
        check_tokens: bool = False,
        offset: int = 0,
        pool: np.ndarray | None = None,
        expected: tuple[np.ndarray, np.ndarray] | None = None,
        loc_map=None,
    ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Plan, verify (returns its new rows), fill KV, write (returns its new rows).

        ``pool`` (default ``tokens``) is the expected-token pool when ``check_tokens``;
        ``expected`` the write-input assert's (tokens, positions); ``loc_map`` rewrites
        out_cache_loc before the write (e.g. an SWA translation to -1).
        """
        from kvcanary_numba import launch_canary_plan_kernels

        rpi, prefix, extend = (np.asarray(a, dtype=np.int64) for a in (rpi, prefix, extend))
        launch_canary_plan_kernels(
            verify_plan_out=self.vplan,
            write_plan_out=self.wplan,
            req_pool_indices=rpi,
            prefix_lens=prefix,
            extend_seq_lens=extend,
            req_to_token=self.req_to_token,
            swa_window_size=self.window,
            full_to_swa_index_mapping=self.lut,
            verify_capacity=self.vplan.verify_capacity,
            req_to_verify_expected_tokens=(self.tokens if pool is None else pool).astype(np.int32)
            if check_tokens
            else None,
            req_to_verify_expected_tokens_valid_lens=(prefix + extend + offset) if check_tokens else None,
            kv_token_id_vs_position_offset=offset,
            backend="numpy",
        )
        before = write_index(self.ctx)
        # run_verify and run_write are looked up on canary_helpers at each call, so that a test can
        # swap them (test_kernels_write_scenarios runs these pipelines on the kernels too).
        canary_helpers.run_verify(self.ctx, self.vplan, check_tokens)
        verify_rows = ring_rows(self.ctx)[before:]
        ids, pos, loc = self.batch_inputs(rpi, prefix, extend)
        loc = loc if loc_map is None else i64(loc_map(loc))
        for slot in loc[loc > 0]:
            self.kv[slot] = self.rng.integers(0, 256, self.kv.shape[1], dtype=np.uint8)
        before = write_index(self.ctx)
        exp_ids, exp_pos = expected if expected is not None else (None, None)
        canary_helpers.run_write(self.ctx, self.wplan, ids, pos, loc, exp_ids, exp_pos)
        return verify_rows, ring_rows(self.ctx)[before:]

    def batch_inputs(self, rpi, prefix, extend) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """input_ids, positions, out_cache_loc of the new tokens, request-major (padding rows add none)."""
        ids, pos, loc = [], [], []
        for rp, start, n in zip(rpi, prefix, extend):
            if rp == 0 or n <= 0:
                continue
            ids.extend(self.tokens[rp, start : start + n])
            pos.extend(range(start, start + n))
            loc.extend(self.req_to_token[rp, start : start + n])
        return i64(ids), i64(pos), i64(loc)


#: Faults :func:`plant_fault` can plant, as in the golden vectors.
FAULTS = ("token", "position", "prev_hash", "real_kv", "req_to_token_swap")


def plant_fault(pipe: Pipeline, fault: str, rp: int, position: int) -> tuple[int, int]:
    """Corrupt what verify will read for ``position`` of request row ``rp``.

    Returns the (slot, FailReason bit) a verify of the prefix must report.
    ``token`` needs ``position + 1`` in the prefix (the successor's chain sees
    it), ``req_to_token_swap`` needs ``position + 2``; ``real_kv`` needs a
    real-KV mode.
    """
    slot = int(pipe.req_to_token[rp, position])
    if fault == "token":
        fields(pipe.ctx)[slot, TOKEN] += 7
        return int(pipe.req_to_token[rp, position + 1]), 1
    if fault == "position":
        fields(pipe.ctx)[slot, POSITION] += 1
        return slot, 2
    if fault == "prev_hash":
        fields(pipe.ctx)[slot, PREV_HASH] ^= 1 << 40
        return slot, 1
    if fault == "real_kv":
        pipe.kv[slot, 0] ^= 0x80
        return slot, 4
    if fault == "req_to_token_swap":
        other = int(pipe.req_to_token[rp, position + 2])
        pipe.req_to_token[rp, position], pipe.req_to_token[rp, position + 2] = other, slot
        return other, 2  # the slot now listed at `position` holds position + 2
    raise ValueError(f"unknown fault {fault!r}")
