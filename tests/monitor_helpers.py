"""A hand-driven KV pool for the CanaryMonitor tests: explicit tokens, slots and positions per step."""

from __future__ import annotations

import logging

import numpy as np

from kvcanary_numba import RealKvHashMode, RealKvSource
from kvcanary_numba.monitor import CanaryMonitor, KvGroup, StepBatch

NUM_SLOTS = 16
BYTES = 32
ROWS, WIDTH = 4, 16
#: New (token, slot) pairs of request row 1: a prefill step, then a decode step.
PREFILL = {1: [(101, 3), (102, 4), (103, 5)]}
DECODE = {1: [(104, 6)]}


def token_bytes(token: int, salt: int) -> np.ndarray:
    """32 KV bytes of a token: any fixed function does; salt separates K from V."""
    return ((np.arange(BYTES) * 7 + token * 13 + salt) % 251).astype(np.uint8)


def source(array: np.ndarray) -> RealKvSource:
    return RealKvSource(tensor=array, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES)


class Driver:
    """Requests as lists of (token, slot); each step appends new tokens and runs the monitor hooks."""

    def __init__(self, *, swa_window: int = 0, has_v: bool = True, **monitor_options):
        self.k = np.zeros((NUM_SLOTS, BYTES), dtype=np.uint8)
        self.v = np.zeros((NUM_SLOTS, BYTES), dtype=np.uint8)
        self.req_to_token = np.zeros((ROWS, WIDTH), dtype=np.int32)
        self.requests: dict[int, list[tuple[int, int]]] = {}
        swa = None
        if swa_window:
            # SWA slot = FULL slot + 1 (mod NUM_SLOTS, never 0): a visible translation.
            self.lut = np.zeros(NUM_SLOTS + 1, dtype=np.int64)
            self.lut[1 : NUM_SLOTS - 1] = np.arange(2, NUM_SLOTS)
            self.swa_k = np.zeros((NUM_SLOTS, BYTES), dtype=np.uint8)
            swa = KvGroup(
                kind="swa",
                num_slots=NUM_SLOTS,
                k_sources=(source(self.swa_k),),
                has_v=False,
                swa_window_size=swa_window,
                full_to_swa_index_mapping=self.lut,
            )
        options = dict(write_req_capacity=ROWS - 1, real_kv_hash_mode=RealKvHashMode.ALL, health_interval=0)
        options.update(monitor_options)
        full = KvGroup(
            kind="full",
            num_slots=NUM_SLOTS,
            k_sources=(source(self.k),),
            v_sources=(source(self.v),) if has_v else (),
            has_v=has_v,
        )
        self.monitor = CanaryMonitor(full=full, swa=swa, **options)

    def batch(self, new: dict[int, list[tuple[int, int]]], *, positions=None, expected=None) -> StepBatch:
        """Batch of the given new (token, slot) per request row; ``positions`` overrides the fed positions."""
        rows, prefix, extend, ids, pos, loc, flat, offsets = [], [], [], [], [], [], [], [0]
        for row, tokens in new.items():
            seq = self.requests.setdefault(row, [])
            rows.append(row)
            prefix.append(len(seq))
            extend.append(len(tokens))
            for i, (token, slot) in enumerate(tokens):
                self.req_to_token[row, len(seq) + i] = slot
                ids.append(token)
                pos.append(len(seq) + i)
                loc.append(slot)
            flat += [t for t, _ in seq] + [t for t, _ in tokens]
            offsets.append(len(flat))
        i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
        fed = i64(positions if positions is not None else pos)
        return StepBatch(
            req_pool_indices=i64(rows),
            prefix_lens=i64(prefix),
            extend_seq_lens=i64(extend),
            req_to_token=self.req_to_token,
            input_ids=i64(ids),
            positions=fed,
            out_cache_loc=i64(loc),
            expected_input_tokens=i64(expected) if expected is not None else None,
            expected_input_positions=i64(pos) if expected is not None else None,
            token_ids_flat=i64(flat),
            token_offsets=i64(offsets),
        )

    def step(self, new: dict[int, list[tuple[int, int]]], *, fed_tokens=None, sweep=None, **batch_options):
        """One monitored step; the forward writes the KV of the fed tokens (``fed_tokens`` overrides)."""
        batch = self.batch(new, **batch_options)
        if fed_tokens is not None:
            batch.input_ids[:] = fed_tokens
        with self.monitor.forward(batch):
            for token, slot in zip(batch.input_ids, batch.out_cache_loc):
                self.k[slot] = token_bytes(int(token), 0)
                self.v[slot] = token_bytes(int(token), 1)
                if hasattr(self, "swa_k"):
                    self.swa_k[self.lut[slot]] = token_bytes(int(token), 2)
        for row, tokens in new.items():
            self.requests[row] += tokens
        self.monitor.end_step(sweep=sweep)
        return batch

    def rows(self, since: int = 0) -> list[tuple[str, int, int, tuple[str, ...]]]:
        """(tag, slot, position, reasons) of the violations decoded so far, from index ``since``."""
        return [(v.tag, v.slot_idx, v.position, v.reasons) for v in self.monitor.violations[since:]]


