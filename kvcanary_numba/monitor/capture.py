"""CUDA-graph capture of a monitor step: both phases of one fixed batch, replayed per step.

Built on :class:`~.fastpath.FastPath`: the phases are recorded and bound as for a
prepared step, then what they launch is captured (CuPy stream capture) into one
graph for HEAD and one for TAIL. :func:`~.fastpath.run_pre` replays them while
the batch matches (:meth:`CapturedStep.matches`).
"""

from __future__ import annotations

from typing import Callable

from ..errors import error
from .batch import StepBatch
from .fastpath import _ROLE_FIELDS, _same_arrays, _same_layout
from .groups import check_type

__all__ = ["CapturedStep", "capture_graph", "capture_step"]


class CapturedStep:
    """One monitor step of one fixed batch, captured as two CUDA graphs (HEAD and TAIL).

    Replays run on CuPy's current stream. Constraints: the engine updates the
    batch arrays *in place* (same objects, same shapes: pad batches to a fixed
    size with padding rows, ``req_pool_indices == 0``); the canary's own state
    (plans, buffers, ring, counters, scratch) is fixed at construction; the
    graphs contain no host reads, so readback stays in ``end_step``. A batch
    field reassigned to another array after capture would be a stale pointer in
    the graph unless it has the captured layout: :meth:`matches` tells, and
    :func:`run_pre` then takes the prepared path (which rebinds by role).
    """

    def __init__(self, monitor, batch):
        import cupy

        fast = monitor.fast
        stream = cupy.cuda.Stream(non_blocking=True)  # legacy-default streams cannot capture
        with stream:
            pool, lens = monitor._prepare_inputs(batch, eager=False)
            # Recording allocates this stream's plan scratch, outside the capture.
            fast.phases(batch, pool, lens, fast.roles(batch, lens))
            stream.synchronize()
            head = capture_graph(stream, lambda: fast.pre(batch))
            tail = capture_graph(stream, fast.post)
        self._hold(batch, head, tail)

    @classmethod
    def of_graphs(cls, batch, head, tail) -> "CapturedStep":
        """A step over given graphs (anything with ``launch()``): host-only tests and benchmarks."""
        step = cls.__new__(cls)
        step._hold(batch, head, tail)
        return step

    def _hold(self, batch, head, tail) -> None:
        self.batch, self._captured, self.head, self.tail = batch, _ROLE_FIELDS(batch), head, tail
        self.replays = 0
        self._matched = None  # the monitor's checked-fields tuple this graph last matched

    def matches(self, batch, checked: tuple | None = None) -> bool:
        """Whether ``batch`` is the captured batch and each role's array is the captured object
        or has its layout (pointer, shape, strides, dtype: what the graph launches on).

        ``checked`` is the monitor's ``(batch, field objects)`` of its last array check, passed
        only when ``batch``'s fields are those objects now: a tuple that matched once matches
        again without the per-field tests (the monitor replaces the tuple when a field changes).
        """
        if batch is not self.batch:
            return False
        if checked is not None and checked is self._matched:
            return True
        same = _same_arrays(batch, self._captured) or all(map(_same_layout, _ROLE_FIELDS(batch), self._captured))
        if same and checked is not None:
            self._matched = checked
        return same

    def pre(self) -> None:
        self.head.launch()
        self.replays += 1

    def post(self) -> None:
        self.tail.launch()


def capture_graph(stream, body: Callable[[], None]):
    """The CUDA graph of what ``body()`` issues on the CuPy ``stream`` (current during the call)."""
    stream.begin_capture()  # CuPy's default mode: relaxed
    try:
        body()
    finally:
        graph = stream.end_capture()
    return graph


def capture_step(monitor, batch, *, busy: str | None, order: str) -> CapturedStep:
    """Checks of :meth:`CanaryMonitor.capture_graph`, then the capture."""
    fn = "CanaryMonitor.capture_graph"
    if monitor.fast is None or not _gpu(monitor):
        raise error("KVC-C008", function=fn, argument="device", got=monitor.device,
                    reason="CUDA-graph capture needs device='cuda' (CuPy arrays on a GPU)")  # fmt: skip
    if busy is not None:
        raise error("KVC-M005", function=fn, state=busy, expected=order)
    check_type(fn, "batch", batch, StepBatch)
    batch.check_fits(fn, monitor.write_req_capacity, monitor.write_token_capacity, monitor.check_tokens)
    return CapturedStep(monitor, batch)


def _gpu(monitor) -> bool:
    return monitor.xp.__name__ == "cupy"
