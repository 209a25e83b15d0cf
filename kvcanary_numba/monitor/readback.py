"""The monitor's status block and its one-step-delayed readback.

Everything the host needs per step (violation write index, the 12 kernel and
12 slot run counters, each group's plan flags) lives in ONE contiguous int64
device array, the status block; the launch contexts and plans hold views into
it. One small copy of the block per step therefore carries every signal, and
on a GPU that copy goes to pinned host memory on a side stream, ordered after
the step's launches by an event. The host reads the *previous* step's copy, so
it never stalls the GPU (SGLang pumps its ``write_index > 0`` flag the same way).
On the CPU the block is host memory and is read immediately.

Layout (int64 words):

====================  =====================================================
word 0                int32 lanes: [violation_write_index, unused]
words 1 .. 12         kernel_run_counter per CanaryLaunchTag
words 13 .. 24        slot_run_counter per CanaryLaunchTag
words 25 + 2g, +1     group g, int32 lanes: [enable, verify_num_valid,
                      write_num_valid_reqs, unused]
====================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import NUM_LAUNCH_TAGS

__all__ = ["StatusBlock", "Snapshot", "HostReadback", "CudaReadback"]

_KRC = 1
_SLOT = _KRC + NUM_LAUNCH_TAGS
_GROUPS = _SLOT + NUM_LAUNCH_TAGS
_WORDS_PER_GROUP = 2


class StatusBlock:
    """The status block of one monitor and the views the launches use."""

    def __init__(self, xp, num_groups: int):
        self.words = xp.zeros(_GROUPS + _WORDS_PER_GROUP * num_groups, dtype=np.int64)
        lanes = self.words.view(np.int32)  # little-endian: lane 2w is the low half of word w
        self.violation_write_index = lanes[0:1]
        self.kernel_run_counters = self.words[_KRC:_SLOT]
        self.slot_run_counters = self.words[_SLOT:_GROUPS]
        self.plan_lanes = [lanes[2 * (_GROUPS + 2 * g) : 2 * (_GROUPS + 2 * g) + 4] for g in range(num_groups)]

    def launch_views(self, group: int) -> dict:
        """The views one group's contexts and plans write into (write index, counters, plan lanes)."""
        return dict(
            violation_write_index=self.violation_write_index,
            kernel_run_counters=self.kernel_run_counters,
            slot_run_counters=self.slot_run_counters,
            plan_lanes=self.plan_lanes[group],
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Host copy of the status block as of the end of ``step``."""

    step: int
    words: np.ndarray

    @property
    def write_index(self) -> int:
        """Violation rows ever recorded (keeps counting past the ring capacity)."""
        return int(self.words[0:1].view(np.int32)[0])

    @property
    def kernel_run_counters(self) -> np.ndarray:
        return self.words[_KRC:_SLOT]

    @property
    def slot_run_counters(self) -> np.ndarray:
        return self.words[_SLOT:_GROUPS]

    def plan_enable(self, group: int) -> int:
        """The plan's ``enable`` flag of group ``group`` (0 = verify skipped: overflow)."""
        return int(self.words[_GROUPS + 2 * group : _GROUPS + 2 * group + 1].view(np.int32)[0])


class HostReadback:
    """CPU path: the block is host memory; every step's snapshot is available at once."""

    def __init__(self, block: StatusBlock):
        self._words = block.words

    def push(self, step: int) -> Snapshot | None:
        """Snapshot the block after ``step``; returns the snapshot to process now."""
        return Snapshot(step, self._words.copy())

    def flush(self) -> Snapshot | None:
        """Nothing is ever pending on the CPU."""
        return None

    def ring(self, ring) -> np.ndarray:
        return ring


class CudaReadback:
    """GPU path: double-buffered pinned copies on a side stream, read one step late."""

    def __init__(self, block: StatusBlock):
        import cupy
        import cupyx

        self._cupy = cupy
        self._words = block.words
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._host = [cupyx.empty_pinned(block.words.shape, np.int64) for _ in range(2)]
        self._launched = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self._copied = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self._pending: list[int | None] = [None, None]  # step whose copy sits in buffer i

    def _issue(self, step: int) -> None:
        cupy, i = self._cupy, step % 2
        self._launched[i].record(cupy.cuda.get_current_stream())
        self._stream.wait_event(self._launched[i])
        cupy.cuda.runtime.memcpyAsync(
            self._host[i].ctypes.data,
            self._words.data.ptr,
            self._words.nbytes,
            cupy.cuda.runtime.memcpyDeviceToHost,
            self._stream.ptr,
        )
        self._copied[i].record(self._stream)
        self._pending[i] = step

    def _take(self, i: int) -> Snapshot | None:
        step = self._pending[i]
        if step is None:
            return None
        self._copied[i].synchronize()  # a step old: normally complete already
        self._pending[i] = None
        return Snapshot(step, self._host[i].copy())

    def push(self, step: int) -> Snapshot | None:
        """Copy this step's block asynchronously; return the previous step's snapshot."""
        older = self._take(step % 2)  # only left over when step numbers were skipped
        self._issue(step)
        previous = self._take((step - 1) % 2)
        return previous or older  # snapshots are cumulative: the newest supersedes

    def flush(self) -> Snapshot | None:
        """Wait for the newest pending copy (end of a run)."""
        found = [s for s in (self._take(0), self._take(1)) if s is not None]
        return max(found, key=lambda s: s.step) if found else None

    def ring(self, ring) -> np.ndarray:
        """Host copy of the ring (synchronous; only done when the index says there are rows)."""
        return self._cupy.asnumpy(ring)
