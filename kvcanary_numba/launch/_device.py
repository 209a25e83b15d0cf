"""What the device decides about a launch, and the shapes tests set under the simulator.

The launch glue asks the device once per kernel: how many multiprocessors it has
(:func:`sm_count`), how many blocks of a compiled kernel stay resident
(:func:`resident_blocks`), and numba-cuda's stream object for a raw handle
(:func:`numba_stream`). None of it runs under the simulator, where
:func:`simulated_shapes` lets tests give simulated launches other shapes instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, lru_cache

from ..kernels import ON_SIMULATOR

__all__ = [
    "SIM_SHAPES",
    "SIM_SHAPE_NAMES",
    "compile_kernel",
    "numba_stream",
    "resident_blocks",
    "simulated_shapes",
    "sm_count",
]


@cache
def compile_kernel(kernel, signature: str):
    """``kernel`` compiled for ``signature`` (cached); the kernel itself under the simulator."""
    if ON_SIMULATOR:
        return kernel
    return kernel.compile(signature)


@cache
def sm_count() -> int:
    """Multiprocessors of the current device (1 under the simulator)."""
    if ON_SIMULATOR:
        return 1
    from numba import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


@cache
def resident_blocks(kernel, signature: str, block: int) -> int:
    """Blocks of ``block`` threads of the compiled kernel that fit on the device at once (cached)."""
    return max(1, int(compile_kernel(kernel, signature).max_cooperative_grid_blocks(block)))


@lru_cache(maxsize=64)
def numba_stream(handle: int):
    """numba-cuda's stream object for a raw handle (0: the default stream), cached."""
    from numba import cuda

    return cuda.external_stream(handle) if handle else cuda.default_stream()


# --- simulated launch shapes ------------------------------------------------------

#: Launch-shape names :func:`simulated_shapes` accepts, and where they apply.
SIM_SHAPE_NAMES = {
    "block": "threads per block of block_size() launches (verify, plan entries, fingerprint, scatter)",
    "offsets_block": "threads per block of the plan offsets kernel",
    "offsets_items": "requests per thread of the plan offsets kernel",
    "write_warps": "warps (requests walked at once) per block of the write kernel",
    "own_tiled_min_tokens": "tokens per request from which a public write takes the tiled path",
}
#: The shapes :func:`simulated_shapes` sets now (read by ``_launch.sim_shape``).
SIM_SHAPES: dict[str, int] = {}


@contextmanager
def simulated_shapes(**shapes: int) -> Iterator[None]:
    """Run simulated launches with other launch shapes, e.g. the GPU's (tests only).

    Simulated launches default to one warp per block and one request per thread (each
    simulated thread costs ~0.2 ms), so index arithmetic that only matters with several
    warps per block or several items per thread would go untested otherwise. The launch
    modules read these values through :func:`~kvcanary_numba.launch._launch.sim_shape`; kernels derive their index
    arithmetic from ``blockDim``, so nothing is recompiled. On a GPU it changes nothing.
    """
    unknown = set(shapes) - set(SIM_SHAPE_NAMES)
    if unknown:
        raise RuntimeError(f"unknown launch shape(s) {sorted(unknown)}; known: {sorted(SIM_SHAPE_NAMES)}")
    if any(int(v) < 1 for v in shapes.values()):
        raise RuntimeError(f"launch shapes must be >= 1: {shapes}")
    saved = dict(SIM_SHAPES)
    if ON_SIMULATOR:
        SIM_SHAPES.update({k: int(v) for k, v in shapes.items()})
    try:
        yield
    finally:
        SIM_SHAPES.clear()
        SIM_SHAPES.update(saved)
