"""Benchmark inputs: clean canary chains, write and plan batches, and a monitored pool.

Everything is built for NumPy (CPU references, tests) or CuPy (kernels) from
the same host description. Records are *clean* (every check passes), so the
kernels take their common path and record no rows; slots are a random
permutation of the pool, as in a long-running engine, so the gathers are
realistic; verify also has a ``contiguous`` layout (each chain in consecutive
slots, as a fresh pool or a paged allocator hands them out). Repeating a write
or a monitor step on unchanged inputs re-stamps identical records: timed loops
change nothing.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from kvcanary_numba import (
    CANARY_CHAIN_HEAD,
    CanaryContext,
    CanaryLaunchTag,
    CanaryMonitor,
    KvGroup,
    RealKvHashMode,
    RealKvSource,
    StepBatch,
    VerifyPlan,
    WritePlan,
    compute_real_kv_hash,
)

from .baselines import mix3_array

__all__ = ["MonitorWorkload", "plan_case", "verify_case", "write_case"]

#: Verify chains are this long (positions per request) unless the case is smaller.
CHAIN_LEN = 4096


def _device(xp) -> str:
    return "cpu" if xp is np else "cuda"


def _random_bytes(xp, rng, shape: tuple[int, int]):
    if xp is np:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    xp.random.seed(int(rng.integers(1 << 31)))  # device-side: gigabytes of KV are not made on the host
    return xp.random.randint(0, 256, size=shape, dtype=np.uint8)


def _sources(xp, rng, num_slots: int, bytes_per_token: int, count: int = 1) -> tuple[RealKvSource, ...]:
    return tuple(
        RealKvSource(
            tensor=_random_bytes(xp, rng, (num_slots, bytes_per_token)),
            page_size=1,
            num_bytes_per_token=bytes_per_token,
            read_bytes=bytes_per_token,
        )
        for _ in range(count)
    )


def _context(xp, buf, *, sources, mode, tag=CanaryLaunchTag.TAIL_K_FULL, ring_capacity: int = 1024) -> CanaryContext:
    return CanaryContext(
        canary_buf=buf,
        kernel_kind=tag,
        violation_ring=xp.zeros((ring_capacity, 8), dtype=np.int64),
        violation_write_index=xp.zeros(1, dtype=np.int32),
        slot_run_counter=xp.zeros(1, dtype=np.int64),
        kernel_run_counter=xp.zeros(1, dtype=np.int64),
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        enable_chain_position_assert=xp.zeros(1, dtype=np.int32),
    )


@functools.lru_cache(maxsize=4)  # the modes of one size share their chains
def _chains(seed: int, requests: int, length: int, contiguous: bool = False):
    """Host chains: slots [R, L] (1..R*L, permuted unless ``contiguous``), tokens [R, L], prev_hash [R, L] (uint64)."""
    rng = np.random.default_rng([seed, requests, length])
    order = np.arange(requests * length) if contiguous else rng.permutation(requests * length)
    slots = (order + 1).reshape(requests, length).astype(np.int64)
    tokens = rng.integers(1, 1 << 31, (requests, length), dtype=np.int64)
    prev = np.empty((requests, length), dtype=np.uint64)
    running = np.full(requests, CANARY_CHAIN_HEAD, dtype=np.uint64)
    for p in range(length):  # serial in p, vectorised over requests
        prev[:, p] = running
        running = mix3_array(np, running, tokens[:, p].view(np.uint64), np.full(requests, p, np.uint64))
    return slots, tokens, prev


def verify_case(
    xp,
    *,
    entries: int,
    mode: RealKvHashMode,
    bytes_per_token: int = 128,
    seed: int = 0,
    chain_len: int = CHAIN_LEN,
    contiguous: bool = False,
):
    """A clean verify of ``entries`` entries: (context, plan, meta).

    Entries are ``entries // L`` whole chains of length ``L = min(chain_len,
    entries)`` (request-major, as the plan emits them); every record, chain
    link and real-KV fingerprint matches, so no rows are recorded. Slots are a
    random permutation of the pool, or consecutive per chain with ``contiguous``.
    """
    rng = np.random.default_rng(seed)
    length = min(chain_len, entries)
    requests = -(-entries // length)
    slots, tokens, prev = _chains(seed, requests, length, contiguous)
    num_slots = requests * length + 1
    words = np.zeros((num_slots, 4), dtype=np.int64)
    flat = slots.reshape(-1)
    words[flat, 0] = tokens.reshape(-1)
    words[flat, 1] = np.tile(np.arange(length, dtype=np.int64), requests)
    words[flat, 2] = prev.reshape(-1).view(np.int64)
    sources = _sources(xp, rng, num_slots, bytes_per_token) if mode != RealKvHashMode.NONE else ()
    buf = xp.asarray(words.view(np.uint8).reshape(num_slots, 32))
    if sources:  # field 3: the fingerprint of the live bytes, computed by the library itself
        real = xp.zeros(num_slots, dtype=np.int64)
        compute_real_kv_hash(
            real_kv_sources=sources, real_kv_hash_mode=mode, slot_indices=xp.arange(num_slots, dtype=np.int64), out=real
        )
        buf.view(np.int64)[:, 3] = real
        buf.view(np.int64)[0, 3] = 0
    prevs = np.concatenate([np.full((requests, 1), -1, np.int64), slots[:, :-1]], axis=1).reshape(-1)
    arrays = dict(
        verify_slot_indices=flat[:entries],
        verify_expected_tokens=tokens.reshape(-1)[:entries],
        verify_expected_positions=np.tile(np.arange(length, dtype=np.int64), requests)[:entries],
        verify_prev_slot_indices=prevs[:entries],
    )
    plan = VerifyPlan(
        **{k: xp.asarray(np.ascontiguousarray(v)) for k, v in arrays.items()},
        verify_num_valid=xp.full(1, entries, dtype=np.int32),
        enable=xp.ones(1, dtype=np.int32),
    )
    meta = {
        "entries": entries,
        "chains": requests,
        "chain_len": length,
        "bytes_per_token": bytes_per_token,
        "slots": slots,
        "tokens": tokens,
    }  # host [chains, chain_len]
    return _context(xp, buf, sources=sources, mode=mode), plan, meta


@contextlib.contextmanager
def serial_public_writes():
    """Within the block, public writes of any length run the serial kernel (one warp per request,
    its own chain): the public path before long writes took the tiled one, for rows in the same run.
    The threshold is part of the replay key, so memoised calls take the serial path too."""
    from kvcanary_numba.fast import chain

    saved, chain.OWN_TILED_MIN_TOKENS = chain.OWN_TILED_MIN_TOKENS, 1 << 62
    try:
        yield
    finally:
        chain.OWN_TILED_MIN_TOKENS = saved


def write_case(xp, *, requests: int, tokens: int, mode: RealKvHashMode, bytes_per_token: int = 128, seed: int = 0):
    """``requests`` fresh requests of ``tokens`` new tokens each: (context, plan, inputs dict)."""
    rng = np.random.default_rng(seed)
    n = requests * tokens
    num_slots = n + 1
    sources = _sources(xp, rng, num_slots, bytes_per_token) if mode != RealKvHashMode.NONE else ()
    buf = xp.zeros((num_slots, 32), dtype=np.uint8)
    plan = WritePlan(
        write_offsets=xp.asarray(np.arange(requests + 1, dtype=np.int64) * tokens),
        write_seed_slot_indices=xp.full(requests, -1, dtype=np.int64),
        write_num_valid_reqs=xp.full(1, requests, dtype=np.int32),
    )
    inputs = dict(
        input_ids=xp.asarray(rng.integers(1, 1 << 31, n, dtype=np.int64)),
        positions=xp.asarray(np.tile(np.arange(tokens, dtype=np.int64), requests)),
        out_cache_loc=xp.asarray(rng.permutation(n).astype(np.int64) + 1),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    return _context(xp, buf, sources=sources, mode=mode), plan, inputs


def plan_case(xp, *, bs: int, prefix: int, extend: int = 1, seed: int = 0, slots: np.ndarray | None = None) -> dict:
    """Keyword arguments of ``launch_canary_plan_kernels`` for a decode-like batch.

    ``slots`` (host [bs, >= prefix + extend]) gives each request's slots, e.g.
    a verify case's chains; by default they are random.
    """
    rng = np.random.default_rng(seed)
    width = prefix + extend
    table = np.zeros((bs + 1, width), dtype=np.int32)
    table[1:] = rng.integers(1, 1 << 30, (bs, width), dtype=np.int32) if slots is None else slots[:, :width]
    capacity = max(bs * prefix, 1)
    return dict(
        verify_plan_out=VerifyPlan.allocate(verify_capacity=capacity, device=_device(xp)),
        write_plan_out=WritePlan.allocate(write_req_capacity=bs, device=_device(xp)),
        req_pool_indices=xp.arange(1, bs + 1, dtype=np.int64),
        prefix_lens=xp.full(bs, prefix, dtype=np.int64),
        extend_seq_lens=xp.full(bs, extend, dtype=np.int64),
        req_to_token=xp.asarray(table),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=capacity,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )


class MonitorWorkload:
    """A FULL pool (K and V halves, layer-0 sources) under a :class:`CanaryMonitor`, driven by decode-like steps.

    ``requests`` requests grow by ``extend`` tokens per step from a ``prefix``
    already in the cache (stamped by one prefill step in :meth:`prefill`). The
    step's batch arrays are allocated once and refilled in place, as a CUDA-graph
    engine does; the KV "forward" writes bytes derived from each token.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    requests, prefix, extend : int
        Batch size, tokens already cached per request, new tokens per step.
    max_steps : int
        Steps the pool has room for after the prefix.
    """

    def __init__(
        self,
        xp,
        *,
        requests: int,
        prefix: int,
        extend: int = 1,
        max_steps: int = 1,
        bytes_per_token: int = 64,
        mode: RealKvHashMode = RealKvHashMode.PARTIAL,
        seed: int = 0,
        monitor_mode: str = "log",
        **monitor_options,
    ):
        self.xp, self.requests, self.prefix, self.extend = xp, requests, prefix, extend
        rng = np.random.default_rng(seed)
        self.width = prefix + extend * max_steps
        num_slots = requests * self.width + 1
        slots = (rng.permutation(requests * self.width) + 1).reshape(requests, self.width)
        self.table = np.zeros((requests + 1, self.width), dtype=np.int32)
        self.table[1:] = slots
        self.tokens = rng.integers(1, 32000, (requests, self.width), dtype=np.int64)
        self.k = xp.zeros((num_slots, bytes_per_token), dtype=np.uint8)
        self.v = xp.zeros((num_slots, bytes_per_token), dtype=np.uint8)
        src = [
            (RealKvSource(tensor=t, page_size=1, num_bytes_per_token=bytes_per_token, read_bytes=bytes_per_token),)
            for t in (self.k, self.v)
        ]
        full = KvGroup(kind="full", num_slots=num_slots, k_sources=src[0], v_sources=src[1])
        options = dict(
            write_req_capacity=requests,
            write_token_capacity=requests * max(prefix, extend),
            verify_capacity=max(requests * self.width, 1),
            health_interval=0,
            ring_capacity=4096,
        )
        options.update(monitor_options, mode=monitor_mode)  # ``mode`` here is the real-KV hash mode
        self.monitor = CanaryMonitor(full=full, device=_device(xp), real_kv_hash_mode=mode, **options)
        self.req_to_token = xp.asarray(self.table)
        self.batch = self._batch(extend)
        self.length = prefix

    def _batch(self, extend: int) -> StepBatch:
        xp, bs = self.xp, self.requests
        zeros = lambda n: xp.zeros(n, dtype=np.int64)  # noqa: E731
        return StepBatch(
            req_pool_indices=xp.arange(1, bs + 1, dtype=np.int64),
            prefix_lens=zeros(bs),
            extend_seq_lens=xp.full(bs, extend, dtype=np.int64),
            req_to_token=self.req_to_token,
            input_ids=zeros(bs * extend),
            positions=zeros(bs * extend),
            out_cache_loc=zeros(bs * extend),
        )

    def fill(self, batch: StepBatch, start: int, extend: int) -> None:
        """Refill ``batch`` in place for positions ``[start, start + extend)`` of every request."""
        cols = slice(start, start + extend)
        batch.prefix_lens[...] = start
        batch.positions[...] = self.xp.asarray(np.tile(np.arange(start, start + extend, dtype=np.int64), self.requests))
        batch.out_cache_loc[...] = self.xp.asarray(self.table[1:, cols].reshape(-1).astype(np.int64))
        batch.input_ids[...] = self.xp.asarray(self.tokens[:, cols].reshape(-1))

    def write_kv(self, batch: StepBatch) -> None:
        """The engine's forward: KV bytes of each new token (a fixed function of the token)."""
        xp = self.xp
        pattern = (batch.input_ids[:, None] * 7 + xp.arange(self.k.shape[1])[None, :]) % 251
        self.k[batch.out_cache_loc] = pattern.astype(np.uint8)
        self.v[batch.out_cache_loc] = (pattern + 1).astype(np.uint8)

    def run_step(self, batch: StepBatch) -> None:
        m = self.monitor
        m.pre_forward(batch)
        self.write_kv(batch)
        m.post_forward()
        m.end_step()

    def prefill(self) -> None:
        """Stamp the first ``prefix`` tokens of every request with one monitored step."""
        if self.prefix == 0:
            return
        batch = self._batch(self.prefix)
        self.fill(batch, 0, self.prefix)
        self.run_step(batch)

    def step(self, advance: bool = True) -> None:
        """One decode step at the current length (``advance=False`` repeats it: idempotent)."""
        self.fill(self.batch, self.length, self.extend)
        self.run_step(self.batch)
        if advance:
            self.length += self.extend
