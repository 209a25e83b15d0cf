"""Registers, stack and spills of every kernel's sm_90 build: one table per tree.

    python3 benchmarks/ptx_report.py [TREE ...] [--jobs N] [--json FILE]

For each ``TREE`` (default: this repository) every module under ``kvcanary_numba/**/kernels/``
(the core's ``kernels/`` and the fast wing's ``fast/kernels/``, or wherever the tree keeps
them) and, when present, ``benchmarks/baseline_kernels.py`` is compiled, each kernel of its
``KERNELS`` with each declared signature of ``SIGNATURES``, by ``cuda.compile_ptx(...,
cc=(9, 0))`` and linked by nvJitLink with ``-verbose`` for ptxas's report. No GPU is needed,
only the CUDA compiler libraries numba-cuda uses (and ``cuda.bindings.nvjitlink`` for the
register and spill columns; without it they read ``-``). Two trees side by side (``gpu_session.sh
ptx``: ``.base`` and ``.``) show whether a change moved a kernel's code: identical kernel
bodies should give identical registers. ``tests/test_ptx.py`` asserts what the speed relies
on; this script only reports.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

WORKER = r"""
import importlib, json, re, sys
from types import SimpleNamespace

sys.path.insert(0, sys.argv[1])
import numba.cuda.dispatcher as dispatcher

# Device functions ask the current device for its compute capability: none may be here.
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
from numba import cuda

try:
    from cuda.bindings import nvjitlink
except ImportError:
    nvjitlink = None


def ptxas(ptx):
    if nvjitlink is None:
        return {}
    data = ptx.encode()
    options = ["-arch=sm_90", "-verbose"]
    handle = nvjitlink.create(len(options), options)
    nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
    nvjitlink.complete(handle)
    log = bytearray(nvjitlink.get_info_log_size(handle))
    nvjitlink.get_info_log(handle, log)
    nvjitlink.destroy(handle)
    text = log.decode(errors="replace")
    entry = text[text.rfind("Compiling entry function"):] if "Compiling entry function" in text else text
    def first(pattern):
        m = re.search(pattern, entry)
        return int(m.group(1)) if m else None
    return {"registers": first(r"Used (\d+) registers"), "stack": first(r"(\d+) bytes stack frame"),
            "spill_stores": first(r"(\d+) bytes spill stores"), "spill_loads": first(r"(\d+) bytes spill loads")}


module = importlib.import_module(sys.argv[2])
kernels, signatures = getattr(module, "KERNELS", {}), getattr(module, "SIGNATURES", {})
for name, kernel in kernels.items():
    for index, signature in enumerate(signatures.get(name, ())):
        row = {"module": sys.argv[2], "kernel": name, "signature": index}
        try:
            bounds = kernel.targetoptions.get("launch_bounds")
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0), launch_bounds=bounds)
            row.update(ptx_lines=ptx.count("\n"), **ptxas(ptx))
        except Exception as exc:  # one kernel's failure is a row of the report
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(json.dumps(row), flush=True)
"""


def modules(tree: pathlib.Path) -> list[str]:
    """Dotted names of the tree's kernel modules (and the benchmark-only kernels, when it has them)."""
    out = []
    for path in sorted((tree / "kvcanary_numba").rglob("*.py")):
        if path.parent.name == "kernels" and path.stem != "__init__":
            out.append(".".join(path.relative_to(tree).with_suffix("").parts))
    if (tree / "benchmarks" / "baseline_kernels.py").exists():
        out.append("benchmarks.baseline_kernels")
    return out


def _compile(tree: pathlib.Path, module: str) -> list[dict]:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(tree), module], capture_output=True, text=True, env=env, timeout=1200
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        rows.append({"module": module, "kernel": "-", "signature": "-", "error": done.stderr.strip()[-300:]})
    return rows


def report(trees: list[str], jobs: int) -> list[dict]:
    work = [(pathlib.Path(t).resolve(), _label(t), m) for t in trees for m in modules(pathlib.Path(t).resolve())]
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for (_, label, _), found in zip(work, pool.map(lambda w: _compile(w[0], w[2]), work)):
            rows += [{"tree": label, **row} for row in found]
    return rows


def _label(tree: str) -> str:
    return os.path.relpath(pathlib.Path(tree).resolve())


def _cell(row: dict | None, key: str) -> str:
    if row is None:
        return "absent"
    if "error" in row:
        return "error"
    value = row.get(key)
    return "-" if value is None else str(value)


def markdown(rows: list[dict], trees: list[str]) -> str:
    """One line per kernel and signature; registers / stack / spill stores of each tree."""
    key = lambda r: (r["module"].rsplit(".kernels.", 1)[-1], r["kernel"], r["signature"])  # noqa: E731
    kernels = sorted({key(r) for r in rows}, key=str)
    by = {(r["tree"], key(r)): r for r in rows}
    header = ["module", "kernel", "sig"] + [f"{t}: {c}" for t in trees for c in ("regs", "stack", "spills")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k in kernels:
        cells = [str(part) for part in k]
        for t in trees:
            row = by.get((t, k))
            cells += [_cell(row, "registers"), _cell(row, "stack"), _cell(row, "spill_stores")]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [f"- {r['tree']} {r['module']} {r['kernel']}: {r['error']}" for r in rows if "error" in r]
    return "\n".join(lines + ([""] + errors if errors else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", default=[str(pathlib.Path(__file__).resolve().parent.parent)])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="modules compiled at once")
    parser.add_argument("--json", default=None, help="also write every row as JSON lines to this file")
    args = parser.parse_args(argv)
    rows = report(args.trees, args.jobs)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in rows)
    print(markdown(rows, [_label(t) for t in args.trees]))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
