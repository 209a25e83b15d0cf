"""kvcanary benchmark suite: one run measures the kernels, the per-step host path and the
baselines on this machine, checks the performance targets (benchmarks/NOTES.md) and writes JSON, markdown and plots.

Usage::

    python benchmarks/run.py                 # everything this machine can run (GPU sections need CuPy + a GPU)
    python benchmarks/run.py --quick         # small sizes, seconds
    python benchmarks/run.py --cpu           # CPU comparisons only
    kvcanary bench -- --quick --out /tmp/r   # the same through the CLI

Each section runs under a wall-clock budget (``--budget``, default 330 s for the
whole run): cases that would start after it are listed as skipped, and a
section that fails is recorded in ``meta.errors`` while the run goes on (exit
status 1). See ``benchmarks/NOTES.md`` for the byte models and predictions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: make ``benchmarks`` and the package importable
    sys.path.insert(0, str(HERE.parent))

from benchmarks.report import write_results  # noqa: E402
from benchmarks.timing import Deadline  # noqa: E402

GPU_SECTIONS = ("roofline", "verify", "write", "plan", "launch", "step", "monitor", "budget", "chain", "public")
CPU_SECTIONS = ("cpu", "validation", "public-cpu")
#: Sections that run on every allowed core even under ``--pin``: the NumPy path's parallel loops
#: (H100, 2026-12-05, 60ed848: pinned to one core, the CPU verify row read 96.7x instead of 700x+).
#: They run first, so Numba's worker threads start before the pin and keep every core.
UNPINNED_SECTIONS = ("cpu",)


class Run:
    """State of one benchmark run shared by the sections."""

    def __init__(self, *, quick: bool, iters: int, budget: float):
        self.quick, self.iters = quick, iters
        self.mode = "quick" if quick else "full"  # the key of the sections' SIZES tables
        self.deadline = Deadline(budget)
        self.records: list[dict] = []
        self.skipped: list[str] = []
        self.errors: list[dict] = []
        self.copy_gbps: float | None = None

    @contextlib.contextmanager
    def guard(self, section: str, case: str = ""):
        """Record an exception of one case (or section) in ``errors`` and go on."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - one failure must not lose the run
            self.errors.append(
                {
                    "section": section,
                    "case": case,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=8),
                }
            )
            print(self.errors[-1]["traceback"], file=sys.stderr, flush=True)

    def add(self, record: dict) -> None:
        self.records.append(record)
        label = record.get("variant", "")
        size = next((record[k] for k in ("entries", "tokens", "bs", "size", "n") if k in record), "")
        print(f"  {record['op']:<32} {label:<44} {size!s:>10} {record.get('median_us', '-')!s:>12} us", flush=True)

    def skip(self, section: str, case: str) -> None:
        self.skipped.append(f"{section}: {case}")

    def case(self, section: str, case: str, body, *, reserve: float = 30.0, cleanup=None) -> None:
        """Run ``body()`` unless less than ``reserve`` seconds of budget are left (then it is listed
        as skipped); an exception is recorded, not raised; ``cleanup()`` runs afterwards."""
        if not self.deadline.allows(reserve):
            self.skip(section, case)
            return
        with self.guard(section, case):
            body()
        if cleanup is not None:
            cleanup()

    def bandwidth(self, nbytes: int, result: dict) -> dict:
        gbps = nbytes / (result["median_us"] * 1e-6) / 1e9
        out = {"gbps": round(gbps, 1)}
        if self.copy_gbps:
            out["copy_fraction"] = round(gbps / self.copy_gbps, 3)
        return out


def _gpu_available() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no usable GPU, whatever the reason
        return False


