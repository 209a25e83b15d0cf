"""The monitor's one-step-delayed readback of the status block (:mod:`.status`).

One small copy of the status block per step carries every signal; on a GPU that
copy goes to pinned host memory on a side stream, ordered after the step's
launches by an event, and the host reads an earlier step's copy once its event
says it is done (normally the previous step's), so it never stalls the GPU
(SGLang pumps its ``write_index > 0`` flag the same way). On the CPU the block
is host memory and is read immediately. :class:`MergedCopies` reads the ranks'
merged verdict words the same way, one call later (:mod:`.verdict`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..fast import driver as _driver, native as _native
from .status import FIRST_PLAN_WORD, Snapshot, StatusBlock, _snapshot

__all__ = ["CudaReadback", "HostReadback", "MergedCopies"]


class HostReadback:
    """CPU path: the block is host memory; every step's snapshot is available at once."""

    def __init__(self, block: StatusBlock):
        self._words = block.words

    def push(self, step: int, expect: int = -1) -> Snapshot | None:
        """Snapshot the block after ``step``; returns the snapshot to process now (``expect`` is
        :meth:`CudaReadback.push`'s: every snapshot is processed on the CPU)."""
        return _snapshot(step, self._words.copy())

    def flush(self) -> Snapshot | None:
        """Nothing is ever pending on the CPU."""
        return None

    def ring(self, ring) -> np.ndarray:
        return ring


class CudaReadback:
    """GPU path: double-buffered pinned copies on a side stream, read once they are done.

    ``push`` never waits for the previous step's copy: it queries the copies'
    events in issue order and returns the newest finished one. Only a copy two
    steps old is waited for (its buffer is needed again, and the pump's plan
    history spans a bounded lag), which happens only when the device runs
    more than a step behind the host.

    In the usual state (the previous step's copy is the only one in flight) a step's
    five driver calls -- query that copy's event, record the step's end on the compute
    stream, make the side stream wait for it, copy, record the copy -- are one call
    into compiled code (:func:`kvcanary_numba.fast.native.compiled_readback`, libcuda's
    functions); any other state, or no compiled calls, takes CuPy's runtime calls one by one.
    That call also reads the finished copy's write index and plan flags: when they say
    nothing is new (``push``'s ``expect``), no snapshot is built, which is most steps.

    Parameters
    ----------
    block : StatusBlock
    modules : (cupy, cupyx), optional
        Stand-ins for host-only tests and ``benchmarks/host_step.py`` (default: the real ones).
    functions : sequence of int, optional
        Addresses of :data:`~kvcanary_numba.fast.native.READBACK_FUNCTIONS` for the
        compiled calls (default: libcuda's, unless ``modules`` are given; None in the
        sequence: CuPy's runtime calls only).
    """

    def __init__(self, block: StatusBlock, *, modules=None, functions=None):
        if modules is None:
            import cupy
            import cupyx

            if functions is None:
                functions = _driver.libcuda_functions(_native.READBACK_FUNCTIONS)
        else:  # (cupy, cupyx) stand-ins: host-only tests and benchmarks/host_step.py
            cupy, cupyx = modules
        self._cupy = cupy
        self._words = block.words
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._host = [cupyx.empty_pinned(block.words.shape, np.int64) for _ in range(2)]
        self._launched = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self._copied = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self._queue: deque[tuple[int, int]] = deque()  # (step, buffer) of the copies in flight, oldest first
        self._side = self._stream.ptr
        data = self._words.data
        device_ptr = data.ptr if hasattr(data, "ptr") else self._words.ctypes.data  # NumPy: a stand-in
        # This runs every step on the host's hot path: raw runtime calls, bound once, on cached pointers.
        runtime = cupy.cuda.runtime
        self._record, self._wait, self._query = runtime.eventRecord, runtime.streamWaitEvent, runtime.eventQuery
        self._current_stream = cupy.cuda.get_current_stream
        self._copy = (runtime.memcpyAsync, device_ptr, self._words.nbytes, runtime.memcpyDeviceToHost, self._side)
        self._buffers = [
            (launched.ptr, copied.ptr, host.ctypes.data)
            for launched, copied, host in zip(self._launched, self._copied, self._host)
        ]
        step = None if functions is None or None in functions else _native.compiled_readback()
        #: (compiled readback step, int64 function addresses), or None: CuPy's runtime calls.
        self.native = None if step is None else (step, np.array(functions, dtype=np.int64))
        if self.native is not None:
            # The compiled call's arguments but the compute stream and ``expect``, per buffer: with no
            # copy in flight, and with the other buffer's copy to query.
            fns, size = self.native[1], self._words.nbytes
            self._fixed = [
                [
                    (fns, *query, FIRST_PLAN_WORD, launched, copied, self._side, host, device_ptr, size)
                    for query in ((0, 0), self._buffers[1 - i][1:])
                ]
                for i, (launched, copied, host) in enumerate(self._buffers)
            ]

    def _issue(self, step: int) -> None:
        i = step & 1
        launched, copied, host = self._buffers[i]
        record, side = self._record, self._side
        record(launched, self._current_stream().ptr)  # after the step's launches on the compute stream
        self._wait(side, launched)  # the side stream waits, the compute stream never does
        memcpy, device, nbytes, kind, _ = self._copy
        memcpy(host, device, nbytes, kind, side)
        record(copied, side)
        self._queue.append((step, i))

    def _collect(self, wait_before: float) -> Snapshot | None:
        """The newest finished copy (waiting for those of steps before ``wait_before``); frees their buffers."""
        newest, queue, buffers, query = None, self._queue, self._buffers, self._query
        while queue:
            step, i = queue[0]
            if query(buffers[i][1]) != 0:  # not done (CuPy's Event.done, without the wrapper)
                if step >= wait_before:
                    break  # the side stream is in order: later copies are not done either
                self._copied[i].synchronize()  # the copy's own event: the compute stream is never waited for
            queue.popleft()
            newest = (step, i)
        return None if newest is None else _snapshot(newest[0], self._host[newest[1]].copy())

    def push(self, step: int, expect: int = -1) -> Snapshot | None:
        """Copy this step's block asynchronously; return the newest finished snapshot of an earlier step.

        ``expect``: the write index with which a finished snapshot of step ``step - 1`` needs no
        processing (-1: every snapshot is returned); such a snapshot is read where it lies and
        None is returned, as when no copy is done yet (compiled calls only).
        """
        queue = self._queue
        if self.native is None or not (not queue or (len(queue) == 1 and queue[0][0] == step - 1)):
            snapshot = self._collect(step - 1) if queue else None  # frees this step's buffer (two steps old)
            self._issue(step)
            return snapshot
        # What _collect(step - 1) then _issue(step) do when at most the previous step's copy is in
        # flight: its buffer is the other one, so this step's copy is issued whatever the query says.
        i = step & 1
        previous = queue[0] if queue else None
        status = self.native[0](*self._fixed[i][previous is not None], self._current_stream().ptr, expect)
        if status >> 32:
            call, err = _native.decode_status(status)
            name = ("cuEventQuery", "cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoHAsync_v2", "cuEventRecord")
            raise RuntimeError(f"status readback: {name[call - 1]} failed: {_driver.driver.error_name(err)}")
        queue.append((step, i))
        if previous is None or status == _native.NOT_READY:  # nothing in flight, or the previous copy is not done yet
            return None
        queue.popleft()
        if status == _native.QUIET:  # done, and nothing in it to process
            return None
        return _snapshot(previous[0], self._host[previous[1]].copy())

    def flush(self) -> Snapshot | None:
        """Wait for every pending copy (end of a run); the newest snapshot."""
        return self._collect(float("inf"))

    def ring(self, ring) -> np.ndarray:
        """Host copy of the ring (synchronous; only done when the index says there are rows)."""
        return self._cupy.asnumpy(ring)


