"""How a monitor's results reach the host: the status readback, the health check, the verdict
word of a job of several ranks and the violation pump (:func:`build_reporting`), and the
counters of ``CanaryMonitor.stats()`` (:func:`monitor_stats`).

With a verdict (``verdict=True``) the pump never raises: mode ``raise`` is acted on by
``apply_verdict`` on every rank at the same call (:mod:`.verdict`).
"""

from __future__ import annotations

import numpy as np

from .._validate import check_int
from .health import HealthChecker
from .pump import ViolationPump
from .readback import CudaReadback, HostReadback
from .status import Snapshot
from .verdict import VerdictState

__all__ = ["build_reporting", "monitor_stats"]


def build_reporting(function: str, monitor, verdict, health: tuple, verify_capacity: int, *, placement) -> tuple:
    """``(readback, phase_launches, health, verdict, pump)`` of ``monitor``.

    Parameters
    ----------
    function : str
        The constructor, for error messages.
    monitor : CanaryMonitor
        Its array module, status block, ring, groups, rank and mode are set.
    verdict : bool
        Whether the monitor writes a verdict word (KVC-C010 unless a bool).
    health : (int, int)
        ``health_interval`` and ``health_warmup_steps`` as given (KVC-C011 when negative).
    verify_capacity : int
        Verify entries per step and group (named in the overflow warnings).
    placement : ArrayInfo
        Where the monitor's buffers live.
    """
    interval = check_int(function, "health_interval", health[0], low=0)
    warmup = check_int(function, "health_warmup_steps", health[1], low=0)
    status, groups = monitor.status, monitor.groups
    readback = HostReadback(status) if monitor.xp is np else CudaReadback(status)
    phases = tuple(sum(g.launch_counts(stage) for g in groups) for stage in ("head", "tail"))
    checker = HealthChecker(interval=interval, warmup_steps=warmup, phases=phases)
    state = VerdictState.build(function, verdict, monitor, placement=placement)  # None unless verdict=True
    pump = ViolationPump(
        mode="log" if state is not None else monitor.mode,  # with a verdict, ranks raise together (apply_verdict)
        ring=monitor.ring,
        readback=readback,
        health=checker,
        plan_capacities=[(g.kind.upper(), verify_capacity) for g in groups],
        rank=monitor.rank,
    )
    return readback, phases, checker, state, pump


def monitor_stats(monitor) -> dict:
    """``CanaryMonitor.stats()``: the counters as of now (reads the device)."""
    words = monitor.status.words
    snap = Snapshot(monitor.step, words.get() if monitor.xp is not np else words.copy())
    return {
        "step": monitor.step,
        "protected_tokens": int(snap.slot_run_counters.sum()),
        "kernel_runs": int(snap.kernel_run_counters.sum()),
        "sweep_passes": monitor.sweeps,
        **monitor.aftercare.stats(),
        **monitor.pump.counts(snap),  # bundles written / lost; rows recorded, saturated
        "violations_decoded": len(monitor.violations),
        **({} if monitor.budget is None else monitor.budget.stats()),
    }
