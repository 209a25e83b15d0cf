"""Pools with written requests, run tables and independent oracles for the moved-records tests.

A *pool* is a NumPy CanaryContext whose real-KV sources are random bytes; :func:`write_request`
stamps a request's records the way the write kernel would, computed here in plain Python
(chain step by step with :func:`kvcanary_numba.hashing.splitmix64_mix3`, fingerprints byte by
byte with :func:`canary_oracles.scalar_real_kv_hash`), so no library fold is trusted.
:func:`oracle_digest` is the hand-off digest of the issue, spelled out with Python ints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from canary_helpers import HEAD, make_context, stamp
from canary_oracles import random_source, scalar_real_kv_hash

from kvcanary_numba import CanaryLaunchTag, RealKvHashMode
from kvcanary_numba.constants import HANDOFF_DIGEST_ANCHOR, UINT64_MASK
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed, to_unsigned

#: Where the kernels run: the simulator on NumPy arrays, else the GPU on CuPy arrays.
KERNEL_DEVICE = "cpu" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "cuda"


def make_pool(
    rng: np.random.Generator,
    num_slots: int,
    *,
    mode: RealKvHashMode = RealKvHashMode.ALL,
    nsrc: int = 1,
    page_size: int = 1,
    nbytes: int = 32,
    read_bytes: int | None = None,
    stride: int = 32,
    ring_capacity: int = 256,
    kind: CanaryLaunchTag = CanaryLaunchTag.SWEEP_K_FULL,
):
    """A NumPy context of ``num_slots`` slots over ``nsrc`` random sources (none in NONE mode)."""
    sources = tuple(
        random_source(rng, num_slots, page_size=page_size, nbytes=nbytes, read_bytes=read_bytes) for _ in range(nsrc)
    )
    return make_context(num_slots, stride=stride, ring_capacity=ring_capacity, kind=kind, sources=sources, mode=mode)


def live_hash(ctx, slot: int) -> int:
    """The live fingerprint of ``slot`` (unsigned), byte by byte."""
    return scalar_real_kv_hash(ctx.real_kv_sources, ctx.real_kv_hash_mode, slot)


def write_request(ctx, slots: Sequence[int], tokens: Sequence[int], *, start: int = 0, seed_hash: int = HEAD) -> int:
    """Stamp a request's records at ``slots`` (positions ``start, start + 1, ...``) as the write
    kernel would, over the live KV; returns the chain hash after the last one."""
    running = seed_hash
    for k, (slot, token) in enumerate(zip(slots, tokens)):
        stamp(ctx, int(slot), int(token), start + k, running, live_hash(ctx, int(slot)))
        running = splitmix64_mix3(running, int(token), start + k)
    return running


def copy_kv(ctx, src_slots: Sequence[int], dst_ctx, dst_slots: Sequence[int]) -> None:
    """Copy each source's bytes of ``src_slots`` in ``ctx`` to ``dst_slots`` in ``dst_ctx`` (the engine's KV copy)."""
    for a, b in zip(ctx.real_kv_sources, dst_ctx.real_kv_sources):
        ta, tb = a.bytes_view(), b.bytes_view()
        for s, d in zip(src_slots, dst_slots):
            cs = (int(s) % a.page_size) * a.num_bytes_per_token
            cd = (int(d) % b.page_size) * b.num_bytes_per_token
            tb[int(d) // b.page_size, cd : cd + b.num_bytes_per_token] = ta[
                int(s) // a.page_size, cs : cs + a.num_bytes_per_token
            ]


def runs(*chains: Sequence[int], starts: Sequence[int] | None = None, prevs: Sequence[int] | None = None):
    """(slot_indices, run_offsets, run_start_positions, run_prev_slots) of consecutive chains
    (starts default to 0 and predecessors to -1, the chain head)."""
    slots = np.array([s for chain in chains for s in chain], dtype=np.int64)
    offsets = np.zeros(len(chains) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(c) for c in chains])
    start = np.zeros(len(chains), np.int64) if starts is None else np.asarray(starts, np.int64)
    prev = np.full(len(chains), -1, np.int64) if prevs is None else np.asarray(prevs, np.int64)
    return slots, offsets, start, prev


def oracle_digest(ctx, slots: Sequence[int]) -> int:
    """The hand-off digest of one run, as the issue defines it, in Python ints (signed int64)."""
    total = 0
    for e, slot in enumerate(slots):
        slot = int(slot)
        if not 0 < slot < ctx.num_slots:
            continue
        token, position, prev_hash, real = (int(v) for v in ctx.canary_buf.view(np.int64)[slot, :4])
        a = splitmix64_mix3(HANDOFF_DIGEST_ANCHOR ^ e, token, position)
        total += splitmix64(splitmix64_mix3(a, to_unsigned(prev_hash), to_unsigned(real)) ^ live_hash(ctx, slot))
    return to_signed(total & UINT64_MASK)


def ring(ctx) -> list[tuple[int, ...]]:
    """The rows recorded so far (host)."""
    n = min(int(np.asarray(ctx.violation_write_index)[0]), ctx.violation_ring.shape[0])
    return [tuple(int(v) for v in row) for row in np.asarray(ctx.violation_ring)[:n]]


def bits_by_slot(ctx) -> dict[int, int]:
    """OR of the fail bits recorded per slot."""
    out: dict[int, int] = {}
    for row in ring(ctx):
        out[row[1]] = out.get(row[1], 0) | row[7]
    return out


def plan_of_runs(slots, offsets, starts, prevs):
    """The VerifyPlan a run table stands for, built entry by entry in Python (tokens unchecked)."""
    from canary_helpers import verify_plan

    positions, predecessors = [], []
    for r in range(len(offsets) - 1):
        for e, i in enumerate(range(int(offsets[r]), int(offsets[r + 1]))):
            positions.append(int(starts[r]) + e)
            predecessors.append(int(prevs[r]) if e == 0 else int(slots[i - 1]))
    return verify_plan([int(s) for s in slots], positions, predecessors)
