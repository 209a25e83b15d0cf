"""Run the shared bad-input fuzz harness and commit its outcome counts (docs/concepts/reliability.md).

From the repository root (the harness lives beside the clone)::

    python benchmarks/fuzz_summary.py --backend numpy --n 3000 --jobs 2   # -> benchmarks/results/fuzz/fuzz-numpy.json
    python benchmarks/fuzz_summary.py --backend sim --n 200 --jobs 2      # -> benchmarks/results/fuzz/fuzz-sim.json

The JSON holds the command, seed, wall time, and the cases per outcome class in
all and per target; the reliability page's table is checked against it by
``tests/test_reliability_docs.py``. Exit status: the harness's.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
HARNESS = ROOT.parent / "shared" / "tools" / "fuzz_bad_inputs.py"
#: The harness's outcome classes, in its report's order; the first five after CODED are defects.
OUTCOMES = (
    "OK",
    "CODED",
    "OTHER",
    "HANG",
    "CRASH",
    "PARTIAL_WRITE",
    "WRONG",
    "ALIAS",
    "LATE",
    "LENIENT",
    "SKIPPED",
    "HARNESS",
)
DEFECTS = ("OTHER", "HANG", "CRASH", "PARTIAL_WRITE", "WRONG", "HARNESS")


def summarize(records: list[dict]) -> dict:
    """Counts per outcome (signature TypeErrors apart) in all and per target."""

    def outcome(r):
        return "OTHER (call signature)" if r["outcome"] == "OTHER" and r.get("signature") else r["outcome"]

    total = collections.Counter(outcome(r) for r in records)
    targets = collections.defaultdict(collections.Counter)
    for r in records:
        targets[r["target"]][outcome(r)] += 1
    return dict(
        cases=len(records),
        outcomes={k: total[k] for k in (*OUTCOMES, "OTHER (call signature)")},
        defects=sum(total[k] for k in DEFECTS),
        codes=len({r.get("code") for r in records if r["outcome"] == "CODED"}),
        by_target={t: dict(sorted(c.items())) for t, c in sorted(targets.items())},
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("numpy", "sim"), default="numpy")
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--harness", type=pathlib.Path, default=HARNESS)
    p.add_argument("--out", type=pathlib.Path)
    args = p.parse_args(argv)
    if not args.harness.is_file():
        p.error(f"harness not found: {args.harness} (pass --harness)")
    out = args.out or ROOT / "benchmarks" / "results" / "fuzz" / f"fuzz-{args.backend}.json"
    flags = [
        "--backend",
        args.backend,
        "--n",
        str(args.n),
        "--seed",
        str(args.seed),
        "--jobs",
        str(args.jobs),
        "--lenient-signature",
        "--quiet",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        records_path = pathlib.Path(tmp) / "records.json"
        t0 = time.time()
        rc = subprocess.call(
            [sys.executable, str(args.harness), *flags, "--json", str(records_path)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        seconds = time.time() - t0
        records = json.loads(records_path.read_text())
    result = dict(
        command=f"python ../shared/tools/fuzz_bad_inputs.py {' '.join(flags)}",
        backend=args.backend,
        seed=args.seed,
        jobs=args.jobs,
        seconds=round(seconds, 1),
        exit_status=rc,
        **summarize(records),
    )
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{out}: {result['cases']} cases, {result['defects']} defects, {result['seconds']} s, exit {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
