"""Around each public hook of a CanaryMonitor: one host thread, the monitor's device, its own scratch.

**One host thread at a time.** A monitor's step is one sequence of hooks over one set of plans,
canary buffers, counters and readback state: ``pre_forward`` plans the step and runs HEAD,
``post_forward`` runs TAIL on what HEAD planned, ``end_step`` reads the ring back. Two threads
stepping one monitor at once would interleave two batches over those plans and report violations
that never happened. So a monitor refuses, with KVC-M026, a hook called while another host thread
is inside one of its hooks (``pre_forward``, ``post_forward``, the whole block of
``with monitor.forward(batch):``, ``end_step``, ``sweep``, ``flush``, ``capture_graph``,
``finish_warmup``, setting ``backend``, ``rebind_sources``, ``apply_verdict`` and the record
moves: ``take_records``, ``put_records``, ``move_records``, ``verify_records``,
``handoff_digest``). The refused call reads and changes nothing; the other thread's step goes on
undisturbed. Why refuse rather than wait: a call that waited would run later against whatever
step the other thread has reached by then (its ``post_forward`` would stamp the other thread's
batch), which is the same bug, only quieter. An engine that steps one monitor from several
threads holds its own lock around each whole step; handing a monitor from one thread to another
between calls is fine. Reading (``stats()``, ``violations``) is not guarded. The same thread may
re-enter (``end_step`` runs ``sweep``; ``forward`` runs ``pre_forward`` and ``post_forward``).

**The monitor's device.** One process may drive several GPUs, one monitor per device (JAX and
other single-controller engines), and step them in any interleaving. A monitor's buffers are
allocated on the device that is current when it is built; every launch, event and copy of a
hook must go to that device whatever the engine made current since. Each hook makes the
monitor's device current for the call (one ``getDevice`` when it already is) and restores the
caller's device after it, so the engine's own CuPy calls are not moved.

**Its own launch scratch.** Each hook also names the monitor as the owner of the launch scratch
its glue takes (:func:`kvcanary_numba.fast.scratch.owned_by`): prepared steps keep the scratch
pointers they were recorded with and replay them on the engine's stream of the moment, so two
monitors must never share scratch, whichever streams they were recorded on.

All three live in one :class:`HookScope`, entered and left once per hook: a decode step runs
three hooks, and every Python call on that path is host time the engine waits for.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Any

from ..errors import error
from ..fast import scratch as _scratch

__all__ = ["HookScope", "guarded", "on_device"]

_tokens = itertools.count()
_KEPT = object()  # what leave() gets for the scratch owner of a guard-only enter: nothing to restore


class HookScope:
    """The thread guard, the CUDA device (None on the CPU) and the scratch owner token of one monitor.

    Parameters
    ----------
    device : int or None
        The device the monitor's buffers live on (None: host memory).
    runtime : object, optional
        What has ``getDevice()`` and ``setDevice(id)`` (default: CuPy's runtime when
        ``device`` is given; tests pass a stand-in).
    """

    __slots__ = ("device", "token", "_get", "_set", "_lock", "_owner", "_depth")

    def __init__(self, device: int | None, runtime: Any = None):
        self.device = device
        self.token = ("monitor", next(_tokens))  # never reused, unlike an id()
        self._lock = threading.RLock()
        self._owner = 0  # the holder's thread ident, 0 while idle: an idle guard looks the same after a call
        self._depth = 0
        self._get = self._set = None
        if device is not None:
            if runtime is None:
                import cupy

                runtime = cupy.cuda.runtime
            self._get, self._set = runtime.getDevice, runtime.setDevice

    def enter(self, function: str | None, *, switch: bool = True) -> tuple:
        """Hold the guard for a call of ``function`` (None: a reading call, not guarded), make the
        device current and the monitor the scratch owner (unless ``switch`` is False: the guard
        alone); return what :meth:`leave` restores.

        Raises
        ------
        KvCanaryError
            KVC-M026 while another thread is inside a guarded hook (nothing changed).
        """
        if function is not None:
            if not self._lock.acquire(blocking=False):
                raise error("KVC-M026", function=function, thread=threading.current_thread().name, owner=self.owner())
            if self._depth == 0:
                self._owner = get_ident()  # an int, not the thread's name: the hooks' hot path
            self._depth += 1
        if not switch:
            return function, _KEPT, None
        owner_now = _scratch.OWNER  # swapped in line, as _scratch.swap_owner does: a call less per hook
        owner, owner_now.token = owner_now.token, self.token
        if self._get is None:
            return function, owner, None
        try:
            previous = self._get()
            if previous == self.device:
                return function, owner, None
            self._set(self.device)
        except BaseException:
            self.leave((function, owner, None))
            raise
        return function, owner, previous

    def leave(self, entered: tuple) -> None:
        """Restore what :meth:`enter` changed (its return value) and release the guard."""
        function, owner, previous = entered
        try:
            if previous is not None:
                self._set(previous)
        finally:
            if owner is not _KEPT:
                _scratch.OWNER.token = owner
            if function is not None:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = 0
                self._lock.release()

    def owner(self) -> str:
        """The name of the thread inside the hooks ("?" when none, or when it has ended)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        return names.get(self._owner, "?")

    @contextlib.contextmanager
    def holding(self, function: str) -> Iterator[None]:
        """``with scope.holding(function):`` holds the guard alone around the block: the engine's
        code inside (``with monitor.forward(batch):``) keeps its own device and scratch."""
        entered = self.enter(function, switch=False)
        try:
            yield
        finally:
            self.leave(entered)


def _in_scope(method: Callable, function: str | None) -> Callable:
    @functools.wraps(method)
    def hook(self, *args, **kwargs):
        scope = self.hook_scope
        entered = scope.enter(function)
        try:
            return method(self, *args, **kwargs)
        finally:
            scope.leave(entered)

    return hook


def guarded(method: Callable) -> Callable:
    """Decorate a monitor hook: one host thread at a time (KVC-M026), on the monitor's device.

    The decorated object has a ``hook_scope`` (:class:`HookScope`).
    """
    return _in_scope(method, f"CanaryMonitor.{method.__name__}")


def on_device(method: Callable) -> Callable:
    """Decorate a reading method: on the monitor's device with its scratch, not guarded."""
    return _in_scope(method, None)
