"""What the A/B scripts share: loading one tree's package, statistics, and the workloads, built
from the package's public API only.

The A/B scripts (``ab_monitor.py``, ``ab_public.py``, ``ab_cpu.py``) measure one library tree
per process and are run alternately against an old tree and a new one in one device call
(``benchmarks/gpu_session.sh ab``, ``abpublic``, ``abcpu``). The old tree may predate any
internal module this tree has, so nothing here imports ``benchmarks.*`` or a private module of
``kvcanary_numba``: only ``from kvcanary_numba import ...`` names that both trees export.
Each script loads this file by path (:func:`load_common` in the script), not as
``benchmarks.ab_common``: once the measured tree is first on ``sys.path``, ``benchmarks`` would
be that tree's package.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import subprocess
import sys
import time
import warnings

import numpy as np

# CuPy 14 calls np.row_stack, which NumPy 2.4 builds may lack (the device image's did).
np.row_stack = getattr(np, "row_stack", np.vstack)
# The monitors here run without the expected-token check on purpose (the bench's configuration).
warnings.filterwarnings("ignore", message="kv-canary blind spot")

__all__ = ["MonitorCase", "PublicStep", "load_tree", "stats", "timed"]

_MASK = (1 << 64) - 1
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


# --- the measured tree -------------------------------------------------------------------


def load_tree(tree: str) -> dict:
    """Import ``kvcanary_numba`` from ``tree`` (first on ``sys.path``); return what names it.

    Raises ``SystemExit`` when the package imported is not the tree's (an installed copy
    shadowing it would make both sides of the A/B the same code).
    """
    root = pathlib.Path(tree).resolve()
    sys.path.insert(0, str(root))
    for name in [n for n in sys.modules if n == "kvcanary_numba" or n.startswith("kvcanary_numba.")]:
        del sys.modules[name]
    import kvcanary_numba

    where = pathlib.Path(kvcanary_numba.__file__).resolve()
    if root not in where.parents:
        raise SystemExit(f"kvcanary_numba came from {where}, not from the tree {root}")
    digest = hashlib.sha1()
    for path in sorted((root / "kvcanary_numba").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    commit = None
    if (root / ".git").exists():
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commit = done.stdout.strip() or None
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "tree": tree,
        "package": str(where.parent),
        "commit": commit,
        "source_sha1": digest.hexdigest()[:12],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cores": affinity,
    }


def stats(samples_us) -> dict:
    """p10 / median / p90 (µs, 2 decimals) and the sample count."""
    a = np.asarray(samples_us, dtype=np.float64)
    out = {q: round(float(np.percentile(a, p)), 2) for q, p in (("p10", 10), ("median", 50), ("p90", 90))}
    out["n"] = int(a.size)
    return out


def timed(fn, *, calls: int, warmup: int, before=None) -> dict:
    """:func:`stats` of the host time of ``fn(i)``; ``before(i)`` runs untimed before each call."""
    samples = []
    clock = time.perf_counter
    for i in range(warmup + calls):
        if before is not None:
            before(i)
        t0 = clock()
        fn(i)
        t1 = clock()
        if i >= warmup:
            samples.append((t1 - t0) * 1e6)
    return stats(samples)


# --- clean chains (host) ------------------------------------------------------------------


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(_MUL1)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(_MUL2)
    return x ^ (x >> np.uint64(31))


def _mix3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return _splitmix(_splitmix(_splitmix(a) ^ b) ^ c)


def _check_mix3(kv) -> None:
    """The vectorised chain step must be the package's (``kvcanary_numba.splitmix64_mix3``)."""
    values = [(1, 2, 3), (_MASK, 7, 0), (kv.CANARY_CHAIN_HEAD & _MASK, 12345, 4095)]
    with np.errstate(over="ignore"):
        got = _mix3(*(np.array(column, dtype=np.uint64) for column in zip(*values)))
    want = [kv.splitmix64_mix3(*v) & _MASK for v in values]
    if [int(g) for g in got] != want:
        raise SystemExit("ab_common: the vectorised mix3 differs from kvcanary_numba.splitmix64_mix3")


