"""Launch glue of the fast wing's write: the core's plain kernel, the shared chain, or the tiled path.

The core's glue (:mod:`kvcanary_numba.launch.write`) runs one warp per request, each
running its request's chain. The fast wing adds two things:

- inside :func:`.chain.sharing` (a monitor step, on its plain per-endpoint path) the
  step's first write publishes its chain and the others consume it: the serial
  ``write_shared`` kernel (``fast/kernels/write_shared.py``, ``fast/kernels/share.py``);
- a long write (a prefill-shaped monitor step, or a public write whose requests average
  :data:`.chain.OWN_TILED_MIN_TOKENS` tokens) runs ``chain_publish`` (the chain alone,
  ``fast/kernels/chain.py``), then ``write_tiled`` stamps every entry, a block per request
  (``fast/kernels/write_tiled.py``): 1.28x the bare chain's time instead of 1.49x (H200,
  2026-12-04, 8 x 8k, 8 x 32k, 1 x 128k tokens).

Any other write (a short public one) is the core's launch. All stamp the same records and
report the same rows. int32 inputs are widened first into scratch kept per stream
(``launch.write.widen_inputs`` with :data:`.scratch.STREAM_SCRATCH`), so a replayed call
never allocates.
"""

from __future__ import annotations

import numpy as np

from ..constants import WARP_SIZE
from ..launch import write as _core
from ..launch._launch import ON_SIMULATOR, current_stream, launch, persistent_grid, resident_grid, sim_shape
from ..launch.write import WIDENED, widen_inputs, write_arguments, write_shape
from .chain import launch_chain_publish, write_chain
from .kernels import share as _share, write_shared as _shared, write_tiled as _tiled
from .scratch import STREAM_SCRATCH

__all__ = ["launch_canary_write_kernel", "tiled_block", "unshared_scratch", "write_shape"]


def tiled_block() -> int:
    """Threads per block of the tiled stamps (``write_tiled`` and ``tiled_endpoints``)."""
    warps = _tiled.TILED_WARPS
    if ON_SIMULATOR:  # tests run several warps per block with simulated_shapes
        warps = min(sim_shape("write_warps", warps), _tiled.MAX_TILED_WARPS)
    return warps * WARP_SIZE


def unshared_scratch(words):
    """The chain-scratch stand-in of a fast write launch that shares no chain (role OWN, never
    read): the buffer view itself on a GPU; under the simulator a small array of its own, since
    the simulator copies every argument back and an alias of the buffer would overwrite its records."""
    return np.zeros((1, 1), dtype=np.int64) if ON_SIMULATOR else words


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
) -> None:
    """Queue the write of validated arguments on ``stream`` (None: the current stream; see the module docstring)."""
    stream = current_stream() if stream is None else int(stream)  # a long write's scratch is per stream
    wide = widen_inputs(
        STREAM_SCRATCH, stream, dict(input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc)
    )
    input_ids, positions, out_cache_loc = (wide[name] for name in WIDENED)
    capacity = plan.write_seed_slot_indices.shape[0]
    # A monitor step shares one chain between its write launches; a long public write
    # publishes its own (fast/chain.py).
    tiled, chain = write_chain(int(input_ids.shape[0]), capacity, stream)
    if chain is None:  # a short public write: the core's plain kernel
        _core.launch_canary_write_kernel(
            context=context,
            plan=plan,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            enable_write_input_assert=enable_write_input_assert,
            expected_input_tokens=expected_input_tokens,
            expected_input_positions=expected_input_positions,
            stream=stream,
        )
        return
    nsrc, args = write_arguments(
        context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
    )
    args = (*args, *chain)
    if tiled is not None:
        _launch_tiled(tiled, args, capacity, enable_write_input_assert, nsrc, stream)
        return
    name = _shared.kernel_name(enable_write_input_assert, nsrc)
    block, per_sm = write_shape()
    grid = persistent_grid(capacity, 1, blocks_per_sm=per_sm)
    launch(_shared.KERNELS[name], _shared.SIGNATURES[name][0], grid, block, args, stream)


def _launch_tiled(role: str, args: tuple, capacity: int, input_assert: bool, nsrc: int, stream: int) -> None:
    if role == "PUBLISH":
        launch_chain_publish(args, capacity, stream)
    args = (*args[:-3], int(_share.CONSUME), *args[-2:])
    block = tiled_block()
    name = _tiled.kernel_name(input_assert, nsrc)
    kernel, signature = _tiled.KERNELS[name], _tiled.SIGNATURES[name][0]
    # A block per request, up to what stays resident (the slot table's shared memory counts).
    grid = resident_grid(kernel, signature, capacity * block, block)
    launch(kernel, signature, grid, block, args, stream)
