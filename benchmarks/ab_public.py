"""A/B of the public CuPy calls: one library tree's host time per call, one JSON line.

Run alternately for an old tree and this one in one device call, each process pinned
(``benchmarks/gpu_session.sh abpublic``; the old tree unpacked in ``.base/``)::

    taskset -c 3 python3 benchmarks/ab_public.py TREE LABEL [--calls N] [--profile]

The step is the bench's public case (``bench_public``): a decode step of 64 requests, prefix
256, PARTIAL mode, one real-KV source, on clean chains, built with the public API only
(``ab_common.py``). Calls: ``plan``, ``verify``, ``write`` and ``plan+verify+write`` (the
three in a row), ``--calls`` of each (default 2000) after 20 of warm-up, under two protocols:

``synced``  the bench's: the stream synchronized (untimed) before each call;
``queued``  a synchronize every 64 calls only (a call's GPU work is a few µs, so the queue stays
            short): the host cost without the wake-up after a synchronize.

Rows (µs; p10, median, p90): ``<call> / <protocol>``. ``--profile`` adds the cProfile of
``--calls`` synced verify calls, top 20 by own time (inflated; for reading, not comparing).
``--smoke`` runs the script on NumPy arrays with a few calls (a CPU check of the script).
``benchmarks/ab_table.py`` tabulates the lines.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import pathlib
import pstats
import time


def load_common():
    """``ab_common.py`` beside this file, by path (``benchmarks`` may be the measured tree's package)."""
    path = pathlib.Path(__file__).resolve().with_name("ab_common.py")
    spec = importlib.util.spec_from_file_location("kvcanary_ab_common", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = load_common()
BS, PREFIX, WARMUP = 64, 256, 20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="repository root of the measured kvcanary_numba")
    parser.add_argument("label", nargs="?", help="name of this process in the output (default: TREE)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per row (default 2000)")
    parser.add_argument("--profile", action="store_true", help="also profile synced verify calls")
    parser.add_argument("--smoke", action="store_true", help="NumPy arrays, 20 calls: a CPU check of this script")
    args = parser.parse_args(argv)
    info = common.load_tree(args.tree)
    import numpy as np

    import kvcanary_numba as kv

    calls, warmup = (20, 2) if args.smoke else (args.calls, WARMUP)
    if args.smoke:
        xp, sync, device = np, (lambda: None), "cpu (smoke)"
    else:
        import cupy

        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        device = name.decode() if isinstance(name, bytes) else str(name)
    started = time.perf_counter()
    step = common.PublicStep(kv, xp, bs=BS, prefix=PREFIX)
    fns = step.calls()
    fns["plan"](0)  # the verify plan is the plan call's output
    sync()
    result = {
        "script": "ab_public",
        "label": args.label or args.tree,
        **info,
        "device": device,
        "setup_s": round(time.perf_counter() - started, 1),
        "rows": {},
    }
    for protocol in ("synced", "queued"):
        for name, fn in fns.items():
            before = (lambda i: sync()) if protocol == "synced" else (lambda i: sync() if i % 64 == 0 else None)
            result["rows"][f"{name} / {protocol}"] = common.timed(fn, calls=calls, warmup=warmup, before=before)
            sync()
    if args.profile:
        profile = cProfile.Profile()
        for _ in range(calls):
            sync()
            profile.enable()
            fns["verify"](0)
            profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(20)
        result["verify profile"] = text.getvalue().splitlines()[-28:]
    sync()
    result["violations"] = step.rows()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
