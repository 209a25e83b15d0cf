"""A/B of the monitor step: one library tree's CanaryMonitor steps, one JSON line.

Run alternately for an old tree and this one in one device call, each process pinned
(``benchmarks/gpu_session.sh ab``; the old tree unpacked in ``.base/``)::

    taskset -c 3 python3 benchmarks/ab_monitor.py TREE LABEL [--steps N] [--cases decode,prefill]

``TREE`` is the repository root whose ``kvcanary_numba`` is measured; only the package's public
API is used (``ab_common.py``), so any tree that exports it can be measured. Cases (PARTIAL
mode, K and V sources of 64 bytes per token):

``decode``   256 requests x 1 new token after a 4k prefix (the bench's decode case), prepared
             (the monitor's default GPU path) and graph replay (``capture_graph``), under both
             protocols, ``--steps`` steps (default 300) after 20 of warm-up;
``prefill``  8 requests x 8192 new tokens, prepared, ``bench`` protocol, 60 steps.

Protocols:

``bench``  synchronize, a 1.5 ms spin kernel queued (the GPU stays busy while the host issues, so
           CUDA events time the GPU), ``pre_forward``, the KV write, ``post_forward``, ``end_step``;
``idle``   synchronize, ``pre_forward``, ``post_forward``, ``end_step``: nothing else queued (no spin,
           no KV write; the KV bytes are unchanged since the last write).

Rows (µs; p10, median, p90 over the steps): ``<case> <path> / <protocol>: pre+post`` (host time of
``pre_forward`` + ``post_forward``), ``...: end_step`` (its host time), and under ``bench``
``...: device`` (CUDA-event time of the two phases' launches, the KV write excluded) and
``...: device through end_step`` (plus what ``end_step`` queues on the stream). ``violations``
counts each case's violation rows (0 on a clean run). ``benchmarks/ab_table.py`` tabulates the lines.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import time
import types

import numpy as np


def load_common():
    """``ab_common.py`` beside this file, by path (``benchmarks`` may be the measured tree's package)."""
    path = pathlib.Path(__file__).resolve().with_name("ab_common.py")
    spec = importlib.util.spec_from_file_location("kvcanary_ab_common", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = load_common()
WARMUP, SPIN_US = 20, 1500
#: case -> (requests, prefix, extend, paths, protocols, steps or None for --steps)
CASES = {
    "decode": (256, 4096, 1, ("prepared", "graph replay"), ("bench", "idle"), None),
    "prefill": (8, 0, 8192, ("prepared",), ("bench",), 60),
}


def _spinner():
    """A one-thread kernel that keeps the GPU busy about ``us`` microseconds, on CuPy's stream."""
    import cupy
    from numba import cuda

    @cuda.jit("void(int64)")
    def spin(us):
        for _ in range(us):
            cuda.nanosleep(1000)

    def launch(us: int) -> None:
        spin[1, 1, cuda.external_stream(cupy.cuda.get_current_stream().ptr)](us)

    return launch


def _steps(case, spin, *, bench: bool, steps: int, warmup: int = WARMUP) -> dict:
    m, batch = case.monitor, case.batch
    if case.xp is np:  # --smoke: the CPU monitor, idle protocol only
        stream, events = types.SimpleNamespace(synchronize=lambda: None), []
    else:
        import cupy

        stream, events = cupy.cuda.get_current_stream(), [cupy.cuda.Event() for _ in range(5)]
    host, end, device, through_end = [], [], [], []
    clock = time.perf_counter
    for i in range(warmup + steps):
        stream.synchronize()
        if bench:
            spin(SPIN_US)
            events[0].record()
        t0 = clock()
        m.pre_forward(batch)
        t1 = clock()
        if bench:
            events[1].record()
            case.write_kv(batch)
            events[2].record()
        t2 = clock()
        m.post_forward()
        t3 = clock()
        if bench:
            events[3].record()
        m.end_step()
        t4 = clock()
        if bench:
            events[4].record()  # what end_step queues on the stream counts in "through end_step"
            events[4].synchronize()
        if i >= warmup:
            host.append((t1 - t0 + t3 - t2) * 1e6)
            end.append((t4 - t3) * 1e6)
            if bench:
                import cupy

                elapsed = cupy.cuda.get_elapsed_time
                device.append((elapsed(events[0], events[1]) + elapsed(events[2], events[3])) * 1e3)
                through_end.append(device[-1] + elapsed(events[3], events[4]) * 1e3)
    stream.synchronize()
    out = {"pre+post": common.stats(host), "end_step": common.stats(end)}
    if bench:
        out["device"] = common.stats(device)
        out["device through end_step"] = common.stats(through_end)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="repository root of the measured kvcanary_numba")
    parser.add_argument("label", nargs="?", help="name of this process in the output (default: TREE)")
    parser.add_argument("--steps", type=int, default=300, help="timed decode steps per row (default 300)")
    parser.add_argument("--cases", default="decode,prefill", help="comma-separated of " + ",".join(CASES))
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a CPU check of this script: the NumPy monitor, small cases, idle protocol, 5 steps",
    )
    args = parser.parse_args(argv)
    info = common.load_tree(args.tree)
    import kvcanary_numba as kv

    if args.smoke:
        xp, device, spin = np, "cpu (smoke)", None
    else:
        import cupy

        xp, spin = cupy, _spinner()
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        device = name.decode() if isinstance(name, bytes) else str(name)
    result = {
        "script": "ab_monitor",
        "label": args.label or args.tree,
        **info,
        "device": device,
        "rows": {},
        "violations": {},
    }
    started = time.perf_counter()
    for key in [c for c in args.cases.split(",") if c]:
        requests, prefix, extend, paths, protocols, steps = CASES[key]
        if args.smoke:
            requests, prefix, extend = min(requests, 4), min(prefix, 64), min(extend, 64)
            paths, protocols, steps = ("prepared",), ("idle",), 5
        case = common.MonitorCase(kv, xp, requests=requests, prefix=prefix, extend=extend)
        for path in paths:  # prepared first: capture_graph has no public way back to the prepared path
            if path == "graph replay":
                case.monitor.capture_graph(case.batch)
            for protocol in protocols:
                measured = _steps(
                    case, spin, bench=protocol == "bench", steps=steps or args.steps, warmup=2 if args.smoke else WARMUP
                )
                for metric, value in measured.items():
                    result["rows"][f"{key} {path} / {protocol}: {metric}"] = value
        result["violations"][key] = case.rows()
        del case
        if xp is not np:
            xp.get_default_memory_pool().free_all_blocks()
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