class MergedCopies:
    """Small int32 words (the ranks' merged verdict words) copied to pinned host memory on the
    current stream, read one call later.

    The copy runs in the order of the current stream: after the collective that wrote the
    merged word and before anything issued later (the next step's collective into the same
    buffer) can overwrite it. Only the host waits, and only for the previous call's copy.
    """

    def __init__(self, lanes: int):
        import cupy
        import cupyx

        self._cupy = cupy
        self._host = cupyx.empty_pinned((lanes,), np.int32)
        self._copied = cupy.cuda.Event(disable_timing=True)
        self._pending = None  # the merged array being copied (kept alive until the copy is done)

    def push(self, ptr: int, keep) -> np.ndarray | None:
        """Copy the word at device pointer ``ptr`` (of array ``keep``) in the current stream's order;
        return the previous call's word (waiting for its copy), None at the first call."""
        previous = self.take()
        runtime, stream = self._cupy.cuda.runtime, self._cupy.cuda.get_current_stream()
        nbytes = self._host.nbytes
        runtime.memcpyAsync(self._host.ctypes.data, ptr, nbytes, runtime.memcpyDeviceToHost, stream.ptr)
        self._copied.record(stream)
        self._pending = keep
        return previous

    def take(self) -> np.ndarray | None:
        """The word of the copy in flight, once it is done (None when none is)."""
        if self._pending is None:
            return None
        self._copied.synchronize()
        self._pending = None
        return self._host.copy()
