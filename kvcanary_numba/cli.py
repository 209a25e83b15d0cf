"""The ``kvcanary`` command line (also ``python -m kvcanary_numba``).

Subcommands: ``demo`` (toy engine with planted faults, and what the canary
caught), ``explain CODE`` (one error-catalogue entry; a pasted message, ours or SGLang's,
finds its entry: :mod:`kvcanary_numba.errors.matching`), ``doctor`` (backends,
versions, the CUDA runtime and driver, why a GPU path is unavailable:
:mod:`kvcanary_numba.doctor`),
``inspect BUNDLE`` (replay a violation bundle), ``bench`` (the benchmark script
of a source checkout; the wheel does not ship it).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap

from . import __version__, doctor
from ._runtime import gpu_available
from .errors import REGISTRY, ErrorEntry, KvCanaryError
from .errors.matching import match_message
from .monitor.bundle_file import MAX_BUNDLE_BYTES

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
    if not args.code:
        for code, entry in sorted(REGISTRY.items()):
            print(f"{code}  {entry.title}")
        return 0
    text = " ".join(args.code)  # a message pasted without quotes arrives in pieces
    code = _normalise(text)
    entry = REGISTRY.get(code)
    if entry is not None:
        print(format_entry(entry))
        return 0
    if _CODE_LIKE.fullmatch(text.strip().upper()):
        hints = close_codes(text)
        print(f"kvcanary explain: unknown error code {text!r}.", file=sys.stderr)
        if hints:
            print(f"Did you mean: {', '.join(hints)}?", file=sys.stderr)
        print("Run `kvcanary explain` without a code to list every code.", file=sys.stderr)
        return 2
    return _explain_message(text)


#: An argument that is meant as a code (``KVC-P0O1``, ``P12``), not a pasted message.
_CODE_LIKE = re.compile(r"(?:KVC-)?[A-Z][0-9A-Z]{1,3}")


def _explain_message(text: str) -> int:
    """A pasted message: its entry (0), the entries it is listed under (0), or the three nearest (2)."""
    found = match_message(text)
    if len(found) == 1 and found[0].how != "words":
        print(f"kvcanary explain: {found[0].code}, which {found[0].why()}\n")
        print(format_entry(REGISTRY[found[0].code]))
        return 0
    exact = found[0].how != "words"
    if exact:
        print(f"kvcanary explain: the message is listed under {len(found)} entries:")
    else:
        print("kvcanary explain: no entry's message matches the text; the three nearest:")
    for match in found:
        print(f"  {match.code}  {REGISTRY[match.code].title}")
        print(textwrap.fill(f"why: {match.why()}", _WIDTH, initial_indent="      ", subsequent_indent="      "))
    print("Run `kvcanary explain CODE` for the whole entry.")
    return 0 if exact else 2


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

    print(explain_bundle(args.bundle, max_bytes=args.max_bytes))  # a bad bundle: one coded line, exit 2
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


def _byte_limit(text: str) -> int:
    """argparse type of ``inspect --max-bytes``: a whole number of bytes, >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
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
    explain = sub.add_parser(
        "explain", help="print the error-catalogue entry of a code or of a pasted message (nothing: list all)"
    )
    explain.add_argument(
        "code", nargs="*", help="e.g. KVC-P001 (or P001), or a whole error message, ours or SGLang's, values included"
    )
    explain.set_defaults(run=_explain)
    sub.add_parser("doctor", help="backends, GPU and versions").set_defaults(run=lambda args: doctor.report())
    inspect = sub.add_parser("inspect", help="replay a violation bundle (.npz) on the NumPy path and explain it")
    inspect.add_argument("bundle", help="a bundle written by CanaryMonitor(bundle_dir=...)")
    inspect.add_argument(
        "--max-bytes",
        type=_byte_limit,
        default=MAX_BUNDLE_BYTES,
        help=f"largest file and inflated arrays to read (default {MAX_BUNDLE_BYTES} bytes)",
    )
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
