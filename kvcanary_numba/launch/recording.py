"""Recording the launches of the launch glue instead of running them.

Inside a ``with recording()`` block every launch-glue call of this host thread
runs as usual (after the public wrapper's validation) but its launches are
kept as :class:`~.spec.LaunchSpec` descriptions, each array argument with its
:class:`~.spec.Origin` (which caller array it views, how, and whether the glue
called it long-lived). Nothing is swapped: the view builders report what they
built to a thread-local observer (``_array_views.observing``) and ``launch``
hands each description to this thread's sink (``_kernel_launch.sink``)
instead of running it; other threads are untouched. :mod:`.prepared` packs the
descriptions into one-call launches whose per-step arguments can be re-pointed
at new arrays. A tuple argument (the per-endpoint contexts of ``launch/endpoints.py``)
has no origin and may hold only persistent views: recording refuses one holding a
view of a per-call array, which no role could rebind.
"""

from __future__ import annotations

import contextlib

from . import _array_views, _kernel_launch
from .spec import LaunchSpec, Origin

__all__ = ["recording"]


class _Recording:
    def __init__(self):
        self.launches: list[LaunchSpec] = []
        self._origins: dict[int, tuple] = {}  # id(view) -> (view kept alive, origin)

    def note(self, view, source, builder: str, params: tuple, persistent: bool) -> None:
        self._origins[id(view)] = (view, Origin(source, builder, params, persistent=persistent))

    def origin_of(self, arg) -> Origin | None:
        hit = self._origins.get(id(arg))
        return hit[1] if hit is not None and hit[0] is arg else None

    def take(self, spec: LaunchSpec) -> None:
        for arg in spec.args:
            if isinstance(arg, tuple):
                self._check_members(spec, arg)
        self.launches.append(spec._replace(origins=tuple(self.origin_of(a) for a in spec.args)))

    def _check_members(self, spec: LaunchSpec, items: tuple) -> None:
        # A tuple argument is packed whole and has no origin, so no role can rebind a view inside
        # it: only views of long-lived arrays (``persistent=True``) may travel in tuples.
        for item in items:
            if isinstance(item, tuple):
                self._check_members(spec, item)
                continue
            origin = self.origin_of(item)
            if origin is not None and not origin.persistent:
                raise RuntimeError(f"recording: a tuple argument of {spec.signature} holds a view of a per-call "
                                   "array; tuples may hold only persistent views (a replay could not rebind it)")


@contextlib.contextmanager
def recording():
    """Record the launches of launch-glue calls this thread makes in the block instead of running them.

    Everything else the glue does still happens (validation, scratch
    allocation, view caching), so a phase can be recorded before it is
    captured into a CUDA graph. Public calls are not replayed inside (their
    glue runs and is recorded). Recordings nest (the inner one collects).
    """
    rec = _Recording()
    with _kernel_launch.sink(rec.take):
        saved = getattr(_array_views.observing, "note", None)
        _array_views.observing.note = rec.note
        try:
            yield rec
        finally:
            _array_views.observing.note = saved
