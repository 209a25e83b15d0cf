"""Launch glue of the write kernels (``kvcanary_numba.kernels.write``)."""

from __future__ import annotations

import numpy as np

from ..constants import WARP_SIZE
from ..kernels import write as _kernels
from . import _common
from .chain import launch_chain_publish, write_chain
from .verify import context_args

__all__ = ["launch_canary_write_kernel", "launch_write_baseline"]


def _arguments(context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions):
    tokens = _common.kernel_array(input_ids)
    token_positions = _common.kernel_array(positions)
    # Without the write-input assert the expected arrays are None; the variant
    # never reads them, so the (read-only) inputs stand in for them.
    nsrc, words, tail = context_args(context, _common.reinterpret(input_ids, np.uint64))
    args = (
        words,
        *_common.persistent_views(plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs),
        tokens,
        token_positions,
        _common.kernel_array(out_cache_loc),
        tokens if expected_input_tokens is None else _common.kernel_array(expected_input_tokens),
        token_positions if expected_input_positions is None else _common.kernel_array(expected_input_positions),
        *_common.persistent_views(context.enable_chain_position_assert),
        *tail,
    )
    return nsrc, args


def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
) -> None:
    """Run the warp-per-request write kernel on CuPy's current stream (or the simulator).

    Arguments are those of :func:`kvcanary_numba.launch_canary_write_kernel`
    minus ``backend``, already validated: CUDA arrays on a GPU, NumPy arrays
    under the simulator.

    Parameters
    ----------
    context : CanaryContext
        Canary buffer (uint8 [num_slots, stride], written), ring, write index,
        counters, ``enable_chain_position_assert`` (int32 [1]), tag, real-KV
        sources and mode.
    plan : WritePlan
        int64 [capacity + 1] offsets, int64 [capacity] seeds, int32 [1]
        ``write_num_valid_reqs``.
    input_ids, positions, out_cache_loc : int64 [num_tokens]
        Entries' tokens, positions and target slots.
    enable_write_input_assert : bool
        Selects the variant that compares with the expected inputs.
    expected_input_tokens, expected_input_positions : int64 [num_tokens] or None
        Present exactly when ``enable_write_input_assert``.

    Notes
    -----
    One warp per request (``WRITE_WARPS`` per block), grid-striding over the
    requests when the capacity exceeds what stays resident. A long write takes
    the tiled path instead (``launch.chain.write_chain``): ``chain_publish``
    runs the chain alone, then ``write_tiled`` stamps, a block per request.
    Inside ``launch.chain.sharing`` (a monitor step) the step's first write
    publishes and the others only stamp; outside it a write whose requests
    average ``OWN_TILED_MIN_TOKENS`` tokens publishes to launch scratch.
    """
    nsrc, args = _arguments(
        context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
    )
    name = _kernels.kernel_name(enable_write_input_assert, nsrc)
    capacity = plan.write_seed_slot_indices.shape[0]
    # A monitor step shares one chain between its write launches; a long public write
    # publishes its own (launch/chain.py).
    tiled, chain = write_chain(int(input_ids.shape[0]), capacity, unshared_scratch(args[0]))
    args = (*args, *chain)
    if tiled is not None:
        _launch_tiled(tiled, args, capacity, enable_write_input_assert, nsrc)
        return
    block, per_sm = write_shape()
    # One warp per request, requests spread over the blocks first (one block
    # per request up to what stays resident): warps then stride.
    grid = _common.persistent_grid(capacity, 1, blocks_per_sm=per_sm)
    _common.launch(_kernels.KERNELS[name], _kernels.SIGNATURES[name][0], grid, block, args)


def write_shape() -> tuple[int, int]:
    """(threads per block, blocks per SM) of the serial write kernels (plain and endpoint)."""
    warps = _kernels.WRITE_WARPS
    if _common.ON_SIMULATOR:  # tests run several warps per block with _common.simulated_shapes
        warps = min(_common.sim_shape("write_warps", warps), _kernels.MAX_WRITE_WARPS)
    block = warps * WARP_SIZE
    return block, _common.THREADS_PER_SM // block


def tiled_block() -> int:
    """Threads per block of the tiled stamps (``write_tiled`` and ``tiled_endpoints``)."""
    from ..kernels import write_tiled as _tiled

    warps = _tiled.TILED_WARPS
    if _common.ON_SIMULATOR:  # tests run several warps per block with _common.simulated_shapes
        warps = min(_common.sim_shape("write_warps", warps), _tiled.MAX_TILED_WARPS)
    return warps * WARP_SIZE


def unshared_scratch(words):
    """Chain scratch stand-in of a launch that shares nothing (role OWN never reads it): the
    buffer ``words`` itself on a GPU; under the simulator a small array of its own, since the
    simulator copies every top-level argument back and an alias of a buffer would overwrite its
    records."""
    return np.zeros((1, 1), dtype=np.int64) if isinstance(words, np.ndarray) else words


def _launch_tiled(role: str, args: tuple, capacity: int, input_assert: bool, nsrc: int) -> None:
    from ..kernels import share as _share
    from ..kernels import write_tiled as _tiled

    if role == "PUBLISH":
        launch_chain_publish(args, capacity)
    args = (*args[:-3], int(_share.CONSUME), *args[-2:])
    block = tiled_block()
    name = _tiled.kernel_name(input_assert, nsrc)
    kernel, signature = _tiled.KERNELS[name], _tiled.SIGNATURES[name][0]
    # A block per request, up to what stays resident (the slot table's shared memory counts).
    grid = _common.resident_grid(kernel, signature, capacity * block, block)
    _common.launch(kernel, signature, grid, block, args)


def launch_write_baseline(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
) -> None:
    """Same as :func:`launch_canary_write_kernel` with one thread per request (SGLang's layout).

    For benchmarks and tests only: the whole request, real-KV folds included,
    runs serially in one thread.
    """
    nsrc, args = _arguments(
        context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
    )
    capacity = plan.write_seed_slot_indices.shape[0]
    block = 1  # SGLang's kWriteBlockSize
    kernel = _kernels.KERNELS["write_baseline"]
    signature = _kernels.SIGNATURES["write_baseline"][0]
    args = (*args, int(bool(enable_write_input_assert)), nsrc)
    _common.launch(kernel, signature, _common.grid_for(capacity, block), block, args)
