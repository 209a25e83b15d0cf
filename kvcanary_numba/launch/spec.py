"""The launch description every consumer of a kernel launch reads (rules: :mod:`._common`).

:class:`LaunchSpec` is what the launch glue asks for when it calls
``_common.launch(kernel, signature, grid, block, args)``: the eager launch runs
it, a recording keeps it (with each array argument's :class:`Origin`), memo
replay and the monitor's prepared phases pack it
(:class:`~.prepared.PreparedLaunch`), and a CUDA graph captures the packed
launches. It is immutable: a consumer that wants other arguments builds another
spec or rebinds a packed launch, it never edits a description in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["LaunchSpec", "Origin"]


@dataclass(frozen=True, slots=True)
class Origin:
    """How the launch glue built one kernel array argument: ``builder(source, *params, **options)``.

    ``persistent`` is the glue's word that ``source`` is long-lived (it asked for a cached
    view): a prepared phase may keep launching on it. A view of a per-call array
    (``persistent=False``) must be rebound to each call's array, by role.
    """

    source: Any
    builder: str  # "kernel_array" | "reinterpret" | "byte_span"
    params: tuple = ()
    options: tuple = ()  # sorted (name, value) keyword arguments other than ``persistent``
    persistent: bool = False

    def rebuild(self, source: Any):
        """The same view of another array (never cached: ``source`` may be per-step)."""
        from . import _common

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


class LaunchSpec(NamedTuple):
    """One kernel launch as the glue asked for it.

    Attributes
    ----------
    kernel : numba.cuda dispatcher
        A module-level ``@cuda.jit`` kernel (see :mod:`kvcanary_numba.kernels`).
    signature : str
        The declared signature it runs with.
    grid, block : int
        1-D launch shape.
    args : tuple
        Kernel arguments (Numba device-array views or CUDA arrays, NumPy arrays under
        the simulator, Python scalars and tuples).
    origins : tuple or None
        Per argument, the :class:`Origin` of an array view built by a ``_common``
        builder, None for anything else (scalars, glue scratch passed as is). Only
        a recording fills it in (the eager path does not track origins): None.
    """

    kernel: Any
    signature: str
    grid: int
    block: int
    args: tuple
    origins: tuple | None = None

    def transient_arguments(self) -> list[int]:
        """Indices of array arguments viewed from a per-call array (built with ``persistent=False``)."""
        return [i for i, origin in enumerate(self.origins or ()) if origin is not None and not origin.persistent]
