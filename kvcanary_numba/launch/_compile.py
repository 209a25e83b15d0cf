"""Launch shapes, grids and compilation of declared kernel signatures (API: :mod:`._common`)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator, Sequence

from numba.core.types import BaseTuple

from ..kernels import ON_SIMULATOR

__all__ = [
    "SIM_BLOCK",
    "SIM_MAX_BLOCKS",
    "THREADS_PER_SM",
    "block_size",
    "check_signature",
    "compile_eagerly",
    "compile_kernel",
    "function_handle",
    "grid_for",
    "persistent_grid",
    "resident_grid",
    "sim_shape",
    "simulated_shapes",
    "sm_count",
]

#: Threads per block under the simulator (one warp: each simulated thread costs ~0.2 ms).
SIM_BLOCK = 32
#: Largest grid-stride grid under the simulator (two blocks still exercise the stride).
SIM_MAX_BLOCKS = 2
#: Resident threads per SM aimed at by persistent grids (H100/H200: 2048).
THREADS_PER_SM = 2048


# --- simulated launch shapes ----------------------------------------------------

#: Launch-shape names :func:`simulated_shapes` accepts, and where they apply.
SIM_SHAPE_NAMES = {
    "block": "threads per block of block_size() launches (verify, plan entries, fingerprint, scatter)",
    "offsets_block": "threads per block of the plan offsets kernel",
    "offsets_items": "requests per thread of the plan offsets kernel",
    "write_warps": "warps (requests walked at once) per block of the write kernel",
    "own_tiled_min_tokens": "tokens per request from which a public write takes the tiled path",
}
_sim_shapes: dict[str, int] = {}


def sim_shape(name: str, default: int) -> int:
    """Launch shape ``name`` of a simulated launch: the :func:`simulated_shapes` value, else ``default``.

    Launch modules call it only under the simulator (on a GPU they use their GPU shapes).
    """
    return int(_sim_shapes.get(name, default))


@contextmanager
def simulated_shapes(**shapes: int) -> Iterator[None]:
    """Run simulated launches with other launch shapes, e.g. the GPU's (tests only).

    Simulated launches default to one warp per block and one request per
    thread (each simulated thread costs ~0.2 ms), so index arithmetic that only
    matters with several warps per block or several items per thread would go
    untested. Inside ``with simulated_shapes(offsets_items=2, write_warps=2):``
    the launch modules read these values (names and meaning:
    :data:`SIM_SHAPE_NAMES`) through :func:`sim_shape`. Kernels derive their
    index arithmetic from the launch's ``blockDim``, so nothing is recompiled.
    On a GPU it changes nothing: launches keep the GPU shapes these imitate.
    Not thread-safe; nests (the inner values win, the outer come back).
    """
    unknown = set(shapes) - set(SIM_SHAPE_NAMES)
    if unknown:
        raise RuntimeError(f"unknown launch shape(s) {sorted(unknown)}; known: {sorted(SIM_SHAPE_NAMES)}")
    if any(int(v) < 1 for v in shapes.values()):
        raise RuntimeError(f"launch shapes must be >= 1: {shapes}")
    saved = dict(_sim_shapes)
    if ON_SIMULATOR:
        _sim_shapes.update({k: int(v) for k, v in shapes.items()})
    try:
        yield
    finally:
        _sim_shapes.clear()
        _sim_shapes.update(saved)


# --- grids --------------------------------------------------------------------


@lru_cache(maxsize=None)
def sm_count() -> int:
    """Multiprocessors of the current device (1 under the simulator)."""
    if ON_SIMULATOR:
        return 1
    from numba import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def block_size(gpu_block: int) -> int:
    """Threads per block: ``gpu_block`` on a GPU, ``SIM_BLOCK`` (or the ``block`` shape) under the simulator."""
    return sim_shape("block", SIM_BLOCK) if ON_SIMULATOR else int(gpu_block)


def grid_for(n_items: int, block: int) -> int:
    """Blocks of ``block`` threads covering ``n_items`` (at least 1)."""
    return max(1, -(-int(n_items) // int(block)))


def persistent_grid(n_items: int, block: int, *, blocks_per_sm: int | None = None, parts: int = 1) -> int:
    """Blocks for a grid-stride loop over ``n_items``: no more than stay resident.

    ``parts``: the grid is one of that many equal parts of a launch (one per endpoint,
    ``kernels/endpoints.py``), which share what stays resident.
    """
    if ON_SIMULATOR:
        return min(grid_for(n_items, block), SIM_MAX_BLOCKS)
    per_sm = blocks_per_sm if blocks_per_sm is not None else max(1, THREADS_PER_SM // int(block))
    return min(grid_for(n_items, block), max(1, sm_count() * per_sm // int(parts)))


def resident_grid(kernel, signature: str, n_items: int, block: int, *, parts: int = 1) -> int:
    """:func:`persistent_grid` sized by the compiled kernel's occupancy.

    A grid-stride kernel whose registers or shared memory keep fewer than
    ``THREADS_PER_SM`` threads resident would otherwise run its blocks in
    uneven waves; this asks the driver how many blocks of ``block`` threads fit
    on the whole device at once (cached per kernel and block size). ``parts``: as
    for :func:`persistent_grid`, each part gets its share of them.
    """
    if ON_SIMULATOR:
        return persistent_grid(n_items, block)
    key = (id(kernel), signature, int(block))
    fit = _resident.get(key)
    if fit is None:
        fit = _resident[key] = max(1, int(compile_kernel(kernel, signature).max_cooperative_grid_blocks(int(block))))
    return min(grid_for(n_items, block), max(1, fit // int(parts)))


_resident: dict[tuple[int, str, int], int] = {}


# --- compilation and argument types -------------------------------------------

_compiled: dict[tuple[int, str], Any] = {}


def compile_kernel(kernel, signature: str):
    """``kernel`` compiled for ``signature`` (cached); the kernel itself under the simulator."""
    if ON_SIMULATOR:
        return kernel
    key = (id(kernel), signature)
    hit = _compiled.get(key)
    if hit is None:
        hit = kernel.compile(signature)
        hit.bind()  # load the module now: not allowed later inside CUDA-graph capture
        _compiled[key] = hit
    return hit


#: Why :func:`function_handle` found no handle, once logged (None: it never failed).
_handle_failure: list[str] = []


def function_handle(kernel, signature: str):
    """The driver handle of ``kernel`` compiled for ``signature`` (a ``CUfunction`` of the
    current context, else the library's ``CUkernel``), or None.

    numba-cuda 0.30 has no documented call for it. The path taken uses no
    underscored name: the compiled kernel's ``library`` property, its
    ``get_cufunc()`` (the per-device function, loaded by :func:`compile_kernel`),
    that function's cuda.core ``Kernel`` and cuda.core's public ``Kernel.handle``.
    A numba-cuda release that renames one of them raises AttributeError here:
    then the warning is logged once and callers take Numba's own launch.
    Not under the simulator (no driver).
    """
    compiled = compile_kernel(kernel, signature)
    try:
        handle = compiled.library.get_cufunc().kernel.handle
    except AttributeError as exc:
        if not _handle_failure:
            _handle_failure.append(f"{type(exc).__name__}: {exc}")
            logging.getLogger("kvcanary_numba.launch").warning(
                "no driver handle for compiled kernels (%s): launches take Numba's launch path", exc)
        return None
    return context_function(handle)


def context_function(handle):
    """The current context's ``CUfunction`` of library kernel ``handle`` (a ``CUkernel``), or
    ``handle`` itself when the driver cannot give one.

    A ``CUkernel`` is resolved to the context's function on every launch; the
    function launches without that lookup (H200, session 7 probe
    ``launch_route_cost.py``: 3.7 us per cuda-bindings call against 5.2 us).
    """
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return handle
    if not isinstance(handle, cu.CUkernel):
        return handle
    err, function = cu.cuKernelGetFunction(handle)
    return function if err == cu.CUresult.CUDA_SUCCESS else handle


def compile_eagerly(module, names: Sequence[str] | None = None) -> int:
    """Compile the declared signatures of ``module``'s kernels; returns how many."""
    count = 0
    for name in module.KERNELS if names is None else names:
        for signature in module.SIGNATURES[name]:
            compile_kernel(module.KERNELS[name], signature)
            count += 1
    return count


@lru_cache(maxsize=None)
def _declared_types(signature: str):
    from numba.core import sigutils

    return sigutils.normalize_signature(signature)[0]


def _same_type(declared, actual) -> bool:
    if hasattr(declared, "ndim"):  # array: ignore mutability / alignment flags
        return (
            hasattr(actual, "ndim")
            and (declared.dtype, declared.ndim, declared.layout) == (actual.dtype, actual.ndim, actual.layout)
        )
    if isinstance(declared, BaseTuple):  # item by item (a read-only array makes a heterogeneous Tuple)
        return (isinstance(actual, BaseTuple) and len(actual) == len(declared)
                and all(map(_same_type, declared, actual)))  # fmt: skip
    return declared == actual


def check_signature(signature: str, args: Sequence[Any], kernel=None) -> None:
    """Raise ``RuntimeError`` if ``args`` do not have the Numba types of ``signature``.

    Under the simulator the types come from ``numba.typeof``; on a GPU pass the
    ``kernel``, whose compiled argument types and argument typing are used.
    """
    if kernel is None or ON_SIMULATOR:
        from numba import typeof

        declared = _declared_types(signature)
    else:
        declared, typeof = compile_kernel(kernel, signature).argument_types, kernel.typeof_pyval
    if len(declared) != len(args):
        raise RuntimeError(f"kernel launch: {len(args)} arguments for signature {signature}")
    for i, (want, arg) in enumerate(zip(declared, args)):
        got = typeof(arg)
        if not _same_type(want, got):
            raise RuntimeError(f"kernel launch: argument {i} is {got}, signature {signature} declares {want}")

