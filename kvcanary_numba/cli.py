"""The ``kvcanary`` command line (also ``python -m kvcanary_numba``).

Subcommands: ``demo`` (toy engine with planted faults, and what the canary
caught), ``explain CODE`` (one error-catalogue entry), ``doctor`` (backends,
versions, the CUDA runtime and driver, why a GPU path is unavailable),
``inspect BUNDLE`` (replay a violation bundle), ``bench`` (the benchmark script
of a source checkout; the wheel does not ship it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import difflib
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
from importlib import metadata

from . import __version__
from ._runtime import NUMBA_CUDA_NUMPY_LIMIT as _NUMBA_CUDA_NUMPY_LIMIT, gpu_available
from .errors import REGISTRY, ErrorEntry, KvCanaryError

__all__ = ["main"]

_SOURCE_TREE = pathlib.Path(__file__).resolve().parent.parent
_BENCH = _SOURCE_TREE / "benchmarks" / "run.py"
_WIDTH = 100


# --- demo --------------------------------------------------------------------------
def _progress_bar(stream):
    """A plain-text progress bar; redrawn in place on a terminal, one line per run elsewhere (logs)."""
    live = stream.isatty()

    def show(label: str, done: int, total: int) -> None:
        if not live and done != total:
            return
        width = 30
        filled = width * done // max(total, 1)
        end = "\n" if done == total else ""
        stream.write(f"\r{label:<15} [{'#' * filled}{'.' * (width - filled)}] {done:>5}/{total} steps{end}")
        stream.flush()

    return show


def _demo(args) -> int:
    from .engine import FAULT_CLASSES, EngineConfig
    from .engine.demo import format_report, report_dict, run_demo

    device = args.device if args.device != "auto" else ("cuda" if gpu_available() else "cpu")
    names = [f.strip() for f in args.faults.split(",") if f.strip()]
    faults = list(FAULT_CLASSES) if names == ["all"] else [] if names == ["none"] else names
    config = EngineConfig(seed=args.seed, swa_window=args.swa_window)
    progress = None if args.no_progress else _progress_bar(sys.stderr)
    runs = run_demo(steps=args.steps, faults=faults, device=device, config=config, progress=progress)
    if args.json:
        print(json.dumps(report_dict(runs, device=device, config=config), indent=2))
    else:
        print(format_report(runs, device=device, config=config))
    return 0 if all(run.ok for run in runs) else 1


# --- explain -----------------------------------------------------------------------
def _normalise(code: str) -> str:
    """Accept ``KVC-P001``, ``kvc-p001``, ``P001`` and ``P1``."""
    code = code.strip().upper()
    short = re.fullmatch(r"(?:KVC-)?([A-Z])(\d{1,3})", code)
    return f"KVC-{short.group(1)}{int(short.group(2)):03d}" if short else code


def close_codes(code: str, n: int = 5) -> list[str]:
    """Registered codes that look like ``code`` (full or without the ``KVC-`` prefix)."""
    pool = {c: c for c in REGISTRY} | {c[4:]: c for c in REGISTRY}
    found = difflib.get_close_matches(code.strip().upper(), sorted(pool), n=2 * n, cutoff=0.5)
    return list(dict.fromkeys(pool[f] for f in found))[:n]


def _block(title: str, body: str, *, code: bool = False) -> list[str]:
    if code:
        return [title, *("    " + line for line in body.splitlines()), ""]
    return [title, textwrap.fill(body, _WIDTH, initial_indent="  ", subsequent_indent="  "), ""]


def _bullets(title: str, items) -> list[str]:
    lines = [title]
    for item in items:
        lines.append(textwrap.fill(item, _WIDTH, initial_indent="  - ", subsequent_indent="    "))
    return [*lines, ""]


def format_entry(entry: ErrorEntry) -> str:
    """A registry entry as plain text, in catalogue order."""
    kind = "KvCanaryTypeError (TypeError)" if entry.exception == "type" else "KvCanaryError (ValueError)"
    origin = "extension (SGLang has no such check)" if entry.extension else "mirrors an SGLang check"
    lines = [f"{entry.code}  {entry.title}", f"Operation: {entry.operation}", f"Raises: {kind}; {origin}", ""]
    lines += _block("Message", entry.message, code=True)
    lines += _block("What it means", entry.meaning)
    lines += _bullets("Common causes", entry.triggers)
    lines += _bullets("How to fix", entry.solutions)
    lines += _block("Before", entry.before, code=True)
    lines += _block("After", entry.after, code=True)
    lines += _block("Defensive pattern", entry.defensive, code=True)
    lines += _block("Prevention", entry.prevention)
    if entry.sglang:
        lines += _bullets("SGLang message(s)", entry.sglang)
    if entry.related:
        lines += [f"Related: {', '.join(entry.related)}", ""]
    lines.append(f"Docs: {entry.url}")
    return "\n".join(lines)


def _explain(args) -> int:
    if args.code is None:
        for code, entry in sorted(REGISTRY.items()):
            print(f"{code}  {entry.title}")
        return 0
    code = _normalise(args.code)
    entry = REGISTRY.get(code)
    if entry is None:
        hints = close_codes(args.code)
        print(f"kvcanary explain: unknown error code {args.code!r}.", file=sys.stderr)
        if hints:
            print(f"Did you mean: {', '.join(hints)}?", file=sys.stderr)
        print("Run `kvcanary explain` without a code to list every code.", file=sys.stderr)
        return 2
    print(format_entry(entry))
    return 0


# --- doctor ------------------------------------------------------------------------
#: First NumPy release numba-cuda 0.30 does not import on (``_runtime.NUMBA_CUDA_NUMPY_LIMIT``).
#: Doctor imports numba-cuda's NumPy array overloads (``numba.cuda.np.arrayobj``: loaded by the
#: first kernel compile, not by ``import numba.cuda``, and the module that fails there) to find out.
NUMBA_CUDA_NUMPY_LIMIT = _NUMBA_CUDA_NUMPY_LIMIT

#: Kinds of reason the GPU path is unavailable, in the order doctor reports them.
REASON_KINDS = (
    "no-numba-cuda",
    "numpy-too-new",
    "numba-cuda-broken",
    "no-cupy",
    "cupy-broken",
    "no-driver",
    "driver-error",
    "no-gpu",
    "driver-too-old",
    "runtime-mismatch",
    "no-runtime",
    "simulator",
)

#: ``cuInit``'s result on a machine whose driver sees no CUDA device (CUDA_ERROR_NO_DEVICE).
_CUDA_ERROR_NO_DEVICE = 100


@dataclasses.dataclass(frozen=True)
class CudaProbe:
    """What ``kvcanary doctor`` found, as plain values (``probe_cuda`` reads them; tests build their own).

    Versions are strings as the packages report them; ``None`` means not installed (or, for
    ``driver``, no driver library). ``runtimes`` holds one ``(source, "major.minor")`` pair per
    package that reported a CUDA runtime version.
    """

    numpy: str
    numba_cuda: str | None = None  #: numba-cuda's version, when the package is installed
    numba_cuda_error: str | None = None  #: why ``import numba.cuda`` failed, when it did
    cupy: str | None = None  #: CuPy's version (cupy-cuda13x, cupy-cuda12x or cupy)
    cupy_error: str | None = None  #: why ``import cupy`` failed, when it did
    runtimes: tuple[tuple[str, str], ...] = ()
    driver: str | None = None  #: CUDA version the driver supports, "major.minor"
    driver_error: str | None = None  #: why the driver could not be asked (or answered an error)
    devices: tuple[str, ...] = ()  #: one description per CUDA device the driver sees
    simulator: bool = False


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why the GPU path is unavailable: a stable ``kind`` (one of ``REASON_KINDS``) and the text shown."""

    kind: str
    text: str


