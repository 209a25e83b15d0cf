"""Probe (session 8): which part of the bench's protocol makes a monitor step's host time grow.

The bench (``benchmarks/bench_step.py::_monitor_path``) reads a graph-replayed decode step at
17.9 / 44.1 / 26.2 us (session 7 runs 1-3) and end_step at 23.7 / 56.9 / 42.4 us, while an idle
GPU (``profile_monitor_step.py``, run 4) gives 8.7 and 9.3 us. The host work outside the driver
calls is ~2 us on a CPU with a do-nothing driver (``benchmarks/host_step.py --driver fake``).
This probe runs the same decode step (256 x 1, prefix 4k, K and V, PARTIAL) under protocols that
add the bench's ingredients one at a time, for the prepared path and for graph replay:

``idle``            synchronize, then the step (run 4's probe)
``write_kv``        synchronize, pre_forward, the workload's KV write, post_forward, end_step
``spin``            synchronize, a 1.5 ms spin kernel queued, then the step (GPU busy while it issues)
``spin+write_kv``   both (the bench's protocol without its timing events)
``bench``           the bench's protocol, timing events included
``hot wait``        as ``spin+write_kv`` but the host polls an event instead of a blocking synchronize
                    (tests whether a sleeping host thread wakes slower: C-states, cold caches)
``no gc``           as ``spin+write_kv`` with Python's garbage collector off (the KV write allocates)
``overlap``         an engine one step ahead: no synchronize before the step; the host waits for the
                    step before the previous one (at most one step in flight, as overlap schedulers do)
``spin+numpy``      as ``spin+write_kv`` with the KV write done by NumPy on host copies of the pool
                    (session 9: the same Python and memory traffic, no driver call between the hooks)
``spin+1 launch``   as ``spin`` with one tiny CuPy kernel between the hooks (driver work, no traffic)

Per protocol and path: median and p10 of pre+post and of end_step, and the split of each into
the driver calls (graph / launch-table launches; the readback's compiled call or CuPy runtime
calls) and everything else; then the two graph launches alone, GPU idle and busy. Run on a GPU from the repository root:
``python3 benchmarks/results/probes/busy_monitor_step.py [out.json]``.
"""

import gc
import json
import sys
import time

import numpy as np

np.row_stack = getattr(np, "row_stack", np.vstack)
sys.path.insert(0, ".")

import cupy  # noqa: E402

from benchmarks.bench_step import _Stopwatch, timed_driver_calls  # noqa: E402
from benchmarks.timing import _spin  # noqa: E402
from benchmarks.workloads import MonitorWorkload  # noqa: E402
from kvcanary_numba import RealKvHashMode  # noqa: E402

STEPS, WARMUP, SPIN_US = 200, 10, 1500
PROTOCOLS = ("idle", "write_kv", "spin", "spin+write_kv", "bench", "hot wait", "no gc", "overlap", "spin+numpy",
             "spin+1 launch")


