"""The monitor's one-step-delayed readback of the status block (:mod:`.status`).

One small copy of the status block per step carries every signal; on a GPU that
copy goes to pinned host memory, ordered after the step's launches (by an event
and a side stream, or by the compute stream itself), and the host reads an
earlier step's copy once its event says it is done (normally the previous
step's), so it never stalls the GPU (SGLang pumps its ``write_index > 0`` flag
the same way). On the CPU the block is host memory and is read immediately.
"""

from __future__ import annotations

import ctypes
import os
from collections import deque

import numpy as np

from ..launch import _driver, _native
from .status import Snapshot, StatusBlock, _newest, _snapshot

__all__ = ["GRAPH_STATUS_COPY", "STATUS_COPY_ON_COMPUTE", "HostReadback", "CudaReadback"]

#: A captured step copies the status block inside its TAIL graph, so a replayed ``end_step`` only
#: queries an event (env ``KVCANARY_GRAPH_STATUS_COPY=1``; off until measured on a GPU).
GRAPH_STATUS_COPY = os.environ.get("KVCANARY_GRAPH_STATUS_COPY") == "1"

#: ``end_step`` copies the status block on the compute stream, which orders it after the step's
#: launches by itself: three driver calls instead of five (no event on the compute stream, no side
#: stream waiting for it), for a ~2 us copy in the engine's stream (env
#: ``KVCANARY_STATUS_COPY_ON_COMPUTE=1``; off until measured on a GPU).
STATUS_COPY_ON_COMPUTE = os.environ.get("KVCANARY_STATUS_COPY_ON_COMPUTE") == "1"


def external_record():
    """libcuda's ``cuEventRecordWithFlags`` (event, stream, flags; 1 = CU_EVENT_RECORD_EXTERNAL) as a
    ctypes function, or None where libcuda does not load or lacks it (called at capture only)."""
    fn = _driver.libcuda_function("cuEventRecordWithFlags")
    if fn is None:
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint), ctypes.c_int
    return fn


