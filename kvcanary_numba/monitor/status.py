"""The monitor's status block: one int64 device array holding every per-step signal.

Everything the host needs per step (violation write index, the 12 kernel and
12 slot run counters, each group's plan flags) lives in ONE contiguous int64
device array; the launch contexts and plans hold views into it, so one small
copy per step (:mod:`.readback`) carries every signal.

Layout (int64 words):

====================  =====================================================
word 0                int32 lanes: [violation_write_index (saturates at
                      ``VIOLATION_INDEX_SATURATED``, never wraps), unused]
words 1 .. 12         kernel_run_counter per CanaryLaunchTag
words 13 .. 24        slot_run_counter per CanaryLaunchTag
words 25 + 2g, +1     group g, int32 lanes: [enable, verify_num_valid,
                      write_num_valid_reqs, unused]
====================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import NUM_LAUNCH_TAGS, VIOLATION_INDEX_SATURATED

__all__ = ["FIRST_PLAN_WORD", "StatusBlock", "Snapshot"]

_KRC = 1
_SLOT = _KRC + NUM_LAUNCH_TAGS
_GROUPS = _SLOT + NUM_LAUNCH_TAGS
_WORDS_PER_GROUP = 2  # launch/_native.py's quiet check steps through the plan words by 2 as well
#: The first group's plan word; every ``_WORDS_PER_GROUP``-th word after it is the next group's.
FIRST_PLAN_WORD = _GROUPS


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
        """Violation rows ever recorded (keeps counting past the ring capacity, up to
        ``VIOLATION_INDEX_SATURATED``, where it stays)."""
        return _low_lane(self.words[0])

    @property
    def saturated(self) -> bool:
        """True when the write index reached its saturation value: more rows were seen than it counts."""
        return self.write_index >= VIOLATION_INDEX_SATURATED

    @property
    def kernel_run_counters(self) -> np.ndarray:
        return self.words[_KRC:_SLOT]

    @property
    def slot_run_counters(self) -> np.ndarray:
        return self.words[_SLOT:_GROUPS]

    def plan_enable(self, group: int) -> int:
        """The plan's ``enable`` flag of group ``group`` (0 = verify skipped: overflow)."""
        return _low_lane(self.words[_GROUPS + 2 * group])


_new, _set_step, _set_words = object.__new__, Snapshot.step.__set__, Snapshot.words.__set__


def _snapshot(step: int, words: np.ndarray) -> Snapshot:
    """``Snapshot(step, words)`` through the slots' descriptors: the frozen dataclass's __init__
    costs twice as much, and every step builds one."""
    snapshot = _new(Snapshot)
    _set_step(snapshot, step)
    _set_words(snapshot, words)
    return snapshot


def _low_lane(word) -> int:
    """The int32 lane in the low half of an int64 status word (lane 2w of word w: little-endian)."""
    value = int(word) & 0xFFFFFFFF  # a Python int: no int32 view per read
    return value - (1 << 32) if value & 0x80000000 else value
