"""What the device decides about a launch, and the shapes tests set under the simulator.

The launch glue asks the device once per kernel: how many multiprocessors it has
(:func:`sm_count`), how many blocks of a compiled kernel stay resident
(:func:`resident_blocks`), and numba-cuda's stream object for a raw handle
(:func:`numba_stream`). Each answer is cached per device (:func:`current_device`): one
process may drive several GPUs, of different sizes, and a stream object belongs to one
device's context. None of it runs under the simulator, where :func:`simulated_shapes` lets
tests give simulated launches other shapes instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, lru_cache

from .._runtime import imported
from ..kernels import ON_SIMULATOR

__all__ = [
    "SIM_SHAPES",
    "SIM_SHAPE_NAMES",
    "compile_kernel",
    "current_device",
    "numba_stream",
    "resident_blocks",
    "simulated_shapes",
    "sm_count",
]


def current_device() -> int:
    """The current CUDA device: CuPy's where the process uses CuPy (its ``Device.use()`` makes
    the device's primary context current, which numba-cuda then uses too), else numba-cuda's."""
    cupy = imported("cupy")  # not while another thread imports it
    if cupy is not None:
        return int(cupy.cuda.runtime.getDevice())
    from numba import cuda

    return int(cuda.get_current_device().id)


@cache
def compile_kernel(kernel, signature: str):
    """``kernel`` compiled for ``signature`` (cached); the kernel itself under the simulator.

    One object serves every device: numba-cuda builds and loads its code per device when a
    launch asks for it (``resident_blocks`` and launches run on the current device)."""
    if ON_SIMULATOR:
        return kernel
    return kernel.compile(signature)


def sm_count() -> int:
    """Multiprocessors of the current device (1 under the simulator); cached per device."""
    if ON_SIMULATOR:
        return 1
    return _sm_count(current_device())


@cache
def _sm_count(device: int) -> int:
    from numba import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)  # the current device is ``device``


def resident_blocks(kernel, signature: str, block: int) -> int:
    """Blocks of ``block`` threads of the compiled kernel that fit on the current device at once
    (cached per device, kernel and block size)."""
    return _resident_blocks(kernel, signature, block, current_device())


@cache
def _resident_blocks(kernel, signature: str, block: int, device: int) -> int:
    return max(1, int(compile_kernel(kernel, signature).max_cooperative_grid_blocks(block)))


def numba_stream(handle: int):
    """numba-cuda's stream object for a raw handle (0: the default stream) on the current device,
    cached per (device, handle): numba-cuda ties a stream object to one device's context."""
    return _numba_stream(handle, current_device())


@lru_cache(maxsize=64)
def _numba_stream(handle: int, device: int):
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
