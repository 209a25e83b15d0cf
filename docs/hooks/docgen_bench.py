"""Benchmarks pages: a summary page and one page per run, from ``benchmarks/results/*.json``.

The summary page (``benchmarks.md``) holds the hand-written summary, a few plots
of the latest run and links to the runs; each run's page holds its metadata,
every plot and every record. Plots are cached on disk by the hash of what they
draw (:func:`cached_plot`), so a rebuild does not re-render them.

Tolerant by design: files may be missing, truncated or half-filled while the
benchmark suite grows. Each file is read on its own; what cannot be read is
reported on the page instead of failing the build. Accepted shapes:

- ``{"meta": {...}, "results": [record, ...]}`` or a bare ``[record, ...]``;
- a record is a flat object. It is plotted when it has an operation name
  (``op`` / ``kernel`` / ``name``), a size (``size`` / ``entries`` / ``bs`` /
  ``tokens`` / ``n``) and a time (``median_us`` / ``time_us`` / ``us``, or
  ``median_ms`` / ``time_ms``); ``variant`` / ``impl`` / ``mode`` / ``backend``
  name the line. Every record, plotted or not, is listed in the table.

Run standalone to write the pages of a folder: ``python docgen_bench.py RESULTS OUT``.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import re
import sys
from collections import defaultdict

OP_KEYS = ("op", "kernel", "name")
SIZE_KEYS = ("size", "entries", "bs", "tokens", "n")
VARIANT_KEYS = ("variant", "impl", "mode", "backend")
TIME_KEYS = (
    ("median_us", 1.0),
    ("time_us", 1.0),
    ("us", 1.0),
    ("median_ms", 1e3),
    ("time_ms", 1e3),
)

LINE_STYLES = ("-", "--", ":", "-.")
#: Operations plotted on the summary page (from the latest run), in this order.
SUMMARY_OPS = ("verify", "write", "plan")
#: Bump when plot_svg draws differently: cached plots of the old look are then not reused.
PLOT_VERSION = 1

NO_RESULTS = (
    '!!! note "No results yet"\n'
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
    problem = (
        f"{len(records) - len(kept)} result entries are not objects"
        if len(kept) < len(records)
        else None
    )
    return (meta if isinstance(meta, dict) else {}), kept, problem


def series(records: list[dict]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """op -> variant -> sorted [(size, time_us)] of the plottable records."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in records:
        op, size = _first(r, OP_KEYS), _number(_first(r, SIZE_KEYS))
        time_us = next(
            (
                _number(r.get(k)) * f
                for k, f in TIME_KEYS
                if _number(r.get(k)) is not None
            ),
            None,
        )
        if op is None or size is None or time_us is None or size <= 0 or time_us <= 0:
            continue
        variant = str(_first(r, VARIANT_KEYS) or "default")
        out[str(op)][variant].append((size, time_us))
    return {
        op: distinct({v: sorted(pts) for v, pts in vs.items()})
        for op, vs in out.items()
    }


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
    keys = {
        next((k for k in SIZE_KEYS if k in r), None)
        for r in records
        if _first(r, OP_KEYS) == op
    }
    keys.discard(None)
    return keys.pop() if len(keys) == 1 else "size"


