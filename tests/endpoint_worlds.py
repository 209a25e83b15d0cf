"""One monitor group's decode step on hand-built contexts, for the endpoint-launch tests.

A :class:`World` holds the four contexts of a group with K and V (HEAD K, HEAD V,
TAIL K, TAIL V) laid out as the monitor lays them out (one ring and write index,
per-tag counters as views of one array; or each context its own), live KV
tensors, a verify plan, a write plan, the step's token arrays and a shared
chain. :func:`random_world` fills one with prefix chains stamped by the NumPy
reference and then plants faults of every class the monitor tests plant
(verify: token, position, chain hash, real-KV byte, req_to_token swap, slot
and predecessor out of range, expected token; write: input assert, chain
position, seed and slot out of range, clipped range, skipped entries).
:func:`run_step` runs HEAD then TAIL on one path (reference, plain kernels,
fused kernels) on a copy, on the kernels' device, and returns host copies.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
from canary_helpers import i64, verify_plan, write_plan
from kernel_pairs import KERNEL_DEVICE, to_host

from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    RealKvHashMode,
    RealKvSource,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)
from kvcanary_numba.fast.chain import SharedChain, sharing
from kvcanary_numba.launch import _launch

T = CanaryLaunchTag
TAGS = (T.HEAD_K_FULL, T.HEAD_V_FULL, T.TAIL_K_FULL, T.TAIL_V_FULL)
KV_BYTES = 32


def _xp(device: str):
    if device == "cpu":
        return np
    import cupy

    return cupy


class World:
    """Host (NumPy) state of one step; :meth:`on` materializes it on a device, sharing as the monitor shares."""

    def __init__(
        self,
        num_slots: int,
        *,
        shared_ring: bool,
        ring_capacity: int,
        nsrc: tuple[int, int],
        mode: RealKvHashMode,
        check_tokens: bool,
        rng,
    ):
        self.num_slots, self.shared_ring, self.mode, self.check_tokens = num_slots, shared_ring, mode, check_tokens
        rings = 1 if shared_ring else 4
        self.rings = np.zeros((rings, ring_capacity, 8), dtype=np.int64)
        self.words = np.zeros((rings, 9), dtype=np.int64)  # [write index lanes, 4 kernel, 4 slot counters]
        self.bufs = np.zeros((4, num_slots, 32), dtype=np.uint8)
        self.kv = [rng.integers(0, 256, (n, num_slots, KV_BYTES), dtype=np.uint8) for n in nsrc]  # K, V
        self.flag = np.ones(1, dtype=np.int32)

    def on(self, device: str) -> dict:
        """Contexts (by tag), on ``device``, viewing one copy of every array."""
        xp = _xp(device)
        rings, words, bufs = xp.asarray(self.rings.copy()), xp.asarray(self.words.copy()), xp.asarray(self.bufs.copy())
        kv = [xp.asarray(half.copy()) for half in self.kv]
        flag = xp.asarray(self.flag.copy())
        out = {"rings": rings, "words": words, "bufs": bufs, "kv": kv}
        for i, tag in enumerate(TAGS):
            r = 0 if self.shared_ring else i
            c = i if self.shared_ring else 0
            half = kv[i % 2]
            sources = tuple(
                RealKvSource(tensor=half[k], page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
                for k in range(half.shape[0])
            )
            tail = i >= 2
            out[tag] = CanaryContext(
                canary_buf=bufs[i],
                kernel_kind=tag,
                violation_ring=rings[r],
                violation_write_index=words[r].view(np.int32)[0:1],
                kernel_run_counter=words[r, 1 + c : 2 + c],
                slot_run_counter=words[r, 5 + c : 6 + c],
                real_kv_sources=sources if tail else (),
                real_kv_hash_mode=self.mode if tail else RealKvHashMode.NONE,
                enable_chain_position_assert=flag,
            )
        return out

    def take(self, state: dict) -> None:
        """Copy a materialized state back into this world (host)."""
        self.rings[...] = to_host(state["rings"])
        self.words[...] = to_host(state["words"])
        self.bufs[...] = to_host(state["bufs"])
        for mine, theirs in zip(self.kv, state["kv"]):
            mine[...] = to_host(theirs)

    def rows(self) -> list[Counter]:
        """Each ring's stored rows, as a multiset."""
        out = []
        for ring, words in zip(self.rings, self.words):
            stored = min(max(int(words[0:1].view(np.int32)[0]), 0), ring.shape[0])
            out.append(Counter(tuple(int(v) for v in row) for row in ring[:stored]))
        return out


