"""Probe (session 7): where the host time of a prepared and of a graph-replayed decode step goes.

Decode 256 x 1, prefix 4k, K and V, PARTIAL (the bench's monitor case). Per path, 300 steps of
pre_forward + post_forward + end_step under cProfile (inflated: read the ranking, not the µs),
then the top functions by own time, and the step's host µs without the profiler. Run on a GPU
from the repository root: ``python3 benchmarks/results/probes/profile_monitor_step.py``.
"""

import cProfile
import io
import pstats
import sys
import time

import numpy as np

np.row_stack = getattr(np, "row_stack", np.vstack)
sys.path.insert(0, ".")

import cupy  # noqa: E402

from benchmarks.workloads import MonitorWorkload  # noqa: E402
from kvcanary_numba import RealKvHashMode  # noqa: E402


def steps(w, n):
    m = w.monitor
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        m.pre_forward(w.batch)
        m.post_forward()
        t1 = time.perf_counter()
        m.end_step()
        t2 = time.perf_counter()
        times.append(((t1 - t0) * 1e6, (t2 - t1) * 1e6))
        cupy.cuda.get_current_stream().synchronize()
    return times


w = MonitorWorkload(cupy, requests=256, prefix=4096, extend=1, mode=RealKvHashMode.PARTIAL)
w.prefill()
w.fill(w.batch, w.length, w.extend)
m = w.monitor
for path in ("prepared", "graph replay"):
    m.graph = None
    if path == "graph replay":
        m.capture_graph(w.batch)
    steps(w, 20)
    t = np.array(steps(w, 300))
    print(f"== {path}: pre+post {np.median(t[:, 0]):.1f} us, end_step {np.median(t[:, 1]):.1f} us, "
          f"graph replays {getattr(m.graph, 'replays', None)}")
    prof = cProfile.Profile()
    prof.enable()
    steps(w, 300)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(28)
    print(out.getvalue()[-6000:])
