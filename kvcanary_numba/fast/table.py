"""Launches issued together, in order, on one stream: a prepared phase, a replayed public call.

:class:`LaunchTable` is what the monitor's prepared phases
and the memo replay of public calls (:func:`.replay.run_launches`) launch. On a GPU it
hands all of its launches to one compiled loop (:mod:`.native`): one Python call per phase
instead of one ``PreparedLaunch.launch`` (and one cuda-bindings call) per launch. Anything
else (the simulator, a launch that is not raw, no C ``cuLaunchKernel``,
``driver.DRIVER_CALLS = "python"``, Numba unable to compile the loop) launches each one as before.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..launch._launch import current_stream
from . import driver as _numba, native as _native

__all__ = ["LaunchTable"]


class LaunchTable:
    """Launches issued together (a prepared phase, a replayed public call), in order, on one stream.

    Parameters
    ----------
    launches : sequence of :class:`~.prepared.PreparedLaunch`

    Notes
    -----
    When every launch is raw, the driver has a C ``cuLaunchKernel`` (``driver.native``) and
    the compiled loop compiles (:mod:`.native`), :meth:`launch` is one call into compiled code
    that launches them all; else each launch's own :meth:`~.prepared.PreparedLaunch.launch`. The compiled
    table copies each launch's handle, grid, block and parameter-array address (or, with
    ``driver.PARAM_BUFFER``, its one-buffer ``extra`` array where it has one): rebinding
    arguments is seen (the array points at the packed values), a :meth:`~.prepared.PreparedLaunch.refill`
    would not be, so a tabled launch refuses it.
    """

    __slots__ = ("launches", "table", "_run", "_fn")

    def __init__(self, launches):
        self.launches = tuple(launches)
        self.table = self._run = self._fn = None
        driver = _numba.driver
        if not self.launches or not all(p.raw for p in self.launches) or driver.native is None:
            return
        run = _native.compiled_launcher()
        if run is None:
            return
        buffers = _numba.PARAM_BUFFER
        try:
            rows = [
                (int(p.handle), p.grid, p.block, 0, ctypes.addressof(p._extra))
                if buffers and p._extra is not None
                else (int(p.handle), p.grid, p.block, ctypes.addressof(p._pointers), 0)
                for p in self.launches
            ]
        except (TypeError, ValueError):  # a handle that is not an address: each launch's own route
            return
        self.table = np.array(rows, dtype=np.int64)
        for p in self.launches:
            p._tabled = True
        self._run, self._fn = run, driver.native

    def __len__(self) -> int:
        return len(self.launches)

    def __iter__(self):
        return iter(self.launches)

    @property
    def compiled(self) -> bool:
        """Whether :meth:`launch` runs the compiled loop."""
        return self._run is not None

    def launch(self, stream: int | None = None) -> None:
        """Launch every launch, in order, on ``stream`` (a handle; default: CuPy's current stream).

        Raises
        ------
        RuntimeError
            A driver error; the launches before the failing one were issued, the rest not.
        """
        handle = current_stream() if stream is None else int(stream)
        if self._run is None:
            for p in self.launches:
                p.launch(handle)
            return
        status = self._run(self._fn, self.table, handle)
        if status:
            row, err = _native.decode_status(status)
            p = self.launches[row]
            raise RuntimeError(
                f"cuLaunchKernel failed: {_numba.driver.error_name(err)} (grid {p.grid}, block {p.block})"
            )