def _release(version: str) -> tuple[int, int]:
    """``"2.5.0rc1"`` -> ``(2, 5)``; ``(0, 0)`` when it does not start with two numbers."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _cuda_version(encoded: int) -> str:
    """CUDA's version integer (``13050``) as ``"13.5"``."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def suggested_extra(probe: CudaProbe) -> str:
    """The extra whose CUDA runtime this machine's driver runs: ``gpu-cu12`` for a CUDA 12 driver, else ``gpu``."""
    return "gpu-cu12" if probe.driver is not None and _release(probe.driver)[0] == 12 else "gpu"


def gpu_path_reasons(probe: CudaProbe) -> list[Reason]:
    """Every reason the Numba-CUDA kernels cannot run on CuPy arrays here; empty when they can.

    Pure host logic over ``probe``: what is installed, what imported, what the driver said.
    """
    from ._runtime import NO_NUMBA_CUDA

    extra = suggested_extra(probe)
    install = f"pip install 'kvcanary_numba[{extra}]'"
    reasons: list[Reason] = []
    if probe.numba_cuda is None:
        cu12 = f"; this driver runs CUDA {probe.driver}: {install}" if extra == "gpu-cu12" else ""
        reasons.append(Reason("no-numba-cuda", NO_NUMBA_CUDA + cu12))
    elif probe.numba_cuda_error is not None:
        if _release(probe.numpy) >= NUMBA_CUDA_NUMPY_LIMIT:
            text = (
                f"numba-cuda {probe.numba_cuda} does not import on NumPy {probe.numpy} ({probe.numba_cuda_error}):"
                f" the kernels need numpy<2.5, which the gpu extras pin ({install})"
            )
            reasons.append(Reason("numpy-too-new", text))
        else:
            reasons.append(
                Reason("numba-cuda-broken", f"numba-cuda {probe.numba_cuda} fails to import: {probe.numba_cuda_error}")
            )
    if probe.cupy is None:
        reasons.append(Reason("no-cupy", f"CuPy is not installed (the GPU path allocates with it): {install}"))
    elif probe.cupy_error is not None:
        reasons.append(Reason("cupy-broken", f"CuPy {probe.cupy} fails to import: {probe.cupy_error}"))
    if probe.driver is None:
        reasons.append(Reason("no-driver", probe.driver_error or "no NVIDIA driver found"))
    elif probe.driver_error is not None:
        reasons.append(Reason("driver-error", probe.driver_error))
    elif not probe.devices:
        reasons.append(Reason("no-gpu", f"the driver (CUDA {probe.driver}) sees no CUDA device"))
    if probe.driver is not None:
        driver_major = _release(probe.driver)[0]
        newer = [(source, version) for source, version in probe.runtimes if _release(version)[0] > driver_major]
        if newer:
            found = ", ".join(f"CUDA {version} from {source}" for source, version in newer)
            fix = f"update the driver or {install}" if extra == "gpu-cu12" else "update the driver"
            reasons.append(
                Reason("driver-too-old", f"the driver supports CUDA {probe.driver}, older than {found}: {fix}")
            )
    if len({_release(version)[0] for _, version in probe.runtimes}) > 1:
        found = ", ".join(f"CUDA {version} from {source}" for source, version in probe.runtimes)
        reasons.append(
            Reason(
                "runtime-mismatch",
                f"two CUDA major versions are installed ({found}): keep one extra, gpu (CUDA 13) or gpu-cu12 (CUDA 12)",
            )
        )
    if probe.numba_cuda is not None and probe.numba_cuda_error is None and not probe.runtimes and not probe.simulator:
        reasons.append(Reason("no-runtime", "no CUDA runtime answered (cuda-bindings, numba-cuda, CuPy)"))
    if probe.simulator:
        reasons.append(
            Reason(
                "simulator",
                "NUMBA_ENABLE_CUDASIM=1: numba.cuda is the CUDA simulator in this "
                "process (the kernels run on NumPy arrays)",
            )
        )
    return reasons


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _probe_driver() -> tuple[str | None, str | None, tuple[str, ...]]:
    """(CUDA version the driver supports, why it could not be asked, devices) through libcuda alone.

    Loads the driver library with ctypes: no CUDA package, no context, nothing initialised on a
    machine without a driver; ``cuInit`` only runs once the driver answered its version.
    """
    import ctypes

    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    lib = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return None, f"no NVIDIA driver: {names[0]} is not on the library path", ()
    value = ctypes.c_int(0)
    if (rc := lib.cuDriverGetVersion(ctypes.byref(value))) != 0:
        return None, f"the NVIDIA driver library did not report its version (CUresult {rc})", ()
    driver = _cuda_version(value.value)
    if (rc := lib.cuInit(0)) == _CUDA_ERROR_NO_DEVICE:
        return driver, None, ()
    if rc != 0:
        return driver, f"the driver (CUDA {driver}) failed to initialise: cuInit returned CUresult {rc}", ()
    count = ctypes.c_int(0)
    if (rc := lib.cuDeviceGetCount(ctypes.byref(count))) != 0:
        return driver, f"the driver (CUDA {driver}) failed to count devices: CUresult {rc}", ()
    devices = []
    for index in range(count.value):
        device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGet(ctypes.byref(device), index)
        lib.cuDeviceGetName(name, len(name), device)
        lib.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # COMPUTE_CAPABILITY_MAJOR
        lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # COMPUTE_CAPABILITY_MINOR
        devices.append(f"{name.value.decode(errors='replace')} (compute capability {major.value}.{minor.value})")
    return driver, None, tuple(devices)