def plot_svg(
    op: str, lines: dict[str, list[tuple[float, float]]], xlabel: str = "size"
) -> bytes:
    """Log-log time-versus-size plot of one operation, as SVG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for index, (variant, points) in enumerate(sorted(lines.items())):
        xs, ys = zip(*points)
        # The colour cycle has 10 entries: later lines change their dash instead.
        ax.plot(
            xs,
            ys,
            marker="o",
            label=variant,
            linestyle=LINE_STYLES[index // 10 % len(LINE_STYLES)],
        )
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


def cached_plot(
    op: str, lines: dict, xlabel: str, cache_dir: pathlib.Path | None
) -> bytes:
    """:func:`plot_svg`, read from ``cache_dir/<hash>.svg`` when the same plot was drawn before.

    The key hashes everything the plot shows (operation, points, axis label) and
    :data:`PLOT_VERSION`; a changed result file changes its key, nothing else does.
    """
    payload = json.dumps(
        [PLOT_VERSION, op, xlabel, sorted(lines.items())], sort_keys=True
    )
    path = (
        cache_dir / f"{hashlib.sha256(payload.encode()).hexdigest()[:32]}.svg"
        if cache_dir
        else None
    )
    if path is not None and path.is_file():
        return path.read_bytes()
    data = plot_svg(op, lines, xlabel)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: a concurrent build never reads half a file
    return data


def _cell(value) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text.replace("|", "/").replace("\n", " ")


def _table(records: list[dict]) -> list[str]:
    columns: list[str] = []
    for r in records:
        columns += [k for k in r if k not in columns]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    rows += [
        "| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in records
    ]
    return rows


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _natural(name: str) -> list:
    """Sort key in which ``run10`` follows ``run9``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _run_page(
    path: pathlib.Path, meta, records, problem, plots: list[tuple[str, str]]
) -> str:
    # Front matter: a run page is data (every record of one run); pasted error messages and
    # API names must find the pages that explain them, not the numbers of a run's table.
    parts = [
        "---",
        "search:",
        "  exclude: true",
        "---",
        "",
        f"# Benchmark run `{path.stem}`",
        "",
        f"From `benchmarks/results/{path.name}`; "
        "the summary of all runs is on the [benchmarks page](../benchmarks.md).",
        "",
    ]
    if problem:
        parts += [f'!!! warning "Partial results"\n    `{path.name}` {problem}.', ""]
    if meta:
        parts += [
            "## Run",
            "",
            "| run | |",
            "|---|---|",
            *(f"| {k} | {_cell(v)} |" for k, v in meta.items()),
            "",
        ]
    if plots:
        parts += [
            "## Plots",
            "",
            *(f"![{op}: time versus size](../{name})\n" for op, name in plots),
        ]
    parts += [
        "## Records",
        "",
        *(_table(records) if records else ["No result records in this file."]),
        "",
    ]
    return "\n".join(parts)


def _run_line(path: pathlib.Path, page: str, meta: dict, records: list, problem) -> str:
    facts = [str(meta[k]) for k in ("device", "date", "commit") if meta.get(k)]
    facts.append(f"{len(records)} records")
    if problem:
        facts.append(f"partial: {problem}")
    return f"- [`{path.stem}`]({page}): {', '.join(facts)}"


def render(
    results_dir: pathlib.Path, image_dir: str, cache_dir: pathlib.Path | None = None
) -> tuple[dict[str, str], dict[str, bytes]]:
    """(docs-relative page path -> Markdown, image path -> SVG bytes).

    ``benchmarks.md`` (docs root) is the summary page; each results file gets
    ``benchmarks/<stem>.md``. ``image_dir`` is the docs-relative folder of the
    plots; ``cache_dir`` (optional) keeps rendered plots between builds.
    """
    summary = ["# Benchmarks", "", '--8<-- "benchmarks-intro.md"', ""]
    files = (
        [(path, *load(path)) for path in results_dir.glob("*.json")]
        if results_dir.is_dir()
        else []
    )
    if not files:
        return {"benchmarks.md": "\n".join(summary + [NO_RESULTS, ""])}, {}
    # Oldest first by the run's recorded date (names mix devices: h100-... sorts before h200-...);
    # files without one come first, in natural name order.
    files.sort(key=lambda f: (str(f[1].get("date", "")), _natural(f[0].name)))
    pages: dict[str, str] = {}
    images: dict[str, bytes] = {}
    runs, latest = [], None
    for path, meta, records, problem in files:
        plots = []
        for op, lines in series(records).items():
            name = f"{image_dir}/{path.stem}-{_slug(op)}.svg"
            images[name] = cached_plot(op, lines, size_key(records, op), cache_dir)
            plots.append((op, name))
        page = f"benchmarks/{path.stem}.md"
        pages[page] = _run_page(path, meta, records, problem, plots)
        runs.append(_run_line(path, page, meta, records, problem))
        if plots:
            latest = (path, plots)
    if latest is not None:
        path, plots = latest
        chosen = [p for op in SUMMARY_OPS for p in plots if p[0] == op] or plots[:3]
        summary += [
            f"## Latest run: `{path.stem}`",
            "",
            f"Median time against size, one line per variant; every plot and record of the run is on "
            f"[its page](benchmarks/{path.stem}.md).",
            "",
        ]
        summary += [f"![{op}: time versus size]({name})\n" for op, name in chosen]
    summary += [
        "## All runs",
        "",
        "One page per results file (metadata, every plot, every record), oldest first:",
        "",
    ]
    pages["benchmarks.md"] = "\n".join(summary + runs + [""])
    return pages, images


def main(argv: list[str]) -> int:
    results, out = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    pages, images = render(results, "img")
    for name, data in {**pages, **images}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(
            data if isinstance(data, bytes) else data.encode("utf-8")
        )
    print(f"wrote {len(pages)} pages and {len(images)} plots under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
