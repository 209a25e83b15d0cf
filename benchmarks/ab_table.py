"""Markdown tables of A/B JSON lines: base tree against new tree, medians and spread across rounds.

    python3 benchmarks/ab_table.py [--base .base] [--tolerance US] [--processes] FILE.jsonl [...]

Reads the lines of ``ab_monitor.py``, ``ab_public.py`` and ``ab_cpu.py`` (``{"tree", "label",
"rows": {row: {"median", ...}}}``) and the older probes' lines (``{"tree": "LABEL (round N)",
"<path> / <protocol>": {"host": {...}, "end_step": {...}}}``); a line with ``"failed": true``
is listed and skipped. Lines are grouped by tree: ``tree``, or for the older lines the label
without its `` (round N)``; ``--base`` names the base tree (default ``.base``), every other
tree is compared with it.

Per row and tree, each process (round) gives one median; the table shows the median of those
medians and their spread (max - min). The decision rule of the speed protocol
(``benchmarks/NOTES.md``): the margin of a row is the largest of the two trees' spreads in this
run and ``--tolerance`` (µs, default 0: the spread of the earlier A/B runs, e.g. 1.5 for the
replayed decode step, goes here); the new tree's row is **within** when its median is at most
the base's median plus the margin, **faster** when it is below the base's median minus the
margin, **slower** otherwise. All rows are times: lower is
better. ``--processes``: also one column per process, in run order. Standard library only, so
it runs wherever the JSON lands.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

_ROUND = re.compile(r"\s*\(round \d+\)$")


def _group(line: dict) -> str:
    if isinstance(line.get("rows"), dict):
        return str(line.get("tree"))
    return _ROUND.sub("", str(line.get("tree", "?")))


def _rows(line: dict) -> dict[str, float]:
    """row -> median (µs) of one process's line, either format."""
    if isinstance(line.get("rows"), dict):
        return {
            row: value["median"] for row, value in line["rows"].items() if isinstance(value, dict) and "median" in value
        }
    out = {}
    for key, value in line.items():  # older probes: "<path> / <protocol>": {"host": {...}, "end_step": {...}}
        if not isinstance(value, dict):
            continue
        if "median" in value:
            out[key] = value["median"]
            continue
        for metric, data in value.items():
            if isinstance(data, dict) and "median" in data:
                out[f"{key}: {'pre+post' if metric == 'host' else metric}"] = data["median"]
    return out


def load(paths: list[str]) -> list[dict]:
    lines = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            lines += [json.loads(text) for text in handle if text.lstrip().startswith("{")]
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def verdict(base: list[float], new: list[float], tolerance: float) -> str:
    margin = max(max(base) - min(base), max(new) - min(new), tolerance)
    b, n = statistics.median(base), statistics.median(new)
    if n > b + margin:
        return f"slower (+{n - b:.2f} > {margin:.2f})"
    if n < b - margin:
        return "faster"
    return "within"


def table(lines: list[dict], base: str = ".base", tolerance: float = 0.0, processes: bool = False) -> str:
    """The markdown of ``lines``: one table per tree compared with ``base`` (or per tree alone without it)."""
    failed = [line for line in lines if line.get("failed")]
    lines = [line for line in lines if not line.get("failed")]
    groups: dict[str, list[dict]] = {}
    for line in lines:
        groups.setdefault(_group(line), []).append(line)
    out = []
    if failed:
        out.append("Failed processes: " + ", ".join(str(line.get("label") or line.get("tree")) for line in failed))
        out.append("")
    others = [name for name in groups if name != base] if base in groups else list(groups)
    for name in others:
        sides = [(base, groups[base]), (name, groups[name])] if base in groups else [(name, groups[name])]
        per_side = [[_rows(line) for line in side_lines] for _, side_lines in sides]
        names = []
        for processes_rows in per_side:
            for rows in processes_rows:
                names += [row for row in rows if row not in names]
        header = ["row"]
        for side, side_lines in sides:
            header += [f"{side} median ({len(side_lines)})", f"{side} spread"]
        if len(sides) == 2:
            header += ["new - base", "verdict"]
        if processes:
            header += [str(line.get("label") or line.get("tree")) for _, side_lines in sides for line in side_lines]
        out += [
            f"### {name}" + (f" against {base}" if len(sides) == 2 else ""),
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for row in names:
            values = [[rows[row] for rows in processes_rows if row in rows] for processes_rows in per_side]
            cells = [row]
            for v in values:
                cells += [_fmt(statistics.median(v)) if v else "-", _fmt(max(v) - min(v)) if v else "-"]
            if len(sides) == 2:
                if values[0] and values[1]:
                    cells += [
                        f"{statistics.median(values[1]) - statistics.median(values[0]):+.2f}",
                        verdict(values[0], values[1], tolerance),
                    ]
                else:
                    cells += ["-", "-"]
            if processes:
                cells += [_fmt(rows.get(row)) for processes_rows in per_side for rows in processes_rows]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files of the A/B scripts")
    parser.add_argument("--base", default=".base", help="the base tree's name in the lines (default .base)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="µs a row may move besides the base's spread")
    parser.add_argument("--processes", action="store_true", help="also one column per process")
    args = parser.parse_args(argv)
    print(table(load(args.files), args.base, args.tolerance, args.processes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
