"""Launch of declared kernel signatures on the call's stream, and replay of repeated calls (API: :mod:`._common`).

Launch shapes, grids and compilation: :mod:`._compile`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Sequence

from ..kernels import ON_SIMULATOR
from ._compile import check_signature, compile_kernel

__all__ = [
    "current_stream",
    "launch",
    "on_stream",
    "run_launches",
]


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
