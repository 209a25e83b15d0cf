"""Probe (session 7, host helper): host µs of the monitor's decode phases per launch, three ways.

The decode case of ``bench_step`` (256 requests x 1 token, prefix 4k, K and V: 10 launches of
90-166 parameters each) is recorded once; its HEAD and TAIL phases are then launched through
launch tables built three ways, each timed while a spin kernel keeps the GPU busy (so no launch
waits for queue room):

- ``python``: each launch's own ``PreparedLaunch.launch`` (cuda-bindings), as before the tables;
- ``compiled``: one compiled loop per phase, ``kernelParams`` (the default now);
- ``compiled_buffer``: the same loop, each kernel's parameters as one buffer (``extra``:
  ``CU_LAUNCH_PARAM_BUFFER_POINTER``; ``_driver.PARAM_BUFFER`` / ``KVCANARY_PARAM_BUFFER=1``).

Prints one JSON object: µs per launch (median over rounds) of each, the launch count, and how
many launches had the one-buffer form (the driver must report offsets equal to ours). If
``compiled_buffer`` reads clearly below ``compiled``, turn ``PARAM_BUFFER`` on by default.
Run on a GPU from the repository root: ``python3 benchmarks/results/probes/launch_table_cost.py``.
"""

import json
import statistics
import sys
import time

import numpy as np

np.row_stack = getattr(np, "row_stack", np.vstack)

import cupy  # noqa: E402

sys.path.insert(0, ".")
from benchmarks.timing import _spin, synchronize  # noqa: E402
from benchmarks.workloads import MonitorWorkload  # noqa: E402
from kvcanary_numba import RealKvHashMode  # noqa: E402
from kvcanary_numba.launch import _driver, table  # noqa: E402

w = MonitorWorkload(cupy, requests=256, prefix=4096, extend=1, mode=RealKvHashMode.PARTIAL)
w.prefill()
w.fill(w.batch, w.length, w.extend)
for _ in range(3):
    w.run_step(w.batch)  # records the phases (and runs them)
m = w.monitor
phases = [phase for pair in m.fast._phases.values() for phase in pair]
launches = [launch for phase in phases for launch in phase.launches]
assert launches and all(p.raw for p in launches), [p.fallback_reason for p in launches]


def tables(kind: str) -> list:
    native, buffers = _driver.driver.native, _driver.PARAM_BUFFER
    for p in launches:
        p._tabled = False  # rebuilt below from the same launches
    try:
        _driver.driver.native = None if kind == "python" else native
        _driver.PARAM_BUFFER = kind == "compiled_buffer"
        return [table.LaunchTable(phase.launches) for phase in phases]
    finally:
        _driver.driver.native, _driver.PARAM_BUFFER = native, buffers


def per_launch(built: list, rounds: int = 200, repeat: int = 4) -> float:
    stream = int(cupy.cuda.get_current_stream().ptr)
    samples = []
    for _ in range(rounds):
        synchronize()
        _spin(3000)
        t0 = time.perf_counter()
        for _ in range(repeat):
            for t in built:
                t.launch(stream)
        samples.append((time.perf_counter() - t0) / (repeat * len(launches)) * 1e6)
    synchronize()
    return round(statistics.median(samples), 3)


out = {"launches": len(launches), "parameters": [len(p._slots) for p in launches]}
built = {kind: tables(kind) for kind in ("python", "compiled", "compiled_buffer")}
out["one_buffer_launches"] = sum(1 for t in built["compiled_buffer"] for row in t.table if row[4])
for _ in range(2):  # alternate, twice: host noise moves all of them alike
    for kind, ts in built.items():
        out.setdefault(f"{kind}_us_per_launch", []).append(per_launch(ts))
out["route"] = _driver.driver.route
print(json.dumps(out))
