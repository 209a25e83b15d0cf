"""One host thread at a time inside a CanaryMonitor's hooks.

A monitor's step is one sequence of hooks over one set of plans, canary buffers, counters and
readback state: ``pre_forward`` plans the step and runs HEAD, ``post_forward`` runs TAIL on what
HEAD planned, ``end_step`` reads the ring back. Two threads stepping one monitor at once would
interleave two batches over those plans and report violations that never happened.

So a monitor refuses, with KVC-M026, a hook called while another host thread is inside one of
its hooks (``pre_forward``, ``post_forward``, the whole block of ``with monitor.forward(batch):``,
``end_step``, ``sweep``, ``flush``, ``capture_graph``, ``finish_warmup``, setting ``backend``,
``rebind_sources``, ``apply_verdict`` and the record moves: ``take_records``, ``put_records``,
``move_records``, ``verify_records``, ``handoff_digest``).
The refused call reads and changes nothing; the other thread's step goes on undisturbed.

Why refuse rather than wait: a call that waited would run later against whatever step the other
thread has reached by then (its ``post_forward`` would stamp the other thread's batch), which is
the same bug, only quieter. An engine that steps one monitor from several threads holds its own
lock around each whole step; handing a monitor from one thread to another between calls is fine.
Reading (``stats()``, ``violations``) is not guarded. The same thread may re-enter (``end_step``
runs ``sweep``; ``forward`` runs ``pre_forward`` and ``post_forward``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from threading import get_ident

from ..errors import error

__all__ = ["HookGuard", "one_thread"]


class HookGuard:
    """Which host thread is inside a monitor's hooks, if any (re-entrant for that thread)."""

    __slots__ = ("_depth", "_lock", "_owner")

    def __init__(self):
        self._lock = threading.RLock()
        self._owner = 0  # the holder's thread ident, 0 while idle: an idle guard looks the same after a call
        self._depth = 0

    def enter(self, function: str) -> None:
        """Hold the guard for a call of ``function``; KVC-M026 while another thread holds it."""
        if not self._lock.acquire(blocking=False):
            raise error("KVC-M026", function=function, thread=threading.current_thread().name, owner=self.owner())
        if self._depth == 0:
            self._owner = get_ident()  # an int, not the thread's name: the hooks' hot path
        self._depth += 1

    def leave(self) -> None:
        """Release one :meth:`enter` of this thread."""
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
        """``with guard.holding(function):`` = :meth:`enter`, the block, :meth:`leave`."""
        self.enter(function)
        try:
            yield
        finally:
            self.leave()


def one_thread(method: Callable) -> Callable:
    """Decorate a monitor hook: the call holds the monitor's ``thread_guard`` (:class:`HookGuard`)."""
    function = f"CanaryMonitor.{method.__name__}"

    @functools.wraps(method)
    def hook(monitor, *args, **kwargs):
        guard = monitor.thread_guard
        guard.enter(function)
        try:
            return method(monitor, *args, **kwargs)
        finally:
            guard.leave()

    hook.guarded = (method, function)  # what monitor/device.py folds into its own wrapper (one call, not two)
    return hook