def probe_cuda() -> CudaProbe:
    """Read what ``gpu_path_reasons`` needs from this process's packages and driver.

    Imports numba.cuda only when numba-cuda is installed (never numba's own CUDA target) and
    asks each CUDA package for the runtime version it carries, which needs no GPU.
    """
    from ._runtime import NO_NUMBA_CUDA, kernels_unavailable, simulator_enabled

    simulator = simulator_enabled()
    # Installed (the version), whatever NumPy it would run on: the import below tells the rest.
    numba_cuda = (_version("numba-cuda") or "unknown version") if kernels_unavailable() != NO_NUMBA_CUDA else None
    numba_cuda_error, runtimes = None, []
    with contextlib.suppress(Exception):  # not installed, or no runtime library: no answer from this source
        from cuda.bindings import runtime as cudart

        err, value = cudart.cudaRuntimeGetVersion()
        if int(err) == 0:
            runtimes.append((f"cuda-bindings {_version('cuda-bindings')}", _cuda_version(value)))
    if numba_cuda is not None:
        try:
            import numba.cuda.np.arrayobj  # noqa: F401 - what the first kernel compile loads (fails on NumPy 2.5)
            from numba import cuda

        except Exception as exc:  # noqa: BLE001 - e.g. numba-cuda 0.30 on NumPy 2.5
            numba_cuda_error = _failure(exc)
        else:
            if not simulator:  # the simulator's runtime is a stand-in
                with contextlib.suppress(Exception):
                    major, minor = cuda.runtime.get_version()
                    runtimes.append((f"numba-cuda {numba_cuda}", f"{major}.{minor}"))
    cupy_version = next((v for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if (v := _version(d))), None)
    cupy_error = None
    if cupy_version is not None:
        try:
            import cupy
        except Exception as exc:  # noqa: BLE001 - e.g. its CUDA libraries are missing
            cupy_error = _failure(exc)
        else:
            with contextlib.suppress(Exception):
                runtimes.append((f"CuPy {cupy_version}", _cuda_version(cupy.cuda.runtime.runtimeGetVersion())))
    driver, driver_error, devices = _probe_driver()
    return CudaProbe(
        numpy=_version("numpy") or "unknown",
        numba_cuda=numba_cuda,
        numba_cuda_error=numba_cuda_error,
        cupy=cupy_version,
        cupy_error=cupy_error,
        runtimes=tuple(runtimes),
        driver=driver,
        driver_error=driver_error,
        devices=devices,
        simulator=simulator,
    )


