"""CUDA-graph capture of a monitor step: both phases of one fixed batch, replayed per step.

Built on :class:`~.steps.PreparedSteps`: the phases are recorded and bound as for a
prepared step, then what they launch is captured (CuPy stream capture) into one
graph for HEAD and one for TAIL (:func:`capture_step`). The monitor replays them
while the batch matches (:meth:`CapturedStep.matches`), else it takes the prepared
steps. Nothing here checks the batch: the monitor hands over one it checked.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from .bound import holds_test, safe_layout

__all__ = ["CapturedStep", "capture_graph", "capture_step"]


def _same_layout(new: Any, layout: Any) -> bool:
    return layout is None if new is None else safe_layout(new) == layout


class CapturedStep:
    """One monitor step of one fixed batch, captured as two CUDA graphs (HEAD and TAIL).

    Replays run on CuPy's current stream. Constraints: the engine updates the
    batch arrays *in place* (same objects, same shapes: pad batches to a fixed
    size with padding rows, ``req_pool_indices == 0``); the canary's own state
    (plans, buffers, ring, counters, scratch) is fixed at construction; the
    graphs contain no host reads, so readback stays in ``end_step``. A batch
    field reassigned to another array after capture would be a stale pointer in
    the graph unless it has the captured layout: :meth:`matches` tells, and the
    monitor then takes the prepared steps (which rebind by role).

    Parameters
    ----------
    batch : StepBatch
        The captured batch (checked by the monitor).
    head, tail : object
        The graphs (anything with ``launch()``; :func:`capture_step` makes CuPy graphs).
    roles : tuple of str
        The batch fields the graphs launch on (the step plan's ``batch_roles``).

    Attributes
    ----------
    roles : tuple of str
        As given.
    replays : int
        HEAD phases replayed so far.
    """

    def __init__(self, batch, head, tail, *, roles: tuple[str, ...]):
        self.roles = tuple(roles)
        self._fields = attrgetter(*roles)  # every role's array: what the graphs hold pointers to
        self.batch, self._captured, self.head, self.tail = batch, self._fields(batch), head, tail
        # The captured arrays as they are now: the same objects changed in place are not what the graphs launch on.
        self._holds = holds_test(self.roles, self._captured)
        self._layouts = [None if a is None else safe_layout(a) for a in self._captured]
        self.replays = 0
        self._matched = None  # the monitor's checked-fields tuple this graph last matched

    def captured(self, role: str) -> Any:
        """The array of ``role`` the graphs launch on."""
        return self._captured[self.roles.index(role)]

    def matches(self, batch, checked: tuple | None = None) -> bool:
        """Whether ``batch`` is the captured batch and each role's array has the layout the captured
        array had at capture (pointer, shape, strides, dtype: what the graph launches on), whether it
        is that object or another.

        ``checked`` is the monitor's ``(batch, field objects)`` of its last array check, passed
        only when ``batch``'s fields are those objects now: a tuple that matched once matches
        again without the per-field tests (the monitor replaces the tuple when a field changes).
        """
        if batch is not self.batch:
            return False
        if checked is not None and checked is self._matched:
            return True
        same = self._holds(batch) or all(map(_same_layout, self._fields(batch), self._layouts))
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


def capture_step(steps, batch) -> CapturedStep:
    """Capture both phases of ``batch`` (checked by the caller) from ``steps``
    (:class:`~.steps.PreparedSteps` on a GPU) into a :class:`CapturedStep`."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)  # legacy-default streams cannot capture
    with stream:
        steps.record(batch)  # recording allocates this stream's plan scratch, outside the capture
        stream.synchronize()
        head = capture_graph(stream, lambda: steps.pre(batch))
        tail = capture_graph(stream, steps.post)
    return CapturedStep(batch, head, tail, roles=steps.batch_roles)
