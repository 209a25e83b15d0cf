"""Raw launches of the launch glue's descriptions, and replay of repeated calls.

The core launches every description through numba-cuda's public API, which re-derives
the kernel ABI from the Python arguments on every call. The fast wing installs a sink
(:func:`kvcanary_numba.launch._launch.sink`) around the glue instead, and each consumer
below turns descriptions into raw ``cuLaunchKernel`` calls (:mod:`.prepared`):

1. eager (:func:`eager`): one packed launch per kernel, signature, device and host thread
   is refilled from the description (every argument re-packed) and launched;
2. memo replay (:func:`run_launches`): the second time a call's argument snapshot comes
   back, its glue runs with a packing sink: each description is packed, launched and kept
   (pointers only, no array kept alive) in the snapshot's :class:`.memo.Entry`; later
   calls with that snapshot replay the packed launches, no glue;
3. recorded phases (:func:`.recording.recording`, the monitor's prepared steps), which
   rebind the per-step arguments by role every step;
4. CUDA graphs, which capture the packed launches of a prepared phase.

The rule that keeps packed pointers current: a packed launch records what it packed for
each argument (``PreparedLaunch.packed``), and a consumer that launches it again either
re-packs it from a new description (1), rebinds by role every argument viewed from a
per-call array (3), replays a graph only while each role's array is the captured object
(4), or replays only where nothing the glue read can differ (2): the snapshot holds every
pointer, shape, scalar and per-object token of the arguments, and ``entry.where`` the
stream, the device and every glue state read besides the arguments (:data:`LAUNCH_STATE`:
the shared write chain of ``fast/chain.py``). Glue that starts reading other state must
register a reader there. :data:`VERIFY_REPLAYS` re-derives every replay's descriptions
(the glue runs, recorded) and raises :class:`StaleLaunch` on a difference (tests).

Under the simulator nothing is packed: the glue runs every call, through the core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..launch._launch import LaunchSpec, current_stream, run, sink, sink_active
from . import driver as _numba
from .prepared import PreparedLaunch
from .table import LaunchTable

__all__ = ["LAUNCH_STATE", "StaleLaunch", "VERIFY_REPLAYS", "eager", "launch_state", "replayable", "run_launches"]

#: Re-derive every replay's launches (the glue runs, recording) and compare them with the packed
#: ones: :class:`StaleLaunch` on a difference. Off in production; tests turn it on.
VERIFY_REPLAYS = False


class StaleLaunch(RuntimeError):
    """A replay would launch something other than what the glue asks for now (a glue bug: the
    call's snapshot or launch state misses something the glue reads)."""


#: Readers of every state the glue reads besides a call's arguments, stream and device;
#: their values are part of where packed launches may be replayed. The module that owns
#: such state registers its reader (``fast/chain.py``: the shared write chain).
LAUNCH_STATE: list[Callable[[], Any]] = []


def launch_state() -> tuple:
    """The values of :data:`LAUNCH_STATE` now."""
    return tuple(read() for read in LAUNCH_STATE)


def eager(spec: LaunchSpec) -> None:
    """Run one launch description now as a raw launch (the core's launch under the simulator, or
    where the kernel cannot be packed: ``PreparedLaunch.raw`` is False).

    The first launch of a kernel and signature per host thread checks the arguments' types.
    """
    driver = _numba.driver
    if not driver.raw:
        run(spec)
        return
    cache = getattr(driver.eager, "by_kernel", None)
    if cache is None:
        cache = driver.eager.by_kernel = {}
    key = (id(spec.kernel), spec.signature, driver.current_device())  # a handle belongs to one context
    packed = cache.get(key)
    if packed is None:
        packed = cache[key] = PreparedLaunch.from_spec(spec)  # checks the types
    elif packed.raw:
        packed.refill(spec)
    if not packed.raw:
        run(spec)
        return
    packed.launch(spec.stream)
    packed.release()  # the arrays' memory is the caller's again; only pointers stay packed


class _Packing:
    """The sink of a call being packed: each launch is packed, launched and kept."""

    __slots__ = ("launches",)

    def __init__(self):
        self.launches: list = []

    def take(self, spec: LaunchSpec) -> None:
        packed = PreparedLaunch.from_spec(spec)
        if not packed.raw:
            self.launches.append(None)  # never replayed: the call runs its glue every time
            run(spec)
            return
        packed.launch(spec.stream)
        packed.release()  # pointers only: the packed launch keeps no array alive
        self.launches.append(packed)


def _verify(launches, glue, kwargs: dict, stream: int) -> None:
    fresh: list[LaunchSpec] = []
    with sink(fresh.append):
        glue(**kwargs, stream=stream)
    if len(fresh) != len(launches):
        raise StaleLaunch(f"replay of {len(launches)} launches, the glue now makes {len(fresh)}")
    for i, (packed, spec) in enumerate(zip(launches, fresh)):
        stale = packed.stale_arguments(spec)
        if stale:
            raise StaleLaunch(f"replayed launch {i} ({spec.signature}): " + "; ".join(stale))


def replayable() -> bool:
    """Whether :func:`run_launches` may pack or replay launches on this thread now: on a GPU,
    with no sink active (a recording sees every launch of the glue)."""
    return _numba.driver.raw and not sink_active()


def run_launches(entry, glue: Callable[..., None], kwargs: dict, handle: int | None) -> None:
    """Run one validated CUDA call: ``glue(**kwargs, stream=...)``, or its replay.

    ``entry`` (:class:`.memo.Entry`) belongs to the call's argument snapshot. The second
    time a snapshot comes back, the glue's launches are packed (and launched); later calls
    with that snapshot and the same :func:`launch_state` replay them (one driver call for
    all of them, no glue). Inside an active sink (a recording) the glue just runs: its
    launches go to that sink. Under the simulator the glue runs through the core's launch.
    """
    stream = current_stream() if handle is None else handle
    if not replayable():
        glue(**kwargs, stream=stream)
        return
    where = (stream, _numba.driver.current_device(), *launch_state())
    launches = entry.launches
    if launches is not None and entry.where == where:
        if VERIFY_REPLAYS:
            _verify(launches, glue, kwargs, stream)
        launches.launch(stream)  # a LaunchTable: one compiled loop for all of them on a GPU
        return
    if not entry.hits:  # the first time, just run: most snapshots never come back
        with sink(eager):
            glue(**kwargs, stream=stream)
        return
    packing = _Packing()
    with sink(packing.take):
        glue(**kwargs, stream=stream)
    if packing.launches and all(p is not None for p in packing.launches):
        entry.launches, entry.where = LaunchTable(packing.launches), where