def _runtime_row(probe: CudaProbe) -> str:
    if not probe.runtimes:
        return "none found (asked cuda-bindings, numba-cuda and CuPy: none importable)"
    by_version: dict[str, list[str]] = {}
    for source, version in probe.runtimes:
        by_version.setdefault(version, []).append(source)
    return "; ".join(f"{version} (from {', '.join(sources)})" for version, sources in by_version.items())


def _driver_row(probe: CudaProbe) -> str:
    if probe.driver is None:
        return f"none ({probe.driver_error})" if probe.driver_error else "none"
    return f"supports CUDA {probe.driver}" + (f"; {probe.driver_error}" if probe.driver_error else "")


def _doctor(args) -> int:
    probe = probe_cuda()
    reasons = gpu_path_reasons(probe)
    gpu = f"{probe.devices[0]}, {len(probe.devices)} device(s)" if probe.devices else "none visible"
    rows = [
        ("kvcanary_numba", __version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", probe.numpy),
        ("numba", _version("numba") or "not installed"),
        ("numba-cuda", probe.numba_cuda or "not installed (CPU path only; the kernels need a gpu extra)"),
        ("cupy", probe.cupy or "not installed"),
        ("CUDA runtime", _runtime_row(probe)),
        ("CUDA driver", _driver_row(probe)),
        ("GPU", gpu),
        (
            "CUDA simulator",
            (
                f"{'on' if probe.simulator else 'off'} "
                f"(NUMBA_ENABLE_CUDASIM={os.environ.get('NUMBA_ENABLE_CUDASIM', 'unset')})"
            ),
        ),
        ("CPU path", "NumPy references (device='cpu', backend='numpy')"),
        ("GPU path", f"unavailable: {reasons[0].text}" if reasons else "Numba-CUDA kernels on CuPy arrays"),
        *(("", f"and: {reason.text}") for reason in reasons[1:]),
        ("demo default", "cuda" if probe.devices and gpu_available() else "cpu"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


# --- bench -------------------------------------------------------------------------
def bench_out_dir(cwd: pathlib.Path, source_tree: pathlib.Path, now: datetime.datetime) -> pathlib.Path:
    """Default results folder of ``kvcanary bench``: never inside the source tree.

    Results written there would be published by the next docs build
    (``benchmarks/results/`` feeds the benchmarks pages); committing a run is a
    deliberate ``--out benchmarks/results``. Outside the tree:
    ``<cwd>/kvcanary-bench-<date>``; inside it: a fresh temporary folder.
    """
    stamp = now.strftime("%Y%m%d-%H%M%S")
    cwd, source_tree = cwd.resolve(), source_tree.resolve()
    if cwd == source_tree or source_tree in cwd.parents:
        return pathlib.Path(tempfile.mkdtemp(prefix=f"kvcanary-bench-{stamp}-"))
    return cwd / f"kvcanary-bench-{stamp}"


#: What ``kvcanary bench`` prints where the package is not a checkout (an installed wheel).
BENCH_FROM_CHECKOUT = (
    "kvcanary bench: the benchmarks are not part of the installed package; they live in benchmarks/ of the "
    "source repository. From a checkout: python -m benchmarks.run --quick --out DIR (or install the "
    "checkout with pip install -e . and run kvcanary bench -- --quick there)."
)


def _from_checkout() -> bool:
    """True when the package runs from a source checkout that has the benchmark script.

    An installed wheel sits in site-packages, which has no ``pyproject.toml`` beside the package
    (and any ``benchmarks/`` there belongs to another distribution).
    """
    return _BENCH.is_file() and (_SOURCE_TREE / "pyproject.toml").is_file()


def _bench(args) -> int:
    if not _from_checkout():
        print(
            f"{BENCH_FROM_CHECKOUT}\n(no benchmarks/run.py beside a pyproject.toml in {_SOURCE_TREE})", file=sys.stderr
        )
        return 1
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not any(a == "--out" or a.startswith("--out=") for a in extra) and not ({"-h", "--help"} & set(extra)):
        out = bench_out_dir(pathlib.Path.cwd(), _SOURCE_TREE, datetime.datetime.now())
        print(f"kvcanary bench: results go to {out} (choose with -- --out DIR)", file=sys.stderr)
        extra = [*extra, "--out", str(out)]
    return subprocess.call([sys.executable, str(_BENCH), *extra])


# --- inspect -----------------------------------------------------------------------
def _inspect(args) -> int:
    from .monitor.replay import explain_bundle

    print(explain_bundle(args.bundle))
    return 0


def _positive_int(text: str) -> int:
    """argparse type of counts such as ``--steps``: 0 or less is a usage error (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (a run needs at least one step), got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvcanary", description="KV-cache canary: demo, error catalogue, checks.")
    parser.add_argument("--version", action="version", version=f"kvcanary_numba {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the toy engine with planted faults and report what was caught")
    demo.add_argument("--steps", type=_positive_int, default=40, help="engine steps per run, >= 1 (default 40)")
    demo.add_argument("--faults", default="all", help="comma-separated fault classes, 'all' or 'none'")
    demo.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--swa-window", type=int, default=0, help="add an SWA sub-pool with this window")
    demo.add_argument("--json", action="store_true", help="print a JSON report instead of text")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    demo.set_defaults(run=_demo)
    explain = sub.add_parser("explain", help="print an error-catalogue entry (no code: list all)")
    explain.add_argument("code", nargs="?", help="e.g. KVC-P001 (or P001)")
    explain.set_defaults(run=_explain)
    doctor = sub.add_parser("doctor", help="backends, GPU and versions")
    doctor.set_defaults(run=_doctor)
    inspect = sub.add_parser("inspect", help="replay a violation bundle (.npz) on the NumPy path and explain it")
    inspect.add_argument("bundle", help="a bundle written by CanaryMonitor(bundle_dir=...)")
    inspect.set_defaults(run=_inspect)
    bench = sub.add_parser("bench", help="run benchmarks/run.py from a source checkout, passing arguments through")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to benchmarks/run.py")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 failure or missed fault, 2 usage / unknown code)."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except KvCanaryError as exc:  # a rejected argument: the message ends with its docs URL and `kvcanary explain`
        print(f"kvcanary {args.command}: {exc}", file=sys.stderr)
        return 2