def _protocol(w, name):
    m, stream = w.monitor, cupy.cuda.get_current_stream()
    launches, runtime = _Stopwatch(), _Stopwatch()
    events = [cupy.cuda.Event() for _ in range(4)]
    done = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
    kv = "write_kv" in name or name in ("bench", "hot wait", "no gc", "overlap")
    host = None
    if name == "spin+numpy":  # the KV write's work on host copies (same shapes, NumPy)
        host = tuple(cupy.asnumpy(a) for a in (w.k, w.v, w.batch.input_ids, w.batch.out_cache_loc))
    tiny = cupy.zeros(1, dtype=np.int64) if name == "spin+1 launch" else None
    spin = name not in ("idle", "write_kv")
    rows = []
    if name == "no gc":
        gc.collect()
        gc.disable()
    with timed_driver_calls(m, launches, runtime):
        for i in range(WARMUP + STEPS):
            if name == "overlap":
                done[i & 1].synchronize()  # the step before the previous one (recorded two steps ago)
            elif name == "hot wait":
                marker = cupy.cuda.Event(disable_timing=True)
                marker.record()
                while not marker.done:
                    pass
            else:
                stream.synchronize()
            if spin:
                _spin(SPIN_US)
            launches.take(), runtime.take()  # the spin's launch is not the step's
            if name == "bench":
                events[0].record()
            t0 = time.perf_counter()
            m.pre_forward(w.batch)
            t1 = time.perf_counter()
            if name == "bench":
                events[1].record()
            if kv:
                w.write_kv(w.batch)
            elif host is not None:
                k, v, ids, locs = host
                pattern = (ids[:, None] * 7 + np.arange(k.shape[1])[None, :]) % 251
                k[locs] = pattern.astype(np.uint8)
                v[locs] = (pattern + 1).astype(np.uint8)
            elif tiny is not None:
                tiny += 1
            if name == "bench":
                events[2].record()
            t2 = time.perf_counter()
            m.post_forward()
            t3 = time.perf_counter()
            if name == "bench":
                events[3].record()
            m.end_step()
            t4 = time.perf_counter()
            (launch_us, _), (runtime_us, _) = launches.take(), runtime.take()
            done[i & 1].record()
            if i >= WARMUP:
                step = (t1 - t0 + t3 - t2) * 1e6
                end = (t4 - t3) * 1e6
                rows.append((step, launch_us, step - launch_us, end, runtime_us, end - runtime_us))
    stream.synchronize()
    a = np.array(rows)
    keys = ("step", "step launches", "step else", "end_step", "end runtime", "end else")
    return {k: {"median": round(float(np.median(a[:, j])), 2), "p10": round(float(np.percentile(a[:, j], 10)), 2)}
            for j, k in enumerate(keys)}  # fmt: skip


def _bare_graphs(m, spin):
    """Host us of the two graph launches alone (no monitor code around them), GPU idle or busy."""
    stream, times = cupy.cuda.get_current_stream(), []
    for i in range(WARMUP + STEPS):
        stream.synchronize()
        if spin:
            _spin(SPIN_US)
        t0 = time.perf_counter()
        m.graph.head.launch()
        m.graph.tail.launch()
        t1 = time.perf_counter()
        if i >= WARMUP:
            times.append((t1 - t0) * 1e6)
    stream.synchronize()
    return {"median": round(float(np.median(times)), 2), "p10": round(float(np.percentile(times, 10)), 2)}


def _run_protocol(w, name):
    try:
        return _protocol(w, name)
    finally:
        gc.enable()  # "no gc" turns it off


def main():
    w = MonitorWorkload(cupy, requests=256, prefix=4096, extend=1, mode=RealKvHashMode.PARTIAL)
    w.prefill()
    w.fill(w.batch, w.length, w.extend)
    m, results = w.monitor, {}
    for path in ("prepared", "graph replay"):
        m.graph = None
        if path == "graph replay":
            m.capture_graph(w.batch)
        for name in PROTOCOLS:
            try:
                r = results[f"{path} / {name}"] = _run_protocol(w, name)
            except Exception as exc:  # noqa: BLE001 - one protocol's failure must not lose the others
                results[f"{path} / {name}"] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{path:13s} {name:14s} failed: {exc}", flush=True)
                continue
            print(f"{path:13s} {name:14s} " + "  ".join(f"{k} {v['median']:6.1f} ({v['p10']:5.1f})"
                                                           for k, v in r.items()), flush=True)  # fmt: skip
    for spin in (False, True):
        r = results[f"bare graph launches, {'spin' if spin else 'idle'}"] = _bare_graphs(m, spin)
        print(f"bare head+tail graph launches, {'spin' if spin else 'idle'}: {r['median']:.1f} ({r['p10']:.1f})")
    results["graph replays"] = getattr(m.graph, "replays", None)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
