"""CUDA launch glue of the plan: offsets kernel, then entries kernel.

Called by :mod:`kvcanary_numba.plan` with validated public keyword arguments
(minus ``backend``); kernels in :mod:`kvcanary_numba.kernels.plan`.

Launch shapes
-------------
Offsets: tiles of ``OFFSETS_BLOCK * OFFSETS_ITEMS`` requests (1024 on a GPU);
batches of several tiles chain them with a single-pass look-back, no cap on
``bs`` (small tiles measured faster than one 4096-request block: see below).
Entries: a persistent grid of ``ENTRIES_BLOCK`` threads, no more blocks than
stay resident and than ``verify_capacity`` needs at ``ENTRIES_PER_THREAD``;
the entry count is read on the device. Under the simulator both use
``SIM_BLOCK`` threads and one request per thread (``SIM_OFFSETS_*``; tests
shrink the tile to get many tiles out of small batches, and run the GPU's
requests per thread with ``_launch.simulated_shapes``).

Scratch
-------
The look-back state (int64, zeroed, left zeroed by every launch) and, for
:func:`launch_canary_plan_kernels`, the verify offsets ``[write_req_capacity + 1]``
come from ``scratch``: by default fresh zeroed arrays per call (:class:`CallScratch`).
The fast wing passes arrays it keeps per (device, stream), so that a replayed call or a
captured CUDA graph never allocates. Their sizes depend only on the plan's capacity,
never on ``bs``, and nothing syncs with the host.
"""

from __future__ import annotations

import numpy as np

from ..constants import PLAN_BLOCK_SIZE
from ..kernels import plan as kernels
from . import _launch as common

__all__ = ["CallScratch", "launch_canary_plan_kernels", "launch_plan_offsets_kernel"]

#: Offsets kernel: threads per block and requests per thread on a GPU (H200, bs=4096:
#: 512 x 2 ran the offsets step in 12.2 us, 1024 x 4 in 19.8 us: each thread's seed
#: lookups are serial DRAM reads, so fewer items per thread beat a single-tile scan) ...
OFFSETS_BLOCK = 512
OFFSETS_ITEMS = 2
#: ... and under the simulator (tests shrink these to get many tiles from small batches).
SIM_OFFSETS_BLOCK = common.SIM_BLOCK
SIM_OFFSETS_ITEMS = 1
#: Entries kernel: threads per block (SGLang's shape).
ENTRIES_BLOCK = PLAN_BLOCK_SIZE

_OFFSETS_SIG = kernels.SIGNATURES["plan_offsets"][0]
_ENTRIES_SIG = kernels.SIGNATURES["plan_entries"][0]


class CallScratch:
    """Zeroed scratch arrays allocated for one call (NumPy under the simulator)."""

    def zeros(self, name: str, shape: tuple[int, ...], dtype, stream: int):
        host = np.zeros(shape, dtype=dtype)
        if common.ON_SIMULATOR:
            return host
        from numba import cuda

        return cuda.to_device(host)


def offsets_shape() -> tuple[int, int]:
    """(threads per block, requests per thread) of the offsets kernel."""
    if common.ON_SIMULATOR:  # tests pick other shapes with common.simulated_shapes
        block = common.sim_shape("offsets_block", SIM_OFFSETS_BLOCK)
        items = common.sim_shape("offsets_items", SIM_OFFSETS_ITEMS)
    else:
        block, items = OFFSETS_BLOCK, OFFSETS_ITEMS
    # The block scan's shared arrays hold MAX_SCAN_BLOCK threads; more items per thread instead.
    return min(block, kernels.MAX_SCAN_BLOCK), items


def _batch(
    scratch, stream: int, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, full_to_swa_index_mapping
):
    """Kernel arguments of the batch metadata: (rpi, prefix, extend, req_to_token, lut, has_lut)."""
    arr = common.kernel_array
    if full_to_swa_index_mapping is None:
        lut, has_lut = scratch.zeros("dummy", (1,), np.int64, stream), 0
    else:
        lut, has_lut = arr(full_to_swa_index_mapping, persistent=True), 1
    # The per-step metadata is not cached (a new array each step); the tables are long-lived.
    return (
        arr(req_pool_indices),
        arr(prefix_lens),
        arr(extend_seq_lens),
        arr(req_to_token, persistent=True),
        lut,
        has_lut,
    )


