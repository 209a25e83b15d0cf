"""Probe (session 10): one library tree against another on the public CuPy calls, same protocol, same call.

Issue 13's targets for the validated public path are <= 20 us host per verify / write call and
<= 60 us per plan+verify+write step (CuPy arrays). Session 7 run 3 read 17.2 / 18.9 / 57.1 us,
session 10 run 1 read 22.9 / 24.3 / 69.6 us, with the prepared step beside them 21.5 and 26.0 us:
rows of different device hosts differ by more than a code change could. This script measures one
tree (its own ``kvcanary_numba`` and ``benchmarks``) on the bench's public case (``bench_public``:
a decode step of 64 requests, prefix 256, PARTIAL, one endpoint) and prints one JSON line; run it
alternately for a base tree and this one in one device call (``gpu_session.sh abpublic``):

    python3 benchmarks/results/probes/ab_public_calls.py TREE LABEL [--profile]

Protocols, 2000 calls after 20 of warm-up, per call (plan, verify, write, plan+verify+write):

``synced``  the bench's: the stream synchronized (untimed) before each call;
``queued``  no synchronize between calls, one every 64 (the GPU work of a call is a few us, so the
            queue stays short): the host cost without the wake-up after a synchronize.

``--smoke``: a CPU check of the script (NumPy arrays, 20 calls). ``--profile``: also the cProfile of 2000 synced verify calls, top 20 by own time (inflated, relative).
"""

import cProfile
import io
import json
import pstats
import sys
import time

tree, label = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
sys.path.insert(0, tree)

import numpy as np  # noqa: E402

np.row_stack = getattr(np, "row_stack", np.vstack)

import cupy  # noqa: E402

from benchmarks.bench_public import SIZES, _calls, _step  # noqa: E402

CALLS, WARMUP = 2000, 20
SMOKE = "--smoke" in sys.argv  # a CPU check of this script: NumPy arrays, a few calls
if SMOKE:
    CALLS, WARMUP = 20, 2


def _stats(values):
    a = np.asarray(values)
    return {q: round(float(np.percentile(a, p)), 2) for q, p in (("p10", 10), ("median", 50), ("p90", 90))}


def _times(fn, synced):
    stream, samples = cupy.cuda.get_current_stream(), []
    stream.synchronize()
    for i in range(WARMUP + CALLS):
        if synced or i % 64 == 0:
            stream.synchronize()
        t0 = time.perf_counter()
        fn(i)
        t1 = time.perf_counter()
        if i >= WARMUP:
            samples.append((t1 - t0) * 1e6)
    stream.synchronize()
    return _stats(samples)


def main():
    plan, verify, write = _step(np if SMOKE else cupy, *SIZES["full"])
    calls = _calls(plan, verify, write)
    result = {"tree": label}
    for protocol in ("synced", "queued"):
        for name, fn in calls.items():
            result[f"{name} / {protocol}"] = _times(fn, protocol == "synced")
    if "--profile" in sys.argv:
        stream, profile = cupy.cuda.get_current_stream(), cProfile.Profile()
        for _ in range(CALLS):
            stream.synchronize()
            profile.enable()
            calls["verify"](0)
            profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(20)
        result["verify profile"] = text.getvalue().splitlines()[-28:]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
