"""The demo behind ``kvcanary demo``: one clean run, then one run per fault class.

The clean run offloads idle cached prefixes to host memory and reloads them (the host tier,
records moved with their KV); each transit fault class runs with the host tier too.

Each run is a fresh :class:`ToyEngine` with a :class:`CanaryMonitor` attached
(mode ``log``, sweeps every few steps); a fault counts as caught when the
monitor reports a violation at the slot the fault hit, with one of the bits
that class is expected to raise.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import error
from .config import EngineConfig
from .engine import ToyEngine
from .faults import ALL_FAULT_CLASSES, FaultRecord

__all__ = ["DemoRun", "TERMS", "format_report", "glossary", "report_dict", "run_demo"]

#: Sweep cadence of the demo runs (cached_kv_flip is only visible to a sweep).
SWEEP_INTERVAL = 4

#: One line per term of the report, printed under "terms:" when the report uses the term.
#: Keys are regular expressions matched as whole words.
TERMS: dict[str, str] = {
    r"HEAD_[KV]_(?:FULL|SWA)": "launch before the forward pass: verifies the prefix, stamps the new slots "
    "(K or V buffer, FULL or SWA pool)",
    r"TAIL_[KV]_(?:FULL|SWA)": "launch after the forward pass wrote the KV: verifies again, now against the "
    "real KV bytes, then stamps the new slots with their KV fingerprints",
    r"SWEEP_[KV]_(?:FULL|SWA)": f"periodic check of idle cached slots (every {SWEEP_INTERVAL} steps here)",
    r"violation row\(s\)": "rows the monitor read back from the violation ring (one per failed check and slot)",
    r"launch_tag": "which launch wrote the row (one of the HEAD / TAIL / SWEEP names above)",
    r"fail_reason": "the checks that failed, joined by +; each is explained on a 'why:' line",
    r"slot_idx": "KV-cache slot the row is about",
    r"stored_token": "token id recorded in the slot's canary record (expected_token: what it should be)",
    r"stored_chain_hash": "chain hash recorded in the slot (hash of its predecessor's record)",
    r"expected_aux": "what the check expected instead: the chain hash for verify rows, the position for "
    "write rows (hex)",
}


@dataclass
class DemoRun:
    """Outcome of one engine run: the fault planted (None for the clean run) and what the monitor saw."""

    fault: str | None
    steps: int
    records: list[FaultRecord] = field(default_factory=list)
    violations: list = field(default_factory=list)
    catches: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        if self.fault is None:
            return not self.violations
        return bool(self.records) and bool(self.catches)

    @property
    def status(self) -> str:
        if self.fault is None:
            return "CLEAN" if self.ok else "FALSE POSITIVES"
        if not self.records:
            return "NOT INJECTED"
        return "CAUGHT" if self.catches else "MISSED"


@contextlib.contextmanager
def _quiet_monitor():
    """The demo prints its own report; silence the per-row warnings meanwhile."""
    log = logging.getLogger("kvcanary_numba.monitor")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def run_demo(
    *,
    steps: int,
    faults: Sequence[str],
    device: str,
    config: EngineConfig,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[DemoRun]:
    """Run the clean run and one run per fault; returns the outcomes in that order.

    Raises
    ------
    KvCanaryError
        KVC-E001 for an unknown fault name; ToyEngine's and EngineConfig's codes.
    """
    for name in faults:  # before any run: a typo should not cost a clean run first
        if name not in ALL_FAULT_CLASSES:
            raise error("KVC-E001", function="run_demo", argument="faults", expected=tuple(ALL_FAULT_CLASSES), got=name)
    fault_step = max(1, min(8, steps // 3))
    runs = []
    for fault in [None, *faults]:
        # The clean run offloads idle prefixes to host memory and reloads them (FULL-only pools): moves stay silent.
        host_tier = 0 if fault is None and not config.swa_window else None
        engine = ToyEngine(config, device=device, faults={fault: fault_step} if fault else {}, host_tier=host_tier)
        monitor = engine.attach_monitor(mode="log", sweep_interval=SWEEP_INTERVAL)
        label = fault or "clean"
        with _quiet_monitor():
            engine.run(steps, progress=(lambda i, n, label=label: progress(label, i, n)) if progress else None)
            # A fault whose preconditions held only late gets the steps it needs to be seen (a sweep).
            last = max((r.step for r in engine.faults), default=-1)
            engine.run(max(0, last + SWEEP_INTERVAL + 1 - engine.step_index))
        catches = [v for hits in engine.catches().values() for v in hits]
        runs.append(DemoRun(fault, engine.step_index, engine.faults, list(monitor.violations), catches))
    return runs


def report_dict(runs: list[DemoRun], *, device: str, config: EngineConfig) -> dict:
    """JSON-ready summary of the runs."""
    out = {"device": device, "config": {k: getattr(config, k) for k in config.__dataclass_fields__}, "runs": []}
    for run in runs:
        entry = {
            "fault": run.fault,
            "status": run.status,
            "ok": run.ok,
            "steps": run.steps,
            "violations": len(run.violations),
            "injected": [
                {"step": r.step, "slots": list(r.slots), "swa_slots": list(r.swa_slots), "detail": r.detail}
                for r in run.records
            ],
            "catching_rows": len(run.catches),
            "first_catch": run.catches[0].to_dict() if run.catches else None,
        }
        if run.fault is not None:
            entry["description"] = ALL_FAULT_CLASSES[run.fault][0]
        out["runs"].append(entry)
    out["ok"] = all(run.ok for run in runs)
    return out


def format_report(runs: list[DemoRun], *, device: str, config: EngineConfig) -> str:
    """Human-readable report: one block per run, a verdict line at the end."""
    c = config
    lines = [
        f"kvcanary demo on {device}: {runs[0].steps} steps per run, {c.max_running} running requests, "
        f"{c.num_pages} pages x {c.page_size} slots, "
        + (f"SWA window {c.swa_window}" if c.swa_window else "FULL pool only"),
        "",
    ]
    for run in runs:
        name = run.fault or "clean run"
        lines.append(f"{name:<20} {run.status:<15} {len(run.violations)} violation row(s)")
        if run.fault is not None:
            lines.append(f"  fault:    {ALL_FAULT_CLASSES[run.fault][0]}")
        for record in run.records:
            lines.append(f"  injected: step {record.step}, slots {list(record.slots)} ({record.detail})")
        if run.catches:
            first = run.catches[0]
            tags = sorted({v.tag for v in run.catches})
            lines.append(f"  caught:   step {first.step} by {', '.join(tags)}")
            lines.append(f"  first:    {first.summary()}")
            lines += [f"  why:      {text}" for text in first.explanations()]
            state = f"{first.persistence}, slot rewritten" if first.rewritten else first.persistence
            lines.append(f"  triage:   {first.diagnosis.category} ({state}): {first.diagnosis.cause}")
        elif run.fault is None and run.violations:
            lines.append(f"  first:    {run.violations[0].summary()}")
        lines.append("")
    lines += glossary("\n".join(lines))
    caught = sum(1 for r in runs if r.fault is not None and r.ok)
    total = sum(1 for r in runs if r.fault is not None)
    clean = runs[0].ok if runs and runs[0].fault is None else True
    lines.append(
        f"summary: {caught}/{total} fault classes caught; clean run {'reported nothing' if clean else 'FAILED'}"
    )
    return "\n".join(lines)


def glossary(text: str) -> list[str]:
    """ "terms:" lines explaining each :data:`TERMS` entry that ``text`` uses ([] when none), then a blank line."""
    found = [(sorted(set(re.findall(rf"\b{pattern}", text))), meaning) for pattern, meaning in TERMS.items()]
    found = [(", ".join(names), meaning) for names, meaning in found if names]
    if not found:
        return []
    width = max(len(names) for names, _ in found)
    return ["terms:", *(f"  {names:<{width}}  {meaning}" for names, meaning in found), ""]
