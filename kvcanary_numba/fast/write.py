"""Launch glue of the fast wing's write: the plain kernel with a chain role, or the tiled path.

The core's glue (:mod:`kvcanary_numba.launch.write`) runs one warp per request, each
running its request's chain. The fast wing adds two things:

- inside :func:`.chain.sharing` (a monitor step, on its plain per-endpoint path) the
  step's first write publishes its chain and the others consume it (``kernels/share.py``);
- a long write (a prefill-shaped monitor step, or a public write whose requests average
  :data:`.chain.OWN_TILED_MIN_TOKENS` tokens) runs ``chain_publish`` (the chain alone,
  ``fast/kernels/chain.py``), then ``write_tiled`` stamps every entry, a block per request
  (``fast/kernels/write_tiled.py``): 1.28x the bare chain's time instead of 1.49x (H200,
  2026-12-04, 8 x 8k, 8 x 32k, 1 x 128k tokens).

Both stamp the same records and report the same rows as the core's launch.
"""

from __future__ import annotations

from ..constants import WARP_SIZE
from ..kernels import share as _share
from ..kernels import write as _kernels
from ..launch._launch import ON_SIMULATOR, launch, persistent_grid, resident_grid, sim_shape
from ..launch.write import unshared_scratch, write_arguments, write_shape
from .chain import launch_chain_publish, write_chain

__all__ = ["launch_canary_write_kernel", "tiled_block", "unshared_scratch", "write_shape"]


def tiled_block() -> int:
    """Threads per block of the tiled stamps (``write_tiled`` and ``tiled_endpoints``)."""
    from .kernels import write_tiled as _tiled

    warps = _tiled.TILED_WARPS
    if ON_SIMULATOR:  # tests run several warps per block with simulated_shapes
        warps = min(sim_shape("write_warps", warps), _tiled.MAX_TILED_WARPS)
    return warps * WARP_SIZE


def launch_canary_write_kernel(*, context, plan, input_ids, positions, out_cache_loc, enable_write_input_assert: bool,
                               expected_input_tokens, expected_input_positions, stream: int) -> None:
    """Queue the write of validated arguments on ``stream`` (see the module docstring)."""
    nsrc, args = write_arguments(context, plan, input_ids, positions, out_cache_loc, expected_input_tokens,
                                 expected_input_positions)
    capacity = plan.write_seed_slot_indices.shape[0]
    # A monitor step shares one chain between its write launches; a long public write
    # publishes its own (fast/chain.py).
    tiled, chain = write_chain(int(input_ids.shape[0]), capacity, unshared_scratch(args[0]), stream)
    args = (*args, *chain)
    if tiled is not None:
        _launch_tiled(tiled, args, capacity, enable_write_input_assert, nsrc, stream)
        return
    name = _kernels.kernel_name(enable_write_input_assert, nsrc)
    block, per_sm = write_shape()
    grid = persistent_grid(capacity, 1, blocks_per_sm=per_sm)
    launch(_kernels.KERNELS[name], _kernels.SIGNATURES[name][0], grid, block, args, stream)


def _launch_tiled(role: str, args: tuple, capacity: int, input_assert: bool, nsrc: int, stream: int) -> None:
    from .kernels import write_tiled as _tiled

    if role == "PUBLISH":
        launch_chain_publish(args, capacity, stream)
    args = (*args[:-3], int(_share.CONSUME), *args[-2:])
    block = tiled_block()
    name = _tiled.kernel_name(input_assert, nsrc)
    kernel, signature = _tiled.KERNELS[name], _tiled.SIGNATURES[name][0]
    # A block per request, up to what stays resident (the slot table's shared memory counts).
    grid = resident_grid(kernel, signature, capacity * block, block)
    launch(kernel, signature, grid, block, args, stream)
