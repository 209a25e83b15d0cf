"""Requests, prefix cache and scheduling of the toy engine (host-side bookkeeping only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..hashing import splitmix64_mix3
from .config import EngineConfig
from .memory import FreeList

__all__ = ["HostBatch", "PrefixEntry", "Request", "Scheduler"]

#: Owner id of pages / SWA slots held by the prefix cache.
CACHE_OWNER = -1


@dataclass
class PrefixEntry:
    """A cached shared prefix: its full slots (whole pages), SWA slots and users."""

    prefix_id: int
    tokens: list[int]
    slots: list[int]
    pages: list[int]
    swa_slots: list[int]
    refs: int = 0


@dataclass
class Request:
    """One request: its tokens (prompt + generated), the slot of every position, progress."""

    rid: int
    row: int
    tokens: list[int]
    prompt_len: int
    max_new: int
    prefix_id: int | None
    cached_len: int = 0  # leading positions held by the prefix cache (hit, or handed over after prefill)
    kv_len: int = 0
    slots: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    swa_slots: dict[int, int] = field(default_factory=dict)  # position -> SWA slot this request owns
    entry: PrefixEntry | None = None

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.max_new - (len(self.tokens) - self.prompt_len)


@dataclass
class HostBatch:
    """One step's batch as host arrays, requests in batch order."""

    requests: list[Request]
    req_pool_indices: np.ndarray
    prefix_lens: np.ndarray
    extend_seq_lens: np.ndarray
    input_ids: np.ndarray
    positions: np.ndarray
    out_cache_loc: np.ndarray
    expected_tokens: np.ndarray
    expected_positions: np.ndarray
    token_ids_flat: np.ndarray
    token_offsets: np.ndarray


