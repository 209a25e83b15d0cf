"""Verify and write of several endpoints (launch contexts) of one plan in ONE launch.

A monitor step verifies and then stamps the same plan on the K and the V
canary buffers of a phase (HEAD before the forward, TAIL after): the launches
differ only in their context (buffer, ring, counters, tag, real-KV sources) and,
for writes, in the role each takes in the step's shared chain. Each launch
costs the host ~4-5 us of driver time, so these kernels take the contexts of
up to :data:`MAX_ENDPOINTS` endpoints at once and give each its own part of a
flattened grid (``parts.py``):

- the launch has ``count * per`` blocks (``per``, the blocks of one part, is a
  launch argument; ``count``, the endpoints, follows from the grid); blocks
  ``[e * per, (e + 1) * per)`` run endpoint ``e``;
- each part runs the verify of the core kernel (its own copy of the loop,
  :func:`_verify_body`) or the body of ``write_shared`` (``make_shared_body``) as
  if it were a launch of ``per`` blocks, on its endpoint's arguments: the records,
  rows, counters and write indices are those of one plain launch per endpoint
  (ring rows in another atomic order: rings compare as multisets, as between any
  two launches of the plain kernels).

Per-endpoint arguments are ``UniTuple``s with one item per endpoint slot
(unused slots repeat a used item and are never read): canary buffers, rings,
write indices, slot and kernel counters, tags, real-KV spans (4 per endpoint)
and parameters and, for writes, chain-position flags and chain roles.
Everything else (the plan, the step's token arrays, the chain scratch) is
shared. All endpoints of a launch fold the same number of real-KV sources (the
variant). The body is inlined once per endpoint slot, each copy reading its
arguments straight from the kernel parameters: selecting them at run time
would keep them all in registers (verify_endpoints_tok0_src0 then spills
under its 32-register bound). Shared arrays are declared once (in the body).

Variants: ``verify_endpoints_tok{0|1}_src{0..4}`` and
``write_endpoints_assert{0|1}_src{0..4}``, as the plain kernels'.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ...constants import MAX_REAL_KV_SOURCES, WARP_SIZE
from ...kernels.fingerprint import TILE_PITCH, warp_real_kv_hash
from ...kernels.hashing import MINUS_ONE, ONE, ZERO
from ...kernels.verify import VERIFY_THREADS, _check_entry, launch_options
from .parts import MAX_ENDPOINTS, part_block, part_stride, part_thread
from .write_shared import make_shared_body

__all__ = ["KERNELS", "MAX_ENDPOINTS", "SIGNATURES", "endpoint_write_kernel", "verify_name", "write_name"]

# The kernels below have one body per endpoint slot, and parts.part_block tells two parts apart.
if MAX_ENDPOINTS != 2:
    raise RuntimeError(f"fast/kernels/endpoints.py is written for 2 endpoints per launch, not {MAX_ENDPOINTS}")

_WARPS = VERIFY_THREADS // WARP_SIZE
_WARP = np.int64(WARP_SIZE)


def _verify_body(check_token: bool, nsrc: int):
    """The verify of one endpoint on its part of the grid, as a device function: the core
    kernel's loop (``kvcanary_numba/kernels/verify.py``) around the core's ``_check_entry``
    and ``warp_real_kv_hash``, with the part's thread index and stride (``parts.py``) where
    the core kernel reads ``cuda.grid(1)`` and ``cuda.gridsize(1)``. A copy of the loop:
    the core kernel stays a plain kernel of its own, not one shaped by this launch."""

    @cuda.jit(device=True)
    def body(
        per,
        buf,
        slots,
        expected_tokens,
        expected_positions,
        prev_slots,
        num_valid,
        enable,
        ring,
        write_index,
        slot_counter,
        kernel_counter,
        kind,
        w0,
        w1,
        w2,
        w3,
        params,
    ):
        tid = part_thread(per)
        if tid == 0:
            cuda.atomic.add(kernel_counter, 0, int64(1))
        if enable[0] == 0:
            return
        capacity = int64(slots.shape[0])
        active = min(max(int64(num_valid[0]), ZERO), capacity)
        if tid == 0 and active > 0:
            cuda.atomic.add(slot_counter, 0, active)
        num_slots = int64(buf.shape[0])
        if nsrc == 0:  # thread per entry
            for i in range(int64(tid), active, part_stride(per)):
                slot = slots[i]
                if slot != ZERO:  # padding slot: never verified
                    token = expected_tokens[i] if check_token else MINUS_ONE
                    _check_entry(
                        buf,
                        num_slots,
                        slot,
                        token,
                        expected_positions[i],
                        prev_slots[i],
                        nsrc,
                        ZERO,
                        ring,
                        write_index,
                        kind,
                    )
            return
        # Real-KV variants: a warp per 32 consecutive entries (see the core kernel).
        warp = cuda.threadIdx.x // WARP_SIZE
        lane = int64(cuda.threadIdx.x % WARP_SIZE)
        tile = cuda.shared.array((_WARPS, WARP_SIZE, TILE_PITCH), uint64)[warp]
        bases = cuda.shared.array((_WARPS, WARP_SIZE), int64)[warp]
        warps = part_stride(per) // _WARP
        for t in range(int64(tid // WARP_SIZE), (active + _WARP - ONE) // _WARP, warps):
            i = t * _WARP + lane
            slot = slots[i] if i < active else ZERO
            fold = slot != ZERO and uint64(slot) < uint64(num_slots)
            real = warp_real_kv_hash(tile, bases, lane, slot, fold, nsrc, w0, w1, w2, w3, params)
            if slot != ZERO:
                token = expected_tokens[i] if check_token else MINUS_ONE
                _check_entry(
                    buf,
                    num_slots,
                    slot,
                    token,
                    expected_positions[i],
                    prev_slots[i],
                    nsrc,
                    real,
                    ring,
                    write_index,
                    kind,
                )

    return body


def _make_verify(check_token: bool, nsrc: int):
    body = _verify_body(check_token, nsrc)

    def verify_endpoints(
        bufs,
        slots,
        expected_tokens,
        expected_positions,
        prev_slots,
        num_valid,
        enable,
        rings,
        write_indices,
        slot_counters,
        kernel_counters,
        kinds,
        spans,
        params,
        per,
    ):
        e, _ = part_block(per)
        if e == 0:
            w = spans[0]
            body(
                per,
                bufs[0],
                slots,
                expected_tokens,
                expected_positions,
                prev_slots,
                num_valid,
                enable,
                rings[0],
                write_indices[0],
                slot_counters[0],
                kernel_counters[0],
                kinds[0],
                w[0],
                w[1],
                w[2],
                w[3],
                params[0],
            )
        else:
            w = spans[1]
            body(
                per,
                bufs[1],
                slots,
                expected_tokens,
                expected_positions,
                prev_slots,
                num_valid,
                enable,
                rings[1],
                write_indices[1],
                slot_counters[1],
                kernel_counters[1],
                kinds[1],
                w[0],
                w[1],
                w[2],
                w[3],
                params[1],
            )

    verify_endpoints.__name__ = verify_endpoints.__qualname__ = verify_name(check_token, nsrc)
    return cuda.jit(verify_endpoints, **launch_options(check_token, nsrc))


def endpoint_write_kernel(body, name: str):
    """The kernel running write body ``body`` (``write_shared.make_shared_body``, or ``write_tiled``'s
    ``make_tiled_body``: same arguments) once per endpoint part of the grid, named ``name``."""

    def write_endpoints(
        bufs,
        offsets,
        seeds,
        num_valid_reqs,
        input_ids,
        positions,
        out_cache_loc,
        expected_tokens,
        expected_positions,
        chain_flags,
        rings,
        write_indices,
        slot_counters,
        kernel_counters,
        kinds,
        spans,
        params,
        chain_roles,
        published,
        published_seeds,
        per,
    ):
        e, block = part_block(per)
        if e == 0:
            w = spans[0]
            body(
                block,
                per,
                bufs[0],
                offsets,
                seeds,
                num_valid_reqs,
                input_ids,
                positions,
                out_cache_loc,
                expected_tokens,
                expected_positions,
                chain_flags[0],
                rings[0],
                write_indices[0],
                slot_counters[0],
                kernel_counters[0],
                kinds[0],
                w[0],
                w[1],
                w[2],
                w[3],
                params[0],
                chain_roles[0],
                published,
                published_seeds,
            )
        else:
            w = spans[1]
            body(
                block,
                per,
                bufs[1],
                offsets,
                seeds,
                num_valid_reqs,
                input_ids,
                positions,
                out_cache_loc,
                expected_tokens,
                expected_positions,
                chain_flags[1],
                rings[1],
                write_indices[1],
                slot_counters[1],
                kernel_counters[1],
                kinds[1],
                w[0],
                w[1],
                w[2],
                w[3],
                params[1],
                chain_roles[1],
                published,
                published_seeds,
            )

    write_endpoints.__name__ = write_endpoints.__qualname__ = name
    return cuda.jit(write_endpoints)


def _make_write(input_assert: bool, nsrc: int):
    return endpoint_write_kernel(make_shared_body(input_assert, nsrc), write_name(input_assert, nsrc))


def verify_name(check_token: bool, nsrc: int) -> str:
    """Name of the verify variant in :data:`KERNELS`."""
    return f"verify_endpoints_tok{int(bool(check_token))}_src{int(nsrc)}"


def write_name(input_assert: bool, nsrc: int) -> str:
    """Name of the write variant in :data:`KERNELS`."""
    return f"write_endpoints_assert{int(bool(input_assert))}_src{int(nsrc)}"


def _each(item: str) -> str:
    return f"UniTuple({item}, {MAX_ENDPOINTS})"


#: Real-KV spans and parameters of each endpoint, laid out as ``fingerprint.SOURCE_SIGNATURE``.
_SOURCES = f"{_each('UniTuple(uint64[::1], 4)')}, {_each('UniTuple(int64, 16)')}"
_CONTEXTS = (
    f"{_each('int64[:, ::1]')}, {_each('int32[::1]')}, {_each('int64[::1]')}, {_each('int64[::1]')}, "
    f"{_each('int64')}, {_SOURCES}"
)  # rings, write indices, slot / kernel counters, tags, sources
VERIFY_SIGNATURE = (
    f"void({_each('int64[:, ::1]')}, int64[::1], int64[::1], int64[::1], int64[::1], int32[::1], int32[::1], "
    f"{_CONTEXTS}, int64)"
)
WRITE_SIGNATURE = (
    f"void({_each('int64[:, ::1]')}, int64[::1], int64[::1], int32[::1], int64[::1], int64[::1], int64[::1], "
    f"int64[::1], int64[::1], {_each('int32[::1]')}, {_CONTEXTS}, {_each('int64')}, int64[:, ::1], int64[:, ::1], "
    "int64)"
)

_VARIANTS = [(flag, n) for flag in (False, True) for n in range(MAX_REAL_KV_SOURCES + 1)]
KERNELS = {
    **{verify_name(f, n): _make_verify(f, n) for f, n in _VARIANTS},
    **{write_name(f, n): _make_write(f, n) for f, n in _VARIANTS},
}
SIGNATURES = {name: (VERIFY_SIGNATURE if name.startswith("verify") else WRITE_SIGNATURE,) for name in KERNELS}
