"""Run the tutorial notebooks, check their committed outputs, or refresh them.

The notebooks under ``docs/tutorials/`` are committed *with* their outputs: the site
shows those outputs as they are, without running anything at build time. This
script keeps them honest. It needs nothing but the ``tutorials`` extra (nbclient and
nbformat come with Jupyter), so it also runs in a fresh virtual environment::

    python tests/run_notebooks.py --check            # execute, compare with the committed outputs
    python tests/run_notebooks.py --update           # execute, write the outputs into the notebooks
    python tests/run_notebooks.py --fresh-venv DIR   # new venv, pip install ".[tutorials]", --check

``--fresh-venv`` is the proof that the one install command of the tutorials is enough on a
machine without a GPU: a CI step can run it as is (DIR must not exist yet; about two
minutes on two cores, most of it pip). The test suite's ``tests/test_notebooks.py`` runs
the notebooks in the suite's own environment on every run instead.

What "the same output" means (:func:`comparable`): the text of each stream (stdout,
stderr) and of every result, the kinds of rich outputs (an ``image/png`` is compared by
its presence, not its bytes, which depend on the installed matplotlib and fonts), and
nothing else. In a cell tagged ``measurement`` the numbers are masked, and so is the
rest of a line after ``measured on``: those cells time this machine and say which it is.

Committed outputs are those of the CPU path without a GPU (NumPy arrays; tutorial 04
in Numba's CUDA simulator). On a machine with a GPU the notebooks print other lines,
so :func:`gpu_present` machines only execute them.
"""

from __future__ import annotations

import argparse
import difflib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import venv

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "docs" / "tutorials"
TIMEOUT_S = 600
#: The pip requirement that installs everything the notebooks import (pyproject's extra).
EXTRA = "tutorials"

MEASUREMENT = "measurement"  # cell tag: numbers and the machine's name may change
SOLUTION = "solution"  # cell tag: an exercise's solution (folded on the site, run here all the same)

_NUMBER = re.compile(r" *\d+(?:\.\d+)?(?:e[+-]?\d+)?")  # with its padding: widths vary
_MACHINE = re.compile(r"(measured on)[^\n]*")


def notebooks() -> list[pathlib.Path]:
    return sorted(TUTORIALS.glob("*.ipynb"))