def _run_offsets(scratch, stream: int, batch: tuple, outputs: tuple, *, swa_window_size, verify_capacity) -> None:
    """Launch the offsets kernel on kernel arguments ``batch`` (see :func:`_batch`) and
    ``outputs`` = (verify offsets, write offsets, seeds, num_valid, enable, write_num_valid_reqs)."""
    bs = int(batch[0].shape[0])
    block, items = offsets_shape()
    tile = block * items
    # Sized by the plan's capacity (>= bs), not by bs, so every batch of the plan shares it.
    capacity_tiles = common.grid_for(max(int(outputs[2].shape[0]), bs), tile)
    size = kernels.LOOKBACK_HEADER + kernels.LOOKBACK_STRIDE * capacity_tiles
    lookback = scratch.zeros("lookback", (size,), np.int64, stream)
    args = (*batch[:4], batch[4], batch[5], int(swa_window_size), int(verify_capacity), items, *outputs, lookback)
    common.launch(kernels.plan_offsets_kernel, _OFFSETS_SIG, common.grid_for(bs, tile), block, args, stream)


def launch_plan_offsets_kernel(
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    full_to_swa_index_mapping,
    out_verify_offsets_scratch,
    out_write_offsets,
    out_write_seed_slot_indices,
    out_verify_num_valid,
    out_verify_enable,
    out_write_num_valid_reqs,
    swa_window_size,
    verify_capacity,
    stream: int | None = None,
    scratch=None,
) -> None:
    """Offsets step on the device (see :func:`kvcanary_numba.plan_offsets.launch_plan_offsets_kernel`).

    The output arrays are the caller's and may be per-call, so their device
    views are not cached.
    """
    stream = common.current_stream() if stream is None else stream
    scratch = CallScratch() if scratch is None else scratch
    batch = _batch(
        scratch, stream, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, full_to_swa_index_mapping
    )
    outputs = tuple(
        common.kernel_array(x)
        for x in (
            out_verify_offsets_scratch,
            out_write_offsets,
            out_write_seed_slot_indices,
            out_verify_num_valid,
            out_verify_enable,
            out_write_num_valid_reqs,
        )
    )
    _run_offsets(scratch, stream, batch, outputs, swa_window_size=swa_window_size, verify_capacity=verify_capacity)


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size,
    full_to_swa_index_mapping,
    verify_capacity,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset,
    stream: int | None = None,
    scratch=None,
) -> None:
    """Full plan on the device (see :func:`kvcanary_numba.plan.launch_canary_plan_kernels`).

    Two launches, no host sync: the entries kernel reads the entry count and
    the enable flag the offsets kernel left on the device.
    """
    vplan, wplan = verify_plan_out, write_plan_out
    stream = common.current_stream() if stream is None else stream
    scratch = CallScratch() if scratch is None else scratch
    batch = _batch(
        scratch, stream, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, full_to_swa_index_mapping
    )
    verify_offsets = scratch.zeros(
        "verify_offsets", (wplan.write_req_capacity + 1,), np.int64, stream
    )  # bs <= capacity
    arr = common.kernel_array
    outputs = (
        verify_offsets,
        *common.persistent_views(
            wplan.write_offsets,
            wplan.write_seed_slot_indices,
            vplan.verify_num_valid,
            vplan.enable,
            wplan.write_num_valid_reqs,
        ),
    )
    _run_offsets(scratch, stream, batch, outputs, swa_window_size=swa_window_size, verify_capacity=verify_capacity)

    pool = req_to_verify_expected_tokens
    if pool is None:
        pool, lens, has_pool = (
            scratch.zeros("dummy", (1, 1), np.int32, stream),
            scratch.zeros("dummy", (1,), np.int64, stream),
            0,
        )
    else:
        pool, lens, has_pool = arr(pool, persistent=True), arr(req_to_verify_expected_tokens_valid_lens), 1
    rpi, prefix, _, rtt, lut, has_lut = batch
    args = (
        rpi,
        prefix,
        rtt,
        lut,
        has_lut,
        int(swa_window_size),
        pool,
        lens,
        has_pool,
        int(kv_token_id_vs_position_offset),
        verify_offsets,
        outputs[4],
        *common.persistent_views(
            vplan.verify_slot_indices,
            vplan.verify_expected_tokens,
            vplan.verify_expected_positions,
            vplan.verify_prev_slot_indices,
        ),
    )
    block = common.block_size(ENTRIES_BLOCK)
    # ENTRIES_PER_THREAD entries per thread and tile; no more blocks than the device keeps resident.
    threads = -(-int(verify_capacity) // kernels.ENTRIES_PER_THREAD)
    grid = common.resident_grid(kernels.plan_entries_kernel, _ENTRIES_SIG, threads, block)
    common.launch(kernels.plan_entries_kernel, _ENTRIES_SIG, grid, block, args, stream)
