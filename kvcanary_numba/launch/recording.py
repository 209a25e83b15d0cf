"""Recording the launches of the launch glue instead of running them.

Inside a ``with recording()`` block every launch-glue call of this host thread
runs as usual (after the public wrapper's validation) but its launches are
collected as :class:`RecordedLaunch` (kernel, signature, grid, block,
arguments), each array argument with its :class:`Origin` (which caller array
it views, and how). Nothing is swapped: the view builders report what they
built to a thread-local observer (``_array_views.observing``) and ``launch``
hands its arguments to a thread-local sink (``_kernel_launch.recording_sink``)
instead of launching; other threads are untouched. :mod:`.prepared` turns the
records into one-call launches whose per-step arguments can be re-pointed at
new arrays.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _array_views, _common, _kernel_launch

__all__ = ["Origin", "RecordedLaunch", "recording"]


@dataclass(frozen=True, slots=True)
class Origin:
    """How the launch glue built one kernel array argument: ``builder(source, *params, **options)``."""

    source: Any
    builder: str  # "kernel_array" | "reinterpret" | "byte_span"
    params: tuple = ()
    options: tuple = ()  # sorted (name, value) keyword arguments other than ``persistent``

    def rebuild(self, source: Any):
        """The same view of another array (never cached: ``source`` may be per-step)."""
        return getattr(_common, self.builder)(source, *self.params, **dict(self.options))

    def layout(self, source_layout: tuple) -> tuple | None:
        """The view's layout computed from its source's, or None when it takes building
        the view (shaped reinterpretations, byte spans)."""
        if self.builder == "kernel_array":
            return source_layout
        options = dict(self.options)
        shape = self.params[1] if len(self.params) > 1 else options.get("shape")
        if self.builder != "reinterpret" or shape is not None:
            return None
        dtype = np.dtype(self.params[0] if self.params else options["dtype"])
        ptr, extents, _, source_dtype = source_layout
        nbytes = source_dtype.itemsize
        for extent in extents:
            nbytes *= extent
        return ptr, (nbytes // dtype.itemsize,), (dtype.itemsize,), dtype


@dataclass(frozen=True, slots=True)
class RecordedLaunch:
    """One launch the glue would have made; ``origins[i]`` is None for a non-array argument."""

    kernel: Any
    signature: str
    grid: int
    block: int
    args: tuple
    origins: tuple


class _Recording:
    def __init__(self):
        self.launches: list[RecordedLaunch] = []
        self._origins: dict[int, tuple[Any, Origin]] = {}  # id(view) -> (view kept alive, origin)

    def note(self, view, source, builder: str, params: tuple) -> None:
        self._origins[id(view)] = (view, Origin(source, builder, params))

    def origin_of(self, arg) -> Origin | None:
        hit = self._origins.get(id(arg))
        return hit[1] if hit is not None and hit[0] is arg else None

    def record(self, kernel, signature, grid, block, args) -> None:
        args = tuple(args)
        origins = tuple(self.origin_of(a) for a in args)
        self.launches.append(RecordedLaunch(kernel, signature, int(grid), int(block), args, origins))


@contextlib.contextmanager
def recording():
    """Record the launches of launch-glue calls this thread makes in the block instead of running them.

    Everything else the glue does still happens (validation, scratch
    allocation, view caching), so a phase can be recorded before it is
    captured into a CUDA graph. Recordings nest (the inner one collects).
    """
    rec = _Recording()
    saved = (getattr(_array_views.observing, "note", None), getattr(_kernel_launch.recording_sink, "record", None))
    _array_views.observing.note, _kernel_launch.recording_sink.record = rec.note, rec.record
    try:
        yield rec
    finally:
        _array_views.observing.note, _kernel_launch.recording_sink.record = saved
