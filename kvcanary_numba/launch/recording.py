"""Recording the launches of the launch glue instead of running them.

:func:`recording` swaps the view builders and ``launch`` of :mod:`._common`
for the duration of a ``with`` block, so every launch-glue call made in it runs
as usual (after the public wrapper's validation) but its launches are collected as
:class:`RecordedLaunch` (kernel, signature, grid, block, arguments), each array
argument with its :class:`Origin` (which caller array it views, and how).
:mod:`.prepared` turns them into one-call launches whose per-step arguments
can be re-pointed at new arrays.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _common

__all__ = ["Origin", "RecordedLaunch", "recording"]

_record_lock = threading.Lock()


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

    def note(self, view, origin: Origin):
        self._origins[id(view)] = (view, origin)
        return view

    def origin_of(self, arg) -> Origin | None:
        hit = self._origins.get(id(arg))
        return hit[1] if hit is not None and hit[0] is arg else None


@contextlib.contextmanager
def recording():
    """Record the launches of launch-glue calls made in the block instead of running them.

    The glue's view builders and ``launch`` of :mod:`._common` are swapped for
    the duration (module attributes the glue looks up at call time); calls from
    other threads pass straight through to the originals, and one recording
    runs at a time (a lock). Everything else the glue does still happens
    (validation, scratch allocation, view caching), so a phase can be recorded
    before it is captured into a CUDA graph.
    """
    rec = _Recording()
    names = ("kernel_array", "reinterpret", "byte_span", "launch")
    me = threading.get_ident()
    with _record_lock:
        saved = {name: getattr(_common, name) for name in names}

        def builder(name):
            original = saved[name]

            def build(x, *params, persistent=False, **options):
                view = original(x, *params, persistent=persistent, **options)
                if threading.get_ident() != me:  # another thread's glue: untouched
                    return view
                return rec.note(view, Origin(x, name, params, tuple(sorted(options.items()))))

            return build

        def record(kernel, signature, grid, block, args):
            if threading.get_ident() != me:
                saved["launch"](kernel, signature, grid, block, args)
                return
            args = tuple(args)
            origins = tuple(rec.origin_of(a) for a in args)
            rec.launches.append(RecordedLaunch(kernel, signature, int(grid), int(block), args, origins))

        try:
            for name in names[:3]:
                setattr(_common, name, builder(name))
            _common.launch = record
            yield rec
        finally:
            for name, original in saved.items():
                setattr(_common, name, original)
