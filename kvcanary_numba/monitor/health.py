"""Health check: did every launch the host issued actually run on the device?

Each verify and write launch adds 1 to its tag's ``kernel_run_counter`` on the
device, even when it has nothing to do. The host counts the launches it issued
per tag; a periodic check compares both over the interval. A tag whose device
count grew less than the host's means launches were lost: a captured graph
that no longer contains them, a stream that never ran, a skipped code path.
SGLang's checker flags tags whose counter did not move at all; counting
host launches also catches partial loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import NUM_LAUNCH_TAGS, CanaryLaunchTag
from .status import Snapshot

__all__ = ["CanaryStalledError", "HealthChecker", "HealthReport"]

_HISTORY = 4  # host counts kept per step; the GPU snapshot lags one step


class CanaryStalledError(RuntimeError):
    """Raised (mode ``raise``) when launches the host issued did not run on the device."""

    def __init__(self, report: HealthReport):
        super().__init__(report.message())
        self.report = report


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Result of one health check over steps ``(since_step, step]``.

    Attributes
    ----------
    step, since_step : int
        Interval covered.
    launched : dict of str to int
        Launches the host issued per tag name (tags with none are left out).
    ran : dict of str to int
        Device ``kernel_run_counter`` growth of the same tags.
    protected_tokens : int
        Sum of all ``slot_run_counter`` values: entries ever verified or written.
    """

    step: int
    since_step: int
    launched: dict[str, int]
    ran: dict[str, int]
    protected_tokens: int

    @property
    def stalled(self) -> tuple[str, ...]:
        """Tags that ran fewer times than they were launched."""
        return tuple(tag for tag, n in self.launched.items() if self.ran[tag] < n)

    @property
    def ok(self) -> bool:
        return not self.stalled

    def message(self) -> str:
        detail = ", ".join(f"{t} ran {self.ran[t]} of {self.launched[t]}" for t in self.stalled)
        return (
            f"kv-canary: kernel_run_counter did not keep up with the launches for tags=[{detail}] "
            f"between step {self.since_step} and step {self.step}; the canary path is not executing"
        )


class HealthChecker:
    """Host launch counts and the periodic comparison with the device counters.

    Parameters
    ----------
    interval : int
        Steps between checks; 0 disables checking.
    warmup_steps : int
        No check covers a step before this one ends (graph capture, warm-up).
    phases : (array, array), optional
        Launches per tag of one HEAD and of one TAIL phase (int64 ``[NUM_LAUNCH_TAGS]``):
        the monitor counts its phases (``pre`` and ``post``, Python ints: two NumPy
        additions per step were a measurable part of a step's host time) and
        :attr:`host` multiplies them out.

    Attributes
    ----------
    pre, post : int
        HEAD and TAIL phases issued so far.
    """

    def __init__(self, *, interval: int, warmup_steps: int, phases=None):
        self.interval, self.warmup_steps = interval, warmup_steps
        zeros = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
        self._phases = (zeros, zeros) if phases is None else tuple(np.asarray(p, dtype=np.int64) for p in phases)
        self.pre = self.post = 0
        self._other = zeros  # launches outside the phases (sweeps): replaced by add(), never changed in place
        self._history = [(0, 0, zeros)] * _HISTORY  # (pre, post, other) as of the end of recent steps
        self._base_step = -1
        self._base_host = zeros
        self._base_device = zeros
        self.last: HealthReport | None = None

    def _total(self, pre: int, post: int, other: np.ndarray) -> np.ndarray:
        head, tail = self._phases
        return other + pre * head + post * tail

    @property
    def host(self) -> np.ndarray:
        """Cumulative launches issued per tag (a new array)."""
        return self._total(self.pre, self.post, self._other)

    def add(self, launches) -> None:
        """Count launches issued outside the phases (per tag: int64 ``[NUM_LAUNCH_TAGS]``)."""
        self._other = self._other + launches

    def end_step(self, step: int) -> None:
        """Remember the host counts as of the end of ``step`` (for the snapshot of that step)."""
        self._history[step % _HISTORY] = (self.pre, self.post, self._other)

    def due(self, step: int) -> bool:
        """Whether the snapshot of ``step`` gets a check."""
        return 0 < self.interval <= step - self._base_step and step + 1 >= self.warmup_steps

    def check(self, snapshot: Snapshot) -> HealthReport | None:
        """Compare if a check is due at ``snapshot.step``; returns the report (None if not due)."""
        step = snapshot.step
        if not self.due(step):
            return None
        host = self._total(*self._history[step % _HISTORY])
        device = snapshot.kernel_run_counters.copy()
        launched, ran = host - self._base_host, device - self._base_device
        names = [tag.name for tag in CanaryLaunchTag]
        report = HealthReport(
            step=step,
            since_step=self._base_step,
            launched={names[i]: int(launched[i]) for i in range(NUM_LAUNCH_TAGS) if launched[i] > 0},
            ran={names[i]: int(ran[i]) for i in range(NUM_LAUNCH_TAGS) if launched[i] > 0},
            protected_tokens=int(snapshot.slot_run_counters.sum()),
        )
        self._base_step, self._base_host, self._base_device = step, host, device
        self.last = report
        return report
