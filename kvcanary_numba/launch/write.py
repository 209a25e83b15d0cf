"""Launch glue of the write kernel (:mod:`kvcanary_numba.kernels.write`).

Called by :func:`kvcanary_numba.write.run` with validated arguments: CUDA arrays on a GPU,
NumPy arrays under the simulator. One warp walks one request (the chain is serial within a
request); requests spread over blocks first, then warps stride over them.

``input_ids``, ``positions`` and ``out_cache_loc`` may be int32 (as SGLang's launcher
accepts): :func:`widen_inputs` copies each into int64 launch scratch first, one launch of
:mod:`kvcanary_numba.kernels.widen` each (scratch as in ``launch/plan.py``: per call by
default, kept per stream by the fast wing).
"""

from __future__ import annotations

import numpy as np

from ..constants import WARP_SIZE
from ..kernels import widen, write as kernels
from ._launch import (
    ON_SIMULATOR,
    THREADS_PER_SM,
    array_layout,
    block_size,
    current_stream,
    kernel_array,
    launch,
    persistent_grid,
    persistent_views,
    reinterpret,
    sim_shape,
)
from .context import context_args
from .plan import CallScratch

__all__ = ["WIDENED", "launch_canary_write_kernel", "widen_inputs", "write_arguments", "write_shape"]

#: The write's arguments that may be int32 (widened to int64 before the write kernel reads them).
WIDENED = ("input_ids", "positions", "out_cache_loc")
_WIDEN_SIG = widen.SIGNATURES["widen_int32"][0]
_WIDEN_BLOCK = 256


def _dtype(array) -> np.dtype:
    """The NumPy dtype of an array argument (its attribute when it is one: NumPy, CuPy, Numba)."""
    dtype = getattr(array, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) else array_layout(array)[3]


def widen_inputs(scratch, stream: int, arrays: dict) -> dict:
    """``arrays`` (name -> array) with each int32 one replaced by an int64 copy in ``scratch``.

    The copy is a view of a scratch array of the next power-of-two size (one array per size
    class and name, so the fast wing's per-stream scratch serves every call of that class),
    filled by one launch of ``widen_int32`` on ``stream``, ahead of the write in stream order.
    """
    out = dict(arrays)
    for name, array in arrays.items():
        if array is None or _dtype(array) != np.int32:
            continue
        n = int(array.shape[0])
        size = 1 << max(n - 1, 0).bit_length()
        wide = scratch.zeros(f"widened_{name}", (size,), np.int64, stream)[:n]
        block = block_size(_WIDEN_BLOCK)
        grid = persistent_grid(n, block)
        launch(widen.widen_int32, _WIDEN_SIG, grid, block, (kernel_array(array), wide), stream)
        out[name] = wide
    return out


def write_arguments(
    context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
) -> tuple[int, tuple]:
    """(real-KV sources folded, the write kernel's arguments; the fast wing's write kernels take more)."""
    tokens = kernel_array(input_ids)
    token_positions = kernel_array(positions)
    # Without the write-input assert the expected arrays are None; the variant never reads
    # them, so the (read-only) inputs stand in for them.
    nsrc, words, tail = context_args(context, reinterpret(input_ids, np.uint64))
    args = (
        words,
        *persistent_views(plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs),
        tokens,
        token_positions,
        kernel_array(out_cache_loc),
        tokens if expected_input_tokens is None else kernel_array(expected_input_tokens),
        token_positions if expected_input_positions is None else kernel_array(expected_input_positions),
        *persistent_views(context.enable_chain_position_assert),
        *tail,
    )
    return nsrc, args


def write_shape() -> tuple[int, int]:
    """(threads per block, blocks per SM) of the warp-per-request write kernels."""
    warps = kernels.WRITE_WARPS
    if ON_SIMULATOR:  # tests run several warps per block with simulated_shapes
        warps = min(sim_shape("write_warps", warps), kernels.MAX_WRITE_WARPS)
    block = warps * WARP_SIZE
    return block, THREADS_PER_SM // block


def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert: bool,
    expected_input_tokens,
    expected_input_positions,
    stream: int | None = None,
    scratch=None,
) -> None:
    """Queue the warp-per-request write kernel on ``stream`` (after widening int32 inputs).

    Parameters
    ----------
    context : CanaryContext
        Canary buffer (uint8 [num_slots, stride], written), ring, write index,
        counters, ``enable_chain_position_assert`` (int32 [1]), tag, real-KV
        sources and mode.
    plan : WritePlan
        int64 [capacity + 1] offsets, int64 [capacity] seeds, int32 [1]
        ``write_num_valid_reqs``.
    input_ids, positions, out_cache_loc : int64 or int32 [num_tokens]
        Entries' tokens, positions and target slots.
    enable_write_input_assert : bool
        Selects the variant that compares with the expected inputs.
    expected_input_tokens, expected_input_positions : int64 [num_tokens] or None
        Present exactly when ``enable_write_input_assert``.
    stream : int or None
        CUDA stream handle (None: CuPy's current stream).
    scratch : optional
        Where int32 inputs are widened (:class:`~kvcanary_numba.launch.plan.CallScratch`:
        per call).
    """
    stream = current_stream() if stream is None else int(stream)
    scratch = CallScratch() if scratch is None else scratch
    wide = widen_inputs(scratch, stream, dict(input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc))
    input_ids, positions, out_cache_loc = (wide[name] for name in WIDENED)
    nsrc, args = write_arguments(
        context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
    )
    name = kernels.kernel_name(enable_write_input_assert, nsrc)
    block, per_sm = write_shape()
    # One warp per request, requests spread over the blocks first (one block per request
    # up to what stays resident): warps then stride.
    grid = persistent_grid(plan.write_seed_slot_indices.shape[0], 1, blocks_per_sm=per_sm)
    launch(kernels.KERNELS[name], kernels.SIGNATURES[name][0], grid, block, args, stream)