def gpu_present() -> bool:
    """Whether ``nvidia-smi -L`` lists a GPU (the notebooks then take their GPU paths)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def read(path: pathlib.Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def execute(path: pathlib.Path, timeout: int = TIMEOUT_S):
    """The notebook at ``path`` run top to bottom in a fresh kernel of this interpreter.

    Runs in the notebook's folder (relative paths as in Jupyter); raises
    ``nbclient.exceptions.CellExecutionError`` on the first failing cell.
    """
    from nbclient import NotebookClient

    nb = read(path)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return nb


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", ()))


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def coalesced(outputs) -> list:
    """``outputs`` with consecutive stream outputs of one stream joined.

    How a cell's printing is split into outputs depends on when the kernel flushed,
    so it differs from run to run; the text does not.
    """
    joined = []
    for out in outputs:
        last = joined[-1] if joined else None
        if (
            out["output_type"] == "stream"
            and last is not None
            and last["output_type"] == "stream"
            and last["name"] == out["name"]
        ):
            last["text"] = _text(last["text"]) + _text(out["text"])
        else:
            joined.append(out)
    return joined


def comparable(nb) -> list[tuple[int, list[tuple]]]:
    """(cell index, outputs) of every code cell, reduced to what must not change."""
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        masked = MEASUREMENT in tags(cell)

        def clean(text: str) -> str:
            return _NUMBER.sub(" #", _MACHINE.sub(r"\1 …", text)) if masked else text

        # Each stream's text as one piece: when stdout and stderr (a log line) interleave
        # depends on when each was flushed, not on what the cell printed.
        streams: dict[str, str] = {}
        outputs = []
        for out in cell.outputs:
            kind = out["output_type"]
            if kind == "stream":
                streams[out["name"]] = streams.get(out["name"], "") + _text(out["text"])
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                outputs.append(("data", tuple(sorted(data)), clean(_text(data.get("text/plain", "")))))
            else:
                outputs.append((kind, out.get("ename", ""), out.get("evalue", "")))
        streams_out = [("stream", name, clean(text)) for name, text in sorted(streams.items())]
        cells.append((index, streams_out + outputs))
    return cells


def differences(committed, executed) -> list[str]:
    """Readable differences between the comparable outputs of two versions of a notebook."""
    got, want = dict(comparable(executed)), dict(comparable(committed))
    lines = []
    for index in sorted(set(got) | set(want)):
        if got.get(index) != want.get(index):
            old = [repr(o) for o in want.get(index, [])]
            new = [repr(o) for o in got.get(index, [])]
            diff = difflib.unified_diff(old, new, "committed", "executed", lineterm="", n=0)
            lines += [f"cell {index}:", *diff]
    return lines


def with_outputs(committed, executed):
    """``committed`` with the outputs of ``executed``, numbered 1, 2, … and nothing else changed.

    The notebook's metadata stays as committed: the kernel would add its Python
    version (``language_info``), which would change with every machine.
    """
    count = 0
    for old, new in zip(committed.cells, executed.cells, strict=True):
        if old.cell_type != "code":
            continue
        count += 1
        old.outputs, old.execution_count = coalesced(new.outputs), count
        for out in old.outputs:
            if out["output_type"] == "execute_result":
                out["execution_count"] = count
        old.metadata.pop("execution", None)
    return committed


def update(paths: list[pathlib.Path]) -> int:
    import nbformat

    for path in paths:
        start = time.perf_counter()
        nbformat.write(with_outputs(read(path), execute(path)), path)
        print(f"{path.name}: outputs written ({time.perf_counter() - start:.1f} s)")
    return 0


def check(paths: list[pathlib.Path]) -> int:
    compare = not gpu_present()
    failed = 0
    for path in paths:
        start = time.perf_counter()
        executed = execute(path)
        found = differences(read(path), executed) if compare else []
        took = time.perf_counter() - start
        if found:
            failed += 1
            print(f"{path.name}: outputs differ from the committed ones ({took:.1f} s)")
            print("\n".join("    " + line for line in found))
        else:
            print(f"{path.name}: ran, outputs {'as committed' if compare else 'not compared (GPU)'} ({took:.1f} s)")
    if failed:
        print(f"{failed} notebook(s) changed: run `python tests/run_notebooks.py --update` and commit.")
    return 1 if failed else 0


def fresh_venv(folder: pathlib.Path) -> int:
    """A new virtual environment with only ``pip install "<checkout>[tutorials]"``, then ``--check``."""
    if folder.exists():
        raise SystemExit(f"{folder} exists: name a new folder")
    start = time.perf_counter()
    venv.EnvBuilder(with_pip=True).create(folder)
    python = folder / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_ENABLE_CUDASIM")}
    subprocess.run([python, "-m", "pip", "install", "-q", f"{ROOT}[{EXTRA}]"], check=True, env=env)
    # Matplotlib builds its font cache on its first import and says so on stderr: do it
    # here, so that the notice does not land in the first plotting notebook's output.
    subprocess.run([python, "-c", "import matplotlib.pyplot"], check=True, env=env, capture_output=True)
    installed = time.perf_counter()
    # The kernels run in docs/tutorials: they must import the package installed in the venv.
    where = subprocess.run(
        [python, "-c", "import kvcanary_numba; print(kvcanary_numba.__file__)"],
        cwd=TUTORIALS,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(folder)):
        raise SystemExit(f"the notebooks would import {where}, not the package installed in {folder}")
    print(f"kvcanary_numba imported from {where}")
    # Run from outside the checkout, so that the notebooks import the installed package.
    status = subprocess.run([python, str(pathlib.Path(__file__).resolve()), "--check"], cwd=folder, env=env).returncode
    done = time.perf_counter()
    print(f"fresh venv: install {installed - start:.0f} s, notebooks {done - installed:.0f} s")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="execute and compare with the committed outputs")
    mode.add_argument("--update", action="store_true", help="execute and write the outputs into the notebooks")
    mode.add_argument("--fresh-venv", type=pathlib.Path, metavar="DIR", help="new venv with the extra, then --check")
    parser.add_argument("names", nargs="*", help="notebook names or prefixes (default: all)")
    args = parser.parse_args(argv)
    paths = [p for p in notebooks() if not args.names or any(p.name.startswith(n) for n in args.names)]
    if args.fresh_venv:
        return fresh_venv(args.fresh_venv.resolve())
    return update(paths) if args.update else check(paths)


if __name__ == "__main__":
    sys.exit(main())
