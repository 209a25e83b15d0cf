"""The load ceiling of a verify: a kernel that only reads what the verify must read.

Copy bandwidth is the roofline of streaming access; a verify over randomly placed
slots gathers one 32-byte record (and, with real-KV sources, one KV row) per
entry, and DRAM serves a random 32-byte read as a 64-byte access
(``results/probes/h200-2026-12-02-ca2345b-ncu-verify-bytes.txt``). What the memory system
delivers for that access pattern is measured here, in the same run: a CUDA C
kernel (CuPy ``RawKernel``) that issues the verify's minimum reads for the same
plan and pool, with 16-byte vector loads and four entries in flight per thread,
and folds nothing. ``verify time / ceiling time`` then says how close the
verify kernel comes to its memory system, on any slot layout.

The kernel XORs every word it reads into one accumulator per thread; the XOR of
all accumulators (:func:`expected_xor`, NumPy) proves it read each byte once.
"""

from __future__ import annotations

import functools

import numpy as np

from kvcanary_numba import RealKvHashMode
from kvcanary_numba.constants import PARTIAL_READ_BYTES

__all__ = ["expected_xor", "verify_loads"]

_SOURCE = r"""
extern "C" __global__ void verify_loads(
        const long long* __restrict__ slots, const long long* __restrict__ positions,
        const long long* __restrict__ prevs, const ulonglong2* __restrict__ records, long long record_pitch,
        const ulonglong2* __restrict__ kv, long long kv_pitch, long long n, unsigned long long* __restrict__ out) {
    // LANES consecutive threads share an entry (a power of two), each reading some of its 16-byte vectors.
    const long long threads = (long long)gridDim.x * blockDim.x;
    const long long total = n * LANES;
    unsigned long long acc = 0;
    for (long long base = (long long)blockIdx.x * blockDim.x + threadIdx.x; base < total; base += UNROLL * threads) {
        unsigned long long part[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {  // UNROLL entries' loads in flight before any is used
            const long long e = base + u * threads;
            part[u] = 0;
            if (e < total) {
                const long long item = e / LANES;
                const int lane = (int)(e % LANES);
                const long long slot = slots[item];
                if (lane == 0) part[u] ^= (unsigned long long)(slot ^ positions[item] ^ prevs[item]);
                #pragma unroll
                for (int r = lane; r < RECORD_VECS; r += LANES) {
                    const ulonglong2 w = records[slot * record_pitch + r];
                    part[u] ^= w.x ^ w.y;
                }
                #pragma unroll
                for (int k = lane; k < KV_VECS; k += LANES) {
                    const ulonglong2 w = kv[slot * kv_pitch + k];
                    part[u] ^= w.x ^ w.y;
                }
            }
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= part[u];
    }
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""
_BLOCK = 256
_UNROLL = 4
_RECORD_VECS = 2  # the record's four int64 fields


def _kv_vectors(context) -> int:
    mode = RealKvHashMode(context.real_kv_hash_mode)
    if mode == RealKvHashMode.NONE or not context.real_kv_sources:
        return 0
    if len(context.real_kv_sources) != 1 or context.real_kv_sources[0].page_size != 1:
        raise ValueError("the load ceiling covers one token-granular (page_size 1) source")
    nbytes = PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else context.real_kv_sources[0].read_bytes
    return int(nbytes) // 16


@functools.cache
def _kernel(lanes: int, kv_vectors: int):
    import cupy

    defines = f"#define LANES {lanes}\n#define UNROLL {_UNROLL}\n#define RECORD_VECS {_RECORD_VECS}\n"
    return cupy.RawKernel(defines + f"#define KV_VECS {kv_vectors}\n" + _SOURCE, "verify_loads")


def verify_loads(context, plan, entries: int, out=None):
    """Read what a clean verify of the first ``entries`` plan entries must read, and nothing else.

    Parameters
    ----------
    context : CanaryContext
        CuPy arrays; ``canary_buf`` uint8 [num_slots, stride] with ``stride % 16 == 0``,
        at most one real-KV source with ``page_size == 1``.
    plan : VerifyPlan
        CuPy arrays; slots, positions and predecessors int64 [capacity].
    entries : int
        Entries read (``<= capacity``).
    out : cupy.ndarray, optional
        uint64 [grid * 256] accumulators, reused between calls.

    Returns
    -------
    cupy.ndarray
        uint64 [grid * 256]: per-thread XOR of the words read (see :func:`expected_xor`).
    """
    import cupy

    kv_vectors = _kv_vectors(context)
    lanes = 8 if kv_vectors >= 8 else 1  # whole 128-byte KV rows per 8 lanes; thread per entry otherwise
    grid = cupy.cuda.Device().attributes["MultiProcessorCount"] * (2048 // _BLOCK)
    if out is None:
        out = cupy.empty(grid * _BLOCK, dtype=np.uint64)
    buf = context.canary_buf
    kv = context.real_kv_sources[0].tensor if kv_vectors else buf  # never read when kv_vectors == 0
    args = (
        plan.verify_slot_indices,
        plan.verify_expected_positions,
        plan.verify_prev_slot_indices,
        buf,
        np.int64(buf.strides[0] // 16),
        kv,
        np.int64(kv.strides[0] // 16),
        np.int64(entries),
        out,
    )
    _kernel(lanes, kv_vectors)((grid,), (_BLOCK,), args)
    return out


def expected_xor(context, plan, entries: int) -> int:
    """XOR of every int64 word :func:`verify_loads` reads (host arrays or CuPy arrays), as uint64."""
    host = [
        np.asarray(getattr(a, "get", lambda: a)())
        for a in (plan.verify_slot_indices, plan.verify_expected_positions, plan.verify_prev_slot_indices)
    ]
    slots, positions, prevs = (a[:entries].view(np.uint64) for a in host)
    words = [slots, positions, prevs]
    buf = np.asarray(getattr(context.canary_buf, "get", lambda: context.canary_buf)())
    words.append(buf.view(np.uint64)[slots.view(np.int64), : 2 * _RECORD_VECS].ravel())
    kv_vectors = _kv_vectors(context)
    if kv_vectors:
        tensor = context.real_kv_sources[0].tensor
        kv = np.asarray(getattr(tensor, "get", lambda: tensor)())
        words.append(kv.view(np.uint64)[slots.view(np.int64), : 2 * kv_vectors].ravel())
    return int(np.bitwise_xor.reduce(np.concatenate(words)))
