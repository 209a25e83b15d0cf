"""Grids, compilation and launch of declared kernel signatures (API: :mod:`._common`)."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator, Sequence

from ..kernels import ON_SIMULATOR

__all__ = [
    "SIM_BLOCK",
    "SIM_MAX_BLOCKS",
    "THREADS_PER_SM",
    "block_size",
    "check_signature",
    "compile_eagerly",
    "compile_kernel",
    "current_stream",
    "grid_for",
    "launch",
    "on_stream",
    "run_launches",
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


def persistent_grid(n_items: int, block: int, *, blocks_per_sm: int | None = None) -> int:
    """Blocks for a grid-stride loop over ``n_items``: no more than stay resident."""
    if ON_SIMULATOR:
        return min(grid_for(n_items, block), SIM_MAX_BLOCKS)
    per_sm = blocks_per_sm if blocks_per_sm is not None else max(1, THREADS_PER_SM // int(block))
    return min(grid_for(n_items, block), sm_count() * per_sm)


def resident_grid(kernel, signature: str, n_items: int, block: int) -> int:
    """:func:`persistent_grid` sized by the compiled kernel's occupancy.

    A grid-stride kernel whose registers or shared memory keep fewer than
    ``THREADS_PER_SM`` threads resident would otherwise run its blocks in
    uneven waves; this asks the driver how many blocks of ``block`` threads fit
    on the whole device at once (cached per kernel and block size).
    """
    if ON_SIMULATOR:
        return persistent_grid(n_items, block)
    key = (id(kernel), signature, int(block))
    fit = _resident.get(key)
    if fit is None:
        fit = _resident[key] = max(1, int(compile_kernel(kernel, signature).max_cooperative_grid_blocks(int(block))))
    return min(grid_for(n_items, block), fit)


_resident: dict[tuple[int, str, int], int] = {}


# --- compilation and launch ---------------------------------------------------

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


_streams: dict[int, tuple[Any, Any]] = {}


def _stream_pair(ptr: int):
    # (Numba stream, cuda.core stream) of one CUDA stream handle, built once.
    pair = _streams.get(ptr)
    if pair is None:
        from numba import cuda
        from numba.cuda.cudadrv import driver

        numba_stream = cuda.external_stream(ptr) if ptr else 0
        pair = _streams[ptr] = (numba_stream, driver._to_core_stream(numba_stream))
    return pair


#: Per host thread: the stream handle a public ``stream=`` argument set for the call in progress.
_stream_override = threading.local()


class on_stream:
    """``with on_stream(handle):`` launches of this thread go to CUDA stream ``handle``."""

    __slots__ = ("handle", "_saved")

    def __init__(self, handle: int):
        self.handle = int(handle)

    def __enter__(self):
        self._saved = getattr(_stream_override, "handle", None)
        _stream_override.handle = self.handle
        return self

    def __exit__(self, *exc) -> None:
        _stream_override.handle = self._saved


def _current_stream_ptr() -> int:
    handle = getattr(_stream_override, "handle", None)
    if handle is not None:
        return handle
    cupy = sys.modules.get("cupy")  # only if the caller already uses CuPy
    return int(cupy.cuda.get_current_stream().ptr) if cupy is not None else 0


def _current_device() -> int:
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return int(cupy.cuda.runtime.getDevice())
    from numba import cuda

    return int(cuda.get_current_device().id)


def current_stream():
    """Numba stream of the call's ``stream=`` (:class:`on_stream`), else CuPy's current stream;
    ``0`` for the legacy default stream."""
    if ON_SIMULATOR:
        return 0
    return _stream_pair(_current_stream_ptr())[0]


#: Per host thread: ``record(kernel, signature, grid, block, args)`` while a recording is active.
recording_sink = threading.local()

#: Per host thread: (kernel, signature, device) -> the PreparedLaunch every launch of it refills.
_raw_launches = threading.local()


def launch(kernel, signature: str, grid: int, block: int, args: Sequence[Any]) -> None:
    """Launch ``kernel`` (compiled for ``signature``) on ``grid`` x ``block`` threads.

    On a GPU every call refills one cached :class:`~.prepared.PreparedLaunch` per
    kernel, signature, device and host thread and launches it with one driver call: Numba's own
    launch re-derives the whole kernel ABI from the arguments on every call (the
    bulk of a launch's host time). The first call checks the arguments' types.
    """
    record = getattr(recording_sink, "record", None)
    if record is not None:  # a recording of this thread (.recording.recording): collected, not run
        record(kernel, signature, grid, block, args)
        return
    if ON_SIMULATOR:
        check_signature(signature, args)
        # The simulator copies every array argument back after the kernel; the wrappers checked
        # that outputs are writeable, so a read-only array here is an input and goes as a copy.
        args = [a.copy() if getattr(getattr(a, "flags", None), "writeable", True) is False else a for a in args]
        kernel[int(grid), int(block)](*args)
        return
    sink = getattr(_collecting, "sink", None)
    if sink is not None:  # a public call being packed for replay: a launch of its own
        from .prepared import PreparedLaunch

        own = PreparedLaunch(kernel, signature, grid, block, args)
        sink.append(own if own.raw else None)
        if own.raw:
            own.launch()
            own.args = []  # pointers only: the packed launch keeps no array alive
            return
    cache = getattr(_raw_launches, "by_kernel", None)
    if cache is None:
        cache = _raw_launches.by_kernel = {}
    key = (id(kernel), signature, _current_device())  # a function handle belongs to one device's context
    prepared = cache.get(key)
    if prepared is None:
        from .prepared import PreparedLaunch  # imports this module's API through _common

        prepared = cache[key] = PreparedLaunch(kernel, signature, grid, block, args)  # checks the types
    elif prepared.raw:
        prepared.refill(grid, block, args)
    if prepared.raw:
        prepared.launch()
        prepared.args = []  # the arrays' memory is the caller's again; only pointers stay packed
        return
    compiled = compile_kernel(kernel, signature)  # preparing failed (logged once): Numba's launch
    compiled.launch(tuple(args), (int(grid), 1, 1), (int(block), 1, 1), _stream_pair(_current_stream_ptr())[1], 0)


# --- replay of repeated public calls -------------------------------------------

#: Per host thread: the list the launches of a public call being packed are appended to.
_collecting = threading.local()


def run_launches(entry, run, kwargs: dict, handle: int | None) -> None:
    """Run one validated public CUDA call: ``run(**kwargs)`` (the launch glue), or its replay.

    ``entry`` (:class:`kvcanary_numba._memo.Entry`) belongs to the call's argument snapshot,
    which holds every CUDA pointer, shape, scalar and per-object token the glue reads. The
    second time a snapshot comes back, the glue's launches are packed as launches of their
    own; later calls with that snapshot on the same stream and device replay them (one
    ``cuLaunchKernel`` each, no glue). A different pointer is a different snapshot, so a
    replay never launches on stale memory. Not under the simulator, and not while
    :func:`.recording.recording` is active on this thread (the monitor records its phases).
    """
    if ON_SIMULATOR or getattr(recording_sink, "record", None) is not None:
        if handle is None:
            run(**kwargs)
        else:
            with on_stream(handle):
                run(**kwargs)
        return
    stream = _current_stream_ptr() if handle is None else handle
    where = (stream, _current_device())
    launches = entry.launches
    if launches is not None and entry.where == where:
        raw = sys.modules["kvcanary_numba.launch.prepared"]._driver.launch  # imported when packed
        for p in launches:
            raw(p._func, p.grid, p.block, stream, p._params)
        return
    sink = [] if entry.hits else None  # the first time, just run: most snapshots never come back
    with on_stream(stream):
        _collecting.sink = sink
        try:
            run(**kwargs)
        finally:
            _collecting.sink = None
    if sink and all(p is not None for p in sink):
        entry.launches, entry.where = sink, where
