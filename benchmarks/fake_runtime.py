"""Stand-ins for the CUDA runtime of the monitor's status readback, for host-only tests and timing.

:class:`FakeRuntime` and :class:`NullRuntime` stand for CuPy's runtime calls
(:class:`~kvcanary_numba.monitor.readback.CudaReadback` built with ``modules=``
stand-ins); :class:`CompiledFunctions` puts C-callable functions with libcuda's
signatures (ctypes callbacks) in front of one of them, for the readback's
compiled calls (``functions=``).
"""

from __future__ import annotations

import ctypes
import types

import numpy as np

# Monitor internals (the status readback): re-check after the monitor composition merge.
from kvcanary_numba.monitor import readback as readback_module

__all__ = ["CompiledFunctions", "FakeRuntime", "NullRuntime", "fake_cuda_readback"]


class FakeRuntime:
    """The CuPy runtime calls :class:`CudaReadback` makes; ``memcpyAsync`` copies host memory at once.

    ``pending`` (if not None) keeps the copies queued instead, run by :meth:`finish`;
    ``calls`` counts the calls by name; ``synchronized`` lists the events waited for. As in CUDA,
    an event re-recorded before its earlier record ran is done only once its latest record has run.
    """

    memcpyDeviceToHost = 2

    def __init__(self, *, deferred: bool = False):
        self.calls: dict[str, int] = {}
        self.pending: list | None = [] if deferred else None
        self.done: set[int] = set()
        self.synchronized: list[int] = []
        self._next = 1000
        self._records: dict[int, int] = {}  # event -> number of its latest record

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def handle(self) -> int:
        self._next += 1
        return self._next

    def eventRecord(self, event, stream):
        self._count("eventRecord")
        self.done.discard(event)
        record = self._records[event] = self._records.get(event, 0) + 1
        if self.pending is None:
            self.done.add(event)
        else:
            self.pending.append(("event", (event, record)))

    def streamWaitEvent(self, stream, event, flags=0):
        self._count("streamWaitEvent")

    def memcpyAsync(self, dst, src, size, kind, stream):
        import ctypes

        self._count("memcpyAsync")
        if self.pending is None:
            ctypes.memmove(dst, src, size)
        else:
            self.pending.append(("copy", (dst, bytes((ctypes.c_char * size).from_address(src)), size)))

    def finish(self, count: int | None = None) -> None:
        """Run the first ``count`` queued operations (all by default), as the device would."""
        import ctypes

        todo = self.pending[: len(self.pending) if count is None else count]
        del self.pending[: len(todo)]
        for kind, what in todo:
            if kind == "event":
                event, record = what
                if record == self._records[event]:  # an earlier record of a re-recorded event: not done
                    self.done.add(event)
            else:
                dst, data, size = what
                ctypes.memmove(dst, data, size)

    def eventQuery(self, event) -> int:
        self._count("eventQuery")
        return 0 if event in self.done else 600  # cudaErrorNotReady

    def eventSynchronize(self, event):
        self._count("eventSynchronize")
        self.synchronized.append(event)
        if self.pending is not None:
            while event not in self.done and self.pending:
                self.finish(1)


class NullRuntime:
    """The same calls doing nothing (every event done): the readback's own Python, for timing.
    The host buffers start as copies of the block (see :func:`fake_cuda_readback`) and are never written."""

    memcpyDeviceToHost = 2
    _next = 1000

    def handle(self) -> int:
        self._next += 1
        return self._next

    def eventRecord(self, event, stream):
        pass

    def streamWaitEvent(self, stream, event, flags=0):
        pass

    def memcpyAsync(self, dst, src, size, kind, stream):
        pass

    def eventQuery(self, event) -> int:
        return 0

    def eventSynchronize(self, event):
        pass


def fake_cuda_readback(block, runtime, functions=None):
    """A :class:`CudaReadback` of a NumPy status block on ``runtime`` (the device pointer is host memory);
    ``functions``: addresses for its compiled calls (:class:`CompiledFunctions`), None for none."""
    compute = types.SimpleNamespace(ptr=7)

    class Event:
        def __init__(self, **_):
            self.ptr = runtime.handle()

        @property
        def done(self):
            return runtime.eventQuery(self.ptr) == 0

        def synchronize(self):
            runtime.eventSynchronize(self.ptr)

    cuda = types.SimpleNamespace(
        runtime=runtime,
        Event=Event,
        get_current_stream=lambda: compute,
        Stream=lambda **_: types.SimpleNamespace(ptr=runtime.handle()),
    )
    cupy = types.SimpleNamespace(cuda=cuda, asnumpy=np.array)  # asnumpy: the ring's copy (host memory here)
    pinned = types.SimpleNamespace(empty_pinned=lambda shape, dtype: np.array(block.words, dtype=dtype))
    extra = {} if functions is None else {"functions": functions}  # older trees take no functions
    return readback_module.CudaReadback(block, modules=(cupy, pinned), **extra)


class CompiledFunctions:
    """ctypes callbacks with the C signatures of ``fast.native.READBACK_FUNCTIONS`` (``cuEventQuery``,
    ``cuEventRecord``, ``cuStreamWaitEvent``, ``cuMemcpyDtoHAsync_v2``) that call ``runtime``'s
    methods; :attr:`addresses` is what ``CudaReadback(functions=...)`` takes. ``fail`` maps a
    function name to the CUresult it returns instead (the runtime is then not called)."""

    def __init__(self, runtime):
        self.runtime, self.fail = runtime, {}
        u64, u32, res = ctypes.c_uint64, ctypes.c_uint, ctypes.c_int
        rt = runtime

        def c(name, argtypes, body):
            def call(*args):
                return self.fail[name] if name in self.fail else (body(*args) or 0)

            return ctypes.CFUNCTYPE(res, *argtypes)(call)

        self._functions = [  # kept alive as long as this object
            c("cuEventQuery", (u64,), lambda event: rt.eventQuery(event)),
            c("cuEventRecord", (u64, u64), lambda event, stream: rt.eventRecord(event, stream)),
            c(
                "cuStreamWaitEvent",
                (u64, u64, u32),
                lambda stream, event, flags: rt.streamWaitEvent(stream, event, flags),
            ),
            c(
                "cuMemcpyDtoHAsync_v2",
                (u64, u64, u64, u64),
                lambda dst, src, size, stream: rt.memcpyAsync(dst, src, size, rt.memcpyDeviceToHost, stream),
            ),
        ]
        self.addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in self._functions]
