"""StepBatch: the metadata of one forward step, as the monitor's hooks take it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import check_int
from ..errors import error

__all__ = ["StepBatch", "allocate_token_pool"]


@dataclass(slots=True, kw_only=True)
class StepBatch:
    """One step's batch, in the engine's own (NumPy or CuPy) arrays; nothing is copied.

    New tokens are packed request-major in batch order: request ``r`` owns
    entries ``[sum(extend_seq_lens[:r]), sum(extend_seq_lens[:r + 1]))`` of the
    token arrays.

    Attributes
    ----------
    req_pool_indices : int64 [bs]
        req_to_token row of each request (0 = padding row).
    prefix_lens : int64 [bs]
        Tokens whose KV was written before this step (verified this step).
    extend_seq_lens : int64 [bs]
        New tokens per request (written this step).
    req_to_token : int32 [rows, max_context_len]
        FULL KV slot of every (row, position), already holding this step's new slots.
    input_ids, positions, out_cache_loc : int64 [num_tokens]
        Token, position and FULL KV slot of every new token.
    expected_input_tokens, expected_input_positions : int64 [num_tokens] or None
        What an independent oracle says the new tokens and positions should
        be; when given, the write kernels assert them (write-input assert).
    token_ids_flat : int64 [total] or None
        Every request's known tokens (prompt + generated) concatenated, for the
        expected-token check.
    token_offsets : int64 [bs + 1] or None
        Exclusive prefix sums into ``token_ids_flat`` (leading 0).
    """

    req_pool_indices: Any
    prefix_lens: Any
    extend_seq_lens: Any
    req_to_token: Any
    input_ids: Any
    positions: Any
    out_cache_loc: Any
    expected_input_tokens: Any = None
    expected_input_positions: Any = None
    token_ids_flat: Any = None
    token_offsets: Any = None

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def check_fits(self, function: str, write_req_capacity: int, write_token_capacity: int, check_tokens: bool) -> None:
        """Host-side checks of the batch against the monitor's capacities (no device reads).

        Raises
        ------
        KvCanaryError
            KVC-M002 (too many requests), KVC-M003 (too many tokens), KVC-M008
            (token snapshot missing while the token check is on).
        """
        if self.batch_size > write_req_capacity:
            raise error("KVC-M002", function=function, got=self.batch_size, capacity=write_req_capacity)
        if self.num_tokens > write_token_capacity:
            raise error("KVC-M003", function=function, argument="batch.input_ids", got=self.num_tokens,
                        capacity=write_token_capacity)  # fmt: skip
        if check_tokens:
            for name in ("token_ids_flat", "token_offsets"):
                if getattr(self, name) is None:
                    raise error("KVC-M008", function=function, argument=f"batch.{name}")


def allocate_token_pool(function: str, xp, *, max_requests, max_context_len, write_req_capacity: int):
    """The expected-token pool int32 [max_requests, max_context_len] and valid lengths int64 [capacity].

    Raises
    ------
    KvCanaryError
        KVC-M008 when a size is missing, KVC-C011 when it is not a positive int.
    """
    for name, value in (("max_requests", max_requests), ("max_context_len", max_context_len)):
        if value is None:
            raise error("KVC-M008", function=function, argument=name)
    rows = check_int(function, "max_requests", max_requests, low=1)
    cols = check_int(function, "max_context_len", max_context_len, low=1)
    return xp.zeros((rows, cols), dtype=np.int32), xp.zeros(write_req_capacity, dtype=np.int64)