def source_sha1() -> str:
    """SHA-1 (12 hex digits) of the package's and the benchmarks' Python sources as they are on disk:
    names the measured code where ``git rev-parse`` cannot (a copy of the tree whose ``.git`` is
    another commit's, as on the device machine of 2026-12-05)."""
    digest = hashlib.sha1()
    for path in sorted([*(HERE.parent / "kvcanary_numba").rglob("*.py"), *HERE.glob("*.py")]):
        digest.update(path.relative_to(HERE.parent).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _meta(args, gpu: bool) -> dict:
    import numpy

    meta = {
        "name": args.name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "gpu": gpu,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "pinned_core": args.pin,
    }
    try:
        meta["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    meta["source_sha1"] = source_sha1()
    for module in ("numba", "numba_cuda", "cupy"):
        try:
            meta[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - optional
            pass
    if gpu:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        meta["device"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        meta["sms"] = int(props["multiProcessorCount"])
        meta["driver"] = cupy.cuda.runtime.driverGetVersion()
    return meta


def _sections(names: list[str]):
    from benchmarks import bench_cpu, bench_public

    table = {
        "cpu": bench_cpu.cpu_verify,
        "validation": bench_cpu.validation_cost,
        "public-cpu": bench_public.public_cpu,
        "public": bench_public.public_calls,
    }
    if any(n in GPU_SECTIONS for n in names):
        from benchmarks import bench_chain, bench_kernels, bench_step

        def roofline(run):
            run.copy_gbps = bench_kernels.roofline(run)["gbps"]

        table.update(
            roofline=roofline,
            verify=bench_kernels.verify_sweep,
            write=bench_kernels.write_sweep,
            plan=bench_kernels.plan_sweep,
            launch=bench_step.launch_overhead,
            step=bench_step.op_step,
            monitor=bench_step.monitor_steps,
            chain=bench_chain.chain_section,
        )
        from benchmarks import bench_budget

        table["budget"] = bench_budget.budget_sweep
    if any(n in ("verify", "write", "plan") for n in names) and "roofline" not in names:
        names = ["roofline", *names]  # bandwidth fractions need it
    return [(n, table[n]) for n in names if n in table]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--cpu", action="store_true", help="CPU comparisons only (no GPU needed)")
    parser.add_argument("--only", default="", help=f"comma-separated sections of {GPU_SECTIONS + CPU_SECTIONS}")
    parser.add_argument("--out", default=str(HERE / "results"), help="results folder (default benchmarks/results)")
    parser.add_argument("--name", default=None, help="file stem of the results (default: device and mode)")
    parser.add_argument("--budget", type=float, default=330.0, help="wall-clock seconds for the whole run")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations per case (default 20, quick 5)")
    parser.add_argument(
        "--pin",
        type=int,
        default=None,
        metavar="CORE",
        help="run on this CPU core only (host rows without the scheduler's migrations)",
    )
    args = parser.parse_args(argv)
    allowed = None  # the process's own cores, read only under --pin (not every platform has affinity)
    if args.pin is not None:
        allowed = os.sched_getaffinity(0)
        if args.pin not in allowed:
            parser.error(f"--pin {args.pin}: this process may run on cores {sorted(allowed)} only")
    gpu = _gpu_available() and not args.cpu
    wanted = [s for s in args.only.split(",") if s] or list((GPU_SECTIONS if gpu else ()) + CPU_SECTIONS)
    unknown = sorted(set(wanted) - set(GPU_SECTIONS + CPU_SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}")
    if not gpu:
        wanted = [s for s in wanted if s in CPU_SECTIONS]
    args.name = args.name or ("gpu" if gpu else "cpu") + ("-quick" if args.quick else "")
    run = Run(quick=args.quick, iters=args.iters or (5 if args.quick else 20), budget=args.budget)
    meta = _meta(args, gpu)
    if gpu:
        meta["device_slug"] = meta["device"].lower().replace(" ", "-")
    started = time.monotonic()
    sections = []
    with run.guard("setup"):
        sections = _sections(wanted)
    if args.pin is not None:
        sections.sort(key=lambda item: item[0] not in UNPINNED_SECTIONS)  # stable: the others keep their order
        meta["unpinned_sections"] = [n for n, _ in sections if n in UNPINNED_SECTIONS]
    for name, section in sections:
        if args.pin is not None:
            # A thread that sleeps in a blocking synchronize may wake on another core, with cold caches:
            # the H200 of 2026-12-05 (76781cc) measured a replayed decode step at 14 us pinned and
            # 21-25 us not, same host.
            os.sched_setaffinity(0, allowed if name in UNPINNED_SECTIONS else {args.pin})
        if name != "roofline" and not run.deadline.allows(5):
            run.skip(name, "whole section (budget spent)")
            continue
        print(f"[{time.monotonic() - started:6.1f}s] {name}", flush=True)
        with run.guard(name):
            section(run)
    meta.update(
        seconds=round(time.monotonic() - started, 1),
        sections=wanted,
        skipped=run.skipped,
        errors=run.errors,
        copy_gbps=run.copy_gbps,
    )
    out = pathlib.Path(args.out)
    write_results(out, args.name, meta, run.records)
    print(f"wrote {out / (args.name + '.json')} and .md ({len(run.records)} records, {len(run.errors)} errors)")
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
