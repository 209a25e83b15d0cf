"""The monitor's per-step :class:`~kvcanary_numba.StepBatch`, built from the scheduler's host batch.

On the CPU the host arrays are the batch. On a GPU every field is a view into one
device buffer, filled by one asynchronous copy from pinned host memory on the
canary's stream (ten separate uploads would cost ten host round trips). Views are
kept per shape, so a step with the same batch and token counts as an earlier one
gets the very same field objects: the monitor then re-checks nothing
(``docs/concepts/step-order.md``, "What the hooks do on the host"), and a captured
graph can replay.
"""

from __future__ import annotations

import numpy as np

from kvcanary_numba import StepBatch

from .scheduler import HostBatch

__all__ = ["BatchArrays"]

#: StepBatch field <- HostBatch field, in the order they sit in the device buffer.
_FIELDS = (
    ("req_pool_indices", "req_pool_indices"),
    ("prefix_lens", "prefix_lens"),
    ("extend_seq_lens", "extend_seq_lens"),
    ("input_ids", "input_ids"),
    ("positions", "positions"),
    ("out_cache_loc", "out_cache_loc"),
    ("expected_input_tokens", "expected_tokens"),
    ("expected_input_positions", "expected_positions"),
    ("token_ids_flat", "token_ids_flat"),
    ("token_offsets", "token_offsets"),
)
_VIEWS_KEPT = 256  # shapes whose views are kept before starting over


class BatchArrays:
    """Turns a :class:`~.scheduler.HostBatch` into the monitor's StepBatch.

    Parameters
    ----------
    xp : module
        NumPy (CPU monitor) or CuPy (GPU monitor).
    capacity : int
        int64 words the staged buffer holds (every field of the largest step).
    stream : cupy.cuda.Stream, optional
        Where the GPU copy runs (the canary's stream).
    staged : bool, optional
        Views into one buffer (default: on a GPU only). On the CPU this runs the GPU
        layout with NumPy, which is how the tests cover it.
    """

    def __init__(self, *, xp, capacity: int, stream=None, staged: bool | None = None):
        self.xp, self.stream = xp, stream
        self.staged = (xp is not np) if staged is None else staged
        self._views: dict[tuple, StepBatch] = {}
        if not self.staged:
            return
        self.device = xp.zeros(capacity, dtype=np.int64)
        if xp is np:
            self._host = [np.zeros(capacity, dtype=np.int64)]
        else:  # two pinned buffers: the host fills one while the copy of the other may still run
            self._host = [
                np.frombuffer(xp.cuda.alloc_pinned_memory(capacity * 8), np.int64, capacity) for _ in range(2)
            ]
        self._copied = [None] * len(self._host)  # event of the copy that last read each host buffer
        self._turn = 0

    def batch(self, hb: HostBatch, req_to_token) -> StepBatch:
        """The StepBatch of ``hb`` (``req_to_token``: the canary's view of the device page table)."""
        if not self.staged:
            return StepBatch(req_to_token=req_to_token, **{f: getattr(hb, h) for f, h in _FIELDS})
        arrays = [getattr(hb, h) for _, h in _FIELDS]
        key = tuple(len(a) for a in arrays)
        host, words = self._host[self._turn], sum(key)
        if words > len(host):
            raise ValueError(f"BatchArrays: the step needs {words} int64 words, capacity is {len(host)}")
        if self._copied[self._turn] is not None:
            self._copied[self._turn].synchronize()  # normally long done: the copy is tiny
        np.concatenate(arrays, out=host[:words])
        if self.xp is np:
            self.device[:words] = host[:words]
        else:
            self.device[:words].set(host[:words], stream=self.stream)
            self._copied[self._turn] = self.stream.record()
            self._turn ^= 1
        out = self._views.get(key)
        if out is None:
            if len(self._views) >= _VIEWS_KEPT:
                self._views.clear()
            ends = np.cumsum(key)
            fields = {f: self.device[end - n : end] for (f, _), n, end in zip(_FIELDS, key, ends)}
            out = self._views[key] = StepBatch(req_to_token=req_to_token, **fields)
        elif out.req_to_token is not req_to_token:
            out.req_to_token = req_to_token  # the table's view is a new object only when its buffer moved
        return out
