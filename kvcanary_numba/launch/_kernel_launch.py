"""Launch of declared kernel signatures on the call's stream, and replay of repeated calls.

API and the rules of launch descriptions: :mod:`._common`. Launch shapes, grids and
compilation: :mod:`._compile`; packing: :mod:`.prepared`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Callable, Sequence

from ..kernels import ON_SIMULATOR
from ._compile import check_signature, compile_kernel
from .spec import LaunchSpec

__all__ = [
    "StaleLaunch",
    "current_stream",
    "launch",
    "on_stream",
    "replayable",
    "run_launches",
    "run_spec",
    "sink",
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


#: Per host thread: ``take(spec)``, the consumer of this thread's launch descriptions while a
#: recording (:func:`.recording.recording`) or the packing of a public call is active.
_sink = threading.local()


@contextlib.contextmanager
def sink(take: Callable[[LaunchSpec], None]):
    """``with sink(take):`` every :func:`launch` of this thread in the block calls ``take(spec)`` instead."""
    saved = getattr(_sink, "take", None)
    _sink.take = take
    try:
        yield
    finally:
        _sink.take = saved


def launch(kernel, signature: str, grid: int, block: int, args: Sequence[Any]) -> None:
    """Launch ``kernel`` (compiled for ``signature``) on ``grid`` x ``block`` threads: the
    description goes to this thread's sink when one is active, else :func:`run_spec` runs it."""
    spec = LaunchSpec(kernel, signature, int(grid), int(block), tuple(args))
    take = getattr(_sink, "take", None)
    if take is not None:
        take(spec)
    else:
        run_spec(spec)


#: Per host thread: (kernel, signature, device) -> the PreparedLaunch every eager launch of it
#: refills. Per thread because a refill rewrites the launch's parameter buffer in place.
_eager = threading.local()
_prepared = _table = None  # the .prepared and .table modules, imported on first use (they import this API)


def _prepared_module():
    global _prepared
    if _prepared is None:
        from . import prepared

        _prepared = prepared
    return _prepared


def _table_module():
    global _table
    if _table is None:
        from . import table

        _table = table
    return _table


def run_spec(spec: LaunchSpec) -> None:
    """Run one launch description now, on the call's stream.

    On a GPU it refills the cached packed launch of its kernel (every argument
    re-packed from ``spec``) and makes one driver call; Numba's own launch
    re-derives the kernel ABI from the arguments on every call (the bulk of a
    launch's host time). The first launch of a kernel and signature per host
    thread checks the arguments' types; the simulator checks every launch.
    """
    kernel, signature, grid, block, args, _ = spec
    if ON_SIMULATOR:
        check_signature(signature, args)
        # The simulator copies every array argument back after the kernel; the wrappers checked
        # that outputs are writeable, so a read-only array here is an input and goes as a copy.
        args = [a.copy() if getattr(getattr(a, "flags", None), "writeable", True) is False else a for a in args]
        kernel[grid, block](*args)
        return
    cache = getattr(_eager, "by_kernel", None)
    if cache is None:
        cache = _eager.by_kernel = {}
    key = (id(kernel), signature, _current_device())  # a function handle belongs to one device's context
    packed = cache.get(key)
    if packed is None:
        packed = cache[key] = _prepared_module().PreparedLaunch.from_spec(spec)  # checks the types
    elif packed.raw:
        packed.refill(spec)
    if packed.raw:
        packed.launch()
        packed.release()  # the arrays' memory is the caller's again; only pointers stay packed
        return
    compiled = compile_kernel(kernel, signature)  # preparing failed (logged): Numba's launch
    compiled.launch(args, (grid, 1, 1), (block, 1, 1), _stream_pair(_current_stream_ptr())[1], 0)


# --- replay of repeated public calls -------------------------------------------

#: Re-derive every replay's launches (the glue runs, recording) and compare them with the packed
#: ones: :class:`StaleLaunch` on a difference. Off in production; tests turn it on, and
#: ``KVCANARY_VERIFY_REPLAYS=1`` does for a whole run (e.g. the GPU suite).
VERIFY_REPLAYS = os.environ.get("KVCANARY_VERIFY_REPLAYS") == "1"


class StaleLaunch(RuntimeError):
    """A replay would launch something other than what the glue asks for now (a glue bug: the
    call's snapshot or launch state misses something the glue reads)."""


#: Readers of every state the glue reads besides a call's arguments, stream and device;
#: their values are part of where packed launches may be replayed (see ``_common``). The module
#: that owns such state registers its reader (``launch/chain.py``: the shared write chain).
LAUNCH_STATE: list[Callable[[], Any]] = []


def launch_state() -> tuple:
    """The values of :data:`LAUNCH_STATE` now (with the stream and device: where a replay is valid)."""
    return tuple(read() for read in LAUNCH_STATE)


class _Packing:
    """The sink of a public call being packed: each launch is packed, launched and kept."""

    __slots__ = ("launches",)

    def __init__(self):
        self.launches: list = []

    def take(self, spec: LaunchSpec) -> None:
        packed = _prepared_module().PreparedLaunch.from_spec(spec)
        if not packed.raw:
            self.launches.append(None)  # never replayed: the call runs its glue every time
            run_spec(spec)
            return
        packed.launch()
        packed.release()  # pointers only: the packed launch keeps no array alive
        self.launches.append(packed)


def _verify(launches: tuple, run, kwargs: dict, stream: int) -> None:
    fresh: list[LaunchSpec] = []
    with on_stream(stream), sink(fresh.append):
        run(**kwargs)
    if len(fresh) != len(launches):
        raise StaleLaunch(f"replay of {len(launches)} launches, the glue now makes {len(fresh)}")
    for i, (packed, spec) in enumerate(zip(launches, fresh)):
        stale = packed.stale_arguments(spec)
        if stale:
            raise StaleLaunch(f"replayed launch {i} ({spec.signature}): " + "; ".join(stale))


def replayable() -> bool:
    """Whether :func:`run_launches` may pack or replay launches on this thread now: on a GPU,
    with no sink active (a recording sees every launch of the glue)."""
    return not ON_SIMULATOR and getattr(_sink, "take", None) is None


def run_launches(entry, run, kwargs: dict, handle: int | None) -> None:
    """Run one validated public CUDA call: ``run(**kwargs)`` (the launch glue), or its replay.

    ``entry`` (:class:`kvcanary_numba._memo.Entry`) belongs to the call's argument snapshot.
    The second time a snapshot comes back, the glue's launches are packed (and launched);
    later calls with that snapshot and the same :func:`launch_state` replay them (one driver
    call each, no glue). Not under the simulator, and not while a sink is active on this
    thread (a recording: the glue runs and is recorded).
    """
    if not replayable():
        if handle is None:
            run(**kwargs)
        else:
            with on_stream(handle):
                run(**kwargs)
        return
    stream = _current_stream_ptr() if handle is None else handle
    where = (stream, _current_device(), *launch_state())
    launches = entry.launches
    if launches is not None and entry.where == where:
        if VERIFY_REPLAYS:
            _verify(launches, run, kwargs, stream)
        launches.launch(stream)  # a LaunchTable: one compiled loop for all of them on a GPU
        return
    if not entry.hits:  # the first time, just run: most snapshots never come back
        with on_stream(stream):
            run(**kwargs)
        return
    packing = _Packing()
    with on_stream(stream), sink(packing.take):
        run(**kwargs)
    if packing.launches and all(p is not None for p in packing.launches):
        entry.launches, entry.where = _table_module().LaunchTable(packing.launches), where