def _plans(world: World, rng, bs: int, prefix_max: int, extend_max: int, extend_min: int = 1):
    """Requests with disjoint slots: a prefix chain each (stamped by the reference) and new tokens."""
    free = list(rng.permutation(np.arange(1, world.num_slots)))
    entries, lengths, seeds, new = [], [], [], []
    for _ in range(bs):
        prefix = int(rng.integers(0, prefix_max + 1))
        slots = [int(free.pop()) for _ in range(prefix + int(rng.integers(extend_min, extend_max + 1)))]
        tokens = [int(t) for t in rng.integers(1, 1000, len(slots))]
        entries.append((slots, tokens, prefix))
    # Prefill: every request's prefix, through the reference, on all four contexts.
    pre = [(s[:p], t[:p]) for s, t, p in entries if p]
    if pre:
        plan = write_plan([len(s) for s, _ in pre], [-1] * len(pre))
        ids = i64([x for _, t in pre for x in t])
        pos = i64([x for s, _ in pre for x in range(len(s))])
        loc = i64([x for s, _ in pre for x in s])
        state = world.on("cpu")
        for tag in TAGS:
            launch_canary_write_kernel(
                context=state[tag],
                plan=plan,
                input_ids=ids,
                positions=pos,
                out_cache_loc=loc,
                enable_write_input_assert=False,
                expected_input_tokens=None,
                expected_input_positions=None,
                backend="numpy",
            )
        world.take(state)
        world.rings[...] = 0
        world.words[...] = 0
    v = ([], [], [], [])  # verify slots, positions, prevs, tokens
    for slots, tokens, prefix in entries:
        for p in range(prefix):
            v[0].append(slots[p]), v[1].append(p), v[2].append(slots[p - 1] if p else -1), v[3].append(tokens[p])
        lengths.append(len(slots) - prefix)
        seeds.append(slots[prefix - 1] if prefix else -1)
        new += [(slots[k], tokens[k], k) for k in range(prefix, len(slots))]
    vplan = verify_plan(*v, capacity=max(len(v[0]), 1) + 3)
    wplan = write_plan(lengths, seeds, capacity=bs + 2)
    ids, pos, loc = (i64([e[k] for e in new]) for k in (1, 2, 0))
    return vplan, wplan, ids, pos, loc


def random_world(
    seed: int,
    *,
    bs: int = 5,
    prefix_max: int = 6,
    extend_max: int = 2,
    extend_min: int = 1,
    num_slots: int | None = None,
    shared_ring: bool = True,
    nsrc=(1, 1),
    mode=RealKvHashMode.ALL,
    check_tokens: bool = True,
    asserted: bool = True,
    faults: bool = True,
):
    """A world and its step (verify plan, write plan, token arrays, expected arrays or None); each request
    has ``extend_min..extend_max`` new tokens (many: a long, prefill-shaped step)."""
    rng = np.random.default_rng(seed)
    num_slots = bs * (prefix_max + extend_max) + 16 if num_slots is None else num_slots
    world = World(
        num_slots,
        shared_ring=shared_ring,
        ring_capacity=4 * num_slots + 64,
        nsrc=nsrc,
        mode=mode,
        check_tokens=check_tokens,
        rng=rng,
    )
    vplan, wplan, ids, pos, loc = _plans(world, rng, bs, prefix_max, extend_max, extend_min)
    expected = (ids.copy(), pos.copy()) if asserted else None
    if faults:
        _plant(world, rng, vplan, wplan, ids, pos, loc, expected)
    return world, vplan, wplan, ids, pos, loc, expected


