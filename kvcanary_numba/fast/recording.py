"""Recording the launches of the launch glue instead of running them.

Inside a ``with recording()`` block every launch-glue call of this host thread runs as
usual (after validation) but its launches are kept as
:class:`~kvcanary_numba.launch._launch.LaunchSpec` descriptions instead of running:
:func:`~kvcanary_numba.launch._launch.sink` hands each one here; other threads are
untouched. Each array argument is a :class:`~kvcanary_numba.launch._launch.View` that
names the caller array it views, how, and whether the glue called it long-lived, so
:mod:`.prepared` can pack the descriptions into one-call launches whose per-step
arguments are re-pointed at new arrays. A tuple argument (the per-endpoint contexts of
``fast/endpoints.py``) is packed whole and may hold only persistent views: recording
refuses one holding a view of a per-call array, which no role could rebind.
"""

from __future__ import annotations

import contextlib

from ..launch._launch import LaunchSpec, View, sink

__all__ = ["recording"]


class _Recording:
    def __init__(self):
        self.launches: list[LaunchSpec] = []

    def take(self, spec: LaunchSpec) -> None:
        for arg in spec.args:
            if isinstance(arg, tuple):
                self._check_members(spec, arg)
        self.launches.append(spec)

    def _check_members(self, spec: LaunchSpec, items: tuple) -> None:
        for item in items:
            if isinstance(item, tuple):
                self._check_members(spec, item)
            elif isinstance(item, View) and not item.persistent:
                raise RuntimeError(
                    f"recording: a tuple argument of {spec.signature} holds a view of a per-call "
                    "array; tuples may hold only persistent views (a replay could not rebind it)"
                )


@contextlib.contextmanager
def recording():
    """Record the launches of launch-glue calls this thread makes in the block instead of running them.

    Everything else the glue does still happens (scratch allocation), so a phase can be
    recorded before it is captured into a CUDA graph. Public calls are not replayed inside
    (their glue runs and is recorded). Recordings nest (the inner one collects).
    """
    rec = _Recording()
    with sink(rec.take):
        yield rec
