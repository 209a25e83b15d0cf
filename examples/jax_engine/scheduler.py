"""Requests and the continuous-batching scheduler (host-side bookkeeping only).

Every step the scheduler admits requests into free ``req_to_token`` rows, gives
each running request its new tokens within the step's token budget -- one token
for a request that is decoding, a chunk of its prompt for one that is still
prefilling (chunked prefill) -- and allocates a KV slot for each. After the
forward it appends the sampled token of every request whose step reached the end
of its known tokens, and retires requests that generated enough.

The batch it hands out is packed request-major (:class:`HostBatch`), the layout
the canary's :class:`~kvcanary_numba.StepBatch` takes; the engine pads it into
the fixed-width rows the model is compiled for (:meth:`HostBatch.padded`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import EngineConfig
from .memory import PageAllocator, RowAllocator

__all__ = ["HostBatch", "Request", "Scheduler"]


@dataclass
class Request:
    """A request: its known tokens (prompt, then generated) and the slot of every written position."""

    rid: int
    row: int
    tokens: list[int]
    prompt_len: int
    max_new: int
    kv_len: int = 0  # leading positions whose KV has been written
    slots: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.max_new


@dataclass
class HostBatch:
    """One step's batch on the host, packed request-major (only requests with new tokens).

    ``input_ids`` and ``positions`` are what the model is fed; ``expected_*`` are the
    scheduler's own record of what they should be (the canary's oracle). They agree
    unless a fault is planted between the two.
    """

    requests: list[Request]
    req_pool_indices: np.ndarray  # int64 [bs]
    prefix_lens: np.ndarray  # int64 [bs]
    extend_seq_lens: np.ndarray  # int64 [bs]
    input_ids: np.ndarray  # int64 [n]
    positions: np.ndarray  # int64 [n]
    out_cache_loc: np.ndarray  # int64 [n]
    expected_tokens: np.ndarray  # int64 [n]
    expected_positions: np.ndarray  # int64 [n]
    token_ids_flat: np.ndarray  # int64 [total]: every request's known tokens
    token_offsets: np.ndarray  # int64 [bs + 1]

    @property
    def offsets(self) -> np.ndarray:
        """Start of each request's tokens in the packed arrays ([bs + 1])."""
        return np.concatenate([[0], np.cumsum(self.extend_seq_lens)])

    def padded(self, rows: int, width: int) -> dict[str, np.ndarray]:
        """The model's int32 arrays: ``rows`` rows of ``width`` tokens (see :class:`~.model.DeviceBatch`)."""
        out = {name: np.zeros((rows, width), np.int32) for name in ("tokens", "positions", "out_loc")}
        out.update(counts=np.zeros(rows, np.int32), rows=np.zeros(rows, np.int32), kv_lens=np.zeros(rows, np.int32))
        starts = self.offsets
        for r in range(len(self.requests)):
            a, b = starts[r], starts[r + 1]
            out["tokens"][r, : b - a] = self.input_ids[a:b]
            out["positions"][r, : b - a] = self.positions[a:b]
            out["out_loc"][r, : b - a] = self.out_cache_loc[a:b]
            out["counts"][r] = b - a
            out["rows"][r] = self.req_pool_indices[r]
            out["kv_lens"][r] = self.prefix_lens[r] + b - a
        return out

    def table_writes(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, slots) int32 [size] of the page-table entries this step adds.

        Positions come from the scheduler's record, not from the fed ``positions``:
        the page table is the allocator's, whatever the model is told. Padding entries
        write slot 0 into row 0, column 0, which stays 0.
        """
        rows, cols, slots = (np.zeros(size, np.int32) for _ in range(3))
        n = len(self.out_cache_loc)
        rows[:n] = np.repeat(self.req_pool_indices, self.extend_seq_lens)
        cols[:n] = self.expected_positions
        slots[:n] = self.out_cache_loc
        return rows, cols, slots


class Scheduler:
    """Admission, chunked prefill, decode and retirement over a :class:`PageAllocator`.

    Parameters
    ----------
    cfg : EngineConfig
    vocab_size : int
        Prompt tokens are drawn from ``[1, vocab_size)``.
    """

    def __init__(self, cfg: EngineConfig, vocab_size: int):
        self.cfg, self.vocab_size = cfg, vocab_size
        self.rng = np.random.default_rng(cfg.seed)
        self.pages = PageAllocator(cfg.num_pages)
        self.rows = RowAllocator(cfg.req_rows)
        self.req_to_token = np.zeros((cfg.req_rows, cfg.max_context), dtype=np.int32)  # host copy
        self.running: list[Request] = []
        self.next_rid = 1
        self.finished = 0

    def _admit(self) -> None:
        # EngineConfig guarantees pages for max_running requests of max_context tokens, so
        # admission waits for a free row only.
        c = self.cfg
        while self.rows.available:
            prompt = int(self.rng.integers(c.min_prompt, c.max_prompt + 1))
            tokens = [int(t) for t in self.rng.integers(1, self.vocab_size, size=prompt)]
            new = int(self.rng.integers(c.min_new, c.max_new + 1))
            self.running.append(Request(self.next_rid, self.rows.alloc(), tokens, prompt, new))
            self.next_rid += 1

    def _slot(self, req: Request, position: int) -> int:
        ps = self.cfg.page_size
        if position % ps == 0:
            req.pages.append(self.pages.alloc(req.rid))
        return req.pages[-1] * ps + position % ps

    def schedule(self) -> HostBatch:
        """Admit, pick this step's tokens (decode first, then prefill chunks) and allocate their slots."""
        self._admit()
        budget = self.cfg.step_tokens
        decoding = [r for r in self.running if r.kv_len == len(r.tokens) - 1 and r.kv_len >= r.prompt_len]
        prefilling = [r for r in self.running if r not in decoding]
        picked: list[tuple[Request, int]] = []
        for req in decoding + prefilling:  # decode first: a decode token is one request's whole step
            take = min(len(req.tokens) - req.kv_len, self.cfg.chunk_size, budget)
            if take > 0:
                picked.append((req, take))
                budget -= take
        ids, pos, loc = [], [], []
        flat, offsets = [], [0]
        for req, take in picked:
            for p in range(req.kv_len, req.kv_len + take):
                slot = self._slot(req, p)
                req.slots.append(slot)
                self.req_to_token[req.row, p] = slot
                ids.append(req.tokens[p])
                pos.append(p)
                loc.append(slot)
            flat += req.tokens
            offsets.append(len(flat))
        i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        return HostBatch(
            requests=[req for req, _ in picked],
            req_pool_indices=i64([r.row for r, _ in picked]),
            prefix_lens=i64([r.kv_len for r, _ in picked]),
            extend_seq_lens=i64([t for _, t in picked]),
            input_ids=i64(ids),
            positions=i64(pos),
            out_cache_loc=i64(loc),
            expected_tokens=i64(ids),
            expected_positions=i64(pos),
            token_ids_flat=i64(flat),
            token_offsets=i64(offsets),
        )

    def complete(self, batch: HostBatch, next_tokens: np.ndarray) -> list[Request]:
        """After the forward: advance each request, append samples, retire finished requests."""
        done = []
        for i, req in enumerate(batch.requests):
            req.kv_len += int(batch.extend_seq_lens[i])
            if req.kv_len == len(req.tokens):  # the step reached its last known token: a sample is due
                req.tokens.append(int(next_tokens[i]))
                if req.done:
                    done.append(req)
        for req in done:
            self.release(req)
        return done

    def release(self, req: Request) -> None:
        """Retire a request: free its pages and its row."""
        self.running.remove(req)
        self.pages.free(req.pages, req.rid)
        self.req_to_token[req.row] = 0
        self.rows.free(req.row)
        self.finished += 1