def _plant(world, rng, vplan, wplan, ids, pos, loc, expected) -> None:
    n = int(vplan.verify_num_valid[0])
    fields = world.bufs.view(np.int64)  # [4, slots, 4]
    picks = lambda k, high: rng.choice(high, size=min(k, high), replace=False) if high else []  # noqa: E731
    for i in picks(6, n):
        slot = int(vplan.verify_slot_indices[i])
        kind = int(rng.integers(0, 8))
        if kind == 0:
            fields[rng.integers(0, 4), slot, 0] += 7  # stored token
        elif kind == 1:
            fields[rng.integers(0, 4), slot, 1] += 1  # position
        elif kind == 2:
            fields[rng.integers(0, 4), slot, 2] ^= 1 << 40  # chain hash
        elif kind == 3:
            world.kv[int(rng.integers(0, 2))][0, slot, 0] ^= 0x80  # live KV byte (TAIL real-KV)
        elif kind == 4 and i + 2 < n:  # req_to_token swap
            a, b = vplan.verify_slot_indices[i], vplan.verify_slot_indices[i + 2]
            vplan.verify_slot_indices[i], vplan.verify_slot_indices[i + 2] = b, a
        elif kind == 5:
            vplan.verify_slot_indices[i] = world.num_slots + int(rng.integers(0, 5))  # slot out of range
        elif kind == 6:
            vplan.verify_prev_slot_indices[i] = world.num_slots + 3  # predecessor out of range
        else:
            vplan.verify_expected_tokens[i] += 1  # expected token
    m = ids.shape[0]
    for i in picks(2, m):
        ids[i] += 5  # the forward is fed another token (write-input assert, when on)
    for i in picks(1, m):
        pos[i] += 3  # chain-position jump
    for i in picks(1, m):
        loc[i] = world.num_slots + 1  # slot out of range
    for i in picks(1, m):
        loc[i] = -1  # skipped entry
    bs = int(wplan.write_num_valid_reqs[0])
    if bs > 2:
        wplan.write_seed_slot_indices[bs - 1] = world.num_slots + 2  # seed out of range
        wplan.write_offsets[bs] = m + 4  # clipped range (and the last request's end)
    if expected is not None and m:
        expected[1][0] += 1  # expected position mismatch


PATHS = ("reference", "plain", "fused")


def run_step(
    world: World,
    step,
    path: str,
    device: str = KERNEL_DEVICE,
    *,
    chain_tokens: int | None = None,
    tail_inputs: tuple | None = None,
) -> tuple[World, int]:
    """HEAD then TAIL (each: verify, then write) on ``path``; the resulting world and the launches issued.
    ``chain_tokens``: columns of the shared chain's scratch (default: enough for the step);
    ``tail_inputs``: other (token ids, positions, slots) for TAIL's writes than those HEAD published."""
    _, vplan, wplan, ids, pos, loc, expected = step
    device = "cpu" if path == "reference" else device
    xp = _xp(device)
    state = world.on(device)
    dev = lambda a: None if a is None else xp.asarray(a)  # noqa: E731
    vp = type(vplan)(**{k: dev(v.copy()) for k, v in vplan.arrays().items()})
    wp = type(wplan)(**{k: dev(v.copy()) for k, v in wplan.arrays().items()})
    inputs = dict(
        input_ids=dev(ids),
        positions=dev(pos),
        out_cache_loc=dev(loc),
        enable_write_input_assert=expected is not None,
        expected_input_tokens=dev(expected and expected[0]),
        expected_input_positions=dev(expected and expected[1]),
    )
    tail = (
        inputs
        if tail_inputs is None
        else {**inputs, **dict(zip(("input_ids", "positions", "out_cache_loc"), map(dev, tail_inputs)))}
    )
    chain = SharedChain(
        xp, tokens=ids.shape[0] + 8 if chain_tokens is None else chain_tokens, requests=wplan.write_req_capacity
    )
    bs = int(wplan.write_num_valid_reqs[0])
    launches = []

    def take(spec):  # every launch of the glue, counted and run at once (public calls are not replayed)
        launches.append(spec)
        _launch.run(spec)

    with _launch.sink(take):
        for stage, publish in (((T.HEAD_K_FULL, T.HEAD_V_FULL), True), ((T.TAIL_K_FULL, T.TAIL_V_FULL), False)):
            contexts = [state[tag] for tag in stage]
            _phase(path, contexts, vp, wp, inputs if publish else tail, chain, publish, bs, world.check_tokens)
    out = copy.deepcopy(world)
    out.take(state)
    return out, len(launches)


def _phase(path, contexts, vp, wp, inputs, chain, publish, bs, check_tokens) -> None:
    from kvcanary_numba.fast.endpoints import launch_endpoint_verifies, launch_endpoint_writes

    if path == "fused":
        launch_endpoint_verifies(contexts=contexts, plan=vp, check_verify_expected_token=check_tokens)
        launch_endpoint_writes(contexts=contexts, plan=wp, chain=chain, publish=publish, requests=bs, **inputs)
        return
    backend = "numpy" if path == "reference" else "cuda"
    for i, ctx in enumerate(contexts):
        launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=check_tokens, backend=backend)
        with sharing(chain, publish=publish and i == 0, requests=bs):
            launch_canary_write_kernel(context=ctx, plan=wp, backend=backend, **inputs)