class Scheduler:
    """Admits requests, allocates pages and SWA slots, finishes requests, evicts the SWA window."""

    def __init__(self, config: EngineConfig):
        self.cfg = c = config
        self.rng = np.random.default_rng(c.seed)
        self.pages = FreeList(c.num_pages)
        self.swa = FreeList(c.num_slots) if c.swa_window else None
        self.lut = np.zeros(c.num_slots + 1, dtype=np.int64)  # full slot -> SWA slot, 0 = none
        self.req_to_token = np.zeros((c.req_rows, c.max_tokens), dtype=np.int32)
        self.free_rows = list(range(c.req_rows - 1, 0, -1))
        self.prompts = [self._tokens(c.shared_prefix_len) for _ in range(c.num_prefix_entries)]
        self.entries: dict[int, PrefixEntry] = {}
        self.running: list[Request] = []
        self.next_rid = 1
        self.forced_prefix: int | None = None  # fault hook: the next request uses this prefix
        self.reload = None  # host tier hook: prefix id -> a PrefixEntry reloaded into the pool, or None
        self.admit = True  # False: a decode engine of a pair (requests only arrive by hand-off)
        self.finished = self.prefix_hits = 0

    def _tokens(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(1, self.cfg.vocab_size, size=n)]

    def next_token(self, req: Request) -> int:
        """The toy model: a deterministic function of (seed, request, position)."""
        h = splitmix64_mix3(self.cfg.seed, req.rid, len(req.tokens))
        return 1 + h % (self.cfg.vocab_size - 1)

    # --- admission ------------------------------------------------------------
    def _admit(self) -> None:
        c = self.cfg
        prefix_id = int(self.rng.integers(0, len(self.prompts) + 1)) if self.prompts else 0
        if self.forced_prefix is not None:
            prefix_id, self.forced_prefix = self.forced_prefix, None
        length = int(self.rng.integers(c.min_prompt_len, c.max_prompt_len + 1))
        shared = self.prompts[prefix_id] if prefix_id < len(self.prompts) else []
        req = Request(
            rid=self.next_rid,
            row=self.free_rows.pop(),
            tokens=shared + self._tokens(length - len(shared)),
            prompt_len=length,
            max_new=int(self.rng.integers(c.min_new_tokens, c.max_new_tokens + 1)),
            prefix_id=prefix_id if shared else None,
        )
        self.next_rid += 1
        entry = self.entries.get(prefix_id) if shared else None
        if entry is None and shared and self.reload is not None:
            entry = self.reload(prefix_id)
        if entry is not None:
            self.prefix_hits += 1
            entry.refs += 1
            req.entry, req.cached_len, req.kv_len = entry, len(entry.slots), len(entry.slots)
            req.slots = list(entry.slots)
            self.req_to_token[req.row, : len(entry.slots)] = entry.slots
        self.running.append(req)

    def accept(self, tokens: list[int], prompt_len: int, max_new: int, kv_len: int, avoid=()) -> Request:
        """A request handed over with its first ``kv_len`` positions' KV (a pair's decode engine): a row
        and pages for them (none of the ``avoid`` pages), its page table written; decoded from the next step."""
        req = Request(self.next_rid, self.free_rows.pop(), list(tokens), prompt_len, max_new, None, kv_len=kv_len)
        self.next_rid += 1
        ps = self.cfg.page_size
        req.pages = [self.pages.alloc_avoiding(req.rid, avoid) for _ in range(-(-kv_len // ps))]
        req.slots = [pg * ps + j for pg in req.pages for j in range(ps)][:kv_len]
        self.req_to_token[req.row, :kv_len] = req.slots
        self.running.append(req)
        return req

    def _allocate(self, req: Request, position: int) -> int:
        ps = self.cfg.page_size
        if position % ps == 0:
            req.pages.append(self.pages.alloc(req.rid))
        slot = req.pages[-1] * ps + position % ps
        if self.swa is not None:
            swa_slot = self.swa.alloc(req.rid)
            req.swa_slots[position] = swa_slot
            self.lut[slot] = swa_slot
        return slot

    def schedule(self) -> HostBatch:
        """Admit new requests and allocate the slots of every new token of this step."""
        for _ in range(self.cfg.max_admit_per_step if self.admit else 0):
            if len(self.running) < self.cfg.max_running:
                self._admit()
        cols = {k: [] for k in ("ids", "pos", "loc")}
        rows, prefix, extend, flat, offsets = [], [], [], [], [0]
        for req in self.running:
            new = range(req.kv_len, len(req.tokens))
            for p in new:
                slot = self._allocate(req, p)
                req.slots.append(slot)
                self.req_to_token[req.row, p] = slot
                cols["ids"].append(req.tokens[p])
                cols["pos"].append(p)
                cols["loc"].append(slot)
            rows.append(req.row)
            prefix.append(req.kv_len)
            extend.append(len(new))
            flat += req.tokens
            offsets.append(len(flat))
        i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
        ids, pos = i64(cols["ids"]), i64(cols["pos"])
        return HostBatch(
            requests=list(self.running),
            req_pool_indices=i64(rows),
            prefix_lens=i64(prefix),
            extend_seq_lens=i64(extend),
            input_ids=ids,
            positions=pos,
            out_cache_loc=i64(cols["loc"]),
            expected_tokens=ids.copy(),
            expected_positions=pos.copy(),
            token_ids_flat=i64(flat),
            token_offsets=i64(offsets),
        )

    # --- after the forward ----------------------------------------------------
    def complete(self) -> list[Request]:
        """Sample one token per request, cache new prefixes, finish and evict. Returns finished requests."""
        done = []
        for req in self.running:
            req.kv_len = len(req.tokens)
            if req.prefix_id is not None and req.entry is None and req.prefix_id not in self.entries:
                self._insert_prefix(req)
            req.tokens.append(self.next_token(req))
            if req.remaining <= 0:
                done.append(req)
        for req in done:
            self.release(req)
        if self.swa is not None:
            for req in self.running:
                self._evict_window(req)
        return done

    def _insert_prefix(self, req: Request) -> None:
        n, ps = self.cfg.shared_prefix_len, self.cfg.page_size
        pages = req.pages[: n // ps]
        for page in pages:
            self.pages.transfer(page, req.rid, CACHE_OWNER)
        del req.pages[: n // ps]
        swa_slots = [req.swa_slots.pop(p) for p in range(n)] if self.swa is not None else []
        for s in swa_slots:
            self.swa.transfer(s, req.rid, CACHE_OWNER)
        entry = PrefixEntry(req.prefix_id, req.tokens[:n], req.slots[:n], pages, swa_slots, refs=1)
        self.entries[req.prefix_id] = req.entry = entry
        req.cached_len = n  # its first n positions now belong to the cache

    def _evict_window(self, req: Request) -> None:
        """Free the SWA slots of positions that left the window (``< kv_len - window``)."""
        for p in [p for p in req.swa_slots if p < req.kv_len - self.cfg.swa_window]:
            self._free_swa(req.slots[p], req.swa_slots.pop(p), req.rid)

    def _free_swa(self, slot: int, swa_slot: int, owner: int) -> None:
        if self.lut[slot] == swa_slot:
            self.lut[slot] = 0
        self.swa.free(swa_slot, owner)

    def release(self, req: Request) -> None:
        """Finish a request: free its own pages, SWA slots and row; drop its prefix reference."""
        self.running.remove(req)
        for p, swa_slot in req.swa_slots.items():
            self._free_swa(req.slots[p], swa_slot, req.rid)
        for page in req.pages:
            self.pages.free(page, req.rid)
        if req.entry is not None:
            req.entry.refs -= 1
        self.free_rows.append(req.row)
        self.finished += 1

    def evict_prefix(self, entry: PrefixEntry, *, keep_index: bool) -> None:
        """Free a cached prefix; ``keep_index=True`` is the stale-page bug (the index still points at it)."""
        for page in entry.pages:
            self.pages.free(page, CACHE_OWNER)
        for slot, swa_slot in zip(entry.slots, entry.swa_slots):
            self._free_swa(slot, swa_slot, CACHE_OWNER)
        if not keep_index:
            del self.entries[entry.prefix_id]
