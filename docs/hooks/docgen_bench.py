"""Benchmarks page: tables and plots from ``benchmarks/results/*.json``.

Tolerant by design: files may be missing, truncated or half-filled while the
benchmark suite grows. Each file is read on its own; what cannot be read is
reported on the page instead of failing the build. Accepted shapes:

- ``{"meta": {...}, "results": [record, ...]}`` or a bare ``[record, ...]``;
- a record is a flat object. It is plotted when it has an operation name
  (``op`` / ``kernel`` / ``name``), a size (``size`` / ``entries`` / ``bs`` /
  ``tokens`` / ``n``) and a time (``median_us`` / ``time_us`` / ``us``, or
  ``median_ms`` / ``time_ms``); ``variant`` / ``impl`` / ``mode`` / ``backend``
  name the line. Every record, plotted or not, is listed in the table.

Run standalone to write the plots of a folder: ``python docgen_bench.py RESULTS OUT``.
"""

from __future__ import annotations

import io
import json
import pathlib
import sys
from collections import defaultdict

OP_KEYS = ("op", "kernel", "name")
SIZE_KEYS = ("size", "entries", "bs", "tokens", "n")
VARIANT_KEYS = ("variant", "impl", "mode", "backend")
TIME_KEYS = (("median_us", 1.0), ("time_us", 1.0), ("us", 1.0), ("median_ms", 1e3), ("time_ms", 1e3))

LINE_STYLES = ("-", "--", ":", "-.")

NO_RESULTS = (
    "!!! note \"No results yet\"\n"
    "    No benchmark results are committed yet. Run the benchmark suite on a GPU "
    "(`kvcanary bench`) and commit its JSON under `benchmarks/results/`; this page is rebuilt from it."
)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _first(record: dict, keys) -> object | None:
    return next((record[k] for k in keys if record.get(k) is not None), None)


def load(path: pathlib.Path) -> tuple[dict, list[dict], str | None]:
    """(meta, records, problem) of one results file; never raises on bad content."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {}, [], f"could not be read ({type(exc).__name__}: {exc})"
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    records = data.get("results", []) if isinstance(data, dict) else data
    if not isinstance(records, list):
        return (meta if isinstance(meta, dict) else {}), [], "has no list of results"
    kept = [r for r in records if isinstance(r, dict)]
    problem = f"{len(records) - len(kept)} result entries are not objects" if len(kept) < len(records) else None
    return (meta if isinstance(meta, dict) else {}), kept, problem


def series(records: list[dict]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """op -> variant -> sorted [(size, time_us)] of the plottable records."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        op, size = _first(r, OP_KEYS), _number(_first(r, SIZE_KEYS))
        time_us = next((_number(r.get(k)) * f for k, f in TIME_KEYS if _number(r.get(k)) is not None), None)
        if op is None or size is None or time_us is None or size <= 0 or time_us <= 0:
            continue
        variant = str(_first(r, VARIANT_KEYS) or "default")
        out[str(op)][variant].append((size, time_us))
    return {op: distinct({v: sorted(pts) for v, pts in vs.items()}) for op, vs in out.items()}


def distinct(lines: dict[str, list]) -> dict[str, list]:
    """``lines`` less those that repeat an earlier line's points (by variant name).

    A record that re-reads another's timing under a different byte model has the
    same points; drawn twice, one line would hide the other.
    """
    seen: set[tuple] = set()
    kept = {}
    for variant, points in sorted(lines.items()):
        if tuple(points) not in seen:
            seen.add(tuple(points))
            kept[variant] = points
    return kept


def size_key(records: list[dict], op: str) -> str:
    """The size field the records of ``op`` use (axis label), ``size`` when they disagree."""
    keys = {next((k for k in SIZE_KEYS if k in r), None) for r in records if _first(r, OP_KEYS) == op}
    keys.discard(None)
    return keys.pop() if len(keys) == 1 else "size"


def plot_svg(op: str, lines: dict[str, list[tuple[float, float]]], xlabel: str = "size") -> bytes:
    """Log-log time-versus-size plot of one operation, as SVG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for index, (variant, points) in enumerate(sorted(lines.items())):
        xs, ys = zip(*points)
        # The colour cycle has 10 entries: later lines change their dash instead.
        ax.plot(xs, ys, marker="o", label=variant, linestyle=LINE_STYLES[index // 10 % len(LINE_STYLES)])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("median time (µs)")
    ax.set_title(op)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def _cell(value) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text.replace("|", "/").replace("\n", " ")


def _table(records: list[dict]) -> list[str]:
    columns: list[str] = []
    for r in records:
        columns += [k for k in r if k not in columns]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    rows += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in records]
    return rows


def render(results_dir: pathlib.Path, image_dir: str) -> tuple[str, dict[str, bytes]]:
    """(Markdown of the benchmarks page, image path -> SVG bytes).

    ``image_dir`` is the docs-relative folder the images are placed in; links
    in the page are relative to ``benchmarks.md`` at the docs root.
    """
    parts = ["# Benchmarks", "", '--8<-- "benchmarks-intro.md"', ""]
    paths = sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []
    if not paths:
        return "\n".join(parts + [NO_RESULTS, ""]), {}
    images: dict[str, bytes] = {}
    for path in paths:
        meta, records, problem = load(path)
        parts += [f"## `{path.name}`", ""]
        if problem:
            parts += [f"!!! warning \"Partial results\"\n    `{path.name}` {problem}.", ""]
        if meta:
            parts += ["| run | |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in meta.items()), ""]
        for op, lines in series(records).items():
            name = f"{image_dir}/{path.stem}-{''.join(c if c.isalnum() else '-' for c in op)}.svg"
            images[name] = plot_svg(op, lines, size_key(records, op))
            parts += [f"![{op}: time versus size]({name})", ""]
        parts += (_table(records) if records else ["No result records in this file."]) + [""]
    return "\n".join(parts), images


def main(argv: list[str]) -> int:
    results, out = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    text, images = render(results, "img")
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.md").write_text(text, encoding="utf-8")
    for name, data in images.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    print(f"wrote {out / 'benchmarks.md'} and {len(images)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
