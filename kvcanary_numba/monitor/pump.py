"""Turning status snapshots into reports: violation rows, overflow warnings, health."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .health import CanaryStalledError, HealthChecker
from .report import Violation, decode_rows, ring_summary
from .status import Snapshot

__all__ = ["CanaryViolationError", "ViolationPump", "logger"]

logger = logging.getLogger("kvcanary_numba.monitor")

_PLAN_HISTORY = 4  # the GPU snapshot lags a step; remember a few steps' "a plan ran" flags


class CanaryViolationError(RuntimeError):
    """Raised once, in mode ``raise``, with every violation the first failing readback found."""

    def __init__(self, violations: Sequence[Violation], *, rank: int | None = None):
        self.violations, self.rank = list(violations), rank
        lines = "\n".join(v.summary() for v in self.violations)
        who = "kv-canary" if rank is None else f"kv-canary rank {rank}"
        super().__init__(f"{who}: {len(self.violations)} violation(s) detected\n{lines}")


class ViolationPump:
    """Processes one status snapshot per step (SGLang's violation pump, overflow warner and health check).

    Parameters
    ----------
    mode : {"log", "raise"}
    ring : array, int64 [capacity, 8]
        The device (or host) violation ring, copied to the host only when new rows exist.
    readback : HostReadback or CudaReadback
    health : HealthChecker
    plan_capacities : list of (str, int)
        Group name and verify capacity, in status-lane order.
    rank : int, optional
        The monitor's rank, named in the errors and log lines (None: a job of one).
    """

    def __init__(self, *, mode: str, ring, readback, health: HealthChecker, plan_capacities, rank: int | None = None):
        self.mode, self.ring, self.readback, self.health, self.rank = mode, ring, readback, health, rank
        self._who = "kv-canary" if rank is None else f"kv-canary rank {rank}"
        self._line = "" if rank is None else f"rank {rank}: "  # before each row's and the saturation's line
        self.plan_capacities = list(plan_capacities)
        self.violations: list[Violation] = []
        self.planned = [-1] * _PLAN_HISTORY  # the step that last ran a plan, per step modulo the history
        self._capacity = int(ring.shape[0])
        self._rows_decoded, self._raised, self._overflow_warned, self._saturation_warned = 0, False, False, False
        self._index_seen = 0  # the write index of the last snapshot processed

    def mark_planned(self, step: int) -> None:
        """Record that ``step`` ran a plan (only then is ``enable == 0`` an overflow); a step never
        marked leaves its slot to an older step, so nothing needs unmarking."""
        self.planned[step % _PLAN_HISTORY] = step

    def quiet_index(self, step: int) -> int:
        """The write index with which the snapshot of ``step`` would need no processing (-1: none).

        A snapshot with the write index of the last one processed and every plan's ``enable``
        set has no rows to decode and no overflow to warn about; unless a health check is due,
        processing it changes nothing.
        """
        return -1 if self.health.due(step) else self._index_seen

    def process(self, snapshot: Snapshot) -> None:
        """Warn about plan overflow, decode new rows, run a due health check, then report.

        Raises
        ------
        CanaryViolationError, CanaryStalledError
            Mode ``raise`` only (violations: the first time rows appear).
        """
        if self.planned[snapshot.step % _PLAN_HISTORY] == snapshot.step:
            for lane, (name, capacity) in enumerate(self.plan_capacities):
                if snapshot.plan_enable(lane) == 0:
                    logger.warning(
                        "%s: per-forward verify skipped at step %d for the %s group: the plan "
                        "overflowed verify_capacity=%d; raise verify_capacity",
                        self._who,
                        snapshot.step,
                        name,
                        capacity,
                    )
        index, capacity = snapshot.write_index, self._capacity
        self._index_seen = index
        stored = min(max(index, 0), capacity)
        new: list[Violation] = []
        if stored > self._rows_decoded:
            new = decode_rows(self.readback.ring(self.ring), self._rows_decoded, stored, step=snapshot.step)
            self._rows_decoded = stored
            self.violations.extend(new)
        if index > capacity and not self._overflow_warned:
            self._overflow_warned = True
            logger.warning(
                "%s: violation ring full (capacity %d); later rows are counted, not kept", self._who, capacity
            )
        if snapshot.saturated and not self._saturation_warned:
            self._saturation_warned = True
            logger.warning("%s%s", self._line, ring_summary(index, capacity))
        report = self.health.check(snapshot)
        if new:
            self._report(new)
        if report is not None and not report.ok:
            if self.mode == "raise":
                raise CanaryStalledError(report)
            logger.error(report.message())

    def counts(self, snapshot: Snapshot) -> dict:
        """The ring's counts for ``stats()``: rows recorded (never negative) and whether the count saturated."""
        return {
            "violations_recorded": max(snapshot.write_index, 0),
            "violations_saturated": snapshot.saturated,
        }

    def summary(self, snapshot: Snapshot) -> str:
        """:func:`~.report.ring_summary` of ``snapshot``: rows recorded and kept, saturated or not."""
        return ring_summary(snapshot.write_index, self._capacity)

    def _report(self, new: list[Violation]) -> None:
        if self.mode == "raise" and not self._raised:
            self._raised = True
            raise CanaryViolationError(new, rank=self.rank)
        # One line per row (SGLang's summary, which log parsers read; a rank's lines start with
        # "rank <r>: "); the explanation and the triage are in ``monitor.violations`` and at DEBUG.
        detail = logger.isEnabledFor(logging.DEBUG)
        for v in new:
            logger.warning("%s%s", self._line, v.summary())
            if detail:
                logger.debug("%s%s", self._line, v.describe())