class HostReadback:
    """CPU path: the block is host memory; every step's snapshot is available at once."""

    def __init__(self, block: StatusBlock):
        self._words = block.words

    def push(self, step: int, swept: bool = False) -> Snapshot | None:
        """Snapshot the block after ``step``; returns the snapshot to process now."""
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
    into compiled code (:func:`kvcanary_numba.launch._native.compiled_readback`, libcuda's
    functions); any other state, or no compiled calls, takes CuPy's runtime calls one by one.
    With ``on_compute`` the copy and its event go on the compute stream, which orders
    them after the step's launches by itself: three calls (query, copy, record).

    Parameters
    ----------
    block : StatusBlock
    modules : (cupy, cupyx), optional
        Stand-ins for host-only tests and ``benchmarks/host_step.py`` (default: the real ones).
    functions : sequence of int, optional
        Addresses of :data:`~kvcanary_numba.launch._native.READBACK_FUNCTIONS` for the
        compiled calls (default: libcuda's, unless ``modules`` are given; None in the
        sequence: CuPy's runtime calls only).
    on_compute : bool, optional
        Copy on the compute stream instead of the side stream (default:
        :data:`STATUS_COPY_ON_COMPUTE`).
    """

    def __init__(self, block: StatusBlock, *, modules=None, functions=None, on_compute: bool | None = None):
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
        self._early: Snapshot | None = None  # collected before a TAIL graph's copy, returned by push
        self._graph_step: int | None = None  # the step whose TAIL graph issued its copy
        self._recorded_in_graph = False  # the TAIL graphs record their copy's event themselves
        self.on_compute = STATUS_COPY_ON_COMPUTE if on_compute is None else bool(on_compute)
        self._side = self._stream.ptr
        data = self._words.data
        device_ptr = data.ptr if hasattr(data, "ptr") else self._words.ctypes.data  # NumPy: a stand-in
        # This runs every step on the host's hot path: raw runtime calls, bound once, on cached pointers.
        runtime = cupy.cuda.runtime
        self._record, self._wait, self._query = runtime.eventRecord, runtime.streamWaitEvent, runtime.eventQuery
        self._current_stream = cupy.cuda.get_current_stream
        self._copy = (runtime.memcpyAsync, device_ptr, self._words.nbytes, runtime.memcpyDeviceToHost, self._side)
        self._buffers = [(launched.ptr, copied.ptr, host.ctypes.data)
                         for launched, copied, host in zip(self._launched, self._copied, self._host)]  # fmt: skip
        step = None if functions is None or None in functions else _native.compiled_readback()
        #: (compiled readback step, int64 function addresses), or None: CuPy's runtime calls.
        self.native = None if step is None else (step, np.array(functions, dtype=np.int64))

    def _issue(self, step: int) -> None:
        i = step & 1
        launched, copied, host = self._buffers[i]
        record, stream = self._record, self._current_stream().ptr
        if not self.on_compute:  # on the compute stream the copy follows the step's launches by itself
            record(launched, stream)  # after the step's launches on the compute stream
            self._wait(self._side, launched)  # the side stream waits, the compute stream never does
            stream = self._side
        memcpy, device, nbytes, kind, _ = self._copy
        memcpy(host, device, nbytes, kind, stream)
        record(copied, stream)
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

    def push(self, step: int, swept: bool = False) -> Snapshot | None:
        """Copy this step's block asynchronously (unless its TAIL graph did and ``end_step`` did not
        sweep since); return the newest finished snapshot of an earlier or this step."""
        queue, early, self._early = self._queue, self._early, None
        if self._graph_step == step:
            self._graph_step = None
            if not swept:
                return _newest(early, self._collect(step - 1))
            queue.pop()  # the sweep wrote status words after the graph's copy: copy again
        if self.native is not None and (not queue or (len(queue) == 1 and queue[0][0] == step - 1)):
            return _newest(early, self._push_compiled(step))
        snapshot = self._collect(step - 1) if queue else None  # frees this step's buffer (two steps old)
        self._issue(step)
        return _newest(early, snapshot)  # snapshots are cumulative: the newest supersedes older ones

    # The status copy inside the replayed TAIL graph (GRAPH_STATUS_COPY; see capture.CapturedStep).
    def capture_copy(self, stream_ptr: int, i: int) -> None:
        """Issue buffer ``i``'s copy on the capturing stream ``stream_ptr`` (a memcpy node of a TAIL
        graph), then its event as an external event-record node where libcuda offers one (a plain
        record during capture is only a dependency of the graph); else :meth:`graph_copied`
        records the event after each graph launch."""
        memcpy, device, nbytes, kind, _ = self._copy
        memcpy(self._buffers[i][2], device, nbytes, kind, stream_ptr)
        record = external_record()
        self._recorded_in_graph = record is not None and record(self._buffers[i][1], stream_ptr, 1) == 0

    def free_for_graph(self, step: int) -> None:
        """Before the TAIL graph of ``step`` copies into buffer ``step & 1``: collect the copy that
        still holds it (two steps old; waited for only if not done), kept for ``push``."""
        if any(i == step & 1 for _, i in self._queue):
            self._early = _newest(self._early, self._collect(step - 1))

    def graph_copied(self, step: int) -> None:
        """After the TAIL graph of ``step`` was launched: its copy's event, on the compute stream."""
        i = step & 1
        if not self._recorded_in_graph:
            self._record(self._buffers[i][1], self._current_stream().ptr)
        self._queue.append((step, i))
        self._graph_step = step

    def _push_compiled(self, step: int) -> Snapshot | None:
        # What _collect(step - 1) then _issue(step) do when at most the previous step's copy is in
        # flight: its buffer is the other one, so this step's copy is issued whatever the query says.
        queue, i = self._queue, step & 1
        previous = queue[0] if queue else None
        launched, copied, host = self._buffers[i]
        run, functions = self.native
        _, device, nbytes, _, side = self._copy
        query = 0 if previous is None else self._buffers[previous[1]][1]
        compute = self._current_stream().ptr
        side = compute if self.on_compute else side  # the compiled step skips the record and the wait
        status = run(functions, query, launched, copied, compute, side, host, device, nbytes)
        if status >> 32:
            call, err = _native.decode_status(status)
            name = ("cuEventQuery", "cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoHAsync_v2", "cuEventRecord")
            raise RuntimeError(f"status readback: {name[call - 1]} failed: {_driver.driver._name(err)}")
        queue.append((step, i))
        if previous is None or status != 0:  # nothing in flight, or the previous copy is not done yet
            return None
        queue.popleft()
        return _snapshot(previous[0], self._host[previous[1]].copy())

    def flush(self) -> Snapshot | None:
        """Wait for every pending copy (end of a run); the newest snapshot."""
        early, self._early = self._early, None
        return _newest(early, self._collect(float("inf")))

    def ring(self, ring) -> np.ndarray:
        """Host copy of the ring (synchronous; only done when the index says there are rows)."""
        return self._cupy.asnumpy(ring)