def chains(kv, requests: int, length: int, seed: int = 0):
    """Host chains of ``requests`` x ``length``: slots (1.., permuted), tokens, prev_hash (uint64)."""
    _check_mix3(kv)
    rng = np.random.default_rng([seed, requests, length])
    slots = (rng.permutation(requests * length) + 1).reshape(requests, length).astype(np.int64)
    tokens = rng.integers(1, 1 << 31, (requests, length), dtype=np.int64)
    prev = np.empty((requests, length), dtype=np.uint64)
    running = np.full(requests, kv.CANARY_CHAIN_HEAD & _MASK, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for p in range(length):
            prev[:, p] = running
            running = _mix3(running, tokens[:, p].view(np.uint64), np.full(requests, p, np.uint64))
    return slots, tokens, prev


# --- the public-call step -------------------------------------------------------------------


class PublicStep:
    """One decode step's plan, verify and write keyword arguments on clean chains (public API only).

    ``bs`` requests hold ``prefix + 1`` stamped positions each; the plan verifies ``[0, prefix)``
    and the write re-stamps position ``prefix`` (identical records: repeated calls change
    nothing). PARTIAL mode, one real-KV source of 128 bytes per token. ``xp``: NumPy or CuPy.
    """

    def __init__(self, kv, xp, *, bs: int, prefix: int, bytes_per_token: int = 128, seed: int = 0):
        mode = kv.RealKvHashMode.PARTIAL
        length = prefix + 1
        slots, tokens, prev = chains(kv, bs, length, seed)
        num_slots = bs * length + 1
        words = np.zeros((num_slots, 4), dtype=np.int64)
        flat = slots.reshape(-1)
        words[flat, 0] = tokens.reshape(-1)
        words[flat, 1] = np.tile(np.arange(length, dtype=np.int64), bs)
        words[flat, 2] = prev.reshape(-1).view(np.int64)
        rng = np.random.default_rng(seed)
        kv_bytes = rng.integers(0, 256, (num_slots, bytes_per_token), dtype=np.uint8)
        source = kv.RealKvSource(
            tensor=xp.asarray(kv_bytes), page_size=1, num_bytes_per_token=bytes_per_token, read_bytes=bytes_per_token
        )
        buf = xp.asarray(words.view(np.uint8).reshape(num_slots, 32))
        real = xp.zeros(num_slots, dtype=np.int64)
        kv.compute_real_kv_hash(
            real_kv_sources=(source,),
            real_kv_hash_mode=mode,
            slot_indices=xp.arange(num_slots, dtype=np.int64),
            out=real,
        )
        buf.view(np.int64)[:, 3] = real
        buf.view(np.int64)[0, 3] = 0
        self.context = kv.CanaryContext(
            canary_buf=buf,
            kernel_kind=kv.CanaryLaunchTag.TAIL_K_FULL,
            violation_ring=xp.zeros((1024, 8), dtype=np.int64),
            violation_write_index=xp.zeros(1, dtype=np.int32),
            slot_run_counter=xp.zeros(1, dtype=np.int64),
            kernel_run_counter=xp.zeros(1, dtype=np.int64),
            real_kv_sources=(source,),
            real_kv_hash_mode=mode,
            enable_chain_position_assert=xp.zeros(1, np.int32),
        )
        table = np.zeros((bs + 1, length), dtype=np.int32)
        table[1:] = slots
        device = "cpu" if xp is np else "cuda"
        capacity = max(bs * prefix, 1)
        vplan = kv.VerifyPlan.allocate(verify_capacity=capacity, device=device)
        wplan = kv.WritePlan.allocate(write_req_capacity=bs, device=device)
        self.plan = dict(
            verify_plan_out=vplan,
            write_plan_out=wplan,
            req_pool_indices=xp.arange(1, bs + 1, dtype=np.int64),
            prefix_lens=xp.full(bs, prefix, dtype=np.int64),
            extend_seq_lens=xp.ones(bs, dtype=np.int64),
            req_to_token=xp.asarray(table),
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=capacity,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )
        self.verify = dict(context=self.context, plan=vplan, check_verify_expected_token=False)
        column = lambda a: xp.asarray(np.ascontiguousarray(a[:, prefix]))  # noqa: E731
        self.write = dict(
            context=self.context,
            plan=wplan,
            input_ids=column(tokens),
            positions=xp.full(bs, prefix, dtype=np.int64),
            out_cache_loc=column(slots),
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
        )
        self.offsets = dict(
            req_pool_indices=self.plan["req_pool_indices"],
            prefix_lens=self.plan["prefix_lens"],
            extend_seq_lens=self.plan["extend_seq_lens"],
            req_to_token=self.plan["req_to_token"],
            full_to_swa_index_mapping=None,
            out_verify_offsets_scratch=xp.zeros(bs + 1, dtype=np.int64),
            out_write_offsets=wplan.write_offsets,
            out_write_seed_slot_indices=wplan.write_seed_slot_indices,
            out_verify_num_valid=vplan.verify_num_valid,
            out_verify_enable=vplan.enable,
            out_write_num_valid_reqs=wplan.write_num_valid_reqs,
            swa_window_size=0,
            verify_capacity=capacity,
        )
        self.kv = kv

    def calls(self) -> dict:
        """name -> ``fn(i)`` of each public call of the step (and the three in a row)."""
        kv, plan, verify, write = self.kv, self.plan, self.verify, self.write
        return {
            "plan": lambda _: kv.launch_canary_plan_kernels(**plan),
            "verify": lambda _: kv.launch_canary_verify_kernel(**verify),
            "write": lambda _: kv.launch_canary_write_kernel(**write),
            "plan+verify+write": lambda _: (
                kv.launch_canary_plan_kernels(**plan),
                kv.launch_canary_verify_kernel(**verify),
                kv.launch_canary_write_kernel(**write),
            ),
        }

    def offsets_call(self):
        kv, offsets = self.kv, self.offsets
        return lambda _: kv.launch_plan_offsets_kernel(**offsets)

    def rows(self) -> int:
        """Violation rows recorded so far (0: every call found clean data)."""
        index = self.context.violation_write_index
        return int(np.asarray(index.get() if hasattr(index, "get") else index)[0])


# --- the monitored pool ---------------------------------------------------------------------


class MonitorCase:
    """A FULL pool (K and V, layer-0 sources) under a ``CanaryMonitor``, one repeated step.

    ``requests`` requests with ``prefix`` tokens already stamped (one prefill step at setup)
    extend by ``extend`` tokens; the same step (positions ``[prefix, prefix + extend)``) is
    repeated, which re-stamps identical records. The batch arrays are allocated once and
    refilled in place, as a CUDA-graph engine does; :meth:`write_kv` is the engine's forward.
    """

    def __init__(self, kv, xp, *, requests: int, prefix: int, extend: int, bytes_per_token: int = 64, seed: int = 0):
        self.xp, self.requests, self.prefix, self.extend = xp, requests, prefix, extend
        rng = np.random.default_rng(seed)
        width = prefix + extend
        num_slots = requests * width + 1
        self.table = np.zeros((requests + 1, width), dtype=np.int32)
        self.table[1:] = (rng.permutation(requests * width) + 1).reshape(requests, width)
        self.tokens = rng.integers(1, 32000, (requests, width), dtype=np.int64)
        self.k = xp.zeros((num_slots, bytes_per_token), dtype=np.uint8)
        self.v = xp.zeros((num_slots, bytes_per_token), dtype=np.uint8)
        sources = [
            (kv.RealKvSource(tensor=t, page_size=1, num_bytes_per_token=bytes_per_token, read_bytes=bytes_per_token),)
            for t in (self.k, self.v)
        ]
        full = kv.KvGroup(kind="full", num_slots=num_slots, k_sources=sources[0], v_sources=sources[1])
        self.monitor = kv.CanaryMonitor(
            full=full,
            device="cpu" if xp is np else "cuda",
            real_kv_hash_mode=kv.RealKvHashMode.PARTIAL,
            write_req_capacity=requests,
            write_token_capacity=requests * max(prefix, extend),
            verify_capacity=max(requests * width, 1),
            health_interval=0,
            ring_capacity=4096,
        )
        self.req_to_token = xp.asarray(self.table)
        self._kv = kv
        if prefix:
            first = self._batch(prefix)
            self.fill(first, 0, prefix)
            self.run_step(first)
        self.batch = self._batch(extend)
        self.fill(self.batch, prefix, extend)

    def _batch(self, extend: int):
        xp, bs = self.xp, self.requests
        zeros = lambda n: xp.zeros(n, dtype=np.int64)  # noqa: E731
        return self._kv.StepBatch(
            req_pool_indices=xp.arange(1, bs + 1, dtype=np.int64),
            prefix_lens=zeros(bs),
            extend_seq_lens=xp.full(bs, extend, dtype=np.int64),
            req_to_token=self.req_to_token,
            input_ids=zeros(bs * extend),
            positions=zeros(bs * extend),
            out_cache_loc=zeros(bs * extend),
        )

    def fill(self, batch, start: int, extend: int) -> None:
        cols = slice(start, start + extend)
        xp = self.xp
        batch.prefix_lens[...] = start
        batch.positions[...] = xp.asarray(np.tile(np.arange(start, start + extend, dtype=np.int64), self.requests))
        batch.out_cache_loc[...] = xp.asarray(self.table[1:, cols].reshape(-1).astype(np.int64))
        batch.input_ids[...] = xp.asarray(self.tokens[:, cols].reshape(-1))

    def write_kv(self, batch) -> None:
        """The engine's forward: KV bytes of each new token (a fixed function of the token)."""
        xp = self.xp
        pattern = (batch.input_ids[:, None] * 7 + xp.arange(self.k.shape[1])[None, :]) % 251
        self.k[batch.out_cache_loc] = pattern.astype(np.uint8)
        self.v[batch.out_cache_loc] = (pattern + 1).astype(np.uint8)

    def run_step(self, batch) -> None:
        m = self.monitor
        m.pre_forward(batch)
        self.write_kv(batch)
        m.post_forward()
        m.end_step()

    def rows(self) -> int:
        """Violation rows the monitor recorded (0 on a clean run; reads the device)."""
        self.monitor.flush()
        return int(self.monitor.stats()["violations_recorded"])