def flip_and_step(d: Driver, caplog, flips, *steps) -> list[str]:
    """Flip a K byte of each slot in ``flips``, run ``steps`` (new tokens per step); the monitor's warnings."""
    for slot in flips:
        d.k[slot, 0] ^= 1
    with caplog.at_level(logging.WARNING, logger="kvcanary_numba.monitor"):
        for new in steps:
            d.step(new)
    return [r.getMessage() for r in caplog.records]


def monitor_records(buffer: np.ndarray) -> np.ndarray:
    """A canary buffer as int64 [slots, 4]: token, position, prev_hash, real_kv_hash."""
    return np.asarray(buffer).view("<i8")[:, :4]


def make(**options) -> CanaryMonitor:
    return Driver(**options).monitor


def gpu_monitor_run(
    kind: str, *, requests: int, prefix: int, bytes_per_token: int, steps: int = 6, flips=()
) -> tuple[dict, CanaryMonitor]:
    """Decode steps of ``benchmarks.workloads.MonitorWorkload`` on the GPU (ALL mode) by path
    ``kind`` (``eager`` / ``fast`` / ``graph``); before step 3 each ``(half, request, position,
    byte)`` of ``flips`` flips bit 0 of that KV byte (``half``: ``"k"`` or ``"v"``).

    Returns host copies of everything the canary keeps (each buffer, the status words, the
    stored ring rows sorted) and the monitor.
    """
    import cupy

    return monitor_run(
        cupy, kind, requests=requests, prefix=prefix, bytes_per_token=bytes_per_token, steps=steps, flips=flips
    )


def monitor_run(
    xp,
    kind: str,
    *,
    requests: int,
    prefix: int,
    bytes_per_token: int,
    steps: int = 6,
    flips=(),
    before_step=None,
    room: int = 0,
) -> tuple[dict, CanaryMonitor]:
    """:func:`gpu_monitor_run` on ``xp`` (NumPy or CuPy); on NumPy ``kind`` is ``numpy`` (the
    reference path) or ``eager`` (the kernel glue with no prepared path: the simulator, or
    a launch layer faked as on a GPU). ``before_step(i, workload)`` runs before step ``i``
    (after the flips), e.g. to reassign batch arrays; ``room``: extra steps the pool has
    room for (a hook that lengthens the steps needs them)."""
    import pathlib
    import sys

    root = str(pathlib.Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.workloads import MonitorWorkload

    options = {}
    if kind == "eager":  # the step plan every step; on NumPy arrays the kernel glue (simulator)
        options = {"prepared": False, "backend": "cuda" if xp is np else "auto"}
    w = MonitorWorkload(
        xp,
        requests=requests,
        prefix=prefix,
        max_steps=steps + room,
        bytes_per_token=bytes_per_token,
        mode=RealKvHashMode.ALL,
        **options,
    )
    m = w.monitor
    w.prefill()
    if kind == "graph":
        w.fill(w.batch, w.length, w.extend)
        m.capture_graph(w.batch)
    for i in range(steps):
        if i == 3:
            for half, request, position, byte in flips:
                getattr(w, half)[int(w.table[request, position]), byte] ^= 1
        if before_step is not None:
            before_step(i, w)
        w.step()
    m.flush()
    host = getattr(xp, "asnumpy", np.asarray)
    stored = min(int(host(m.status.words[0:1].view(np.int32))[0]), m.ring.shape[0])
    out = {f"{stage}_{half}": host(buf).copy() for (stage, half), buf in m.groups[0].buffers.items()}
    out["status"] = host(m.status.words).copy()
    out["violations"] = np.array(sorted(map(tuple, host(m.ring)[:stored].tolist())))
    return out, m
