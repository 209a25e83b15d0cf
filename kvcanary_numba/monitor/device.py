"""The device a monitor lives on, current around each of its hooks, and the scratch its launches own.

One process may drive several GPUs, one monitor per device (JAX and other single-controller
engines), and step them in any interleaving. A monitor's buffers are allocated on the device
that is current when it is built; every launch, event and copy of a hook must go to that
device whatever the engine made current since. :func:`on_own_device` wraps each public hook:
it makes the monitor's device current for the call (one ``getDevice`` when it already is)
and restores the caller's device after it, so the engine's own CuPy calls are not moved.

The same wrapper names the monitor as the owner of the launch scratch its glue takes
(:func:`kvcanary_numba.fast.scratch.owned_by`): prepared steps keep the scratch pointers
they were recorded with and replay them on the engine's stream of the moment, so two
monitors must never share scratch, whichever streams they were recorded on.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

from ..fast import scratch as _scratch

__all__ = ["MONITOR_HOOKS", "HookDevice", "hooks_on_own_device", "on_own_device"]

#: The methods of CanaryMonitor that run with its device current (every one that launches,
#: records, copies or reads its buffers).
MONITOR_HOOKS = (
    "pre_forward",
    "post_forward",
    "end_step",
    "capture_graph",
    "finish_warmup",
    "sweep",
    "flush",
    "stats",
    "rebind_sources",
    "apply_verdict",
    "take_records",
    "put_records",
    "move_records",
    "verify_records",
    "handoff_digest",
)

_tokens = itertools.count()


class HookDevice:
    """The CUDA device of one monitor (None on the CPU) and its scratch owner token.

    Parameters
    ----------
    device : int or None
        The device the monitor's buffers live on (None: host memory).
    runtime : object, optional
        What has ``getDevice()`` and ``setDevice(id)`` (default: CuPy's runtime when
        ``device`` is given; tests pass a stand-in).
    """

    __slots__ = ("device", "token", "_get", "_set")

    def __init__(self, device: int | None, runtime: Any = None):
        self.device = device
        self.token = ("monitor", next(_tokens))  # never reused, unlike an id()
        self._get = self._set = None
        if device is not None:
            if runtime is None:
                import cupy

                runtime = cupy.cuda.runtime
            self._get, self._set = runtime.getDevice, runtime.setDevice

    def enter(self) -> tuple:
        """Make the device current and the monitor the scratch owner; what :meth:`leave` restores."""
        owner_now = _scratch.OWNER  # swapped in line, as _scratch.swap_owner does: a call less per hook
        owner, owner_now.token = owner_now.token, self.token
        if self._get is None:
            return owner, None
        previous = self._get()
        if previous == self.device:
            return owner, None
        self._set(self.device)
        return owner, previous

    def leave(self, entered: tuple) -> None:
        """Restore what :meth:`enter` changed (its return value)."""
        owner, previous = entered
        if previous is not None:
            self._set(previous)
        _scratch.OWNER.token = owner


def on_own_device(method: Callable) -> Callable:
    """Wrap a monitor method: it runs with ``self.hook_device`` entered (see :class:`HookDevice`).

    A method already wrapped by :func:`~.guard.one_thread` gets one wrapper doing both, the
    thread guard first (a refused call touches no device): a frame less on every step hook.
    """
    guarded = getattr(method, "guarded", None)
    if guarded is not None:
        inner, function = guarded

        @functools.wraps(inner)
        def guarded_hook(self, *args, **kwargs):
            guard = self.thread_guard
            guard.enter(function)
            try:
                device = self.hook_device
                entered = device.enter()
                try:
                    return inner(self, *args, **kwargs)
                finally:
                    device.leave(entered)
            finally:
                guard.leave()

        return guarded_hook

    @functools.wraps(method)
    def hook(self, *args, **kwargs):
        device = self.hook_device
        entered = device.enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            device.leave(entered)

    return hook


def hooks_on_own_device(*names: str) -> Callable[[type], type]:
    """Class decorator: wrap the methods ``names`` of the class with :func:`on_own_device`."""

    def wrap(cls: type) -> type:
        for name in names:
            setattr(cls, name, on_own_device(getattr(cls, name)))
        return cls

    return wrap
