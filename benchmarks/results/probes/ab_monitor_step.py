"""Probe (session 8): one library tree against another on the monitor decode step, same protocol, same call.

Issue 13 asks that the monitor's measured numbers (prepared, graph replay) get no worse. The bench's
graph-replay row read 17.9 / 44.1 / 26.2 us in session 7's three runs on three device hosts, so rows
of different runs cannot say whether the code regressed. This script measures one tree (its own
``kvcanary_numba`` and ``benchmarks`` package) and prints one JSON line; run it alternately for the
base tree and the current one in one device call (``gpu_session.sh ab``, base unpacked in ``.base/``):

    python3 benchmarks/results/probes/ab_monitor_step.py TREE LABEL

Workload: the bench's monitor decode case (256 x 1, prefix 4k, K and V, PARTIAL). Protocols, per
path (prepared, graph replay), 300 steps after 20 of warm-up:

``bench``  synchronize, a 1.5 ms spin kernel queued, pre_forward, the KV write, post_forward,
           end_step (the bench's ``_monitor_path``), with the step's device time from events;
``idle``   synchronize, pre_forward, post_forward, end_step (GPU idle while the host issues).
"""

import json
import sys
import time

tree, label = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
sys.path.insert(0, tree)

import numpy as np  # noqa: E402

np.row_stack = getattr(np, "row_stack", np.vstack)

import cupy  # noqa: E402

from benchmarks.timing import _spin  # noqa: E402
from benchmarks.workloads import MonitorWorkload  # noqa: E402
from kvcanary_numba import RealKvHashMode  # noqa: E402

STEPS, WARMUP, SPIN_US = 300, 20, 1500


def _stats(values):
    a = np.asarray(values)
    return {q: round(float(np.percentile(a, p)), 2) for q, p in (("p10", 10), ("median", 50), ("p90", 90))}


def _steps(w, bench):
    m, stream = w.monitor, cupy.cuda.get_current_stream()
    events = [cupy.cuda.Event() for _ in range(5)]
    host, end, device, through_end = [], [], [], []
    for i in range(WARMUP + STEPS):
        stream.synchronize()
        if bench:
            _spin(SPIN_US)
            events[0].record()
        t0 = time.perf_counter()
        m.pre_forward(w.batch)
        t1 = time.perf_counter()
        if bench:
            events[1].record()
            w.write_kv(w.batch)
            events[2].record()
        t2 = time.perf_counter()
        m.post_forward()
        t3 = time.perf_counter()
        if bench:
            events[3].record()
        m.end_step()
        t4 = time.perf_counter()
        if bench:
            events[4].record()  # what end_step queued on this stream (a mapped readback's publish) counts too
            events[4].synchronize()
        if i >= WARMUP:
            host.append((t1 - t0 + t3 - t2) * 1e6)
            end.append((t4 - t3) * 1e6)
            if bench:
                device.append((cupy.cuda.get_elapsed_time(events[0], events[1])
                               + cupy.cuda.get_elapsed_time(events[2], events[3])) * 1e3)  # fmt: skip
                through_end.append(device[-1] + cupy.cuda.get_elapsed_time(events[3], events[4]) * 1e3)
    out = {"host": _stats(host), "end_step": _stats(end)}
    if device:
        out["device"] = _stats(device)
        out["device through end_step"] = _stats(through_end)
    return out


def main():
    started = time.perf_counter()
    w = MonitorWorkload(cupy, requests=256, prefix=4096, extend=1, mode=RealKvHashMode.PARTIAL)
    w.prefill()
    w.fill(w.batch, w.length, w.extend)
    m, result = w.monitor, {"tree": label, "setup_s": round(time.perf_counter() - started, 1)}
    for path in ("prepared", "graph replay"):
        m.graph = None
        if path == "graph replay":
            m.capture_graph(w.batch)
        for protocol in ("bench", "idle"):
            result[f"{path} / {protocol}"] = _steps(w, protocol == "bench")
    m.graph = None
    result["rows"] = int(m.status.words[0:1].view(np.int32).get()[0])  # violations: 0 on a clean run
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
