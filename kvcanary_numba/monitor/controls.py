"""The CanaryMonitor's methods besides the step hooks: sweep, graph capture, warm-up, flush, counters.

:class:`MonitorControls` is a base of :class:`~kvcanary_numba.monitor.CanaryMonitor`
(the constructor and the step hooks are in :mod:`.monitor`); the step phases
below are shared by both.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import error
from .batch import StepBatch
from .capture import capture_step
from .groups import check_type
from .launches import StepLaunches
from .status import Snapshot
from .report import Violation
from .sweep import SlotChain, build_sweep_entries, launch_sweep

__all__ = ["MonitorControls"]

_IDLE, _PRE, _POST = "idle", "between pre_forward and post_forward", "after post_forward"
_ORDER = "pre_forward -> (engine writes KV) -> post_forward -> end_step"


class MonitorControls(StepLaunches):
    """Sweep, graph capture, warm-up switch, flush and counters of a :class:`~kvcanary_numba.monitor.CanaryMonitor`.

    Expects the monitor's attributes (its constructor sets them all).
    """

    def capture_graph(self, batch: StepBatch) -> None:
        """Capture both launch phases of ``batch`` into CUDA graphs, replayed whenever
        :meth:`pre_forward` / :meth:`post_forward` get this same batch object.

        The engine must refill the batch arrays in place (same objects and shapes)
        between steps. Health counting is unchanged: each replay counts its launches.

        Raises
        ------
        KvCanaryError
            KVC-C008 on the CPU path, KVC-M005 between pre_forward and end_step,
            and pre_forward's codes for the batch.
        """
        self.graph = None
        self.graph = capture_step(self, batch, busy=None if self._phase is _IDLE else self._phase, order=_ORDER)

    def finish_warmup(self) -> None:
        """Turn the write chain-position assert on (SGLang: ``mark_init_finished``)."""
        self.enable_chain_position_assert.fill(1)

    def sweep(self, chains: Sequence[SlotChain]) -> None:
        """Verify whole chains (FULL slot indices) against the tail buffers, SWEEP tags.

        Parameters
        ----------
        chains : list or tuple of SlotChain
            Checked before the first launch (a generator is refused: KVC-M009).

        Raises
        ------
        KvCanaryError
            KVC-M005 (between pre_forward and post_forward), KVC-M009, KVC-M004.
        """
        fn = "CanaryMonitor.sweep"
        if self._phase is _PRE:
            raise error("KVC-M005", function=fn, state=self._phase, expected=_ORDER)
        if not isinstance(chains, (list, tuple)):  # a generator would be used up by the checks below
            raise error("KVC-M009", function=fn, argument="chains", expected="list or tuple of SlotChain",
                        got=type(chains).__name__)  # fmt: skip
        for i, chain in enumerate(chains):
            check_type(fn, f"chains[{i}]", chain, SlotChain)
        entries = build_sweep_entries(fn, chains, self.sweep_capacity)
        for g in self.groups:
            self.health.add(launch_sweep(self.xp, g, entries))
        self.sweeps += 1

    def flush(self) -> None:
        """Process every pending readback now (end of a run; waits for the device)."""
        self.aftercare.process(self, self.readback.flush(), self.step)

    @property
    def violations(self) -> list[Violation]:
        """Every violation decoded so far, in ring order (rows lost to a full ring are not included)."""
        return self.pump.violations

    def stats(self) -> dict:
        """Counters as of now (reads the device: not for the hot path)."""
        snap = Snapshot(self.step, self.status.words.get() if self.xp is not np else self.status.words.copy())
        return {
            "step": self.step,
            "protected_tokens": int(snap.slot_run_counters.sum()),
            "kernel_runs": int(snap.kernel_run_counters.sum()),
            "sweep_passes": self.sweeps,
            "violations_recorded": snap.write_index,
            "violations_decoded": len(self.violations),
            **({} if self.budget is None else self.budget.stats()),
        }
