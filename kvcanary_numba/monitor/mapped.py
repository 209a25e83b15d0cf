"""The mapped readback: the status block published into host memory by a kernel, one launch per step.

:class:`~.readback.CudaReadback` makes five driver calls per step (query, record, wait,
copy, record). Session 14 measured them at ~20 us of ``end_step`` while the GPU is busy,
against ~9 us idle, and moving the copy onto the compute stream or into the TAIL graph
did not help (benchmarks/NOTES.md section 40). :class:`MappedReadback` replaces them
with ONE launch: the publish kernel (:mod:`kvcanary_numba.kernels.publish`), queued on
the engine's stream after the step's launches, writes the block into pinned host memory
between a busy mark and a sequence number; the host reads the newest complete publish
without any driver call, and drops a copy whose sequence number changed while it read.

Reads rely on the host loading words in program order (x86-64's memory model; the
kernel orders its side with system-scope fences), so other hosts (aarch64: Grace) keep
:class:`~.readback.CudaReadback` whatever the switch says.
"""

from __future__ import annotations

import os
import platform
import time
from collections import deque

import numpy as np

from .readback import CudaReadback
from .status import Snapshot, StatusBlock, _snapshot

__all__ = ["MAPPED_STATUS", "MappedReadback", "gpu_readback"]

#: The monitor reads its status block through :class:`MappedReadback` (env
#: ``KVCANARY_STATUS_READBACK=mapped``; off until measured on a GPU).
MAPPED_STATUS = os.environ.get("KVCANARY_STATUS_READBACK") == "mapped"

#: Hosts whose loads are not reordered with other loads, which the reads here rely on.
IN_ORDER_LOADS = platform.machine().lower() in ("x86_64", "amd64")

#: Seconds a wait spins on the host buffer before it synchronizes the stream instead (which
#: raises when the device failed, where a spin would never end).
SPIN_S = 1.0


def gpu_readback(block: StatusBlock):
    """The readback of a GPU monitor: :class:`MappedReadback` with :data:`MAPPED_STATUS` on an
    x86-64 host (:data:`IN_ORDER_LOADS`), else :class:`~.readback.CudaReadback`."""
    return MappedReadback(block) if MAPPED_STATUS and IN_ORDER_LOADS else CudaReadback(block)


class MappedReadback:
    """GPU path: one publish launch per step; the host reads the newest complete publish.

    ``push`` waits only when the publish of a step two steps old has not run yet (the
    device is more than a step behind), as :class:`~.readback.CudaReadback` waits for
    such a copy, so the pump's plan history spans a bounded lag.

    Parameters
    ----------
    block : StatusBlock
    publisher : StatusPublisher, optional
        The publish launch (default: one made for ``block``); tests pass stand-ins.
    synchronize : callable, optional
        Waits for the engine's stream when a wait outlasts :data:`SPIN_S` (default: CuPy's
        current stream's ``synchronize``).
    """

    def __init__(self, block: StatusBlock, *, publisher=None, synchronize=None):
        if publisher is None:
            from ..launch.publish import StatusPublisher  # the kernels: imported only by a GPU monitor

            publisher = StatusPublisher(block.words)
        self._publisher = publisher
        self._buffer = self._publisher.host
        self._synchronize = synchronize
        self._issued: deque[tuple[int, int]] = deque()  # (sequence number, step) not yet read, oldest first
        self._sequence = 0  # publishes issued
        self._seen = 0  # the newest sequence number read

    def push(self, step: int) -> Snapshot | None:
        """Publish this step's block (after any sweep's launches); return the newest complete
        publish of an earlier or this step, waiting only for one two steps old."""
        self._publisher.launch()
        self._sequence += 1
        self._issued.append((self._sequence, step))
        return self._read(step - 1)

    def flush(self) -> Snapshot | None:
        """Wait for every publish issued (end of a run); the newest snapshot not yet returned."""
        return self._read(float("inf"))

    def ring(self, ring) -> np.ndarray:
        """Host copy of the ring (synchronous; only done when the index says there are rows)."""
        return ring if isinstance(ring, np.ndarray) else ring.get()

    def _read(self, wait_before: float) -> Snapshot | None:
        """The newest complete publish not yet returned, after those of steps before ``wait_before``."""
        needed = 0
        for sequence, step in self._issued:
            if step < wait_before:
                needed = sequence
        got = self._try_read()
        if needed > (self._seen if got is None else got[0]):
            got = self._wait(needed)
        if got is None:
            return None
        sequence, words = got
        issued, step = self._issued, None
        while issued and issued[0][0] <= sequence:
            step = issued.popleft()[1]
        self._seen = sequence
        return _snapshot(step, words)

    def _try_read(self) -> tuple[int, np.ndarray] | None:
        """(sequence number, words) of the publish in the buffer if it is new and was not
        rewritten while read; else None."""
        buffer = self._buffer
        sequence = int(buffer[0])
        if sequence <= self._seen:  # nothing new, or a publish being written (negative)
            return None
        words = buffer[1:].copy()
        return (sequence, words) if int(buffer[0]) == sequence else None

    def _wait(self, needed: int) -> tuple[int, np.ndarray]:
        """Read until a publish numbered ``needed`` or later is complete: spin for :data:`SPIN_S`,
        then synchronize the stream (which raises where the device failed)."""
        deadline = time.perf_counter() + SPIN_S
        while time.perf_counter() < deadline:
            got = self._try_read()
            if got is not None and got[0] >= needed:
                return got
        self._sync()
        got = self._try_read()
        if got is None or got[0] < needed:
            raise RuntimeError(f"status readback: publish {needed} had not run after the stream synchronized")
        return got

    def _sync(self) -> None:
        if self._synchronize is not None:
            self._synchronize()
            return
        import cupy

        cupy.cuda.get_current_stream().synchronize()
