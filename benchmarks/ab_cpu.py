"""A/B on the CPU: one library tree's public NumPy calls and CPU monitor step, one JSON line.

Run alternately for an old tree and this one, each process pinned (``benchmarks/gpu_session.sh
abcpu`` on the device host; on any machine, e.g. with the old tree checked out by
``git worktree add /tmp/base 9f4649c``)::

    for t in /tmp/base . . /tmp/base; do taskset -c 1 python3 benchmarks/ab_cpu.py $t $t; done > ab-cpu.jsonl
    python3 benchmarks/ab_table.py --base /tmp/base ab-cpu.jsonl

Only the package's public API is used (``ab_common.py``). Rows (host µs; p10, median, p90):

``public <call>, 1 entry``     each public call on NumPy arrays for a one-request, one-entry step
                               (``bench_public.public_cpu``'s case): ``plan``, ``verify``, ``write``,
                               ``plan+verify+write``, ``plan offsets``; ``--calls`` each (default 2000);
``public <call>, 64 x 256``    the same calls for the bench's public step (64 requests, prefix 256,
                               PARTIAL): the NumPy path's own work; ``--calls // 10`` each;
``monitor decode 16 x 1, prefix 256: step``  ``pre_forward`` + KV write + ``post_forward`` + ``end_step``
                               of a CPU ``CanaryMonitor`` (K and V, PARTIAL), ``--calls // 10`` steps.

The compiled CPU loops are cached on disk by Numba: the first process of a tree compiles them
(seconds, outside the timed calls). ``violations`` counts violation rows (0: clean data).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import time


def load_common():
    """``ab_common.py`` beside this file, by path (``benchmarks`` may be the measured tree's package)."""
    path = pathlib.Path(__file__).resolve().with_name("ab_common.py")
    spec = importlib.util.spec_from_file_location("kvcanary_ab_common", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = load_common()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="repository root of the measured kvcanary_numba")
    parser.add_argument("label", nargs="?", help="name of this process in the output (default: TREE)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls of each 1-entry row (default 2000)")
    args = parser.parse_args(argv)
    info = common.load_tree(args.tree)
    import numpy as np

    import kvcanary_numba as kv

    started = time.perf_counter()
    result = {
        "script": "ab_cpu",
        "label": args.label or args.tree,
        **info,
        "device": "cpu",
        "rows": {},
        "violations": {},
    }
    for size, bs, prefix, calls in (("1 entry", 1, 1, args.calls), ("64 x 256", 64, 256, max(args.calls // 10, 5))):
        step = common.PublicStep(kv, np, bs=bs, prefix=prefix)
        fns = {**step.calls(), "plan offsets": step.offsets_call()}
        fns["plan"](0)  # the verify plan is the plan call's output
        for name, fn in fns.items():
            result["rows"][f"public {name}, {size}"] = common.timed(fn, calls=calls, warmup=10)
        result["violations"][f"public {size}"] = step.rows()
    case = common.MonitorCase(kv, np, requests=16, prefix=256, extend=1)
    steps = max(args.calls // 10, 5)
    result["rows"]["monitor decode 16 x 1, prefix 256: step"] = common.timed(
        lambda _: case.run_step(case.batch), calls=steps, warmup=5
    )
    result["violations"]["monitor"] = case.rows()
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
