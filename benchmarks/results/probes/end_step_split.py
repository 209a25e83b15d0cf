"""Probe (session 15): where the monitor decode step's ``end_step`` spends its host time.

Session 15's first call measured the mapped readback (one publish launch per step instead of
the copy readback's five driver calls): ``end_step`` stayed at 31-35 us in the bench protocol,
against 27-55 us for the copy readback, so the driver calls are not most of it. This probe
times the parts of ``end_step`` one by one, by wrapping the monitor's collaborators:

``push``      the readback (its five driver calls, in one compiled call)
``process``   the aftercare: re-checks, the pump's decode, the health check
``health``    the host launch counts kept for the next health check
``rest``      ``end_step`` minus the three (phase bookkeeping, the wrappers' own calls)

Protocols (the decode case of ``ab_monitor_step.py``: 256 x 1, prefix 4k, K and V, PARTIAL),
per path (prepared, graph replay), 300 steps after 20 of warm-up:

``bench``        synchronize, a 1.5 ms spin kernel, pre_forward, KV write, post_forward, end_step
``bench+touch``  the same with one event record on the stream just before ``end_step``, timed
                 on its own (``touch``): is the first driver call after the host's work the cold one?

    python3 benchmarks/results/probes/end_step_split.py LABEL   # one JSON line

(Session 15's run 2 also ran it on the mapped readback, since removed: its last tree is ``9e4874e``.)
"""

import json
import sys
import time

import numpy as np

np.row_stack = getattr(np, "row_stack", np.vstack)

import cupy  # noqa: E402

from benchmarks.timing import _spin  # noqa: E402
from benchmarks.workloads import MonitorWorkload  # noqa: E402
from kvcanary_numba import RealKvHashMode  # noqa: E402

STEPS, WARMUP, SPIN_US = 300, 20, 1500
PARTS = ("push", "process", "health")


def _median(values):
    return round(float(np.median(values)), 2)


def _timed(fn, part, spent):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - t0

    return wrapper


def _steps(w, touch):
    m, stream = w.monitor, cupy.cuda.get_current_stream()
    marker = cupy.cuda.Event(disable_timing=True)
    spent = dict.fromkeys(PARTS, 0.0)
    m.readback.push = _timed(m.readback.push, "push", spent)
    m.aftercare.process = _timed(m.aftercare.process, "process", spent)
    m.health.end_step = _timed(m.health.end_step, "health", spent)
    rows = {name: [] for name in ("end_step", *PARTS, "rest", "touch")}
    try:
        for i in range(WARMUP + STEPS):
            stream.synchronize()
            _spin(SPIN_US)
            m.pre_forward(w.batch)
            w.write_kv(w.batch)
            m.post_forward()
            t0 = time.perf_counter()
            if touch:
                marker.record(stream)
            t1 = time.perf_counter()
            for part in PARTS:
                spent[part] = 0.0
            m.end_step()
            t2 = time.perf_counter()
            if i >= WARMUP:
                rows["end_step"].append((t2 - t1) * 1e6)
                rows["touch"].append((t1 - t0) * 1e6)
                for part in PARTS:
                    rows[part].append(spent[part] * 1e6)
                rows["rest"].append((t2 - t1 - sum(spent.values())) * 1e6)
    finally:
        for name in ("push", "process", "end_step"):  # the instance attributes shadowed the methods
            for owner in (m.readback, m.aftercare, m.health):
                owner.__dict__.pop(name, None)
    return {name: _median(values) for name, values in rows.items() if touch or name != "touch"}


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "end_step split"
    w = MonitorWorkload(cupy, requests=256, prefix=4096, extend=1, mode=RealKvHashMode.PARTIAL)
    w.prefill()
    w.fill(w.batch, w.length, w.extend)
    m, result = w.monitor, {"tree": label, "readback": type(w.monitor.readback).__name__}
    for path in ("prepared", "graph replay"):
        m.graph = None
        if path == "graph replay":
            m.capture_graph(w.batch)
        for protocol in ("bench", "bench+touch"):
            result[f"{path} / {protocol}"] = _steps(w, protocol == "bench+touch")
    m.graph = None
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
